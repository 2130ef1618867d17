//! sluice-intercept: TLS interception for the hosts the policy inspects, so
//! that secrets can be injected into requests the sandbox never sees them in.
//!
//! - [`ca`]: the per-sandbox CA (name-constrained to the inspected hosts) and
//!   the per-SNI leaf cache.
//! - [`proxy`]: the [`Interceptor`]: rustls on both legs, HTTP/1.1 and
//!   HTTP/2 proxying with hyper, the Host/SNI check, secret substitution and
//!   reflection scrubbing; trailers are substituted and scrubbed like heads
//!   (private module `trailers`).
//! - [`plain`]: the [`PlainProxy`] for plain-HTTP flows of an enforcing
//!   gateway: every request's Host checked against the one enforcement
//!   validated, placeholders reported, nothing substituted; no CA needed.
//! - [`event`]: what the proxies report for the audit trail.
//! - [`http`]: what both proxies share: Host / `:authority` parsing
//!   ([`http::authority::parse`]), hop-by-hop headers, their own responses,
//!   the WebSocket-only upgrade rule and splice, the one upstream connect
//!   (refusing local routes), the body layer, and the per-exchange audit
//!   ledger that writes each request's `http` record once.
#![forbid(unsafe_code)]

pub mod ca;
pub mod event;
pub mod http;
pub mod plain;
pub mod proxy;
mod trailers;

#[cfg(test)]
mod name_corpus_tests;

pub use ca::{CaError, CaOptions, SandboxCa};
pub use event::{AuditOut, HttpEvent};
pub use plain::{PlainFlow, PlainProxy};
pub use proxy::{FlowInfo, InterceptError, Interceptor, InterceptorConfig};

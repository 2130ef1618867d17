//! sluice-intercept: TLS interception for the hosts the policy inspects, so
//! that secrets can be injected into requests the sandbox never sees them in.
//!
//! - [`ca`]: the per-sandbox CA (name-constrained to the inspected hosts) and
//!   the per-SNI leaf cache.
//! - [`proxy`]: the [`Interceptor`]: rustls on both legs, HTTP/1.1 and
//!   HTTP/2 proxying with hyper, the Host/SNI check, secret substitution and
//!   reflection scrubbing.
//! - [`event`]: what the proxy reports for the audit trail.
#![forbid(unsafe_code)]

pub mod ca;
pub mod event;
pub mod proxy;
mod trailers;

pub use ca::{CaError, CaOptions, SandboxCa};
pub use event::{AuditOut, HttpEvent};
pub use proxy::{FlowInfo, InterceptError, Interceptor, InterceptorConfig};

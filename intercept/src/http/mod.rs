//! HTTP building blocks shared by the TLS proxy ([`crate::proxy`]) and the
//! plain-HTTP proxy ([`crate::plain`]), so that both apply one rule for each
//! concern:
//!
//! - [`authority`]: Host / `:authority` parsing and host-name normalisation
//!   (public and pure, for fuzzing);
//! - `hop`: hop-by-hop headers and `Connection` tokens;
//! - `responses`: the proxies' own (empty and text) responses;
//! - `upgrade`: which upgrades are allowed (WebSocket only) and the one
//!   splice of two upgraded streams;
//! - `upstream`: the one upstream TCP connect, refusing a destination the
//!   kernel routes locally;
//! - `ledger`: the per-exchange record of what the `http` audit line needs,
//!   written exactly once by an explicit `finish`;
//! - `body`: the body layer both proxies stream through (counting,
//!   optional rewriting, placeholder scanning, finishing the ledger).

pub mod authority;
pub(crate) mod body;
pub(crate) mod hop;
pub(crate) mod ledger;
pub(crate) mod responses;
pub(crate) mod upgrade;
pub(crate) mod upstream;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;

/// The error type of every body the proxies drive.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body type both legs of both proxies are driven with.
pub(crate) type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

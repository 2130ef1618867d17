//! sluice-intercept: TLS interception for the hosts the policy inspects, so
//! that secrets can be injected into requests the sandbox never sees them in.
//!
//! - [`ca`]: the per-sandbox CA (name-constrained to the inspected hosts) and
//!   the per-SNI leaf cache.
#![forbid(unsafe_code)]

pub mod ca;

pub use ca::{CaError, CaOptions, SandboxCa};

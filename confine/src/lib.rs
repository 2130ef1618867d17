//! sluice-confine: the safe building blocks that confine a process, shared by
//! the QEMU jail (`sluice_launcher::jail`) and by the gateway, which restricts
//! itself once its sockets and files are open.
//!
//! * [`seccomp`]: our own syscall filters ([`SeccompProfile`]), each with an
//!   architecture guard that kills i386 (`int 0x80`) and x32 calls.
//! * [`ruleset`]: Landlock rulesets (filesystem, TCP bind/connect, scopes).
//! * [`limits`]: `no_new_privs` and resource limits.
//! * [`gateway_self_restrict`]: the gateway's own jail in one call.
//!
//! Everything here acts on the *calling thread* (seccomp and Landlock) or the
//! calling process (rlimits); see each function for which.

#![forbid(unsafe_code)]

mod gateway;
pub mod limits;
pub mod ruleset;
pub mod seccomp;

pub use gateway::{GatewayConfinement, GatewayRestriction, gateway_self_restrict};
pub use limits::{Rlimits, set_no_new_privs};
pub use ruleset::{LandlockOutcome, LandlockRules};
pub use seccomp::SeccompProfile;

/// Why a confinement step failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfineError {
    /// building the seccomp filter failed
    #[error("building the seccomp filter failed: {0}")]
    SeccompBuild(String),
    /// installing the seccomp filter failed
    #[error("installing the seccomp filter failed: {0}")]
    SeccompInstall(String),
    /// the Landlock ruleset could not be built or enforced
    #[error("landlock: {0}")]
    Landlock(String),
    /// Landlock is not enforced by this kernel (and it was required)
    #[error("landlock is not enforced by this kernel ({0})")]
    LandlockUnavailable(String),
    /// setting a resource limit failed
    #[error("setting {resource} failed: {source}")]
    Rlimit {
        /// the resource (RLIMIT_*)
        resource: &'static str,
        /// the OS error
        source: std::io::Error,
    },
    /// prctl(PR_SET_NO_NEW_PRIVS) failed
    #[error("setting no_new_privs failed: {0}")]
    NoNewPrivs(std::io::Error),
    /// the process has more than one thread; Landlock would confine only the calling one
    #[error(
        "the process has {0} threads: Landlock confines only the calling thread on this kernel; \
         call this before starting any thread (e.g. before building the async runtime)"
    )]
    MultiThreaded(usize),
}

//! The gateway's own jail, applied by the gateway to itself once its
//! listening sockets, frame socket and audit log are open.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{ConfineError, LandlockOutcome, LandlockRules, Rlimits, SeccompProfile};

/// What the gateway still needs after start-up.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GatewayConfinement {
    /// The audit log: the only path it may write (write-only, not read).
    pub audit_path: Option<PathBuf>,
    /// Paths it may read later (the policy file for reloads, CA files).
    pub read_paths: Vec<PathBuf>,
    /// TCP ports it may still bind (`--publish` listeners opened later).
    /// Sockets already bound stay usable whatever this says.
    pub tcp_bind: Vec<u16>,
    /// Directories where it may still create a unix socket (a `--socket`
    /// listener bound after start-up) and remove a stale one.
    #[serde(default)]
    pub socket_dirs: Vec<PathBuf>,
    /// Directories it may read and write (create, replace by rename):
    /// the policy's, when `approval.always` answers write the overlay file
    /// beside it.
    #[serde(default)]
    pub write_dirs: Vec<PathBuf>,
    /// Allow running with Landlock unavailable (reported, not an error).
    pub allow_missing_landlock: bool,
}

/// What [`gateway_self_restrict`] enforced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GatewayRestriction {
    /// The Landlock outcome, or `None` when it was unavailable and allowed to be.
    pub landlock: Option<LandlockOutcome>,
    /// The seccomp profile installed on every thread.
    pub seccomp: SeccompProfile,
}

/// Restricts the calling process for good. It denies, from then on:
///
/// * **exec and new processes**: seccomp ([`SeccompProfile::Gateway`], on all
///   threads via TSYNC) kills the process on `execve`, `execveat`, `fork`,
///   `vfork`, `clone` without `CLONE_THREAD`, and on every call of
///   [`crate::seccomp::KILL_ALWAYS`] (mount, ptrace, namespaces, modules, bpf, ...);
/// * **filesystem**: Landlock allows writing only `audit_path` and reading
///   only `read_paths` (and unix sockets in `socket_dirs`); no execute anywhere; no other file may be opened,
///   created, renamed or removed (descriptors already open keep working);
/// * **network**: TCP bind only on `tcp_bind` ports (outbound connects stay
///   allowed: the gateway connects wherever the policy allows); no signals to
///   and no abstract unix sockets of other processes (Landlock ABI 6+);
/// * core dumps (RLIMIT_CORE 0) and privilege gain (`no_new_privs`).
///
/// Call it **before starting any thread** (before building the tokio
/// runtime): Landlock applies to the calling thread and its future threads
/// only, so it refuses to run in a multi-threaded process.
///
/// # Errors
/// [`ConfineError::MultiThreaded`], or the failing layer's error; a Landlock
/// that the kernel does not enforce is an error unless
/// `allow_missing_landlock`.
pub fn gateway_self_restrict(
    conf: &GatewayConfinement,
) -> Result<GatewayRestriction, ConfineError> {
    let threads = thread_count();
    if threads > 1 {
        return Err(ConfineError::MultiThreaded(threads));
    }
    Rlimits {
        nofile: None,
        core: Some(0),
        fsize: None,
    }
    .apply()?;
    let rules = LandlockRules {
        read: conf.read_paths.clone(),
        write_only: conf.audit_path.iter().cloned().collect(),
        tcp_bind: conf.tcp_bind.clone(),
        socket_dirs: conf.socket_dirs.clone(),
        read_write: conf.write_dirs.clone(),
        ..LandlockRules::default()
    };
    let landlock = match rules.restrict_self() {
        Ok(outcome) => Some(outcome),
        Err(ConfineError::LandlockUnavailable(_)) if conf.allow_missing_landlock => None,
        Err(e) => return Err(e),
    };
    SeccompProfile::Gateway.install(true)?;
    Ok(GatewayRestriction {
        landlock,
        seccomp: SeccompProfile::Gateway,
    })
}

/// The number of threads of this process (from `/proc/self/status`; 1 when
/// it cannot be read, where the kernel then also has no /proc to confuse).
fn thread_count() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(1)
}

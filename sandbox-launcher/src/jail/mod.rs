//! The jail around QEMU (and any other program the launcher starts).
//!
//! [`spawn`] re-executes a helper (the `sluice` binary's hidden
//! `__jail-exec` subcommand, see [`helper_main_if_requested`]) in its own
//! process group. The helper is single-threaded and stays root *outside* the
//! jail as its supervisor. It reads the [`JailSpec`] as one JSON line on its
//! stdin, then, readable top to bottom in `helper.rs`:
//!
//! 1. creates the cgroup(s) and writes the limits;
//! 2. creates the jail mount point `<runtime_dir>/<name>`;
//! 3. `unshare(CLONE_NEWPID)` (affects only its *children*) and `fork()`s:
//!    the child is PID 1 of a new PID namespace. In the child:
//!    1. `PR_SET_PDEATHSIG(SIGKILL)` (dies with the helper), `setsid()`;
//!    2. joins the cgroups (writes itself into `cgroup.procs`);
//!    3. `unshare` mount, IPC, UTS and network namespaces;
//!    4. mounts a tmpfs on the jail dir, bind-mounts each needed path at its
//!       own path inside it (read-only, `nosuid`, `nodev` except device
//!       nodes), `pivot_root`s into it, detaches the old root and remounts
//!       the new root read-only;
//!    5. moves the passed fds to their numbers, points unpassed 0/1/2 at
//!       /dev/null, closes every other fd;
//!    6. sets rlimits; drops all capabilities from the bounding and ambient
//!       sets; drops to the unprivileged uid/gid with no groups;
//!    7. sets `no_new_privs`; enforces the Landlock ruleset; installs the
//!       seccomp filters; `execve`s the program with only the given env.
//! 4. reports `{pid, layers}` (or the child's error) on its stdout, then
//!    waits for the child to exit *or* for its stdin (the launcher's
//!    lifeline) to close: a dropped [`Jailed`] or a dead launcher, even one
//!    killed by SIGKILL, closes it, and the helper kills the child (and with
//!    it the whole PID namespace), removes the cgroups and the jail dir,
//!    reports the exit and exits.
//!
//! A layer that cannot be applied is an error unless the spec lists it in
//! [`JailSpec::allow_missing`]. All `unsafe` code lives in `sys.rs`.
//!
//! The modules: `spec` (what one jail asks for), `layers` (the layers, what
//! this host can apply, the plan for one spec), `launch` (starting the
//! helper and the handle on the jailed program), `helper` (the helper's
//! side, the sequence above), `cgroup`, `userns` (a rootless jail's user
//! namespace), `runtime` (ids and directories), `libraries` (what a program
//! loads, to bind into the jail) and `sys` (the system calls).

mod cgroup;
mod helper;
mod launch;
mod layers;
mod libraries;
mod runtime;
mod spec;
mod sys;
mod userns;

use std::path::PathBuf;

pub use sluice_confine::{LandlockRules, Rlimits, SeccompProfile};

pub use helper::{HELPER_ARG, helper_main_if_requested};
pub use launch::{JailExit, Jailed, KillHandle, spawn};
pub use layers::{Layer, LayerStatus, missing_layers, probe_layers};
pub use libraries::library_deps;
pub use runtime::{NOBODY, default_ids, default_runtime_dir, ensure_private_dir, is_rootless};
pub use spec::{CgroupLimits, FdMap, JailSpec, Namespaces, NetNamespace};
/// The system calls behind `sluice run --network tap` (`network_mode::tap`):
/// they live with the launcher's other `unsafe` code.
pub(crate) use sys::{
    close_fds_across_exec, link_set_mtu_up, packet_socket, raise_ambient, tap_create, unshare,
};
pub use userns::UsernsError;
/// The rootless `--network tap` helper's user namespace
/// (`network_mode::tap_helper`): the same as a rootless jail's.
pub(crate) use userns::{enter as enter_user_namespace, probe as probe_user_namespaces};

/// Why the jail failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JailError {
    /// the jail spec is invalid
    #[error("invalid jail spec: {0}")]
    InvalidSpec(String),
    /// a layer is unavailable on this host and was not allowed to be missing
    #[error(
        "isolation layer {layer} is unavailable on this host ({reason}); \
         allow running without it explicitly if that is acceptable"
    )]
    LayerUnavailable {
        /// [`Layer::name`]
        layer: &'static str,
        /// why
        reason: String,
    },
    /// starting the jail helper failed
    #[error("starting the jail helper {path}: {source}")]
    Helper {
        /// the helper binary
        path: PathBuf,
        /// the OS error
        source: std::io::Error,
    },
    /// setting up the jail failed (reported by the helper)
    #[error("setting up the jail failed: {0}")]
    Setup(String),
    /// talking to the jail helper failed
    #[error("jail helper channel: {0}")]
    Channel(String),
}

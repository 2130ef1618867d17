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

mod cgroup;
mod helper;
mod runtime;
mod sys;
mod userns;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde::{Deserialize, Serialize};
pub use sluice_confine::{LandlockRules, Rlimits, SeccompProfile};

pub use helper::{HELPER_ARG, helper_main_if_requested};
pub use runtime::{NOBODY, default_ids, default_runtime_dir, ensure_private_dir, is_rootless};
/// The system calls behind `sluice run --network tap` (`network_mode::tap`):
/// they live with the launcher's other `unsafe` code.
pub(crate) use sys::{
    close_fds_across_exec, link_set_mtu_up, packet_socket, raise_ambient, tap_create, unshare,
};
pub use userns::UsernsError;
/// The rootless `--network tap` helper's user namespace
/// (`network_mode::tap_helper`): the same as a rootless jail's.
pub(crate) use userns::{enter as enter_user_namespace, probe as probe_user_namespaces};

/// An isolation layer, as `sluice doctor` and `--json` name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Layer {
    /// A new mount namespace.
    MountNs,
    /// A new PID namespace (the program is its PID 1).
    PidNs,
    /// A new IPC namespace.
    IpcNs,
    /// A new UTS namespace (hostname `sluice`).
    UtsNs,
    /// A new, empty network namespace (only a down `lo`).
    NetNs,
    /// `pivot_root` into a tmpfs holding only the listed paths.
    PivotRoot,
    /// Running as an unprivileged uid/gid with no capabilities.
    DropIds,
    /// Resource limits (files, core, file size).
    Rlimits,
    /// `no_new_privs`.
    NoNewPrivs,
    /// Our seccomp filter.
    Seccomp,
    /// A Landlock ruleset.
    Landlock,
    /// cgroup memory limit.
    CgroupMemory,
    /// cgroup pids limit.
    CgroupPids,
    /// cgroup CPU quota.
    CgroupCpu,
    /// Rootless only: a user namespace mapping only the caller's uid and
    /// gid, owning every other namespace of the jail.
    UserNs,
    /// Every fd but the passed ones closed.
    CloseFds,
    /// Killed when the supervisor or launcher dies (PDEATHSIG + lifeline).
    DeathSignal,
    /// Not applied by the jail, and not in [`Layer::ALL`]: the nftables
    /// floor `sluice run` installs under the gateway's own egress (as
    /// root). Named here so that `--allow-missing-isolation nftables`
    /// accepts running without it.
    Nftables,
}

impl Layer {
    /// Every layer, in the order the jail applies them.
    pub const ALL: [Self; 17] = [
        Self::DeathSignal,
        Self::CgroupMemory,
        Self::CgroupPids,
        Self::CgroupCpu,
        Self::UserNs,
        Self::PidNs,
        Self::MountNs,
        Self::IpcNs,
        Self::UtsNs,
        Self::NetNs,
        Self::PivotRoot,
        Self::CloseFds,
        Self::Rlimits,
        Self::DropIds,
        Self::NoNewPrivs,
        Self::Landlock,
        Self::Seccomp,
    ];

    /// The layer's stable name.
    pub fn name(self) -> &'static str {
        match self {
            Self::MountNs => "mount-ns",
            Self::PidNs => "pid-ns",
            Self::IpcNs => "ipc-ns",
            Self::UtsNs => "uts-ns",
            Self::NetNs => "net-ns",
            Self::PivotRoot => "pivot-root",
            Self::DropIds => "drop-ids",
            Self::Rlimits => "rlimits",
            Self::NoNewPrivs => "no-new-privs",
            Self::Seccomp => "seccomp",
            Self::Landlock => "landlock",
            Self::CgroupMemory => "cgroup-memory",
            Self::CgroupPids => "cgroup-pids",
            Self::CgroupCpu => "cgroup-cpu",
            Self::UserNs => "user-ns",
            Self::CloseFds => "close-fds",
            Self::DeathSignal => "death-signal",
            Self::Nftables => "nftables",
        }
    }
}

/// Whether a layer is available on this host ([`probe_layers`]) or active
/// in a jail ([`Jailed::layers`]), and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerStatus {
    /// [`Layer::name`].
    pub name: String,
    /// Available (probe) / applied (jail).
    pub available: bool,
    /// Why, in a few words (e.g. "cgroup v1 /sys/fs/cgroup/memory", "not root").
    pub reason: String,
}

/// Which network namespace the program gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NetNamespace {
    /// A new, empty one: only a down loopback. QEMU's only way out is then
    /// the socketpair fd it is given.
    NewEmpty,
    /// The launcher's (no network isolation).
    Inherit,
}

/// The namespaces to create. The defaults create all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Namespaces {
    /// New mount namespace (required for `pivot_root`).
    pub mount: bool,
    /// New PID namespace.
    pub pid: bool,
    /// New IPC namespace.
    pub ipc: bool,
    /// New UTS namespace.
    pub uts: bool,
    /// Network namespace.
    pub net: NetNamespace,
}

impl Default for Namespaces {
    fn default() -> Self {
        Self {
            mount: true,
            pid: true,
            ipc: true,
            uts: true,
            net: NetNamespace::NewEmpty,
        }
    }
}

/// cgroup limits; `None` leaves that controller unused (no cgroup made for it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupLimits {
    /// Memory limit in bytes (v1 `memory.limit_in_bytes`, v2 `memory.max`,
    /// with swap disabled where the host allows).
    pub memory_bytes: Option<u64>,
    /// Maximum number of tasks (threads count) (`pids.max`).
    pub pids: Option<u64>,
    /// CPU quota in thousandths of a CPU (1000 = one full CPU) per 100 ms period.
    pub cpu_millis: Option<u64>,
}

/// One passed file descriptor: the launcher's `parent` fd becomes the
/// program's fd number `child`. The caller keeps ownership of `parent`
/// (the jail uses a duplicate); it must stay open until [`spawn`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FdMap {
    /// The fd in the launcher.
    pub parent: RawFd,
    /// Its number in the jailed program.
    pub child: RawFd,
}

/// Everything about one jailed program. Its `Debug` output names the
/// environment variables but never shows their values (they may be secrets).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JailSpec {
    /// Unique name of this jail (the cgroup and jail dir are named after it);
    /// `[A-Za-z0-9._-]`, 1-64 bytes.
    pub name: String,
    /// Absolute path of the program; it is bind-mounted into the jail.
    pub program: PathBuf,
    /// `argv[1..]` (`argv[0]` is the program path).
    pub args: Vec<String>,
    /// The complete environment; nothing is inherited.
    pub env: Vec<(String, String)>,
    /// Files and dirs bind-mounted read-only at their own path (program
    /// libraries, see [`library_deps`], kernel, initramfs, firmware,
    /// `/dev/null`...). Character devices keep working (not `nodev`).
    pub ro_paths: Vec<PathBuf>,
    /// Files and dirs bind-mounted read-write at their own path (e.g. the
    /// console log); they must be writable by `uid`/`gid`.
    pub rw_paths: Vec<PathBuf>,
    /// Where the jail's (empty, host-side) mount point dir is created
    /// (default [`default_runtime_dir`]; rootless, the helper creates it
    /// private to the caller if missing).
    pub runtime_dir: PathBuf,
    /// Directories the helper removes, with everything in them, after the
    /// program has ended (also when the launcher died): per-run files of the
    /// caller, e.g. a run dir holding the policy and the CA. Absolute, no
    /// `..`, never `/`.
    #[serde(default)]
    pub remove_after: Vec<PathBuf>,
    /// An egress floor's nftables table (`sluice_floor::egress`) that the
    /// helper removes after the program has ended, also when the launcher
    /// died: the launcher installs it before the program starts and hands
    /// its removal over here. Only `sluice_egress_*` names are accepted.
    #[serde(default)]
    pub egress_floor: Option<String>,
    /// The uid to drop to; must not be 0. Default ([`default_ids`]) 65534
    /// (nobody) as root: with the PID namespace and Landlock's signal
    /// scope, jails sharing a uid still cannot see or signal each other.
    /// Rootless it must be the caller's own (the only uid mapped).
    pub uid: u32,
    /// The gid to drop to: 65534 (nogroup) by default as root; rootless
    /// the caller's own.
    pub gid: u32,
    /// Supplementary groups as root (default none; rootless the caller's
    /// stay, `setgroups` being denied in the user namespace). `sluice run`
    /// gives its gateway a gid of its own and keeps 65534 here, so files
    /// shared with the jail's group stay readable.
    #[serde(default)]
    pub groups: Vec<u32>,
    /// Namespaces to create.
    pub namespaces: Namespaces,
    /// cgroup limits.
    pub cgroup: CgroupLimits,
    /// Resource limits.
    pub rlimits: Rlimits,
    /// The seccomp profile.
    pub seccomp: SeccompProfile,
    /// Landlock: `None` = off. `Some(extra)`: the jail's own paths are added
    /// (ro paths read+execute, rw paths and devices read+write), plus the
    /// given rules; TCP bind is always handled (denied unless listed), TCP
    /// connect when `extra.tcp_connect` is `Some`.
    pub landlock: Option<LandlockRules>,
    /// Fds to pass; every other fd is closed, unpassed 0/1/2 are /dev/null.
    pub fds: Vec<FdMap>,
    /// Layers the user explicitly allowed to be missing on this host.
    pub allow_missing: BTreeSet<Layer>,
    /// The helper binary; `None` = this executable (its `main` must call
    /// [`helper_main_if_requested`] first).
    pub helper: Option<PathBuf>,
}

impl std::fmt::Debug for JailSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JailSpec")
            .field("name", &self.name)
            .field("program", &self.program)
            .field("args", &self.args)
            .field("env", &env_names(&self.env))
            .field("ro_paths", &self.ro_paths)
            .field("rw_paths", &self.rw_paths)
            .field("runtime_dir", &self.runtime_dir)
            .field("remove_after", &self.remove_after)
            .field("egress_floor", &self.egress_floor)
            .field("uid", &self.uid)
            .field("gid", &self.gid)
            .field("groups", &self.groups)
            .field("namespaces", &self.namespaces)
            .field("cgroup", &self.cgroup)
            .field("rlimits", &self.rlimits)
            .field("seccomp", &self.seccomp)
            .field("landlock", &self.landlock)
            .field("fds", &self.fds)
            .field("allow_missing", &self.allow_missing)
            .field("helper", &self.helper)
            .finish()
    }
}

/// The names of `env`, for `Debug` output that must not show values.
pub(crate) fn env_names(env: &[(String, String)]) -> Vec<&str> {
    env.iter().map(|(k, _)| k.as_str()).collect()
}

impl JailSpec {
    /// A spec with every layer on: all namespaces, uid/gid
    /// [`default_ids`] (65534 as root), default rlimits, the QEMU seccomp
    /// profile, Landlock with no TCP at all, no cgroup limits, the
    /// [`default_runtime_dir`].
    pub fn new(name: impl Into<String>, program: impl Into<PathBuf>) -> Self {
        let (uid, gid) = default_ids();
        Self {
            name: name.into(),
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            ro_paths: Vec::new(),
            rw_paths: Vec::new(),
            runtime_dir: default_runtime_dir(),
            remove_after: Vec::new(),
            egress_floor: None,
            uid,
            gid,
            groups: Vec::new(),
            namespaces: Namespaces::default(),
            cgroup: CgroupLimits::default(),
            rlimits: Rlimits::default(),
            seccomp: SeccompProfile::Qemu,
            landlock: Some(LandlockRules {
                tcp_connect: Some(Vec::new()),
                ..LandlockRules::default()
            }),
            fds: Vec::new(),
            allow_missing: BTreeSet::new(),
            helper: None,
        }
    }

    /// Which layers this spec asks for.
    fn requested(&self, layer: Layer) -> bool {
        let ns = &self.namespaces;
        match layer {
            Layer::MountNs | Layer::PivotRoot => ns.mount,
            Layer::PidNs => ns.pid,
            Layer::IpcNs => ns.ipc,
            Layer::UtsNs => ns.uts,
            Layer::NetNs => ns.net == NetNamespace::NewEmpty,
            Layer::Seccomp => self.seccomp != SeccompProfile::None,
            Layer::Landlock => self.landlock.is_some(),
            Layer::CgroupMemory => self.cgroup.memory_bytes.is_some(),
            Layer::CgroupPids => self.cgroup.pids.is_some(),
            Layer::CgroupCpu => self.cgroup.cpu_millis.is_some(),
            // Only a rootless jail needs one; as root it is never made.
            Layer::UserNs => is_rootless(),
            Layer::Nftables => false,
            Layer::DropIds
            | Layer::Rlimits
            | Layer::NoNewPrivs
            | Layer::CloseFds
            | Layer::DeathSignal => true,
        }
    }

    /// Checks the spec's own consistency (not the host).
    fn validate(&self) -> Result<(), JailError> {
        let bad = |why: String| Err(JailError::InvalidSpec(why));
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 64
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
            && !self.name.starts_with('.');
        if !name_ok {
            return bad(format!(
                "name {:?} is not [A-Za-z0-9._-]{{1,64}}",
                self.name
            ));
        }
        for p in std::iter::once(&self.program)
            .chain(&self.ro_paths)
            .chain(&self.rw_paths)
        {
            if !p.is_absolute() || p.components().any(|c| c == std::path::Component::ParentDir) {
                return bad(format!(
                    "{} is not an absolute path without ..",
                    p.display()
                ));
            }
        }
        for p in &self.remove_after {
            if !p.is_absolute()
                || p.parent().is_none()
                || p.components().any(|c| c == std::path::Component::ParentDir)
            {
                return bad(format!(
                    "remove_after {} is not an absolute path below / without ..",
                    p.display()
                ));
            }
        }
        if self.uid == 0 || self.gid == 0 || self.groups.contains(&0) {
            return bad("uid, gid and groups must not be 0".to_owned());
        }
        if is_rootless() && (self.uid, self.gid) != default_ids() {
            let (uid, gid) = default_ids();
            return bad(format!(
                "a rootless jail runs as the caller's uid {uid} and gid {gid} (the only ids \
                 its user namespace maps), not {}/{}",
                self.uid, self.gid
            ));
        }
        let mut seen = BTreeSet::new();
        for m in &self.fds {
            if m.parent < 0 || m.child < 0 || !seen.insert(m.child) {
                return bad(format!("fd mapping {m:?} is negative or a duplicate"));
            }
        }
        Ok(())
    }
}

/// How a jailed program ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum JailExit {
    /// It exited with this code.
    Code(i32),
    /// It was killed by this signal (e.g. 31 = SIGSYS from seccomp, 9 = SIGKILL).
    Signal(i32),
}

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

/// The helper's reports, one JSON line each, on its stdout.
#[derive(Debug, Serialize, Deserialize)]
enum Report {
    /// The program is running.
    Started {
        pid: u32,
        layers: Vec<LayerStatus>,
        cleanup: Vec<PathBuf>,
    },
    /// Setting up the jail failed; nothing is left behind.
    Failed { error: String },
    /// The program ended and everything was removed.
    Exited { exit: JailExit },
}

/// A running jailed program. Dropping it kills the program and removes its
/// cgroups and jail dir (blocking until the helper has done so).
#[derive(Debug)]
pub struct Jailed {
    /// The program's pid (in the launcher's PID namespace).
    pub pid: u32,
    /// Every layer of [`Layer::ALL`]: applied or not, and why.
    pub layers: Vec<LayerStatus>,
    helper: Child,
    lifeline: Option<ChildStdin>,
    reports: BufReader<ChildStdout>,
    cleanup: Vec<PathBuf>,
    exit: Option<JailExit>,
}

impl Jailed {
    /// Blocks until the program has ended and the helper has cleaned up.
    ///
    /// # Errors
    /// [`JailError::Channel`] if the helper died without reporting (the
    /// launcher then removes what it can).
    pub fn wait(&mut self) -> Result<JailExit, JailError> {
        if let Some(exit) = self.exit {
            return Ok(exit);
        }
        let report = read_report(&mut self.reports);
        self.lifeline = None;
        let _ = self.helper.wait();
        remove_leftovers(&self.cleanup);
        match report {
            Ok(Report::Exited { exit }) => {
                self.exit = Some(exit);
                Ok(exit)
            }
            Ok(other) => Err(JailError::Channel(format!("unexpected report {other:?}"))),
            Err(e) => Err(e),
        }
    }

    /// Kills the program (SIGKILL, and with the PID namespace everything in
    /// it) and waits as [`Jailed::wait`] does.
    ///
    /// # Errors
    /// As [`Jailed::wait`].
    pub fn kill(&mut self) -> Result<JailExit, JailError> {
        self.lifeline = None;
        self.wait()
    }

    /// Takes the lifeline out, so that another thread can kill the jail
    /// while this one blocks in [`Jailed::wait`] (e.g. to enforce a timeout).
    /// The jail is killed when the handle is [`KillHandle::kill`]ed **or
    /// dropped**. `None` if it was taken before.
    pub fn kill_handle(&mut self) -> Option<KillHandle> {
        self.lifeline.take().map(|l| KillHandle { _lifeline: l })
    }

    /// The supervising helper's pid (root, outside the jail).
    pub fn helper_pid(&self) -> u32 {
        self.helper.id()
    }
}

/// Kills a jail from another thread; see [`Jailed::kill_handle`].
#[derive(Debug)]
pub struct KillHandle {
    /// Held only to be closed: closing the lifeline makes the helper kill.
    _lifeline: ChildStdin,
}

impl KillHandle {
    /// Kills the jail (SIGKILL to its PID 1); its [`Jailed::wait`] then
    /// returns once the helper has cleaned up.
    pub fn kill(self) {
        drop(self);
    }
}

impl Drop for Jailed {
    fn drop(&mut self) {
        if self.exit.is_none() {
            let _ = self.kill();
        }
    }
}

fn read_report(reader: &mut BufReader<ChildStdout>) -> Result<Report, JailError> {
    let mut line = String::new();
    match reader.read_line(&mut line) {
        Ok(0) => Err(JailError::Channel(
            "the helper exited without a report".to_owned(),
        )),
        Ok(_) => serde_json::from_str(&line)
            .map_err(|e| JailError::Channel(format!("bad report {line:?}: {e}"))),
        Err(e) => Err(JailError::Channel(e.to_string())),
    }
}

/// Best-effort removal of cgroup dirs and the jail dir (the helper does this;
/// this covers a helper that was killed). Only empty dirs are removed.
fn remove_leftovers(paths: &[PathBuf]) {
    for p in paths {
        if p.exists() {
            let _ = std::fs::remove_dir(p);
        }
    }
}

/// Starts `spec.program` in the jail and returns once it has been exec'd
/// (or setting up failed, leaving nothing behind).
///
/// # Errors
/// [`JailError::InvalidSpec`], [`JailError::LayerUnavailable`] for a
/// requested layer this host cannot apply and `allow_missing` does not list,
/// [`JailError::Helper`] / [`JailError::Setup`] / [`JailError::Channel`].
pub fn spawn(spec: &JailSpec) -> Result<Jailed, JailError> {
    spec.validate()?;
    let probed = probe_layers();
    let plan = plan_layers(spec, &probed)?;

    // Duplicate the passed fds above 2 so that the helper's stdio set-up
    // cannot clobber them; the duplicates are closed when this returns.
    let mut dups: Vec<OwnedFd> = Vec::new();
    let mut helper_spec = spec.clone();
    for m in &mut helper_spec.fds {
        let dup = sys::dup_owned_at_least(m.parent, 3).map_err(|e| {
            JailError::InvalidSpec(format!("passed fd {} is not open: {e}", m.parent))
        })?;
        m.parent = dup.as_raw_fd();
        dups.push(dup);
    }
    let helper_path = match &spec.helper {
        Some(p) => p.clone(),
        None => std::env::current_exe().map_err(|e| JailError::Helper {
            path: PathBuf::from("/proc/self/exe"),
            source: e,
        })?,
    };
    let mut cmd = Command::new(&helper_path);
    // The jail's name is only there for `ps`: the helper reads its spec.
    cmd.arg(HELPER_ARG)
        .arg(&spec.name)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .current_dir("/");
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    sys::keep_fds_across_exec(&mut cmd, dups.iter().map(AsRawFd::as_raw_fd).collect());
    let mut child = cmd.spawn().map_err(|e| JailError::Helper {
        path: helper_path.clone(),
        source: e,
    })?;
    drop(dups);
    let (Some(mut lifeline), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(JailError::Channel("helper pipes missing".to_owned()));
    };
    let request = HelperRequest {
        spec: helper_spec,
        layers: plan,
    };
    let mut line = serde_json::to_vec(&request)
        .map_err(|e| JailError::Channel(format!("serialising the spec: {e}")))?;
    line.push(b'\n');
    if let Err(e) = lifeline.write_all(&line).and_then(|()| lifeline.flush()) {
        drop(lifeline);
        let _ = child.wait();
        return Err(JailError::Channel(format!("sending the spec: {e}")));
    }
    let mut reports = BufReader::new(stdout);
    match read_report(&mut reports) {
        Ok(Report::Started {
            pid,
            layers,
            cleanup,
        }) => Ok(Jailed {
            pid,
            layers,
            helper: child,
            lifeline: Some(lifeline),
            reports,
            cleanup,
            exit: None,
        }),
        other => {
            drop(lifeline);
            let _ = child.wait();
            Err(match other {
                Ok(Report::Failed { error }) => JailError::Setup(error),
                Ok(r) => JailError::Channel(format!("unexpected report {r:?}")),
                Err(e) => e,
            })
        }
    }
}

/// What the launcher sends the helper.
#[derive(Debug, Serialize, Deserialize)]
struct HelperRequest {
    spec: JailSpec,
    /// The plan: one status per layer of [`Layer::ALL`] (`available` = to apply).
    layers: Vec<(Layer, LayerStatus)>,
}

/// Decides, per layer, whether to apply it; errors for a requested,
/// unavailable, not-allowed-missing layer.
fn plan_layers(
    spec: &JailSpec,
    probed: &[LayerStatus],
) -> Result<Vec<(Layer, LayerStatus)>, JailError> {
    let mut plan = Vec::new();
    for layer in Layer::ALL {
        let probe = probed.iter().find(|s| s.name == layer.name());
        let (available, probe_reason) =
            probe.map_or((false, "not probed"), |s| (s.available, s.reason.as_str()));
        let status = |on: bool, reason: String| LayerStatus {
            name: layer.name().to_owned(),
            available: on,
            reason,
        };
        let entry = if layer == Layer::UserNs && !spec.requested(layer) {
            status(false, format!("off: {probe_reason}"))
        } else if !spec.requested(layer) {
            status(false, "off: not requested by the caller".to_owned())
        } else if available {
            status(true, probe_reason.to_owned())
        } else if spec.allow_missing.contains(&layer) {
            status(
                false,
                format!("off: unavailable ({probe_reason}), allowed by the user"),
            )
        } else {
            return Err(JailError::LayerUnavailable {
                layer: layer.name(),
                reason: probe_reason.to_owned(),
            });
        };
        plan.push((layer, entry));
    }
    Ok(plan)
}

/// The layers `spec` asks for that this host cannot apply and
/// `spec.allow_missing` does not list, each with the probe's reason: what
/// [`spawn`] would refuse (it names only the first). Empty when the jail
/// can be built.
pub fn missing_layers(spec: &JailSpec) -> Vec<LayerStatus> {
    probe_layers()
        .into_iter()
        .filter(|s| !s.available)
        .filter(|s| {
            Layer::ALL
                .iter()
                .find(|l| l.name() == s.name)
                .is_some_and(|&l| spec.requested(l) && !spec.allow_missing.contains(&l))
        })
        .collect()
}

/// What this host can apply, one entry per layer of [`Layer::ALL`], for
/// `sluice doctor` and the `--json` result. Cheap: reads /proc and /sys and
/// asks the kernel its Landlock ABI; changes nothing.
pub fn probe_layers() -> Vec<LayerStatus> {
    let host = if is_rootless() {
        let (uid, gid) = default_ids();
        Builder::User {
            uid,
            gid,
            userns: userns::probe().map_err(|e| e.to_string()),
        }
    } else {
        Builder::Root
    };
    let ns_file = |ns: &str| Path::new("/proc/self/ns").join(ns).exists();
    Layer::ALL
        .iter()
        .map(|&layer| {
            let (available, reason) = match layer {
                Layer::MountNs | Layer::PivotRoot => ns_probe(&host, ns_file("mnt"), "mnt"),
                Layer::PidNs => ns_probe(&host, ns_file("pid"), "pid"),
                Layer::IpcNs => ns_probe(&host, ns_file("ipc"), "ipc"),
                Layer::UtsNs => ns_probe(&host, ns_file("uts"), "uts"),
                Layer::NetNs => ns_probe(&host, ns_file("net"), "net"),
                Layer::UserNs => match &host {
                    Builder::Root => (
                        false,
                        "not needed: running as root, the jail drops to uid 65534".to_owned(),
                    ),
                    Builder::User { uid, gid, userns } => match userns {
                        Ok(()) if ns_file("user") => (
                            true,
                            format!("maps only uid {uid} and gid {gid}, each to itself"),
                        ),
                        Ok(()) => (false, "kernel lacks user namespaces".to_owned()),
                        Err(why) => (false, why.clone()),
                    },
                },
                Layer::DropIds => match &host {
                    Builder::Root => (true, "root: can drop to an unprivileged uid".to_owned()),
                    Builder::User {
                        uid,
                        gid,
                        userns: Ok(()),
                    } => (
                        true,
                        format!(
                            "rootless: runs as uid {uid}/gid {gid} with no capabilities \
                             (supplementary groups stay: setgroups is denied in an \
                             unprivileged user namespace)"
                        ),
                    ),
                    Builder::User {
                        userns: Err(why), ..
                    } => (false, why.clone()),
                },
                Layer::Rlimits | Layer::NoNewPrivs | Layer::CloseFds | Layer::DeathSignal => {
                    (true, "always available on Linux".to_owned())
                }
                Layer::Seccomp => probe_seccomp(),
                Layer::Landlock => probe_landlock(),
                Layer::CgroupMemory => cgroup::probe(cgroup::Controller::Memory),
                Layer::CgroupPids => cgroup::probe(cgroup::Controller::Pids),
                Layer::CgroupCpu => cgroup::probe(cgroup::Controller::Cpu),
                // Not in ALL; the launcher reports it (egress_floor).
                Layer::Nftables => (false, "not a jail layer".to_owned()),
            };
            LayerStatus {
                name: layer.name().to_owned(),
                available,
                reason,
            }
        })
        .collect()
}

/// Who builds the jail, for [`probe_layers`].
enum Builder {
    /// Root: namespaces directly, then a drop to 65534.
    Root,
    /// An ordinary user: everything inside a user namespace.
    User {
        uid: u32,
        gid: u32,
        /// Whether the sysctls allow unprivileged user namespaces (the
        /// one-line reason if not).
        userns: Result<(), String>,
    },
}

fn ns_probe(host: &Builder, exists: bool, ns: &str) -> (bool, String) {
    match (host, exists) {
        (_, false) => (false, format!("kernel lacks {ns} namespaces")),
        (Builder::Root, true) => (true, format!("{ns} namespaces supported, running as root")),
        (Builder::User { userns: Ok(()), .. }, true) => (
            true,
            format!("{ns} namespace owned by the jail's user namespace (rootless)"),
        ),
        (
            Builder::User {
                userns: Err(why), ..
            },
            true,
        ) => (false, why.clone()),
    }
}

fn probe_seccomp() -> (bool, String) {
    match std::fs::read_to_string("/proc/sys/kernel/seccomp/actions_avail") {
        Ok(actions) if actions.split_whitespace().any(|a| a == "kill_process") => {
            (true, "seccomp filters with kill_process".to_owned())
        }
        Ok(_) => (false, "kernel lacks SECCOMP_RET_KILL_PROCESS".to_owned()),
        Err(e) => (false, format!("no seccomp filter support: {e}")),
    }
}

fn probe_landlock() -> (bool, String) {
    match sys::landlock_abi() {
        abi if abi >= 4 => (true, format!("ABI {abi}: filesystem and TCP rules")),
        abi if abi >= 1 => (
            true,
            format!("ABI {abi}: filesystem rules only (no TCP restriction before ABI 4)"),
        ),
        _ => (
            false,
            "Landlock not enabled in this kernel (lsm= boot parameter)".to_owned(),
        ),
    }
}

/// The shared libraries `program` loads, and its ELF interpreter, as `ldd`
/// reports them (absolute paths, symlinks as named). Empty for a static
/// binary.
///
/// # Errors
/// When `ldd` cannot be run or fails for a dynamic binary.
pub fn library_deps(program: &Path) -> Result<Vec<PathBuf>, JailError> {
    let out = Command::new("ldd")
        .arg(program)
        .env_clear()
        .output()
        .map_err(|e| JailError::Helper {
            path: PathBuf::from("ldd"),
            source: e,
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        if text.contains("not a dynamic executable")
            || String::from_utf8_lossy(&out.stderr).contains("not a dynamic executable")
        {
            return Ok(Vec::new());
        }
        return Err(JailError::InvalidSpec(format!(
            "ldd {} failed: {}",
            program.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let mut deps = Vec::new();
    for line in text.lines() {
        // "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x...)" or
        // "/lib64/ld-linux-x86-64.so.2 (0x...)"; vdso lines have no path.
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            let p = PathBuf::from(p);
            if !deps.contains(&p) {
                deps.push(p);
            }
        }
    }
    Ok(deps)
}

#[cfg(test)]
mod tests {
    #[test]
    fn debug_output_hides_environment_values() {
        let mut spec = JailSpec::new("dbg", "/bin/true");
        spec.env = vec![("SECRET_TOKEN".into(), "sk-real-value-123".into())];
        let shown = format!("{spec:?}");
        assert!(shown.contains("SECRET_TOKEN"), "{shown}");
        assert!(!shown.contains("sk-real-value-123"), "{shown}");
    }

    use super::*;

    fn all_available() -> Vec<LayerStatus> {
        Layer::ALL
            .iter()
            .map(|l| LayerStatus {
                name: l.name().to_owned(),
                available: true,
                reason: "probed".to_owned(),
            })
            .collect()
    }

    #[test]
    fn unavailable_layer_is_an_error_unless_allowed() {
        let mut spec = JailSpec::new("slj-plan", "/bin/true");
        let mut probed = all_available();
        if let Some(s) = probed.iter_mut().find(|s| s.name == "landlock") {
            s.available = false;
            s.reason = "disabled".to_owned();
        }
        let err = plan_layers(&spec, &probed).unwrap_err();
        assert!(
            matches!(
                err,
                JailError::LayerUnavailable {
                    layer: "landlock",
                    ..
                }
            ),
            "{err}"
        );

        spec.allow_missing.insert(Layer::Landlock);
        let plan = plan_layers(&spec, &probed).unwrap();
        let (_, landlock) = plan.iter().find(|(l, _)| *l == Layer::Landlock).unwrap();
        assert!(!landlock.available);
        assert!(
            landlock.reason.contains("allowed by the user"),
            "{}",
            landlock.reason
        );
        assert_eq!(plan.len(), Layer::ALL.len());
    }

    #[test]
    fn layers_the_caller_turned_off_are_reported_off_not_errors() {
        let mut spec = JailSpec::new("slj-plan", "/bin/true");
        spec.seccomp = SeccompProfile::None;
        spec.namespaces.net = NetNamespace::Inherit;
        let mut probed = all_available();
        for s in &mut probed {
            if s.name == "seccomp" || s.name == "net-ns" || s.name.starts_with("cgroup") {
                s.available = false;
            }
        }
        let plan = plan_layers(&spec, &probed).unwrap();
        for (layer, status) in plan {
            let off = matches!(
                layer,
                Layer::Seccomp
                    | Layer::NetNs
                    | Layer::CgroupMemory
                    | Layer::CgroupPids
                    | Layer::CgroupCpu
            ) || (layer == Layer::UserNs && !is_rootless());
            assert_eq!(status.available, !off, "{layer:?}: {}", status.reason);
        }
    }

    #[test]
    fn invalid_specs_are_refused() {
        let ok = JailSpec::new("slj-ok", "/bin/true");
        assert!(ok.validate().is_ok());
        for bad in [
            JailSpec {
                name: "../x".to_owned(),
                ..ok.clone()
            },
            JailSpec {
                name: String::new(),
                ..ok.clone()
            },
            JailSpec {
                program: PathBuf::from("true"),
                ..ok.clone()
            },
            JailSpec {
                ro_paths: vec![PathBuf::from("/a/../etc")],
                ..ok.clone()
            },
            JailSpec {
                uid: 0,
                ..ok.clone()
            },
            JailSpec {
                remove_after: vec![PathBuf::from("/")],
                ..ok.clone()
            },
            JailSpec {
                remove_after: vec![PathBuf::from("/tmp/../etc")],
                ..ok.clone()
            },
            JailSpec {
                fds: vec![
                    FdMap {
                        parent: 3,
                        child: 4,
                    },
                    FdMap {
                        parent: 5,
                        child: 4,
                    },
                ],
                ..ok.clone()
            },
        ] {
            assert!(
                matches!(bad.validate(), Err(JailError::InvalidSpec(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn probe_names_every_layer_once() {
        let probed = probe_layers();
        let names: BTreeSet<&str> = probed.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names.len(), Layer::ALL.len());
        assert!(probed.iter().all(|s| !s.reason.is_empty()));
    }

    #[test]
    fn library_deps_of_a_dynamic_and_a_static_binary() {
        let deps = library_deps(Path::new("/bin/sh")).unwrap();
        assert!(
            deps.iter().any(|p| p.to_string_lossy().contains("libc.so")),
            "{deps:?}"
        );
        if Path::new("/bin/busybox").exists() {
            assert!(library_deps(Path::new("/bin/busybox")).unwrap().is_empty());
        }
    }
}

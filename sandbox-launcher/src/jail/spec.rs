//! What one jail asks for ([`JailSpec`]): the program, its paths,
//! environment, ids and passed fds, the namespaces, limits and filters, and
//! the layers it may go without; and the spec's own consistency checks.

use std::collections::BTreeSet;
use std::os::fd::RawFd;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use sluice_confine::{LandlockRules, Rlimits, SeccompProfile};

use super::{JailError, Layer, default_ids, default_runtime_dir, is_rootless};

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
/// (the jail uses a duplicate); it must stay open until [`spawn`](super::spawn) returns.
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
    /// libraries, see [`library_deps`](super::library_deps), kernel, initramfs, firmware,
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
    /// [`helper_main_if_requested`](super::helper_main_if_requested) first).
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
fn env_names(env: &[(String, String)]) -> Vec<&str> {
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
    pub(super) fn requested(&self, layer: Layer) -> bool {
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
    pub(super) fn validate(&self) -> Result<(), JailError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_hides_environment_values() {
        let mut spec = JailSpec::new("dbg", "/bin/true");
        spec.env = vec![("SECRET_TOKEN".into(), "sk-real-value-123".into())];
        let shown = format!("{spec:?}");
        assert!(shown.contains("SECRET_TOKEN"), "{shown}");
        assert!(!shown.contains("sk-real-value-123"), "{shown}");
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
}

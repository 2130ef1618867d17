//! The isolation layers ([`Layer`]): their stable names, what this host can
//! apply ([`probe_layers`]), and the plan for one spec: each layer applied,
//! off by request, or missing with the user's leave; any other missing
//! layer refuses the jail.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{JailError, JailSpec, cgroup, default_ids, is_rootless, sys, userns};

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
/// in a jail ([`Jailed::layers`](super::Jailed::layers)), and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerStatus {
    /// [`Layer::name`].
    pub name: String,
    /// Available (probe) / applied (jail).
    pub available: bool,
    /// Why, in a few words (e.g. "cgroup v1 /sys/fs/cgroup/memory", "not root").
    pub reason: String,
}

/// Decides, per layer, whether to apply it; errors for a requested,
/// unavailable, not-allowed-missing layer.
pub(super) fn plan_layers(
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
/// [`spawn`](super::spawn) would refuse (it names only the first). Empty when the jail
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use sluice_confine::SeccompProfile;

    use super::*;
    use crate::jail::NetNamespace;

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
    fn probe_names_every_layer_once() {
        let probed = probe_layers();
        let names: BTreeSet<&str> = probed.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names.len(), Layer::ALL.len());
        assert!(probed.iter().all(|s| !s.reason.is_empty()));
    }
}

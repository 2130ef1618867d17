//! The one place where `sluice run` starts processes: QEMU and the gateway,
//! each in its own jail ([`crate::jail::spawn`]).
//!
//! * QEMU: new mount, PID, IPC, UTS and an **empty** network namespace,
//!   `pivot_root` into a tmpfs holding only its binary, libraries, firmware
//!   and module dirs, the kernel, the initramfs and `/dev/null`,
//!   `/dev/urandom` (and `/dev/kvm` under KVM), read-only; uid 65534
//!   (rootless: the caller's, in a user namespace), no capabilities,
//!   `no_new_privs`, rlimits, our seccomp filter (QEMU
//!   profile) plus QEMU's own `-sandbox`, Landlock (no TCP at all), cgroup
//!   memory/pids/cpu limits, only its socketpairs as fds.
//! * The gateway: the same jail but in the **host's** network namespace (it
//!   must reach the internet), Landlock without a TCP connect restriction,
//!   and a filesystem view of its binary, libraries, the policy's directory
//!   and the secret files' directories (read-only; `gateway_inputs`), the
//!   resolver configuration, its own `/proc/net` (host addresses for the
//!   platform deny set) and the run dir (the only writable path, for the
//!   CA). Once started, it restricts itself further
//!   (`sluice_confine::gateway_self_restrict`: no exec, no new processes, no
//!   writes).
//!
//! Each child runs under a supervising helper that kills it and removes its
//! cgroups, jail dir and run dir when the child exits, when the
//! [`Sidecar`] is dropped or killed, or when the launcher dies (even by
//! SIGKILL: the helper's lifeline pipe closes).

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::Duration;

use crate::jail::{
    self, CgroupLimits, FdMap, JailError, JailExit, JailSpec, KillHandle, LandlockRules, Layer,
    LayerStatus, Namespaces, NetNamespace, Rlimits, SeccompProfile,
};

/// A jailed child of the launcher. Dropping it kills the child and blocks
/// until its helper has removed everything it made.
#[derive(Debug)]
pub(crate) struct Sidecar {
    /// What it is, for messages ("QEMU", "the gateway").
    what: &'static str,
    /// The child's pid in the launcher's PID namespace.
    pid: u32,
    /// Every jail layer: applied or not, and why.
    layers: Vec<LayerStatus>,
    kill: Option<KillHandle>,
    exit_rx: Receiver<Result<JailExit, JailError>>,
    exit: Option<JailExit>,
    /// Set by the waiter thread once the helper reported the exit.
    ended: Arc<AtomicBool>,
    waiter: Option<thread::JoinHandle<()>>,
}

impl Sidecar {
    /// Starts `spec` in its jail.
    pub(crate) fn spawn(what: &'static str, spec: &JailSpec) -> Result<Self, JailError> {
        let mut jailed = jail::spawn(spec)?;
        let kill = jailed.kill_handle();
        let (tx, exit_rx) = mpsc::channel();
        let pid = jailed.pid;
        let layers = jailed.layers.clone();
        let ended = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&ended);
        let waiter = thread::spawn(move || {
            let r = jailed.wait();
            flag.store(true, Ordering::Release);
            let _ = tx.send(r);
        });
        Ok(Self {
            what,
            pid,
            layers,
            kill,
            exit_rx,
            exit: None,
            ended,
            waiter: Some(waiter),
        })
    }

    /// The child's pid.
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// The jail layers, as the helper applied them.
    pub(crate) fn layers(&self) -> &[LayerStatus] {
        &self.layers
    }

    /// Waits up to `grace` for the child to end by itself; `None` if it
    /// still runs.
    pub(crate) fn wait_timeout(&mut self, grace: Duration) -> Option<JailExit> {
        if self.exit.is_none() {
            match self.exit_rx.recv_timeout(grace) {
                Ok(r) => self.record(r),
                Err(RecvTimeoutError::Timeout) => return None,
                Err(RecvTimeoutError::Disconnected) => self.record(Err(JailError::Channel(
                    "the waiter thread ended".to_owned(),
                ))),
            }
        }
        self.exit
    }

    /// Whether the child has ended (without waiting).
    pub(crate) fn has_exited(&self) -> bool {
        self.exit.is_some() || self.ended.load(Ordering::Acquire)
    }

    fn record(&mut self, r: Result<JailExit, JailError>) {
        self.exit = Some(match r {
            Ok(exit) => exit,
            Err(e) => {
                eprintln!("sluice: {}: {e}", self.what);
                JailExit::Signal(libc::SIGKILL)
            }
        });
        if let Some(w) = self.waiter.take() {
            let _ = w.join();
        }
    }

    /// Kills the child (SIGKILL to its PID namespace) and waits until its
    /// helper has cleaned up.
    pub(crate) fn kill(&mut self) {
        if let Some(k) = self.kill.take() {
            k.kill();
        }
        if self.exit.is_none() {
            let r = self
                .exit_rx
                .recv()
                .unwrap_or_else(|_| Err(JailError::Channel("the waiter thread ended".to_owned())));
            self.record(r);
        }
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Host limits and isolation choices shared by both jails.
#[derive(Debug, Clone)]
pub(crate) struct Isolation {
    /// Layers the user allowed to be missing (`--allow-missing-isolation`).
    pub(crate) allow_missing: BTreeSet<Layer>,
    /// The helper binary: `None` = this executable (`sluice`).
    pub(crate) helper: Option<PathBuf>,
}

/// What goes into QEMU's jail.
#[derive(Debug)]
pub(crate) struct QemuJail<'a> {
    /// The jail's name (cgroups, jail dir).
    pub(crate) name: String,
    /// The QEMU binary (absolute).
    pub(crate) qemu: &'a Path,
    /// QEMU's arguments.
    pub(crate) args: Vec<String>,
    /// Files QEMU opens by path: the kernel, the initramfs.
    pub(crate) files: Vec<PathBuf>,
    /// `kvm` or `tcg`.
    pub(crate) accel: &'static str,
    /// Guest memory in MiB (the memory limit adds QEMU's own overhead).
    pub(crate) memory_mib: u32,
    /// Guest vCPUs (the CPU quota is one CPU per vCPU plus one for I/O).
    pub(crate) cpus: u32,
    /// Descriptors: (launcher fd, number in QEMU).
    pub(crate) fds: Vec<FdMap>,
    /// Shown in QEMU's environment, to find it with `ps e`.
    pub(crate) sandbox_id: String,
}

/// QEMU's own memory beyond the guest's: device state, libraries, and
/// under TCG the translation cache (bounded by `tb-size` in `qemu.rs`).
const QEMU_OVERHEAD_MIB: u64 = 256;

/// Directories QEMU reads firmware and loadable modules from (the TCG
/// accelerator is a module it `dlopen`s).
const QEMU_DATA_DIRS: [&str; 3] = [
    "/usr/share/qemu",
    "/usr/share/seabios",
    "/usr/lib/x86_64-linux-gnu/qemu",
];

/// The jail spec for QEMU.
pub(crate) fn qemu_spec(q: &QemuJail<'_>, iso: &Isolation) -> Result<JailSpec, JailError> {
    let mut spec = JailSpec::new(q.name.clone(), q.qemu);
    spec.args.clone_from(&q.args);
    spec.env = vec![("SLUICE_SANDBOX_ID".to_owned(), q.sandbox_id.clone())];
    spec.ro_paths = jail::library_deps(q.qemu)?;
    spec.ro_paths.extend(
        QEMU_DATA_DIRS
            .iter()
            .map(PathBuf::from)
            .filter(|p| p.exists()),
    );
    spec.ro_paths
        .extend(["/dev/null", "/dev/urandom"].map(PathBuf::from));
    if q.accel == "kvm" {
        // QEMU opens /dev/kvm through its group (crw-rw---- root:kvm): as
        // root, run with that gid, still uid 65534 and no supplementary
        // groups. Rootless the caller's own groups (kept) open it.
        let kvm = Path::new("/dev/kvm");
        if let Ok(meta) = std::fs::metadata(kvm)
            && meta.gid() != 0
            && !jail::is_rootless()
        {
            spec.gid = meta.gid();
        }
        spec.ro_paths.push(kvm.to_path_buf());
    }
    spec.ro_paths.extend(q.files.iter().cloned());
    let tcg_cache = if q.accel == "tcg" {
        crate::qemu::TCG_TB_MIB
    } else {
        0
    };
    spec.cgroup = CgroupLimits {
        memory_bytes: Some(
            (u64::from(q.memory_mib) + QEMU_OVERHEAD_MIB + tcg_cache).saturating_mul(1 << 20),
        ),
        // Main loop, RCU, vCPUs, and QEMU's worker pool (up to 64).
        pids: Some(96 + u64::from(q.cpus)),
        cpu_millis: Some((u64::from(q.cpus) + 1).saturating_mul(1000)),
    };
    spec.rlimits = Rlimits::default();
    spec.seccomp = SeccompProfile::Qemu;
    spec.landlock = Some(LandlockRules {
        tcp_connect: Some(Vec::new()),
        ..LandlockRules::default()
    });
    spec.fds.clone_from(&q.fds);
    spec.allow_missing.clone_from(&iso.allow_missing);
    spec.helper.clone_from(&iso.helper);
    Ok(spec)
}

/// What goes into the gateway's jail. Not `Debug`: `env` holds secret
/// values.
pub(crate) struct GatewayJail<'a> {
    /// The jail's name.
    pub(crate) name: String,
    /// The gateway binary (absolute).
    pub(crate) gateway: &'a Path,
    /// Its arguments.
    pub(crate) args: Vec<String>,
    /// Paths it reads, bound read-only at their own path: the policy's
    /// directory (or the policy file alone) and the secret files'
    /// directories (`gateway_inputs`).
    pub(crate) read: Vec<PathBuf>,
    /// Extra environment: the variables the policy's `env:` secrets name.
    pub(crate) env: Vec<(String, String)>,
    /// The run dir: writable (the CA), removed when the gateway ends.
    pub(crate) run_dir: &'a Path,
    /// TCP ports it binds on the host (`--publish`).
    pub(crate) tcp_bind: Vec<u16>,
    /// Descriptors: (launcher fd, number in the gateway).
    pub(crate) fds: Vec<FdMap>,
    /// Shown in its environment.
    pub(crate) sandbox_id: String,
}

/// Resolver configuration the gateway reads when the policy names no
/// upstream (`config::host_resolvers`).
const RESOLV_CONF: [&str; 2] = ["/etc/resolv.conf", "/run/systemd/resolve/resolv.conf"];

/// The gateway's file limit: two sockets per flow, up to 4096 flows, plus
/// listeners. Rootless it cannot exceed the caller's own hard limit (a user
/// namespace grants no `CAP_SYS_RESOURCE` over the host's limits), so it is
/// clamped to it rather than failing the jail: fewer flows at once, each
/// one past the limit refused on its own.
fn gateway_nofile(rootless: bool) -> u64 {
    const WANT: u64 = 16_384;
    if !rootless {
        return WANT;
    }
    rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .maximum
        .map_or(WANT, |hard| hard.min(WANT))
}

/// The jail spec for the gateway.
pub(crate) fn gateway_spec(g: &GatewayJail<'_>, iso: &Isolation) -> Result<JailSpec, JailError> {
    let mut spec = JailSpec::new(g.name.clone(), g.gateway);
    spec.args.clone_from(&g.args);
    spec.env = vec![
        ("SLUICE_SANDBOX_ID".to_owned(), g.sandbox_id.clone()),
        ("RUST_LOG".to_owned(), "info".to_owned()),
        // Its log goes through a pipe to the launcher: plain text.
        ("NO_COLOR".to_owned(), "1".to_owned()),
    ];
    spec.env.extend(g.env.iter().cloned());
    spec.namespaces = Namespaces {
        net: NetNamespace::Inherit,
        ..Namespaces::default()
    };
    spec.ro_paths = jail::library_deps(g.gateway)?;
    spec.ro_paths
        .extend(["/dev/null", "/dev/urandom"].map(PathBuf::from));
    spec.ro_paths
        .extend(RESOLV_CONF.iter().map(PathBuf::from).filter(|p| p.exists()));
    // The host's addresses (platform deny set) come from /proc/net/*; the
    // bind resolves /proc/net -> /proc/self/net in the jail's child, which
    // becomes the gateway (same process after exec).
    spec.ro_paths.push(PathBuf::from("/proc/net"));
    // Its resident memory and open descriptors, for `--metrics`: bound the
    // same way (the child's own `/proc/self/...`, the gateway after exec).
    spec.ro_paths
        .extend(["/proc/self/status", "/proc/self/fd"].map(PathBuf::from));
    spec.ro_paths.extend(g.read.iter().cloned());
    spec.rw_paths = vec![g.run_dir.to_path_buf()];
    spec.remove_after = vec![g.run_dir.to_path_buf()];
    spec.cgroup = CgroupLimits {
        // Bounded flow table (4096 flows) with smoltcp buffers: ~300 MB
        // measured at 1000 flows; 1 GiB leaves room.
        memory_bytes: Some(1 << 30),
        pids: Some(32),
        cpu_millis: Some(1000),
    };
    spec.rlimits = Rlimits {
        nofile: Some(gateway_nofile(jail::is_rootless())),
        ..Rlimits::default()
    };
    // The jail's filter must let it exec the gateway; the gateway installs
    // the stricter Gateway profile itself.
    spec.seccomp = SeccompProfile::Qemu;
    spec.landlock = Some(LandlockRules {
        tcp_bind: g.tcp_bind.clone(),
        tcp_connect: None,
        ..LandlockRules::default()
    });
    spec.fds.clone_from(&g.fds);
    spec.allow_missing.clone_from(&iso.allow_missing);
    spec.helper.clone_from(&iso.helper);
    Ok(spec)
}

#[cfg(test)]
mod nofile_tests {
    use super::gateway_nofile;

    #[test]
    fn the_gateway_file_limit_never_exceeds_a_rootless_callers_hard_limit() {
        assert_eq!(gateway_nofile(false), 16_384);
        let hard = rustix::process::getrlimit(rustix::process::Resource::Nofile).maximum;
        let got = gateway_nofile(true);
        assert!(got <= 16_384);
        if let Some(h) = hard {
            assert!(got <= h, "{got} > hard limit {h}");
            assert_eq!(got, h.min(16_384));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iso() -> Isolation {
        Isolation {
            allow_missing: BTreeSet::new(),
            helper: None,
        }
    }

    #[test]
    fn qemu_jail_has_an_empty_netns_and_limits_sized_from_the_vm() {
        let q = QemuJail {
            name: "la-q".to_owned(),
            qemu: Path::new("/bin/sh"),
            args: vec!["-M".to_owned(), "microvm".to_owned()],
            files: vec![PathBuf::from("/etc/hostname")],
            accel: "tcg",
            memory_mib: 256,
            cpus: 2,
            fds: vec![FdMap {
                parent: 7,
                child: 3,
            }],
            sandbox_id: "sluice-1".to_owned(),
        };
        let spec = qemu_spec(&q, &iso()).unwrap();
        assert_eq!(spec.namespaces.net, NetNamespace::NewEmpty);
        assert!(spec.ro_paths.contains(&PathBuf::from("/etc/hostname")));
        assert!(spec.ro_paths.contains(&PathBuf::from("/dev/urandom")));
        assert!(!spec.ro_paths.contains(&PathBuf::from("/dev/kvm")));
        assert!(spec.rw_paths.is_empty());
        let mib = spec.cgroup.memory_bytes.unwrap() >> 20;
        assert_eq!(mib, 256 + QEMU_OVERHEAD_MIB + crate::qemu::TCG_TB_MIB);
        assert_eq!(spec.cgroup.cpu_millis, Some(3000));
        // 65534 as root; rootless the caller's own ids.
        assert_eq!((spec.uid, spec.gid), jail::default_ids());
        assert_eq!(spec.seccomp, SeccompProfile::Qemu);
        assert_eq!(
            spec.landlock.as_ref().unwrap().tcp_connect,
            Some(Vec::new())
        );
    }

    #[test]
    fn qemu_jail_under_kvm_gets_the_device_and_its_group() {
        use std::os::unix::fs::MetadataExt;
        let q = QemuJail {
            name: "vc-q".to_owned(),
            qemu: Path::new("/bin/sh"),
            args: Vec::new(),
            files: Vec::new(),
            accel: "kvm",
            memory_mib: 256,
            cpus: 1,
            fds: Vec::new(),
            sandbox_id: "sluice-1".to_owned(),
        };
        let spec = qemu_spec(&q, &iso()).unwrap();
        assert!(spec.ro_paths.contains(&PathBuf::from("/dev/kvm")));
        // No TCG translation cache in the memory limit.
        assert_eq!(
            spec.cgroup.memory_bytes.unwrap() >> 20,
            256 + QEMU_OVERHEAD_MIB
        );
        let (uid, gid) = jail::default_ids();
        assert_eq!(spec.uid, uid);
        match std::fs::metadata("/dev/kvm") {
            // Rootless the caller's own groups open the device.
            Ok(m) if m.gid() != 0 && !jail::is_rootless() => assert_eq!(spec.gid, m.gid()),
            _ => assert_eq!(spec.gid, gid),
        }
    }

    #[test]
    fn gateway_jail_keeps_the_host_network_and_only_the_run_dir_writable() {
        let g = GatewayJail {
            name: "la-g".to_owned(),
            gateway: Path::new("/bin/sh"),
            args: Vec::new(),
            read: vec![PathBuf::from("/etc/hostname")],
            env: vec![("VC_TOKEN".to_owned(), "value".to_owned())],
            run_dir: Path::new("/tmp/la-run"),
            tcp_bind: vec![8080],
            fds: Vec::new(),
            sandbox_id: "sluice-1".to_owned(),
        };
        let spec = gateway_spec(&g, &iso()).unwrap();
        assert_eq!(spec.namespaces.net, NetNamespace::Inherit);
        assert!(spec.namespaces.mount && spec.namespaces.pid);
        assert_eq!(spec.rw_paths, vec![PathBuf::from("/tmp/la-run")]);
        assert_eq!(spec.remove_after, vec![PathBuf::from("/tmp/la-run")]);
        let ll = spec.landlock.as_ref().unwrap();
        assert_eq!(ll.tcp_connect, None);
        assert_eq!(ll.tcp_bind, vec![8080]);
        assert!(spec.ro_paths.contains(&PathBuf::from("/proc/net")));
        assert!(spec.ro_paths.contains(&PathBuf::from("/proc/self/status")));
        assert!(spec.ro_paths.contains(&PathBuf::from("/etc/hostname")));
        assert!(
            spec.env
                .contains(&("VC_TOKEN".to_owned(), "value".to_owned()))
        );
    }
}

//! A jailed process as `vm.rs` sees it from /proc: its status fields, its
//! mounts, and the checks that every layer of QEMU's and the gateway's
//! jails is in force.

use std::fs;
use std::path::Path;

use crate::Mode;
use crate::common::{fd_targets, status_field};

/// A process's real gid.
pub(crate) fn gateway_gid(pid: u32) -> u32 {
    status_field(pid, "Gid")
        .split_whitespace()
        .next()
        .and_then(|g| g.parse().ok())
        .unwrap()
}

/// (mount point, per-mount options) of every mount `pid` sees.
pub(crate) fn mounts(pid: u32) -> Vec<(String, String)> {
    fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[4].to_owned(), f[5].to_owned())
        })
        .collect()
}

/// Every layer of a jail, from /proc: seccomp, no_new_privs, no
/// capabilities, running as `uid` (65534 as root, the user's rootless),
/// the namespaces (rootless also its own user namespace mapping only
/// `uid`), read-only mounts.
pub(crate) fn assert_confined(pid: u32, what: &str, mode: Mode, expected_uid: u32) {
    assert_eq!(status_field(pid, "Seccomp"), "2", "{what}: seccomp filter");
    assert_eq!(status_field(pid, "NoNewPrivs"), "1", "{what}");
    assert_eq!(status_field(pid, "CapEff"), "0000000000000000", "{what}");
    assert_eq!(status_field(pid, "CapPrm"), "0000000000000000", "{what}");
    assert_eq!(status_field(pid, "CapBnd"), "0000000000000000", "{what}");
    let uid = status_field(pid, "Uid");
    assert!(
        uid.split_whitespace()
            .all(|u| u == expected_uid.to_string()),
        "{what}: uid {uid}"
    );
    let ns = |p: &str| fs::read_link(p).unwrap();
    let user_ns_shared = ns(&format!("/proc/{pid}/ns/user")) == ns("/proc/self/ns/user");
    assert_eq!(user_ns_shared, mode == Mode::Root, "{what}: user namespace");
    if mode == Mode::Rootless {
        let map = fs::read_to_string(format!("/proc/{pid}/uid_map")).unwrap();
        let map: Vec<&str> = map.split_whitespace().collect();
        let u = expected_uid.to_string();
        assert_eq!(map, [u.as_str(), u.as_str(), "1"], "{what}: uid_map");
    }
    for n in ["mnt", "pid", "ipc", "uts"] {
        assert_ne!(
            ns(&format!("/proc/{pid}/ns/{n}")),
            ns(&format!("/proc/self/ns/{n}")),
            "{what}: {n} namespace is the host's"
        );
    }
    // Read-only everything but the paths the jail lists as writable.
    let m = mounts(pid);
    assert!(m.len() < 64, "{what}: {} mounts: {m:?}", m.len());
    for (point, opts) in &m {
        assert!(
            !["/home", "/root", "/work", "/etc/shadow", "/var"].contains(&point.as_str()),
            "{what}: host path {point} is mounted"
        );
        let writable_ok = point.ends_with(".run");
        assert!(
            writable_ok || opts.split(',').any(|o| o == "ro"),
            "{what}: {point} is mounted {opts}"
        );
    }
}

/// QEMU's cgroups (named after `launcher`) hold it, with limits: v1's
/// per-controller hierarchies where the host mounts them, else v2's one dir.
pub(crate) fn assert_qemu_cgroups(qemu: u32, launcher: u32) {
    let cgroups = fs::read_to_string(format!("/proc/{qemu}/cgroup")).unwrap();
    let name = format!("sluice-{launcher}-qemu");
    let v1 = Path::new("/sys/fs/cgroup/memory/cgroup.clone_children").exists();
    let (memory, pids) = if v1 {
        for c in ["memory", "pids", "cpu"] {
            assert!(
                cgroups
                    .lines()
                    .any(|l| l.contains(c) && l.ends_with(&format!("/{name}"))),
                "QEMU not in a {c} cgroup {name}: {cgroups}"
            );
        }
        let root = Path::new("/sys/fs/cgroup");
        (
            root.join("memory")
                .join(&name)
                .join("memory.limit_in_bytes"),
            root.join("pids").join(&name).join("pids.max"),
        )
    } else {
        let path = cgroups
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .unwrap_or_else(|| panic!("QEMU in no v2 cgroup: {cgroups}"));
        assert!(
            path.ends_with(&format!("/{name}")),
            "QEMU in {path}, not {name}"
        );
        let dir = Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
        (dir.join("memory.max"), dir.join("pids.max"))
    };
    let limit: u64 = fs::read_to_string(memory).unwrap().trim().parse().unwrap();
    assert!(limit > 256 << 20 && limit < 2 << 30, "memory limit {limit}");
    let pids_max = fs::read_to_string(pids).unwrap();
    assert_ne!(pids_max.trim(), "max");
}

/// QEMU sees only its data dirs and the image and holds only its
/// socketpairs; the gateway holds its pipes and socketpair.
pub(crate) fn assert_qemu_view(qemu: u32, gw: u32) {
    // QEMU's mounts: its data dirs and the image, nothing of the host's /etc.
    let points: Vec<String> = mounts(qemu).into_iter().map(|(p, _)| p).collect();
    assert!(points.iter().any(|p| p == "/usr/share/qemu"), "{points:?}");
    assert!(
        points.iter().any(|p| p.ends_with("/initramfs.cpio")),
        "{points:?}"
    );
    assert!(!points.iter().any(|p| p.starts_with("/etc")), "{points:?}");

    // fds: 0/1 /dev/null, 2 a pipe to the launcher, 3-5 the socketpairs;
    // no other socket, no file outside the jail's read-only set.
    let fds = fd_targets(qemu);
    assert_eq!(fds[&0], "/dev/null", "{fds:?}");
    assert_eq!(fds[&1], "/dev/null", "{fds:?}");
    assert!(fds[&2].starts_with("pipe:"), "{fds:?}");
    for n in 3..=5 {
        assert!(fds[&n].starts_with("socket:"), "{fds:?}");
    }
    let sockets = fds.values().filter(|t| t.starts_with("socket:")).count();
    assert_eq!(sockets, 3, "QEMU holds only its three socketpairs: {fds:?}");
    for t in fds.values().filter(|t| t.starts_with('/')) {
        assert!(
            t.starts_with("/dev/") || t.contains("/images/") || t.starts_with("/usr/"),
            "unexpected file {t} open in QEMU: {fds:?}"
        );
    }
    // The gateway: stdout (audit) and stderr are pipes, 3 its socketpair.
    let gfds = fd_targets(gw);
    assert!(gfds[&1].starts_with("pipe:"), "{gfds:?}");
    assert!(gfds[&3].starts_with("socket:"), "{gfds:?}");
}

//! QEMU itself under the jail: it stays up with every layer on, and
//! opens `/dev/kvm` through the jail's device rules.

use super::*;

/// QEMU itself under the jail: it starts (paused, `-S`) and stays up with
/// every layer on.
#[test]
#[ignore = "needs root: run via scripts/test"]
fn qemu_runs_jailed() {
    let qemu = "/usr/bin/qemu-system-x86_64";
    if !Path::new(qemu).exists()
        && sluice_test_skip::may_skip(
            "qemu",
            &format!("{qemu} not installed (scripts/install-deps)"),
        )
    {
        return;
    }
    let mut spec = make_spec(
        "qemu",
        qemu,
        &[
            "-M",
            "microvm",
            "-accel",
            "tcg",
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-S",
        ],
    );
    spec.ro_paths.push(PathBuf::from("/usr/share/qemu"));
    // QEMU dlopens its accelerator ("tcg-accel-ops") from its module dir;
    // without it QEMU dies at start-up whenever it needs the module.
    let modules = Path::new("/usr/lib/x86_64-linux-gnu/qemu");
    if modules.exists() {
        spec.ro_paths.push(modules.to_path_buf());
    }
    spec.ro_paths.push(PathBuf::from("/dev/urandom"));
    spec.cgroup.memory_bytes = Some(1 << 30);
    let (ours, theirs) = UnixStream::pair().unwrap();
    spec.fds = vec![FdMap {
        parent: theirs.as_raw_fd(),
        child: 2,
    }];
    let mut jailed = jail::spawn(&spec).unwrap();
    drop(theirs);
    let pid = jailed.pid;
    // QEMU has initialised when its threads (RCU, vCPU) exist.
    eventually("QEMU to start its threads", || {
        assert!(
            Path::new(&format!("/proc/{pid}")).exists(),
            "QEMU exited: {:?}",
            stderr_of(&ours)
        );
        let threads: u32 = status_field(pid, "Threads").parse().unwrap();
        assert!(
            !status_field(pid, "State").starts_with('Z'),
            "QEMU died: {:?}",
            stderr_of(&ours)
        );
        threads >= 2
    });
    assert_eq!(status_field(pid, "Seccomp"), "2");
    assert_eq!(status_field(pid, "NoNewPrivs"), "1");
    assert_eq!(status_field(pid, "CapEff"), "0000000000000000");
    assert_eq!(
        status_field(pid, "Uid").split_whitespace().next(),
        Some(expected_ids().0.as_str())
    );
    assert_eq!(jailed.kill().unwrap(), JailExit::Signal(SIGKILL));
    assert_no_leftovers(&spec.name, pid);
}

fn stderr_of(s: &UnixStream) -> String {
    s.set_nonblocking(true).unwrap();
    let mut buf = String::new();
    let _ = std::io::Read::read_to_string(&mut &*s, &mut buf);
    buf
}

/// QEMU's arguments for a KVM VM that never runs a vCPU (`-S`) with a QMP
/// monitor on `qmp` (a chardev spec). `-cpu qemu64`: PVM hosts (these test
/// machines) refuse `-cpu host`'s MSRs; what is under test is the jail's
/// `/dev/kvm` path, not the CPU model.
fn kvm_probe_args(qmp: &str) -> Vec<String> {
    [
        "-M",
        "microvm",
        "-accel",
        "kvm",
        "-cpu",
        "qemu64",
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-sandbox",
        "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
        "-S",
    ]
    .iter()
    .map(|a| (*a).to_owned())
    .chain(qmp.split(' ').map(str::to_owned))
    .collect()
}

/// Speaks QMP on a connected monitor: capabilities, then `query-kvm`.
/// Returns its `return` object (or the error reply, or `"closed"` when QEMU
/// went away, e.g. because it could not open `/dev/kvm`), then asks QEMU to
/// quit.
fn qmp_query_kvm(read: impl std::io::Read, mut write: impl std::io::Write) -> serde_json::Value {
    let closed = serde_json::Value::from("closed");
    let mut lines = BufReader::new(read).lines();
    let mut next_reply = || loop {
        let Some(Ok(line)) = lines.next() else {
            return None;
        };
        let v: serde_json::Value = serde_json::from_str(&line).expect("QMP JSON");
        // Events interleave with replies.
        if v.get("event").is_none() {
            return Some(v);
        }
    };
    let Some(greeting) = next_reply() else {
        return closed;
    };
    assert!(greeting.get("QMP").is_some(), "{greeting}");
    let _ = writeln!(write, r#"{{"execute":"qmp_capabilities"}}"#);
    if next_reply().is_none() {
        return closed;
    }
    let _ = writeln!(write, r#"{{"execute":"query-kvm"}}"#);
    let Some(reply) = next_reply() else {
        return closed;
    };
    let _ = writeln!(write, r#"{{"execute":"quit"}}"#);
    reply.get("return").cloned().unwrap_or(reply)
}

/// The KVM path of the jail: QEMU with every layer (uid 65534, the
/// device's group as gid, no supplementary groups, seccomp, Landlock,
/// `/dev/kvm` bound into the jail) opens `/dev/kvm` and creates its VM:
/// QMP `query-kvm` answers `enabled: true`. Skipped where `/dev/kvm` is
/// missing or an unjailed QEMU cannot use it either (the control).
#[test]
#[ignore = "needs root: run via scripts/test"]
fn qemu_in_the_jail_opens_dev_kvm() {
    use std::os::unix::fs::MetadataExt;
    let qemu = "/usr/bin/qemu-system-x86_64";
    let kvm = Path::new("/dev/kvm");
    if !Path::new(qemu).exists()
        && sluice_test_skip::may_skip(
            "qemu",
            &format!("{qemu} not installed (scripts/install-deps)"),
        )
    {
        return;
    }
    if !kvm.exists() && sluice_test_skip::may_skip("kvm", "/dev/kvm is missing") {
        return;
    }
    // Control: the same QEMU unjailed, monitor on stdio.
    let mut control = Command::new(qemu)
        .args(kvm_probe_args("-qmp stdio"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let reply = qmp_query_kvm(
        control.stdout.take().unwrap(),
        control.stdin.take().unwrap(),
    );
    let _ = control.wait();
    if reply["enabled"] != true
        && sluice_test_skip::may_skip(
            "kvm",
            &format!("QEMU cannot use /dev/kvm here even unjailed: {reply}"),
        )
    {
        return;
    }

    let mut spec = make_spec(
        "kvm",
        qemu,
        &kvm_probe_args("-chardev socket,id=qmp,fd=3,server=off -mon chardev=qmp,mode=control")
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    spec.ro_paths.push(PathBuf::from("/usr/share/qemu"));
    let modules = Path::new("/usr/lib/x86_64-linux-gnu/qemu");
    if modules.exists() {
        spec.ro_paths.push(modules.to_path_buf());
    }
    spec.ro_paths.push(PathBuf::from("/dev/urandom"));
    spec.ro_paths.push(kvm.to_path_buf());
    // As `qemu_spec` does: the device's group, nothing else.
    let kvm_gid = fs::metadata(kvm).unwrap().gid();
    if kvm_gid != 0 {
        spec.gid = kvm_gid;
    }
    let kvm_gid = spec.gid;
    spec.cgroup.memory_bytes = Some(1 << 30);
    let (ours, theirs) = UnixStream::pair().unwrap();
    let (err_ours, err_theirs) = UnixStream::pair().unwrap();
    spec.fds = vec![
        FdMap {
            parent: err_theirs.as_raw_fd(),
            child: 2,
        },
        FdMap {
            parent: theirs.as_raw_fd(),
            child: 3,
        },
    ];
    let mut jailed = jail::spawn(&spec).unwrap();
    drop((theirs, err_theirs));
    let pid = jailed.pid;
    for layer in ["seccomp", "landlock", "drop-ids", "mount-ns", "pivot-root"] {
        assert!(
            jailed.layers.iter().any(|l| l.name == layer && l.available),
            "{layer} not applied: {:?}",
            jailed.layers
        );
    }
    let gid = status_field(pid, "Gid");
    assert!(
        gid.split_whitespace().all(|g| g == kvm_gid.to_string()),
        "gid {gid}"
    );
    assert_eq!(status_field(pid, "Groups"), "");
    assert_eq!(status_field(pid, "Seccomp"), "2");
    let reply = qmp_query_kvm(&ours, &ours);
    assert_eq!(
        reply["enabled"],
        true,
        "KVM in the jail: {reply}; QEMU said {:?}",
        stderr_of(&err_ours)
    );
    // Whatever QEMU does after `quit`, the jail ends and is cleaned up.
    let exit = jailed.wait().unwrap();
    assert_eq!(
        exit,
        JailExit::Code(0),
        "QEMU said {:?}",
        stderr_of(&err_ours)
    );
    assert_no_leftovers(&spec.name, pid);
}

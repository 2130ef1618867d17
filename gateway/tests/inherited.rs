//! Inherited descriptors (`--fd N`, `gateway/src/inherited.rs`): validated
//! and owned before the gateway opens anything, so a number the parent did
//! not pass is refused rather than taken for a file the gateway itself
//! opened under it, and a socket of the wrong kind is refused in one line.
//! The descriptor is placed by `python3` (`os.dup2`, then exec), so the
//! test needs no unsafe code.
#![allow(clippy::expect_used, reason = "test helpers: a panic is a failed test")]

use std::process::Command;

const GATEWAY: &str = env!("CARGO_BIN_EXE_sluice-gateway");

/// Runs the gateway with `args`; with `kind` (`"stream"` or `"dgram"`),
/// fd 3 is one end of a unix socketpair of that kind. Returns the exit
/// code and stderr's lines that start with `Error`.
fn run(kind: Option<&str>, args: &[&str]) -> (Option<i32>, Vec<String>) {
    let place = match kind {
        Some(k) => format!(
            "a,b=socket.socketpair(socket.AF_UNIX,socket.SOCK_{});os.dup2(b.fileno(),3);",
            k.to_uppercase()
        ),
        None => String::new(),
    };
    let code = format!("import os,socket,sys\n{place}os.execv(sys.argv[1],sys.argv[1:])");
    let out = Command::new("python3")
        .args(["-c", &code, GATEWAY])
        .args(args)
        .output()
        .expect("running python3");
    let errors = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.starts_with("Error"))
        .map(str::to_owned)
        .collect();
    (out.status.code(), errors)
}

#[test]
fn an_fd_that_was_not_passed_is_refused_before_anything_is_opened() {
    let audit = std::env::temp_dir().join(format!("sluice-inherited-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&audit);
    let audit_arg = audit.to_str().expect("utf-8 path");
    // fd 3 is closed: the audit log, opened later, would get number 3.
    let (code, errors) = run(
        None,
        &[
            "--fd",
            "3",
            "--audit",
            audit_arg,
            "--dns-upstream",
            "192.0.2.1",
        ],
    );
    assert_eq!(code, Some(1), "{errors:?}");
    assert!(
        errors.len() == 1 && errors[0].contains("--fd 3: not an open file descriptor"),
        "{errors:?}"
    );
    // Refused before the audit log was opened: it does not exist.
    assert!(
        !audit.exists(),
        "the audit log was opened before --fd was taken"
    );
}

#[test]
fn a_socket_of_the_wrong_kind_is_refused_in_one_line() {
    let (code, errors) = run(
        Some("stream"),
        &["--fd", "3", "--dgram", "--dns-upstream", "192.0.2.1"],
    );
    assert_eq!(code, Some(1), "{errors:?}");
    assert!(
        errors.len() == 1 && errors[0].contains("want a unix datagram socket"),
        "{errors:?}"
    );
    let (code, errors) = run(Some("dgram"), &["--fd", "3", "--dns-upstream", "192.0.2.1"]);
    assert_eq!(code, Some(1), "{errors:?}");
    assert!(
        errors.len() == 1 && errors[0].contains("want a unix stream socket"),
        "{errors:?}"
    );
    let (code, errors) = run(
        Some("stream"),
        &["--fd", "3", "--packet", "--dns-upstream", "192.0.2.1"],
    );
    assert_eq!(code, Some(1), "{errors:?}");
    assert!(
        errors.len() == 1 && errors[0].contains("want a packet socket"),
        "{errors:?}"
    );
}

#[test]
fn a_descriptor_no_flag_names_is_closed_at_start() {
    // fd 3: the guest's datagram socket (--fd 3 --dgram); fd 4: the
    // readiness pipe (--ready-fd 4); fd 7: a pipe the parent leaked (no
    // FD_CLOEXEC, no flag). Once the gateway is ready, no descriptor of
    // its may be that pipe, and one must still be the guest's socket (so
    // the probe can tell).
    let code = r#"
import os, socket, sys
gw = sys.argv[1]
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
r, w = os.pipe()
lr, lw = os.pipe()
pid = os.fork()
if pid == 0:
    # Out of the way first, then placed: 3 the guest, 4 ready, 7 leaked.
    src = [os.dup(fd) + 0 for fd in (b.fileno(), w, lw)]
    high = [os.dup2(fd, 40 + i) for i, fd in enumerate(src)]
    for i, target in enumerate((3, 4, 7)):
        os.dup2(40 + i, target)
    null = os.open("/dev/null", os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.execv(gw, [gw, "--fd", "3", "--dgram", "--ready-fd", "4",
                  "--dns-upstream", "192.0.2.1", "--allow-missing-landlock"])
try:
    leaked = f"pipe:[{os.fstat(lw).st_ino}]"
    guest = f"socket:[{os.fstat(b.fileno()).st_ino}]"
    os.close(w)
    os.close(lw)
    ready = os.read(r, 16)
    fds = f"/proc/{pid}/fd"
    held = [os.readlink(f"{fds}/{n}") for n in os.listdir(fds)]
    print(ready.decode().strip(), leaked in held, guest in held, flush=True)
finally:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
"#;
    let out = Command::new("python3")
        .args(["-c", code, GATEWAY])
        .output()
        .expect("running python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.trim(),
        "ready False True",
        "(ready, the leaked pipe held, the guest socket held): {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

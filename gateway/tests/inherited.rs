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

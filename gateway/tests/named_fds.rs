//! A path argument naming an inherited descriptor (`--policy /dev/fd/N`,
//! as a shell's `--policy <(…)` gives): the descriptor is kept when the
//! gateway closes what no flag named (`gateway/src/inherited.rs`), so the
//! path still opens. The descriptor is placed by `python3` (`os.dup2`,
//! then exec), so the test needs no unsafe code.
#![allow(clippy::expect_used, reason = "test helpers: a panic is a failed test")]

use std::process::Command;

const GATEWAY: &str = env!("CARGO_BIN_EXE_sluice-gateway");

/// Runs the gateway with `args`, fd 3 one end of a unix datagram
/// socketpair and fd 5 a pipe holding `policy`; returns the exit code and
/// stderr.
fn run(policy: &str, args: &[&str]) -> (Option<i32>, String) {
    let code = format!(
        "import os,socket,sys\na,b=socket.socketpair(socket.AF_UNIX,socket.SOCK_DGRAM);os.dup2(b.fileno(),3)\nr,w=os.pipe();os.write(w,{policy:?}.encode());os.close(w);os.dup2(r,5);os.set_inheritable(5,True)\nos.execv(sys.argv[1],sys.argv[1:])"
    );
    let out = Command::new("python3")
        .args(["-c", &code, GATEWAY])
        .args(args)
        .output()
        .expect("running python3");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A policy on fd 5 that the gateway refuses for what it says (an unknown
/// version): it was read, so fd 5 was still open when it was opened
/// (before the fix: `No such file or directory`).
#[test]
fn a_policy_given_as_dev_fd_n_is_read() {
    let (code, stderr) = run(
        "version: 99\nid: x\n",
        &[
            "--fd",
            "3",
            "--dgram",
            "--policy",
            "/dev/fd/5",
            "--dns-upstream",
            "192.0.2.1",
        ],
    );
    assert_eq!(code, Some(1), "{stderr}");
    // Refused for what it says, not as a path that names nothing.
    assert!(
        stderr.contains("/dev/fd/5:1:10: unsupported policy version 99")
            && !stderr.contains("No such file"),
        "{stderr}"
    );
}

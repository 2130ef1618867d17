//! `--ready-fd`: the gateway writes `ready` on the inherited pipe once it
//! serves, and closes it unwritten when it stops before that. The pipe is the
//! child's fd 3, placed by `sh` (`3>&1`) so the test needs no unsafe code.
#![allow(clippy::expect_used, reason = "test helpers: a panic is a failed test")]

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};

const GATEWAY: &str = env!("CARGO_BIN_EXE_sluice-gateway");

/// A fresh directory for one test, removed when dropped.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!("sluice-ready-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("creating the test directory");
        Self(path)
    }

    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Starts the gateway with `args` plus `--ready-fd 3`, fd 3 being the pipe
/// this test reads as the child's stdout.
fn start(args: &[&str]) -> Child {
    Command::new("sh")
        .arg("-c")
        .arg(r#"exec "$0" "$@" --ready-fd 3 3>&1 1>/dev/null"#)
        .arg(GATEWAY)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning sh")
}

#[test]
fn ready_is_written_once_the_socket_is_bound_then_the_pipe_closes() {
    let dir = TempDir::new("ok");
    let socket = dir.path().join("guest.sock");
    let audit = dir.path().join("audit.jsonl");
    let mut child = start(&[
        "--socket",
        socket.to_str().expect("utf-8 path"),
        "--audit",
        audit.to_str().expect("utf-8 path"),
        "--dns-upstream",
        "192.0.2.1",
        "--allow-missing-landlock",
    ]);
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("reading the ready pipe");
    let bound = socket.exists();
    let mut rest = Vec::new();
    out.read_to_end(&mut rest)
        .expect("reading to the pipe's end");
    let still_running = child.try_wait().expect("try_wait").is_none();
    let _ = child.kill();
    let status = child.wait().expect("wait");
    let mut err = String::new();
    let _ = child.stderr.take().map(|mut e| e.read_to_string(&mut err));
    assert_eq!(line, "ready\n", "gateway stderr:\n{err}");
    assert!(bound, "ready came before the guest socket existed");
    assert!(rest.is_empty(), "more than the ready line: {rest:?}");
    assert!(
        still_running,
        "the pipe closed because the gateway exited ({status}):\n{err}"
    );
}

#[test]
fn a_gateway_that_fails_to_start_closes_the_pipe_unwritten() {
    let dir = TempDir::new("bad");
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, "version: 1\nallow: [[[\n").expect("writing the policy");
    let socket = dir.path().join("guest.sock");
    let mut child = start(&[
        "--socket",
        socket.to_str().expect("utf-8 path"),
        "--policy",
        policy.to_str().expect("utf-8 path"),
        "--dns-upstream",
        "192.0.2.1",
    ]);
    let mut out = Vec::new();
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_end(&mut out)
        .expect("reading the pipe");
    let status = child.wait().expect("wait");
    assert!(out.is_empty(), "a failed start wrote {out:?}");
    assert!(!status.success(), "an invalid policy must stop the gateway");
}

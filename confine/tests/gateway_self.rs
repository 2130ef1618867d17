//! `gateway_self_restrict` on a real process (no root needed): the audit
//! log stays writable, nothing else can be written or read, exec kills.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::process::ExitStatusExt;
use std::process::Command;

const DEMO: &str = env!("CARGO_BIN_EXE_sluice-confine-demo");

#[test]
fn audit_log_only_and_exec_dies_with_sigsys() {
    let dir = std::env::temp_dir().join(format!("slj-confine-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let audit = dir.join("audit.jsonl");
    std::fs::write(&audit, b"").unwrap();
    let other = dir.join("other");
    let out = Command::new(DEMO)
        .arg(&audit)
        .arg(&other)
        .arg("exec")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    if stdout.contains("landlock is not enforced by this kernel")
        && sluice_test_skip::may_skip(
            "landlock",
            &format!("Landlock is not enabled on this kernel: {stdout}"),
        )
    {
        return;
    }
    assert!(stdout.contains("restricted: "), "{stdout}");
    assert!(stdout.contains("audit write: ok"), "{stdout}");
    assert!(stdout.contains("other write: denied"), "{stdout}");
    assert!(stdout.contains("other read: denied"), "{stdout}");
    assert!(!stdout.contains("exec: "), "exec returned: {stdout}");
    assert_eq!(out.status.signal(), Some(libc::SIGSYS), "{stdout}");
    assert!(!other.exists());
    assert_eq!(std::fs::read_to_string(&audit).unwrap(), "{\"ok\":true}\n");
    std::fs::remove_dir_all(&dir).unwrap();
}

//! The unprivileged user the rootless test runs use (`jail.rs` runs the
//! jail suite as it, `vm.rs` runs `sluice run` as it): one definition, so
//! both suites create the same user the same way.

use std::process::{Command, Stdio};

/// The user's name.
pub(crate) const TEST_USER: &str = "sluice-rootless";

/// [`TEST_USER`]'s uid, if the user exists.
pub(crate) fn uid() -> Option<u32> {
    let out = Command::new("id")
        .args(["-u", TEST_USER])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

/// [`TEST_USER`]'s primary gid (the user must exist: [`ensure`]).
#[allow(dead_code, reason = "jail.rs does not need it")]
pub(crate) fn gid() -> u32 {
    let out = Command::new("id").args(["-g", TEST_USER]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("`id -g {TEST_USER}`: {out:?}"))
}

/// [`TEST_USER`]'s uid, creating the user first (a system user without a
/// home or a login shell) when it does not exist. Needs root to create it.
pub(crate) fn ensure() -> u32 {
    if let Some(uid) = uid() {
        return uid;
    }
    let st = Command::new("useradd")
        .args([
            "--system",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
        ])
        .arg(TEST_USER)
        .status()
        .unwrap();
    assert!(st.success(), "useradd {TEST_USER} failed");
    uid().unwrap_or_else(|| panic!("{TEST_USER} created but `id -u` does not find it"))
}

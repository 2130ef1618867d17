//! The systemd template unit in `deploy/systemd/` is one systemd accepts:
//! `systemd-analyze verify` on an instance of it, with its `ExecStart`
//! pointed at the gateway binary this build made (verify checks that the
//! command exists and is executable). Fails when systemd-analyze is missing,
//! unless `SLUICE_TEST_MAY_SKIP` names `systemd-analyze`.

#![allow(clippy::unwrap_used, reason = "test: a panic is a failed test")]

use std::path::PathBuf;
use std::process::Command;

#[test]
fn the_template_unit_passes_systemd_analyze_verify() {
    let unit =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/systemd/sluice-gateway@.service");
    let text = std::fs::read_to_string(&unit).unwrap();
    assert!(
        text.contains("ExecStart=/usr/local/bin/sluice-gateway "),
        "{text}"
    );
    let probe = Command::new("systemd-analyze").arg("--version").output();
    if probe.is_err()
        && sluice_test_skip::may_skip("systemd-analyze", "systemd-analyze is not installed")
    {
        return;
    }
    let dir = std::env::temp_dir().join(format!("sluice-unit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let gateway = env!("CARGO_BIN_EXE_sluice-gateway");
    std::fs::write(
        dir.join("sluice-gateway@.service"),
        text.replace("/usr/local/bin/sluice-gateway", gateway),
    )
    .unwrap();
    std::os::unix::fs::symlink(
        dir.join("sluice-gateway@.service"),
        dir.join("sluice-gateway@vm-1.service"),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(dir.join("sluice-gateway@vm-1.service"))
        .env("SYSTEMD_LOG_LEVEL", "notice")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // verify exits non-zero on errors; warnings about this unit (unknown
    // keys, bad values) are printed with its name and fail the test too.
    let about_unit: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("sluice-gateway@"))
        .collect();
    assert!(
        out.status.success() && about_unit.is_empty(),
        "systemd-analyze verify: {}\n{stderr}",
        out.status
    );
}

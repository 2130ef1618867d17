//! End-to-end tests of `sluice run`: real QEMU (TCG here), the real guest
//! image and agent. Each test boots its own VM without a network
//! (`--no-network`; networking through the gateway is tested with it) and
//! checks, after the launcher exits, that no process it started is left.
//!
//! Leftover detection: every launcher gets a unique `SLV_TEST_MARK`
//! environment variable, which QEMU and the gateway inherit; after the
//! launcher exits, no process in /proc may carry it.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

/// Builds the static agent once per test binary; returns its path, or None
/// (with a message) when QEMU is not installed.
fn agent() -> Option<PathBuf> {
    static AGENT: OnceLock<Option<PathBuf>> = OnceLock::new();
    AGENT
        .get_or_init(|| {
            if Command::new("qemu-system-x86_64")
                .arg("--version")
                .output()
                .is_err()
            {
                eprintln!("skipping: qemu-system-x86_64 is not installed (scripts/install-deps)");
                return None;
            }
            // target/<profile>/sluice -> target/
            let target = Path::new(SLUICE).parent()?.parent()?.to_owned();
            let status = Command::new(env!("CARGO"))
                .args([
                    "build",
                    "--release",
                    "-p",
                    "sluice-guest-agent",
                    "--target",
                    "x86_64-unknown-linux-gnu",
                ])
                .env("RUSTFLAGS", "-C target-feature=+crt-static")
                .env("CARGO_TARGET_DIR", &target)
                .status()
                .expect("cargo runs");
            assert!(status.success(), "building the static agent failed");
            Some(target.join("x86_64-unknown-linux-gnu/release/sluice-agent"))
        })
        .clone()
}

fn mark() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "slv-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn sluice(agent: &Path, mark: &str, args: &[&str]) -> Command {
    let mut c = Command::new(SLUICE);
    c.arg("run");
    if !args.iter().any(|a| a.starts_with("--gateway")) {
        c.arg("--no-network");
    }
    c.args(args)
        .env("SLUICE_AGENT", agent)
        .env("SLV_TEST_MARK", mark)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Pids of live (non-zombie) processes whose environment holds `mark`.
fn marked(mark: &str) -> Vec<u32> {
    let needle = format!("SLV_TEST_MARK={mark}\0");
    let mut pids = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        if stat
            .rsplit(')')
            .next()
            .is_some_and(|s| s.trim_start().starts_with('Z'))
        {
            continue;
        }
        let env = fs::read(e.path().join("environ")).unwrap_or_default();
        if env.windows(needle.len()).any(|w| w == needle.as_bytes()) {
            pids.push(pid);
        }
    }
    pids
}

/// Waits (bounded, generously) for every marked process to be gone.
fn assert_no_leftovers(mark: &str) {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let left = marked(mark);
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < until, "processes left behind: {left:?}");
        thread::sleep(Duration::from_millis(100));
    }
}

fn run(agent: &Path, args: &[&str]) -> Output {
    let m = mark();
    let out = sluice(agent, &m, args).output().unwrap();
    assert_no_leftovers(&m);
    out
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn streams_stdout_and_stderr_and_returns_the_exit_code() {
    let Some(agent) = agent() else { return };
    let out = run(
        &agent,
        &[
            "--env",
            "GREETING=hi there",
            "--workdir",
            "/etc",
            "--",
            "sh",
            "-c",
            "echo \"$GREETING from $(pwd)\"; echo to-stderr >&2; exit 3",
        ],
    );
    assert_eq!(out.status.code(), Some(3), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "hi there from /etc\n");
    assert!(text(&out.stderr).contains("to-stderr\n"));
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn stdin_and_copies_in_both_directions() {
    let Some(agent) = agent() else { return };
    let dir = std::env::temp_dir().join(format!("slv-test-{}", mark()));
    fs::create_dir_all(&dir).unwrap();
    let input = dir.join("in.txt");
    fs::write(&input, "file from the host\n").unwrap();
    let output = dir.join("out.txt");
    let copy_in = format!("{}:/work/in.txt", input.display());
    let copy_out = format!("/work/out.txt:{}", output.display());
    let m = mark();
    let mut child: Child = sluice(
        &agent,
        &m,
        &[
            "--copy-in",
            &copy_in,
            "--copy-out",
            &copy_out,
            "--",
            "sh",
            "-c",
            "cat /work/in.txt; tr a-z A-Z > /work/out.txt; uname -s >> /work/out.txt",
        ],
    )
    .stdin(Stdio::piped())
    .spawn()
    .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"through stdin\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_no_leftovers(&m);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "file from the host\n");
    assert_eq!(
        fs::read_to_string(&output).unwrap(),
        "THROUGH STDIN\nLinux\n"
    );
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn a_signal_gives_128_plus_n_and_a_missing_program_127() {
    let Some(agent) = agent() else { return };
    let out = run(&agent, &["--json", "--", "sh", "-c", "kill -9 $$"]);
    assert_eq!(
        out.status.code(),
        Some(137),
        "stderr: {}",
        text(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["signal"], 9);
    assert_eq!(v["exit_code"], 137);
    assert!(v["timings_ms"]["boot"].as_u64().is_some());

    let out = run(&agent, &["--", "/no/such/program"]);
    assert_eq!(out.status.code(), Some(127));
    assert!(text(&out.stderr).contains("cannot run /no/such/program"));
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn timeout_kills_the_vm_and_exits_124() {
    let Some(agent) = agent() else { return };
    let out = run(&agent, &["--timeout", "40", "--", "sleep", "100000"]);
    assert_eq!(
        out.status.code(),
        Some(124),
        "stderr: {}",
        text(&out.stderr)
    );
    assert!(text(&out.stderr).contains("--timeout expired"));
}

/// Ctrl-C (SIGINT) and SIGKILL of the launcher while the VM runs.
#[test]
#[ignore = "needs root: run via scripts/test"]
fn interrupting_or_killing_the_launcher_leaves_nothing_behind() {
    let Some(agent) = agent() else { return };
    for signal in ["INT", "KILL"] {
        let m = mark();
        let mut child = sluice(
            &agent,
            &m,
            &["--", "sh", "-c", "echo started; sleep 100000"],
        )
        .spawn()
        .unwrap();
        // Wait until the command runs in the guest (its first output).
        let mut stdout = child.stdout.take().unwrap();
        let mut first = [0u8; 8];
        std::io::Read::read_exact(&mut stdout, &mut first).unwrap();
        assert_eq!(&first, b"started\n");
        assert!(marked(&m).len() >= 2, "the launcher and QEMU run");
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let status = child.wait().unwrap();
        if signal == "INT" {
            assert_eq!(status.code(), Some(130));
        }
        assert_no_leftovers(&m);
    }
}

/// The guest's network is the gateway: DHCP configures eth0 and a default
/// route, the guest's DNS query reaches the gateway and is audited, and the
/// gateway is gone afterwards.
#[test]
#[ignore = "needs root: run via scripts/test"]
fn the_guest_network_is_a_sluice_gateway() {
    let Some(agent) = agent() else { return };
    let gateway = Path::new(SLUICE).with_file_name("sluice-gateway");
    if !gateway.is_file() {
        eprintln!(
            "skipping: {} not built (scripts/test builds every binary)",
            gateway.display()
        );
        return;
    }
    let gateway = format!("--gateway={}", gateway.display());
    let out = run(
        &agent,
        &[
            &gateway,
            "--json",
            "--",
            "sh",
            "-c",
            "ip -4 addr show eth0; ip route; nslookup blocked.invalid >/dev/null 2>&1; echo done",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let stdout = v["stdout"].as_str().unwrap();
    assert!(stdout.contains("inet "), "no DHCP address: {stdout}");
    assert!(
        stdout.contains("default via "),
        "no default route: {stdout}"
    );
    assert_eq!(v["network"], "sluice-gateway");
    let dns = v["audit"]["by_reason"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| k.starts_with("dns:"))
        .count();
    assert!(dns > 0, "no DNS audit line: {}", v["audit"]);
}

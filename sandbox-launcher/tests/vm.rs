//! End-to-end tests of `sluice run`: real QEMU (TCG here), the real guest
//! image and agent. Each test boots its own VM without a network
//! (`--no-network`; networking through the gateway is tested with it) and
//! checks, after the launcher exits, that no process it started is left.
//!
//! Leftover detection: every launcher gets a unique `SLV_TEST_MARK`
//! environment variable (the launcher's own); QEMU and the gateway run
//! jailed with a clean environment holding `SLUICE_SANDBOX_ID=sluice-<launcher
//! pid>`, and their jail helpers carry `__jail-exec sluice-<pid>-...` in
//! their command line. After the launcher exits, no process may carry any of
//! these, and no cgroup, jail dir or run dir named after the launcher's pid
//! may exist.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
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

fn is_zombie(proc_dir: &Path) -> bool {
    let stat = fs::read_to_string(proc_dir.join("stat")).unwrap_or_default();
    stat.rsplit(')')
        .next()
        .is_some_and(|s| s.trim_start().starts_with('Z'))
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Pids of live (non-zombie) processes started for the launcher `mark`
/// whose pid is `launcher` (0: unknown): the launcher itself, its jailed
/// QEMU and gateway, and their jail helpers.
fn marked(mark: &str, launcher: u32) -> Vec<u32> {
    let env_mark = format!("SLV_TEST_MARK={mark}\0");
    let sandbox = format!("SLUICE_SANDBOX_ID=sluice-{launcher}\0");
    let helper = format!("__jail-exec\0sluice-{launcher}-");
    let mut pids = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if is_zombie(&e.path()) {
            continue;
        }
        let env = fs::read(e.path().join("environ")).unwrap_or_default();
        let cmdline = fs::read(e.path().join("cmdline")).unwrap_or_default();
        if contains(&env, env_mark.as_bytes())
            || (launcher != 0
                && (contains(&env, sandbox.as_bytes()) || contains(&cmdline, helper.as_bytes())))
        {
            pids.push(pid);
        }
    }
    pids
}

/// The cgroups, jail dirs and run dir a launcher with this pid creates.
fn launcher_paths(launcher: u32) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    for jail in ["qemu", "gateway"] {
        let name = format!("sluice-{launcher}-{jail}");
        for c in ["memory", "pids", "cpu"] {
            paths.push(Path::new("/sys/fs/cgroup").join(c).join(&name));
        }
        paths.push(std::env::temp_dir().join(format!("{name}.jail")));
    }
    paths.push(std::env::temp_dir().join(format!("sluice-{launcher}.run")));
    paths
}

/// Waits (bounded, generously) for every marked process and every path
/// of the launcher to be gone.
fn assert_no_leftovers(mark: &str, launcher: u32) {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let left = marked(mark, launcher);
        let paths: Vec<PathBuf> = launcher_paths(launcher)
            .into_iter()
            .filter(|p| p.exists())
            .collect();
        if left.is_empty() && paths.is_empty() {
            return;
        }
        assert!(
            Instant::now() < until,
            "left behind: processes {left:?}, paths {paths:?}"
        );
        thread::sleep(Duration::from_millis(100));
    }
}

fn run(agent: &Path, args: &[&str]) -> Output {
    let m = mark();
    let child = sluice(agent, &m, args).spawn().unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert_no_leftovers(&m, pid);
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
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert_no_leftovers(&m, pid);
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
        assert!(
            marked(&m, child.id()).len() >= 3,
            "the launcher, QEMU and its helper run"
        );
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let status = child.wait().unwrap();
        if signal == "INT" {
            assert_eq!(status.code(), Some(130));
        }
        assert_no_leftovers(&m, child.id());
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

fn gateway_bin() -> Option<PathBuf> {
    let gateway = Path::new(SLUICE).with_file_name("sluice-gateway");
    if gateway.is_file() {
        Some(gateway)
    } else {
        eprintln!(
            "skipping: {} not built (scripts/test builds every binary)",
            gateway.display()
        );
        None
    }
}

/// The pid of the jailed process of launcher `launcher` whose comm is `comm`.
fn jailed_pid(launcher: u32, comm: &str) -> Option<u32> {
    let sandbox = format!("SLUICE_SANDBOX_ID=sluice-{launcher}\0");
    fs::read_dir("/proc").unwrap().flatten().find_map(|e| {
        let pid = e.file_name().to_string_lossy().parse::<u32>().ok()?;
        let env = fs::read(e.path().join("environ")).ok()?;
        let c = fs::read_to_string(e.path().join("comm")).ok()?;
        (c.trim() == comm && contains(&env, sandbox.as_bytes())).then_some(pid)
    })
}

fn status_field(pid: u32, field: &str) -> String {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
        .trim()
        .to_owned()
}

/// (mount point, per-mount options) of every mount `pid` sees.
fn mounts(pid: u32) -> Vec<(String, String)> {
    fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[4].to_owned(), f[5].to_owned())
        })
        .collect()
}

/// What each open fd of `pid` points at.
fn fd_targets(pid: u32) -> BTreeMap<i32, String> {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let fd = e.file_name().to_string_lossy().parse().ok()?;
            let target = fs::read_link(e.path()).ok()?;
            Some((fd, target.to_string_lossy().into_owned()))
        })
        .collect()
}

fn assert_confined(pid: u32, what: &str) {
    assert_eq!(status_field(pid, "Seccomp"), "2", "{what}: seccomp filter");
    assert_eq!(status_field(pid, "NoNewPrivs"), "1", "{what}");
    assert_eq!(status_field(pid, "CapEff"), "0000000000000000", "{what}");
    assert_eq!(status_field(pid, "CapBnd"), "0000000000000000", "{what}");
    let uid = status_field(pid, "Uid");
    assert!(
        uid.split_whitespace().all(|u| u == "65534"),
        "{what}: uid {uid}"
    );
    let ns = |p: &str| fs::read_link(p).unwrap();
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

/// QEMU and the gateway, seen from /proc while a command runs in the guest:
/// every layer of their jails is in force. Then SIGKILL of the launcher
/// leaves nothing behind (processes, cgroups, jail dirs, the run dir).
#[test]
#[ignore = "needs root: run via scripts/test"]
fn qemu_and_the_gateway_run_jailed() {
    let Some(agent) = agent() else { return };
    let Some(gateway) = gateway_bin() else { return };
    let m = mark();
    let gateway = format!("--gateway={}", gateway.display());
    let mut child = sluice(
        &agent,
        &m,
        &[&gateway, "--", "sh", "-c", "echo started; sleep 100000"],
    )
    .spawn()
    .unwrap();
    let launcher = child.id();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 8];
    std::io::Read::read_exact(&mut stdout, &mut first).unwrap();
    assert_eq!(&first, b"started\n");

    let qemu = jailed_pid(launcher, "qemu-system-x86").expect("QEMU runs");
    let gw = jailed_pid(launcher, "sluice-gateway").expect("the gateway runs");
    assert_confined(qemu, "QEMU");
    assert_confined(gw, "the gateway");

    // QEMU: an empty network namespace (only lo), the gateway: the host's.
    let dev = fs::read_to_string(format!("/proc/{qemu}/net/dev")).unwrap();
    let ifaces: Vec<&str> = dev
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(str::trim)
        .collect();
    assert_eq!(ifaces, ["lo"], "QEMU's netns");
    assert_eq!(
        fs::read_link(format!("/proc/{gw}/ns/net")).unwrap(),
        fs::read_link("/proc/self/ns/net").unwrap(),
        "the gateway keeps the host network"
    );

    // cgroups: QEMU is in its own memory, pids and cpu cgroups, with limits.
    let cgroups = fs::read_to_string(format!("/proc/{qemu}/cgroup")).unwrap();
    let name = format!("sluice-{launcher}-qemu");
    for c in ["memory", "pids", "cpu"] {
        assert!(
            cgroups
                .lines()
                .any(|l| l.contains(c) && l.ends_with(&format!("/{name}"))),
            "QEMU not in a {c} cgroup {name}: {cgroups}"
        );
    }
    let limit: u64 = fs::read_to_string(format!(
        "/sys/fs/cgroup/memory/{name}/memory.limit_in_bytes"
    ))
    .unwrap()
    .trim()
    .parse()
    .unwrap();
    assert!(limit > 256 << 20 && limit < 2 << 30, "memory limit {limit}");
    let pids_max = fs::read_to_string(format!("/sys/fs/cgroup/pids/{name}/pids.max")).unwrap();
    assert_ne!(pids_max.trim(), "max");

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

    child.kill().unwrap();
    child.wait().unwrap();
    assert_no_leftovers(&m, launcher);
    assert!(
        !Path::new(&format!("/proc/{qemu}")).exists()
            || is_zombie(Path::new(&format!("/proc/{qemu}")))
    );
}

/// `--rootfs DIR`: the guest boots the user's tree (here a small one made
/// of busybox links and a marker file) instead of the default userland.
#[test]
#[ignore = "needs root: run via scripts/test"]
fn a_user_rootfs_replaces_the_default_userland() {
    let Some(agent) = agent() else { return };
    let root = std::env::temp_dir().join(format!("la-rootfs-{}", mark()));
    let _ = fs::remove_dir_all(&root);
    fs::create_dir_all(root.join("bin")).unwrap();
    fs::create_dir_all(root.join("etc")).unwrap();
    for applet in ["sh", "cat", "ls", "uname"] {
        std::os::unix::fs::symlink("/sluice/bin/busybox", root.join("bin").join(applet)).unwrap();
    }
    let marker = format!("made by the test {}\n", mark());
    fs::write(root.join("etc/la-marker"), &marker).unwrap();
    let rootfs = root.to_string_lossy().into_owned();
    let out = run(
        &agent,
        &[
            "--rootfs",
            &rootfs,
            "--",
            "/bin/sh",
            "-c",
            "cat /etc/la-marker; ls /usr/bin/curl 2>/dev/null || echo no-curl",
        ],
    );
    fs::remove_dir_all(&root).unwrap();
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), format!("{marker}no-curl\n"));
}

/// The network end to end: `sluice run` inside the harness's host
/// namespace (entered with nsenter, so /sys and its cgroups stay mounted),
/// its gateway using the fake internet's dnsmasq (policy `dns.upstream`).
/// From inside the guest an allowed HTTPS fetch succeeds, a denied name and
/// a denied IP literal fail, and the audit log holds the allow and the
/// denies with their reasons.
#[test]
#[ignore = "needs root: run via scripts/test"]
fn https_from_the_guest_allowed_and_denied_through_the_gateway() {
    use sluice_e2e::{DNS_ADDR, ORIGIN_NAME, ORIGIN2_ADDR, ORIGIN2_NAME, World};
    let Some(agent) = agent() else { return };
    let Some(gateway) = gateway_bin() else { return };
    let world = World::builder().connect_guest(false).start().unwrap();
    let dir = world.dir().to_path_buf();
    let policy = dir.join("la-policy.yaml");
    fs::write(
        &policy,
        // The fake internet lives in documentation ranges: `internal:` lets
        // DNS answers point there; the TTL floor keeps the answer valid for
        // the connect that follows on a slow TCG guest.
        format!(
            "version: 1\nid: la-vm-https\nallow:\n  - domain: {ORIGIN_NAME}\n\
             internal:\n  - \"198.51.100.0/24\"\n  - \"203.0.113.0/24\"\n\
             dns:\n  upstream: [{DNS_ADDR}]\n  ttl_min: 600\n  ttl_max: 3600\n"
        ),
    )
    .unwrap();
    let audit = dir.join("la-audit.jsonl");
    let ca = world.ca_pem();
    let script = format!(
        "curl -sS --max-time 20 --cacert /tmp/ca.pem https://{ORIGIN_NAME}/; echo allowed=$?; \
         curl -sS --max-time 20 --cacert /tmp/ca.pem https://{ORIGIN2_NAME}/; echo name=$?; \
         curl -sS --max-time 20 -k https://{ORIGIN2_ADDR}/; echo ip=$?"
    );
    let m = mark();
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net=/run/netns/{}", world.host.name()))
        .arg(SLUICE)
        .arg("run")
        .arg(format!("--gateway={}", gateway.display()))
        .arg("--policy")
        .arg(&policy)
        .arg("--audit")
        .arg(&audit)
        .arg("--copy-in")
        .arg(format!("{}:/tmp/ca.pem", ca.display()))
        .args(["--", "sh", "-c", &script])
        .env("SLUICE_AGENT", &agent)
        .env("SLV_TEST_MARK", &m)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    let nsenter = child.id();
    let out = child.wait_with_output().unwrap();
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert!(
        stdout.contains("hello from sluice-test-origin\nallowed=0\n"),
        "the allowed fetch failed: {stdout}\nstderr: {stderr}"
    );
    assert!(
        !stdout.contains("name=0"),
        "the denied name was fetched: {stdout}"
    );
    assert!(
        !stdout.contains("ip=0"),
        "the IP literal was fetched: {stdout}"
    );

    let lines: Vec<serde_json::Value> = fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let has = |pred: &dyn Fn(&serde_json::Value) -> bool| lines.iter().any(pred);
    // Schema-1 records (docs/audit.md).
    assert!(
        has(&|l| l["kind"] == "connection"
            && l["decision"] == "allow"
            && l["dst"]["port"] == 443
            && l["sni"] == ORIGIN_NAME),
        "no allowed HTTPS flow to {ORIGIN_NAME} in the audit: {lines:#?}"
    );
    assert!(
        has(&|l| l["kind"] == "dns"
            && l["qname"]
                .as_str()
                .is_some_and(|q| q.trim_end_matches('.') == ORIGIN2_NAME)
            && l["decision"] == "deny"
            && l["reason"].is_string()),
        "no denied DNS query for {ORIGIN2_NAME} with a reason: {lines:#?}"
    );
    assert!(
        has(&|l| l["kind"] == "connection"
            && l["decision"] == "deny"
            && l["dst"]["ip"] == ORIGIN2_ADDR.to_string()
            && l["dst"]["port"] == 443
            && l["reason"].is_string()),
        "no denied connection to {ORIGIN2_ADDR} with a reason: {lines:#?}"
    );
    // nsenter execs the launcher: same pid.
    assert_no_leftovers(&m, nsenter);
    drop(world);
}

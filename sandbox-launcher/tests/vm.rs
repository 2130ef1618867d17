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
//!
//! The suite runs as root; `qemu_and_the_gateway_run_jailed_rootless` boots
//! once more with `sluice` started as an unprivileged user the test creates
//! ([`Mode::Rootless`]), with the same checks.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

mod common;
use common::rootless_user::TEST_USER;
use common::*;
#[path = "vm/egress_floor.rs"]
mod egress_floor;
#[path = "vm/jail_view.rs"]
mod jail_view;
#[path = "vm/secrets.rs"]
mod secrets;
use jail_view::*;

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

/// Who starts `sluice`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Root, as `scripts/test` runs the suite.
    Root,
    /// [`TEST_USER`], through `runuser`: a rootless run.
    Rootless,
}

/// `sluice run ARGS` as [`TEST_USER`] (its environment: the copies, the
/// mark, no runtime dir, so the run dirs go in `/tmp/sluice-<uid>`).
fn sluice_as_user(u: &UserCopy, mark: &str, args: &[&str]) -> Command {
    let mut c = Command::new("runuser");
    c.args(["-u", TEST_USER, "--"])
        .arg(&u.sluice)
        .arg("run")
        .args(args)
        .env("SLUICE_AGENT", &u.agent)
        .env("SLV_TEST_MARK", mark)
        .env("XDG_CACHE_HOME", u.dir.join("cache"))
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("SLUICE_CACHE")
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// A host without unprivileged user namespaces (issue 14): inside a user
/// namespace the test makes (mapping every id to itself, so nothing else
/// changes) `user.max_user_namespaces` is set to 0 there, and
/// [`TEST_USER`] runs `sluice run` and `sluice doctor` in it. The run
/// stops before any work with one line naming the sysctl and the value
/// that enables it; doctor shows `user-ns` OFF with the same reason.
#[test]
#[ignore = "needs root: run via scripts/test"]
fn without_user_namespaces_a_rootless_run_names_the_sysctl() {
    let Some(agent) = agent() else { return };
    let Some(gateway) = gateway_bin() else { return };
    let u = user_copy(&agent, &gateway);
    // The holder of the user namespace; its maps are written from here
    // (root in the initial namespace may map every id).
    let mut holder = Command::new("unshare")
        .args(["--user", "sleep", "600"])
        .spawn()
        .unwrap();
    let pid = holder.id();
    let map = |file: &str| {
        let path = format!("/proc/{pid}/{file}");
        sluice_e2e::wait_until(&format!("{path} writable"), Duration::from_secs(10), || {
            fs::write(&path, "0 0 4294967295\n").is_ok()
        })
        .unwrap();
    };
    map("uid_map");
    map("gid_map");
    let as_user = |args: &str| -> Output {
        let script = format!(
            "echo 0 > /proc/sys/user/max_user_namespaces && \
             exec setpriv --reuid {uid} --regid {uid} --clear-groups \
             env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin SLUICE_AGENT={agent} \
             XDG_CACHE_HOME={cache} {sluice} {args}",
            uid = u.uid,
            agent = u.agent.display(),
            cache = u.dir.join("cache").display(),
            sluice = u.sluice.display(),
        );
        Command::new("nsenter")
            .args(["--user", "--target", &pid.to_string(), "sh", "-c", &script])
            .current_dir("/")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let out = as_user(&format!("run --gateway={} -- true", u.gateway.display()));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("user.max_user_namespaces")
            && err.contains("sysctl -w user.max_user_namespaces="),
        "{err}"
    );
    let out = as_user("doctor");
    let report = text(&out.stdout);
    let line = report
        .lines()
        .find(|l| l.trim_start().starts_with("user-ns:"))
        .unwrap_or_else(|| panic!("no user-ns line: {report}"));
    assert!(
        line.contains("OFF") && line.contains("user.max_user_namespaces"),
        "{line}"
    );
    let _ = holder.kill();
    let _ = holder.wait();
}

fn run(agent: &Path, args: &[&str]) -> Output {
    let m = mark();
    let child = sluice(agent, &m, args).spawn().unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert_no_leftovers(&m, pid);
    out
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
    let Some(gateway) = gateway_bin() else { return };
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

/// QEMU and the gateway, seen from /proc while a command runs in the guest:
/// every layer of their jails is in force. Then SIGKILL of the launcher
/// leaves nothing behind (processes, cgroups, jail dirs, the run dir).
#[test]
#[ignore = "needs root: run via scripts/test"]
fn qemu_and_the_gateway_run_jailed() {
    qemu_and_the_gateway_run_jailed_as(Mode::Root);
}

/// The same as an unprivileged user: every layer but the cgroups (this
/// host is cgroup v1, which cannot be delegated: the run must name them in
/// `--allow-missing-isolation`, and refuses in one line without).
#[test]
#[ignore = "needs root: run via scripts/test"]
fn qemu_and_the_gateway_run_jailed_rootless() {
    qemu_and_the_gateway_run_jailed_as(Mode::Rootless);
}

fn qemu_and_the_gateway_run_jailed_as(mode: Mode) {
    let Some(agent) = agent() else { return };
    let Some(gateway) = gateway_bin() else { return };
    let m = mark();
    let user = (mode == Mode::Rootless).then(|| user_copy(&agent, &gateway));
    let cgroups_v1 = Path::new("/sys/fs/cgroup/memory/cgroup.clone_children").exists();
    let mut args = vec![format!(
        "--gateway={}",
        user.as_ref().map_or(&gateway, |u| &u.gateway).display()
    )];
    // Rootless the user (started by `runuser` from this test's cgroup) has
    // no cgroup delegated to it, on v1 or v2.
    if let Some(u) = &user {
        // Without the flags: one line naming them, and no VM.
        let out = sluice_as_user(u, &m, &[&args[0], "--", "true"])
            .output()
            .unwrap();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        let why = if cgroups_v1 { "cgroup v1" } else { "delegated" };
        assert!(
            err.contains("--allow-missing-isolation cgroup-memory") && err.contains(why),
            "{err}"
        );
        for c in ["memory", "pids", "cpu"] {
            args.push(format!("--allow-missing-isolation=cgroup-{c}"));
        }
    }
    let mut cmd_args: Vec<&str> = args.iter().map(String::as_str).collect();
    cmd_args.extend(["--", "sh", "-c", "echo started; sleep 100000"]);
    let mut child = match &user {
        None => sluice(&agent, &m, &cmd_args),
        Some(u) => sluice_as_user(u, &m, &cmd_args),
    }
    .spawn()
    .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 8];
    std::io::Read::read_exact(&mut stdout, &mut first).unwrap();
    assert_eq!(&first, b"started\n");
    // Rootless the child is runuser; the launcher is the marked `sluice`.
    let launcher = match &user {
        None => child.id(),
        Some(_) => marked(&m, 0)
            .into_iter()
            .find(|p| {
                fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "sluice")
            })
            .expect("the launcher runs"),
    };
    let expected_uid = user.as_ref().map_or(65534, |u| u.uid);

    let qemu = jailed_pid(launcher, "qemu-system-x86").expect("QEMU runs");
    let gw = jailed_pid(launcher, "sluice-gateway").expect("the gateway runs");
    assert_confined(qemu, "QEMU", mode, expected_uid);
    assert_confined(gw, "the gateway", mode, expected_uid);

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

    // cgroups: QEMU is in its own memory, pids and cpu cgroups, with limits
    // (as root; rootless, without a delegated subtree, there are none). As root the
    // gateway has a gid of its own and its egress floor is in place; the
    // SIGKILL below leaves its removal to the jail's supervisor.
    if mode == Mode::Root {
        assert_qemu_cgroups(qemu, launcher);
        let gid = gateway_gid(gw);
        assert_eq!(gid, FLOOR_GID_BASE + launcher, "the gateway's own gid");
        assert!(
            nft_tables(None).contains(&floor_table(launcher)),
            "no egress floor: {}",
            nft_tables(None)
        );
    }
    assert_qemu_view(qemu, gw);

    // SIGKILL of the launcher (rootless: `sluice`, not runuser).
    Command::new("kill")
        .args(["-KILL", &launcher.to_string()])
        .status()
        .unwrap();
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
/// denies with their reasons. The policy inspects nothing, so no sandbox CA
/// is installed: no `/etc/sluice/sandbox-ca.pem`, no CA variables, and the
/// guest's system bundle is the host's, byte for byte.
#[test]
#[ignore = "needs root: run via scripts/test"]
fn https_from_the_guest_allowed_and_denied_through_the_gateway() {
    use sluice_e2e::{ORIGIN_NAME, ORIGIN2_ADDR, ORIGIN2_NAME};
    let Some(rw) = RunWorld::start() else { return };
    let (agent, gateway, world) = (rw.agent, rw.gateway, rw.world);
    let dir = world.dir().to_path_buf();
    let policy = dir.join("la-policy.yaml");
    fs::write(
        &policy,
        format!(
            "version: 1\nid: la-vm-https\nallow:\n  - domain: {ORIGIN_NAME}\n{}",
            world_policy_tail()
        ),
    )
    .unwrap();
    let audit = dir.join("la-audit.jsonl");
    let ca = world.ca_pem();
    // The policy inspects nothing: no sandbox CA may reach the guest.
    let bundle_out = dir.join("la-bundle.pem");
    let script = format!(
        "test -e /etc/sluice/sandbox-ca.pem && echo sandbox_ca=present || echo sandbox_ca=absent; \
         echo \"ca_env=${{SSL_CERT_FILE:-unset}},${{CURL_CA_BUNDLE:-unset}}\"; \
         curl -sS --max-time 60 --cacert /tmp/ca.pem https://{ORIGIN_NAME}/; echo allowed=$?; \
         curl -sS --max-time 60 --cacert /tmp/ca.pem https://{ORIGIN2_NAME}/; echo name=$?; \
         curl -sS --max-time 60 -k https://{ORIGIN2_ADDR}/; echo ip=$?"
    );
    let (audit_flag, copy_out) = (
        audit.display().to_string(),
        format!(
            "/etc/ssl/certs/ca-certificates.crt:{}",
            bundle_out.display()
        ),
    );
    let args = run_args(
        &["--audit", &audit_flag, "--copy-out", &copy_out],
        &policy,
        &ca,
        script,
    );
    let m = mark();
    let child = sluice_in_world(&world, &agent, &gateway, &m, &args, &[]);
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
        stdout.contains("sandbox_ca=absent\nca_env=unset,unset\n"),
        "a CA was installed for a policy that inspects nothing: {stdout}"
    );
    assert_eq!(
        fs::read(&bundle_out).unwrap(),
        fs::read("/etc/ssl/certs/ca-certificates.crt").unwrap(),
        "the guest's system bundle differs from the host's it was built from"
    );
    assert!(
        !stdout.contains("name=0"),
        "the denied name was fetched: {stdout}"
    );
    assert!(
        !stdout.contains("ip=0"),
        "the IP literal was fetched: {stdout}"
    );

    let lines = audit_records(&audit);
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

/// Ends a run whose guest script waits for a line on stdin: sends it,
/// waits for `sluice run` (exit 0) and checks it left nothing behind.
/// Returns the run's stdout and stderr.
fn release_held_run(
    mut child: Child,
    mut stdin: std::process::ChildStdin,
    stdout: thread::JoinHandle<String>,
    stderr: &std::sync::Mutex<String>,
    mark: &str,
) -> (String, String) {
    let launcher = child.id();
    stdin.write_all(b"go\n").unwrap();
    drop(stdin);
    let status = child.wait().unwrap();
    let stdout = stdout.join().unwrap();
    let stderr = stderr.lock().unwrap().clone();
    assert_eq!(status.code(), Some(0), "stdout: {stdout}\nstderr: {stderr}");
    assert_no_leftovers(mark, launcher);
    (stdout, stderr)
}

/// A directory in the world's dir the jail user can search (the policy's
/// or a secret's directory: `sluice run` binds it read-only).
fn jail_dir(world: &sluice_e2e::World, name: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let d = world.dir().join(name);
    fs::create_dir_all(&d).unwrap();
    fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// Replaces `path` the way editors and config management do: write a
/// sibling, then rename it over the original (a new inode).
fn rename_replace(path: &Path, content: &str) {
    let tmp = path.with_extension("yaml.vc-new");
    fs::write(&tmp, content).unwrap();
    fs::rename(&tmp, path).unwrap();
}

/// Reload under `sluice run` (issue 6 with the reload of issue 4): the
/// command fetches `other.test` (denied) and `origin.test` (allowed) once a
/// second. The policy file is then replaced by rename: first with a
/// malformed policy (the gateway logs and audits the rejection; the old
/// policy stays: `origin.test` still allowed, `other.test` still denied),
/// then with one that allows `other.test`, which the next fetches reach.
/// The jail binds the policy's directory, so the gateway's poll of the path
/// sees the new inode.
#[test]
#[ignore = "needs root: run via scripts/test"]
fn a_policy_replaced_by_rename_is_reloaded_under_sluice_run() {
    use sluice_e2e::{ORIGIN_NAME, ORIGIN2_NAME};
    let Some(rw) = RunWorld::start() else { return };
    let (agent, gateway, world) = (rw.agent, rw.gateway, rw.world);
    let policy = jail_dir(&world, "vc-reload").join("policy.yaml");
    let allow = |names: &str, id: &str| {
        format!(
            "version: 1\nid: {id}\nallow:\n  - domains: [{names}]\n{}",
            world_policy_tail()
        )
    };
    fs::write(&policy, allow(&format!("\"{ORIGIN_NAME}\""), "vc-reload-1")).unwrap();
    let audit = world.dir().join("vc-reload-audit.jsonl");
    let script = format!(
        "i=0; while [ $i -lt 200 ]; do i=$((i+1)); \
         curl -sS --max-time 60 --cacert /tmp/ca.pem -o /dev/null https://{ORIGIN_NAME}/ 2>/dev/null; o=$?; \
         curl -sS --max-time 60 --cacert /tmp/ca.pem -o /dev/null https://{ORIGIN2_NAME}/ 2>/dev/null; x=$?; \
         echo \"fetch $i origin=$o other=$x\"; \
         [ $x -eq 0 ] && {{ read go; exit 0; }}; sleep 1; done; exit 1"
    );
    let audit_flag = audit.display().to_string();
    let args = run_args(
        &["--debug", "--audit", &audit_flag],
        &policy,
        &world.ca_pem(),
        script,
    );
    let m = mark();
    let mut child = sluice_in_world(&world, &agent, &gateway, &m, &args, &[]);
    let launcher = child.id();
    // The script waits for a line once other.test is reached, so the floor
    // is checked while the run lasts.
    let stdin = child.stdin.take().unwrap();
    let (lines, stdout) = line_reader(child.stdout.take().unwrap());
    let stderr = drain(child.stderr.take().unwrap());
    let is_fetch = |l: &str| l.starts_with("fetch ");
    let kept = |l: &str| l.contains("origin=0 ") && !l.ends_with("other=0");

    // The first policy: origin.test allowed, other.test denied.
    let first = wait_line(&lines, &stderr, 300, "the first fetch", is_fetch);
    assert!(kept(&first), "{first}");
    // The egress floor (docs/isolation.md) follows the policy's networks.
    let floor = || floor_rules(world.host.name(), &floor_table(launcher));
    assert!(floor().contains("198.51.100.0/24"), "{}", floor());
    assert!(!floor().contains("10.99.0.0/16"), "{}", floor());

    // A malformed replacement: rejected, the old policy stays.
    rename_replace(
        &policy,
        "version: 1\nid: vc-reload-bad\nallow:\n  - domain: [unclosed\n",
    );
    let until = Instant::now() + Duration::from_secs(120);
    while !audit_records(&audit)
        .iter()
        .any(|r| r["kind"] == "policy_reload" && r["reason"] == "reload_rejected")
    {
        assert!(
            Instant::now() < until,
            "no reload_rejected record: {:#?}\nsluice's stderr:\n{}",
            audit_records(&audit),
            stderr.lock().unwrap()
        );
        thread::sleep(Duration::from_millis(200));
    }
    // Two whole fetches after the rejection was audited, both under the old policy.
    let _ = wait_line(
        &lines,
        &stderr,
        300,
        "a fetch after the rejection",
        is_fetch,
    );
    for _ in 0..2 {
        let l = wait_line(
            &lines,
            &stderr,
            300,
            "a fetch under the kept policy",
            is_fetch,
        );
        assert!(kept(&l), "{l}");
    }

    // A valid replacement allowing other.test (and naming one more
    // internal network): the next fetches reach it.
    rename_replace(
        &policy,
        &allow(
            &format!("\"{ORIGIN_NAME}\", \"{ORIGIN2_NAME}\""),
            "vc-reload-2",
        )
        .replace("internal:\n", "internal:\n  - \"10.99.0.0/16\"\n"),
    );
    let allowed = wait_line(&lines, &stderr, 300, "a fetch of other.test allowed", |l| {
        l.ends_with("other=0")
    });
    assert!(allowed.contains("origin=0"), "{allowed}");
    sluice_e2e::wait_until(
        "the egress floor to follow the reload",
        Duration::from_secs(60),
        || floor().contains("10.99.0.0/16"),
    )
    .unwrap();
    let (_, stderr) = release_held_run(child, stdin, stdout, &stderr, &m);

    // The gateway's log (streamed by --debug) and the audit say so.
    assert!(
        stderr.contains("policy reload rejected; old policy stays"),
        "no rejection in the gateway's log: {stderr}"
    );
    let records = audit_records(&audit);
    let rejected = records
        .iter()
        .find(|r| r["kind"] == "policy_reload" && r["reason"] == "reload_rejected")
        .unwrap();
    assert!(
        rejected["detail"]
            .as_str()
            .unwrap_or("")
            .contains("policy.yaml:"),
        "the rejection names the file and position: {rejected}"
    );
    assert!(
        records.iter().any(|r| r["kind"] == "policy_reload"
            && r["reason"] == "reload_applied"
            && r.to_string().contains("vc-reload-2")),
        "no reload_applied for the new policy: {records:#?}"
    );
    drop(world);
}

//! Helpers shared by the end-to-end tests of `sluice run` (`vm.rs`,
//! `vm_approval.rs`, `network_modes.rs`, `jail.rs`): the static agent, the
//! gateway binary, running `sluice run` in the harness's host namespace,
//! reading its output, and checking that nothing a launcher made is left
//! behind.

// Each test binary uses a part of these.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

#[path = "../rootless_user/mod.rs"]
pub(crate) mod rootless_user;

/// The binaries a rootless run uses, copied where [`TEST_USER`] can read
/// them (the build dir may not be traversable by other users), and a cache
/// dir of the user's (`XDG_CACHE_HOME`; root's image cache is read first).
pub(crate) struct UserCopy {
    pub(crate) dir: PathBuf,
    pub(crate) sluice: PathBuf,
    pub(crate) gateway: PathBuf,
    pub(crate) agent: PathBuf,
    /// A dir the user owns, for what its run writes (an audit log).
    pub(crate) work: PathBuf,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
}

impl Drop for UserCopy {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

pub(crate) fn user_copy(agent: &Path, gateway: &Path) -> UserCopy {
    use std::os::unix::fs::PermissionsExt;
    let uid = rootless_user::ensure();
    // One dir per copy: tests of one binary run in parallel.
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "slv-rootless-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
    let copy = |from: &Path, name: &str| {
        let to = dir.join(name);
        fs::copy(from, &to).unwrap();
        fs::set_permissions(&to, fs::Permissions::from_mode(0o755)).unwrap();
        to
    };
    let cache = dir.join("cache");
    fs::create_dir(&cache).unwrap();
    std::os::unix::fs::chown(&cache, Some(uid), None).unwrap();
    let work = dir.join("work");
    fs::create_dir(&work).unwrap();
    std::os::unix::fs::chown(&work, Some(uid), None).unwrap();
    UserCopy {
        work,
        gid: rootless_user::gid(),
        sluice: copy(Path::new(SLUICE), "sluice"),
        gateway: copy(gateway, "sluice-gateway"),
        agent: copy(agent, "sluice-agent"),
        dir,
        uid,
    }
}

pub(crate) const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

/// Builds the static agent once per test binary; returns its path, or None
/// when QEMU is not installed and `SLUICE_TEST_MAY_SKIP` names `qemu` (the
/// test then returns; otherwise it fails).
pub(crate) fn agent() -> Option<PathBuf> {
    static AGENT: OnceLock<PathBuf> = OnceLock::new();
    let qemu_missing = Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .is_err();
    if qemu_missing {
        sluice_test_skip::may_skip(
            "qemu",
            "qemu-system-x86_64 is not installed (scripts/install-deps)",
        );
        return None;
    }
    let agent = AGENT.get_or_init(|| {
        // target/<profile>/sluice -> target/
        let target = Path::new(SLUICE)
            .parent()
            .and_then(Path::parent)
            .expect("the sluice binary is in target/<profile>/")
            .to_owned();
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
        target.join("x86_64-unknown-linux-gnu/release/sluice-agent")
    });
    Some(agent.clone())
}

pub(crate) fn mark() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "slv-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

pub(crate) fn is_zombie(proc_dir: &Path) -> bool {
    let stat = fs::read_to_string(proc_dir.join("stat")).unwrap_or_default();
    stat.rsplit(')')
        .next()
        .is_some_and(|s| s.trim_start().starts_with('Z'))
}

pub(crate) fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Pids of live (non-zombie) processes started for the launcher `mark`
/// whose pid is `launcher` (0: unknown): the launcher itself, its jailed
/// QEMU and gateway, and their jail helpers.
pub(crate) fn marked(mark: &str, launcher: u32) -> Vec<u32> {
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

/// The cgroups, jail dirs and run dir a launcher with this pid creates
/// (as root in the temp dir, rootless in the test user's private dir).
pub(crate) fn launcher_paths(launcher: u32) -> Vec<PathBuf> {
    let mut bases = vec![std::env::temp_dir()];
    if let Some(uid) = rootless_user::uid() {
        bases.push(std::env::temp_dir().join(format!("sluice-{uid}")));
    }
    let mut paths = Vec::new();
    for jail in ["qemu", "gateway"] {
        let name = format!("sluice-{launcher}-{jail}");
        let root = Path::new("/sys/fs/cgroup");
        // v1: one hierarchy per controller.
        for c in ["memory", "pids", "cpu"] {
            paths.push(root.join(c).join(&name));
        }
        // v2: the unified hierarchy at the root (and a hybrid host's `unified/`).
        paths.push(root.join(&name));
        paths.push(root.join("unified").join(&name));
        for base in &bases {
            paths.push(base.join(format!("{name}.jail")));
        }
    }
    for base in &bases {
        paths.push(base.join(format!("sluice-{launcher}.run")));
    }
    paths
}

/// The first gid `sluice run` gives a gateway (as root); the launcher's pid
/// is added (sandbox-launcher/src/egress_floor.rs).
pub(crate) const FLOOR_GID_BASE: u32 = 0x7100_0000;

/// The nftables table of launcher `launcher`'s egress floor.
pub(crate) fn floor_table(launcher: u32) -> String {
    format!("sluice_egress_gid_{}", FLOOR_GID_BASE + launcher)
}

/// `nft list tables` in the namespace named `netns` (`ip netns`), or in
/// the test's own.
pub(crate) fn nft_tables(netns: Option<&str>) -> String {
    let out = match netns {
        Some(ns) => Command::new("ip")
            .args(["netns", "exec", ns, "nft", "list", "tables"])
            .output(),
        None => Command::new("nft").args(["list", "tables"]).output(),
    }
    .unwrap();
    assert!(out.status.success(), "nft: {}", text(&out.stderr));
    text(&out.stdout)
}

/// The value of `field` in `/proc/PID/status`.
pub(crate) fn status_field(pid: u32, field: &str) -> String {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
        .trim()
        .to_owned()
}

/// The rules of the nftables table `table` (an egress floor,
/// [`floor_table`]) in the network namespace `netns`, as `nft list` prints
/// them; empty when there is no such table.
pub(crate) fn floor_rules(netns: &str, table: &str) -> String {
    let out = Command::new("ip")
        .args([
            "netns", "exec", netns, "nft", "list", "table", "inet", table,
        ])
        .output()
        .unwrap();
    text(&out.stdout)
}

/// Waits (bounded, generously: a loaded 2-core machine tears down two VMs
/// at once) for every marked process and every path of the launcher to be
/// gone, and (as root, in the test's namespace) its egress floor.
pub(crate) fn assert_no_leftovers(mark: &str, launcher: u32) {
    let until = Instant::now() + Duration::from_secs(60);
    let root = sluice_e2e::is_root();
    loop {
        let left = marked(mark, launcher);
        let paths: Vec<PathBuf> = launcher_paths(launcher)
            .into_iter()
            .filter(|p| p.exists())
            .collect();
        let floor = root && nft_tables(None).contains(&floor_table(launcher));
        if left.is_empty() && paths.is_empty() && !floor {
            return;
        }
        assert!(
            Instant::now() < until,
            "left behind: processes {left:?}, paths {paths:?}, egress floor {floor}"
        );
        thread::sleep(Duration::from_millis(100));
    }
}

pub(crate) fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

pub(crate) fn gateway_bin() -> Option<PathBuf> {
    let gateway = Path::new(SLUICE).with_file_name("sluice-gateway");
    if gateway.is_file() {
        return Some(gateway);
    }
    sluice_test_skip::may_skip(
        "gateway-bin",
        &format!(
            "{} not built (cargo build --release -p sluice-gateway; scripts/test builds every binary)",
            gateway.display()
        ),
    );
    None
}

/// The pid of the jailed process of launcher `launcher` whose comm is `comm`.
pub(crate) fn jailed_pid(launcher: u32, comm: &str) -> Option<u32> {
    let sandbox = format!("SLUICE_SANDBOX_ID=sluice-{launcher}\0");
    fs::read_dir("/proc").unwrap().flatten().find_map(|e| {
        let pid = e.file_name().to_string_lossy().parse::<u32>().ok()?;
        let env = fs::read(e.path().join("environ")).ok()?;
        let c = fs::read_to_string(e.path().join("comm")).ok()?;
        (c.trim() == comm && contains(&env, sandbox.as_bytes())).then_some(pid)
    })
}

/// What each open fd of `pid` points at.
pub(crate) fn fd_targets(pid: u32) -> BTreeMap<i32, String> {
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

/// Who starts `sluice` in [`sluice_in_world_as`].
#[derive(Clone, Copy)]
pub(crate) enum Who<'a> {
    /// Root, as `scripts/test` runs the suites.
    Root,
    /// [`rootless_user::TEST_USER`], with its copies of the binaries.
    Rootless(&'a UserCopy),
}

impl Who<'_> {
    /// The mode's name in test messages.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Root => "root",
            Self::Rootless(_) => "rootless",
        }
    }

    /// `sluice run`'s `--allow-missing-isolation` flags this host needs for
    /// the user: a cgroup v1 host cannot delegate cgroups (vm.rs checks
    /// the refusal without them).
    pub(crate) fn isolation_flags(self) -> Vec<String> {
        let v1 = Path::new("/sys/fs/cgroup/memory/cgroup.clone_children").exists();
        match self {
            Self::Rootless(_) if v1 => ["memory", "pids", "cpu"]
                .map(|c| format!("--allow-missing-isolation=cgroup-{c}"))
                .to_vec(),
            _ => Vec::new(),
        }
    }
}

/// `sluice run ARGS` in the harness's host namespace, as root
/// ([`sluice_in_world_as`]).
pub(crate) fn sluice_in_world(
    world: &sluice_e2e::World,
    agent: &Path,
    gateway: &Path,
    mark: &str,
    args: &[String],
    envs: &[(&str, &str)],
) -> Child {
    sluice_in_world_as(Who::Root, world, agent, gateway, mark, args, envs)
}

/// `sluice run ARGS` in the harness's host namespace (`nsenter --net`, so
/// /sys keeps its cgroup mounts), with the test's marker, the agent, the gateway and `envs`;
/// stdin, stdout and stderr piped. `nsenter` execs the launcher: the
/// child's pid is the launcher's.
///
/// As [`Who::Rootless`], `nsenter` also drops to the user's uid and gid
/// (no supplementary groups) before it execs the user's copy of `sluice`,
/// with the user's copies of the agent and the gateway (not `agent` and
/// `gateway`), its cache dir, no runtime dir (the run dirs go in
/// `/tmp/sluice-<uid>`) and the cgroup flags ([`Who::isolation_flags`]).
#[allow(clippy::too_many_arguments, reason = "test helper")]
pub(crate) fn sluice_in_world_as(
    who: Who<'_>,
    world: &sluice_e2e::World,
    agent: &Path,
    gateway: &Path,
    mark: &str,
    args: &[String],
    envs: &[(&str, &str)],
) -> Child {
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net=/run/netns/{}", world.host.name()));
    let (sluice, agent, gateway) = match who {
        Who::Root => (Path::new(SLUICE), agent, gateway),
        Who::Rootless(u) => {
            cmd.arg(format!("--setuid={}", u.uid))
                .arg(format!("--setgid={}", u.gid))
                .env("XDG_CACHE_HOME", u.dir.join("cache"))
                .env("HOME", &u.work)
                .env_remove("XDG_RUNTIME_DIR")
                .env_remove("SLUICE_CACHE")
                .current_dir("/");
            (u.sluice.as_path(), u.agent.as_path(), u.gateway.as_path())
        }
    };
    cmd.arg("--")
        .arg(sluice)
        .arg("run")
        .arg(format!("--gateway={}", gateway.display()))
        .args(who.isolation_flags())
        .args(args)
        .env("SLUICE_AGENT", agent)
        .env("SLV_TEST_MARK", mark)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

/// Reads a child's stdout line by line on a thread; lines arrive on the
/// returned channel, and the thread returns everything read.
pub(crate) fn line_reader(
    out: impl std::io::Read + Send + 'static,
) -> (
    std::sync::mpsc::Receiver<String>,
    thread::JoinHandle<String>,
) {
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = thread::spawn(move || {
        let mut all = String::new();
        for line in std::io::BufRead::lines(std::io::BufReader::new(out)) {
            let Ok(line) = line else { break };
            all.push_str(&line);
            all.push('\n');
            let _ = tx.send(line);
        }
        all
    });
    (rx, handle)
}

/// Reads a child's stream to the end on a thread (so a full pipe never
/// blocks the launcher); what was read so far is in the returned buffer.
pub(crate) fn drain(mut out: impl std::io::Read + Send + 'static) -> Arc<Mutex<String>> {
    let buf = Arc::new(Mutex::new(String::new()));
    let keep = Arc::clone(&buf);
    thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        loop {
            match std::io::Read::read(&mut out, &mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => keep.lock().unwrap().push_str(&text(&chunk[..n])),
            }
        }
    });
    buf
}

/// The next line from `lines` matching `pred`, waiting up to `secs`;
/// panics (with `what` and the launcher's stderr so far) when the stream
/// ends or the time is up.
pub(crate) fn wait_line(
    lines: &std::sync::mpsc::Receiver<String>,
    stderr: &Mutex<String>,
    secs: u64,
    what: &str,
    pred: impl Fn(&str) -> bool,
) -> String {
    let until = Instant::now() + Duration::from_secs(secs);
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(l) if pred(&l) => return l,
            Ok(_) => {}
            Err(e) => panic!(
                "waiting for {what}: {e}; sluice's stderr so far:\n{}",
                stderr.lock().unwrap()
            ),
        }
    }
}

/// The schema-1 records of an `--audit` file written so far (none before
/// the gateway creates it). Strict (`sluice_e2e::parse_audit`): a line that
/// does not parse fails the test.
pub(crate) fn audit_records(path: &Path) -> Vec<serde_json::Value> {
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => panic!("{}: {e}", path.display()),
    };
    sluice_e2e::parse_audit(&text).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()))
}

/// The fake internet's resolver and address ranges, for a policy's tail.
/// The fake internet lives in documentation ranges: `internal:` lets DNS
/// answers point there; the TTL floor keeps an answer valid for the connect
/// that follows on a slow TCG guest.
pub(crate) fn world_policy_tail() -> String {
    use sluice_e2e::DNS_ADDR;
    format!(
        "internal:\n  - \"198.51.100.0/24\"\n  - \"203.0.113.0/24\"\n\
         dns:\n  upstream: [{DNS_ADDR}]\n  ttl_min: 600\n  ttl_max: 3600\n"
    )
}

/// `sluice run`'s arguments for a guest shell script: `flags` first, then
/// the policy, the world's CA copied to `/tmp/ca.pem`, and `sh -c script`.
pub(crate) fn run_args(flags: &[&str], policy: &Path, ca: &Path, script: String) -> Vec<String> {
    let mut args: Vec<String> = flags.iter().map(|f| (*f).to_owned()).collect();
    args.extend([
        "--policy".to_owned(),
        policy.display().to_string(),
        "--copy-in".to_owned(),
        format!("{}:/tmp/ca.pem", ca.display()),
        "--".to_owned(),
        "sh".to_owned(),
        "-c".to_owned(),
        script,
    ]);
    args
}

/// One test's world (the guest not connected: `sluice run` boots its own)
/// and what a `sluice run` in it needs.
pub(crate) struct RunWorld {
    pub(crate) agent: PathBuf,
    pub(crate) gateway: PathBuf,
    pub(crate) world: sluice_e2e::World,
    /// The world's directory, for the test's files.
    pub(crate) dir: PathBuf,
}

impl RunWorld {
    /// Starts the world; None when the agent (QEMU) or the gateway binary
    /// is missing and the skip is allowed (the test then returns;
    /// otherwise it has failed).
    pub(crate) fn start() -> Option<Self> {
        let agent = agent()?;
        let gateway = gateway_bin()?;
        let world = sluice_e2e::World::builder()
            .connect_guest(false)
            .start()
            .unwrap();
        let dir = world.dir().to_path_buf();
        Some(Self {
            agent,
            gateway,
            world,
            dir,
        })
    }

    /// `nsenter --net=<the world's host> sluice run --gateway=…`, then
    /// `flags`, then the policy, the world's CA as `/tmp/ca.pem` and
    /// `sh -c script` ([`run_args`]).
    pub(crate) fn run_words(&self, flags: &[&str], policy: &Path, script: String) -> Vec<String> {
        let mut words = vec![
            "nsenter".to_owned(),
            format!("--net=/run/netns/{}", self.world.host.name()),
            SLUICE.to_owned(),
            "run".to_owned(),
            format!("--gateway={}", self.gateway.display()),
        ];
        words.extend(run_args(flags, policy, &self.world.ca_pem(), script));
        words
    }

    /// [`RunWorld::run_words`] behind `env SLUICE_AGENT=… SLV_TEST_MARK=mark`:
    /// a command line for a shell on the prompt's terminal.
    pub(crate) fn env_run_words(
        &self,
        mark: &str,
        flags: &[&str],
        policy: &Path,
        script: String,
    ) -> Vec<String> {
        let mut words = vec![
            "env".to_owned(),
            format!("SLUICE_AGENT={}", self.agent.display()),
            format!("SLV_TEST_MARK={mark}"),
        ];
        words.extend(self.run_words(flags, policy, script));
        words
    }

    /// [`RunWorld::run_words`] started with no terminal: stdin /dev/null,
    /// stdout and stderr piped.
    pub(crate) fn spawn_run(
        &self,
        mark: &str,
        flags: &[&str],
        policy: &Path,
        script: String,
    ) -> Child {
        let words = self.run_words(flags, policy, script);
        Command::new(&words[0])
            .args(&words[1..])
            .env("SLUICE_AGENT", &self.agent)
            .env("SLV_TEST_MARK", mark)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }
}

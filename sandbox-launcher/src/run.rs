//! `sluice run [OPTIONS] -- COMMAND...`: boot a fresh VM, run one command in
//! it with its network behind a `sluice-gateway`, stream its output and exit
//! with its status.
//!
//! Exit status: the command's exit code; 128+N when a signal N killed it;
//! [`EXIT_TIMEOUT`] when `--timeout` expired (the VM is killed);
//! [`EXIT_LAUNCHER`] when the VM could not be set up or booted or a file
//! copy failed after a successful command; [`EXIT_INTERRUPTED`] on Ctrl-C,
//! SIGTERM or SIGHUP.
//!
//! Cleanup: QEMU and the gateway run in their own process groups with a
//! parent-death SIGKILL, and are killed and reaped on every exit path. The
//! launcher creates no files outside the image cache (all channels are
//! socketpairs, an inline policy is a memfd), so a SIGKILL of the launcher
//! leaves nothing behind.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use sluice_agent_proto::{
    CHUNK, ExecRequest, ExitStatus, Message, VERSION, read_frame, write_frame,
};

use crate::image::{self, ImageOptions};
use crate::qemu::{self, AGENT_FD, CONSOLE_FD, NET_FD, VmConfig};
use crate::spawn::{Inherit, kill_group, spawn_child};

/// Exit status when `--timeout` expired.
pub const EXIT_TIMEOUT: i32 = 124;
/// Exit status when the launcher itself failed.
pub const EXIT_LAUNCHER: i32 = 125;
/// Exit status after Ctrl-C, SIGTERM or SIGHUP.
pub const EXIT_INTERRUPTED: i32 = 130;

/// How much of the serial console is kept for `--debug` and boot failures.
const CONSOLE_KEEP: usize = 256 * 1024;
/// How much output `--json` captures per stream.
const JSON_CAPTURE: usize = 16 * 1024 * 1024;

/// Options of `sluice run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Policy file for the gateway (default: the embedded default policy).
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// Allow this domain (repeatable): a small inline policy, instead of --policy.
    #[arg(long = "allow-domain", value_name = "NAME", conflicts_with = "policy")]
    pub allow_domain: Vec<String>,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 256, value_name = "MIB")]
    pub memory: u32,
    /// Guest vCPUs.
    #[arg(long, default_value_t = 1)]
    pub cpus: u32,
    /// Kill the VM after this many seconds (from QEMU start) and exit 124.
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<f64>,
    /// Environment variable for the command (repeatable).
    #[arg(long = "env", short = 'e', value_name = "NAME=VALUE")]
    pub env: Vec<String>,
    /// Working directory of the command in the guest.
    #[arg(long, short = 'w', value_name = "DIR")]
    pub workdir: Option<String>,
    /// Copy a host file into the guest before the command (repeatable).
    #[arg(long = "copy-in", value_name = "HOST:GUEST")]
    pub copy_in: Vec<String>,
    /// Copy a guest file out after the command (repeatable).
    #[arg(long = "copy-out", value_name = "GUEST:HOST")]
    pub copy_out: Vec<String>,
    /// Publish a guest port on the host (passed to the gateway; repeatable).
    #[arg(long, value_name = "SPEC")]
    pub publish: Vec<String>,
    /// Write the gateway's audit log to this file (default: summarised only).
    #[arg(long, value_name = "PATH")]
    pub audit: Option<PathBuf>,
    /// Print one JSON result (exit code, timings, output, audit summary) on
    /// stdout instead of streaming the command's output.
    #[arg(long)]
    pub json: bool,
    /// Stream the guest console and the gateway's log to stderr.
    #[arg(long)]
    pub debug: bool,
    /// The static guest agent binary.
    #[arg(long, env = "SLUICE_AGENT", value_name = "PATH")]
    pub agent: Option<PathBuf>,
    /// The sluice-gateway binary (default: next to this executable).
    #[arg(long, env = "SLUICE_GATEWAY", value_name = "PATH")]
    pub gateway: Option<PathBuf>,
    /// Boot without a gateway: the guest's network link has nobody on it.
    #[arg(long, conflicts_with_all = ["policy", "allow_domain", "publish", "audit", "gateway"])]
    pub no_network: bool,
    /// A root filesystem directory to boot instead of the default userland.
    #[arg(long, value_name = "DIR")]
    pub rootfs: Option<PathBuf>,
    /// The kernel image (default: the newest /boot/vmlinuz-*).
    #[arg(long, value_name = "VMLINUZ")]
    pub kernel: Option<PathBuf>,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// Why the session stopped waiting for the guest.
#[derive(Debug)]
enum Stop {
    Timeout,
    Interrupted,
    Failed(anyhow::Error),
}

impl From<anyhow::Error> for Stop {
    fn from(e: anyhow::Error) -> Self {
        Stop::Failed(e)
    }
}

/// What the agent reader thread reports.
enum Event {
    Msg(Message),
    Closed(Option<String>),
}

/// QEMU and the gateway; killed and reaped when dropped.
#[derive(Default)]
struct Children {
    qemu: Option<Child>,
    gateway: Option<Child>,
}

impl Children {
    /// Waits up to `grace` for QEMU to exit by itself (after the guest
    /// powered off), then kills whatever is left.
    fn finish(&mut self, grace: Duration) {
        if let Some(q) = self.qemu.as_mut() {
            let until = Instant::now() + grace;
            while Instant::now() < until {
                if matches!(q.try_wait(), Ok(Some(_))) {
                    break;
                }
                thread::sleep(Duration::from_millis(20));
            }
        }
        self.kill_all();
    }

    fn kill_all(&mut self) {
        for child in [self.qemu.take(), self.gateway.take()]
            .into_iter()
            .flatten()
        {
            let mut child = child;
            kill_group(child.id(), libc::SIGKILL);
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// Timestamps of the phases, for `--json`.
struct Timings {
    start: Instant,
    qemu_started: Option<Instant>,
    hello: Option<Instant>,
    exec_sent: Option<Instant>,
    first_output: Option<Instant>,
    exited: Option<Instant>,
}

fn ms(a: Instant, b: Option<Instant>) -> Option<u128> {
    b.map(|b| b.saturating_duration_since(a).as_millis())
}

/// Runs `sluice run` and returns the process exit status.
pub fn main(args: RunArgs) -> i32 {
    let interrupted = Arc::new(AtomicBool::new(false));
    for sig in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        if let Err(e) = signal_hook::flag::register(sig, Arc::clone(&interrupted)) {
            eprintln!("sluice: cannot handle signal {sig}: {e}");
            return EXIT_LAUNCHER;
        }
    }
    let mut session = match Session::new(&args, interrupted) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("sluice: {e:#}");
            return EXIT_LAUNCHER;
        }
    };
    let outcome = session.run(&args);
    if outcome.is_ok() {
        // The guest was asked to power off: give it a moment to do so.
        session.children.finish(Duration::from_secs(3));
    } else {
        session.children.kill_all();
    }
    session.report(&args, outcome)
}

/// One VM's run.
struct Session {
    timings: Timings,
    children: Children,
    writer: Arc<Mutex<UnixStream>>,
    events: Receiver<Event>,
    interrupted: Arc<AtomicBool>,
    deadline: Option<Instant>,
    console: Arc<Mutex<Vec<u8>>>,
    audit: Arc<Mutex<Vec<serde_json::Value>>>,
    audit_reader: Option<thread::JoinHandle<()>>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    accel: qemu::Accel,
    image_built: bool,
    has_gateway: bool,
}

impl Session {
    /// Builds or finds the image, spawns the gateway and QEMU.
    fn new(args: &RunArgs, interrupted: Arc<AtomicBool>) -> anyhow::Result<Session> {
        let start = Instant::now();
        let agent = image::find_agent(args.agent.as_deref())?;
        let opts = ImageOptions {
            agent,
            kernel: args.kernel.clone(),
            rootfs: args.rootfs.clone(),
            cache_dir: image::default_cache_dir(),
        };
        let image = image::prepare(&opts, &mut |line| eprintln!("sluice: {line}"))?;
        let qemu_bin = qemu::find_qemu().ok_or_else(|| {
            anyhow!("qemu-system-x86_64 not found: install qemu-system-x86 (scripts/install-deps)")
        })?;
        let accel = qemu::choose_accel();
        if args.debug {
            eprintln!("sluice: accelerator {} ({})", accel.name, accel.reason);
        }

        let (net_host, net_guest) = UnixStream::pair().context("socketpair")?;
        let (agent_host, agent_guest) = UnixStream::pair().context("socketpair")?;
        let (console_host, console_guest) = UnixStream::pair().context("socketpair")?;

        let mut children = Children::default();
        let audit = Arc::new(Mutex::new(Vec::new()));
        let gateway = if args.no_network {
            None
        } else {
            Some(find_gateway(args.gateway.as_deref()).ok_or_else(|| {
                anyhow!(
                    "no sluice-gateway found (--gateway, SLUICE_GATEWAY, or next to sluice); \
                     pass --no-network to run without a network"
                )
            })?)
        };
        let mut audit_reader = None;
        let has_gateway = gateway.is_some();
        match gateway {
            Some(gw) => {
                let (child, reader) =
                    spawn_gateway(&gw, args, OwnedFd::from(net_host), Arc::clone(&audit))?;
                children.gateway = Some(child);
                audit_reader = Some(reader);
            }
            None => {
                // Hold the link open and discard what the guest sends: the
                // guest sees a cable with nobody on it.
                thread::spawn(move || {
                    let mut net_host = net_host;
                    let mut sink = [0u8; 65536];
                    while matches!(net_host.read(&mut sink), Ok(n) if n > 0) {}
                });
            }
        }

        let cfg = VmConfig {
            qemu: qemu_bin,
            accel: accel.clone(),
            kernel: image.kernel.clone(),
            initrd: image.initrd.clone(),
            memory_mib: args.memory,
            cpus: args.cpus,
            verbose_console: args.debug,
        };
        let net_guest = OwnedFd::from(net_guest);
        let agent_guest = OwnedFd::from(agent_guest);
        let console_guest = OwnedFd::from(console_guest);
        let mut cmd = qemu::command(&cfg);
        cmd.stdin(Stdio::null()).stdout(Stdio::null());
        cmd.stderr(Stdio::inherit());
        let qemu_child = spawn_child(
            &mut cmd,
            &[
                Inherit {
                    fd: &net_guest,
                    at: NET_FD,
                },
                Inherit {
                    fd: &agent_guest,
                    at: AGENT_FD,
                },
                Inherit {
                    fd: &console_guest,
                    at: CONSOLE_FD,
                },
            ],
        )
        .context("starting QEMU")?;
        children.qemu = Some(qemu_child);
        drop((net_guest, agent_guest, console_guest));
        let qemu_started = Instant::now();
        let deadline = args
            .timeout
            .map(|s| qemu_started + Duration::from_secs_f64(s.max(0.0)));

        let console = Arc::new(Mutex::new(Vec::new()));
        spawn_console_reader(console_host, Arc::clone(&console), args.debug);

        let reader = agent_host.try_clone().context("cloning the agent socket")?;
        let (tx, events) = mpsc::channel();
        thread::spawn(move || {
            let mut reader = reader;
            loop {
                match read_frame(&mut reader) {
                    Ok(Some(m)) => {
                        if tx.send(Event::Msg(m)).is_err() {
                            return;
                        }
                    }
                    Ok(None) => {
                        let _ = tx.send(Event::Closed(None));
                        return;
                    }
                    Err(e) => {
                        let _ = tx.send(Event::Closed(Some(e.to_string())));
                        return;
                    }
                }
            }
        });

        Ok(Session {
            timings: Timings {
                start,
                qemu_started: Some(qemu_started),
                hello: None,
                exec_sent: None,
                first_output: None,
                exited: None,
            },
            children,
            writer: Arc::new(Mutex::new(agent_host)),
            events,
            interrupted,
            deadline,
            console,
            audit,
            audit_reader,
            stdout: Vec::new(),
            stderr: Vec::new(),
            accel,
            image_built: image.built,
            has_gateway,
        })
    }

    fn send(&self, msg: &Message) -> anyhow::Result<()> {
        let mut w = self
            .writer
            .lock()
            .map_err(|_| anyhow!("agent writer lock poisoned"))?;
        write_frame(&mut *w, msg).context("sending to the guest agent")
    }

    /// The next message from the agent, or why there is none.
    fn next(&self) -> Result<Message, Stop> {
        loop {
            if self.interrupted.load(Ordering::Relaxed) {
                return Err(Stop::Interrupted);
            }
            let mut wait = Duration::from_millis(100);
            if let Some(d) = self.deadline {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(Stop::Timeout);
                }
                wait = wait.min(left);
            }
            match self.events.recv_timeout(wait) {
                Ok(Event::Msg(Message::Error { message })) => {
                    return Err(Stop::Failed(anyhow!("guest agent: {message}")));
                }
                Ok(Event::Msg(m)) => return Ok(m),
                Ok(Event::Closed(reason)) => {
                    return Err(Stop::Failed(anyhow!(
                        "the guest agent closed the session{}",
                        reason.map(|r| format!(": {r}")).unwrap_or_default()
                    )));
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(Stop::Failed(anyhow!("the agent reader stopped")));
                }
            }
        }
    }

    /// Expects `Ack` for the last request.
    fn ack(&self, what: &str) -> Result<(), Stop> {
        match self.next() {
            Ok(Message::Ack) => Ok(()),
            Ok(other) => Err(Stop::Failed(anyhow!("{what}: unexpected answer {other:?}"))),
            Err(Stop::Failed(e)) => Err(Stop::Failed(e.context(what.to_owned()))),
            Err(e) => Err(e),
        }
    }

    /// The whole conversation with the agent.
    fn run(&mut self, args: &RunArgs) -> Result<ExitStatus, Stop> {
        match self.next()? {
            Message::Hello { version } if version == VERSION => {}
            other => {
                return Err(Stop::Failed(anyhow!(
                    "expected the agent's Hello (version {VERSION}), got {other:?}"
                )));
            }
        }
        self.timings.hello = Some(Instant::now());
        self.send(&Message::Hello { version: VERSION })?;

        for spec in &args.copy_in {
            let (host, guest) = spec
                .split_once(':')
                .ok_or_else(|| anyhow!("--copy-in {spec}: expected HOST:GUEST"))?;
            self.copy_in(Path::new(host), guest)?;
        }

        let exec = ExecRequest {
            argv: args.command.clone(),
            env: parse_env(&args.env)?,
            cwd: args.workdir.clone(),
            stdin: true,
        };
        self.send(&Message::Exec(exec))?;
        self.timings.exec_sent = Some(Instant::now());
        self.forward_stdin();
        let status = loop {
            match self.next()? {
                Message::Stdout(d) => self.output(false, &d, args.json),
                Message::Stderr(d) => self.output(true, &d, args.json),
                Message::Exit(s) => break s,
                other => {
                    return Err(Stop::Failed(anyhow!(
                        "unexpected message during exec: {other:?}"
                    )));
                }
            }
        };
        self.timings.exited = Some(Instant::now());

        let mut copy_failed = false;
        for spec in &args.copy_out {
            let result = spec
                .split_once(':')
                .ok_or_else(|| anyhow!("--copy-out {spec}: expected GUEST:HOST"))
                .map_err(Stop::Failed)
                .and_then(|(guest, host)| self.copy_out(guest, Path::new(host)));
            match result {
                Ok(()) => {}
                Err(Stop::Failed(e)) => {
                    eprintln!("sluice: {e:#}");
                    copy_failed = true;
                }
                Err(other) => return Err(other),
            }
        }
        self.send(&Message::Shutdown)?;
        // The agent acks and exits; the guest then powers off.
        let _ = self.ack("shutdown");
        if copy_failed && status == ExitStatus::Code(0) {
            return Err(Stop::Failed(anyhow!("a --copy-out failed")));
        }
        Ok(status)
    }

    fn output(&mut self, err: bool, data: &[u8], json: bool) {
        if self.timings.first_output.is_none() {
            self.timings.first_output = Some(Instant::now());
        }
        if json {
            let buf = if err {
                &mut self.stderr
            } else {
                &mut self.stdout
            };
            let room = JSON_CAPTURE.saturating_sub(buf.len());
            buf.extend_from_slice(&data[..data.len().min(room)]);
            return;
        }
        // A closed stdout/stderr on the host is not the guest's problem.
        if err {
            let mut e = io::stderr().lock();
            let _ = e.write_all(data).and_then(|()| e.flush());
        } else {
            let mut o = io::stdout().lock();
            let _ = o.write_all(data).and_then(|()| o.flush());
        }
    }

    /// Forwards the launcher's stdin to the command until EOF.
    fn forward_stdin(&self) {
        let writer = Arc::clone(&self.writer);
        thread::spawn(move || {
            let mut stdin = io::stdin().lock();
            let mut buf = vec![0u8; CHUNK];
            loop {
                let msg = match stdin.read(&mut buf) {
                    Ok(0) | Err(_) => Message::StdinEof,
                    Ok(n) => Message::Stdin(buf[..n].to_vec()),
                };
                let eof = msg == Message::StdinEof;
                let sent = writer
                    .lock()
                    .map(|mut w| write_frame(&mut *w, &msg).is_ok())
                    .unwrap_or(false);
                if eof || !sent {
                    return;
                }
            }
        });
    }

    fn copy_in(&self, host: &Path, guest: &str) -> Result<(), Stop> {
        let mut f = fs::File::open(host)
            .with_context(|| format!("--copy-in: opening {}", host.display()))?;
        let mode = f
            .metadata()
            .with_context(|| format!("--copy-in: {}", host.display()))?
            .permissions()
            .mode()
            & 0o7777;
        self.send(&Message::CopyIn {
            path: guest.to_owned(),
            mode,
        })?;
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = match f.read(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Keep the session in step, then fail.
                    self.send(&Message::FileEnd)?;
                    let _ = self.ack("copy-in");
                    return Err(Stop::Failed(anyhow!(
                        "--copy-in: reading {}: {e}",
                        host.display()
                    )));
                }
            };
            if n == 0 {
                break;
            }
            self.send(&Message::FileChunk(buf[..n].to_vec()))?;
        }
        self.send(&Message::FileEnd)?;
        self.ack(&format!("--copy-in {} to {guest}", host.display()))
    }

    fn copy_out(&self, guest: &str, host: &Path) -> Result<(), Stop> {
        self.send(&Message::CopyOut {
            path: guest.to_owned(),
        })?;
        let mode = match self.next() {
            Ok(Message::FileStart { mode }) => mode,
            Ok(other) => {
                return Err(Stop::Failed(anyhow!(
                    "--copy-out {guest}: unexpected {other:?}"
                )));
            }
            Err(Stop::Failed(e)) => {
                return Err(Stop::Failed(e.context(format!("--copy-out {guest}"))));
            }
            Err(e) => return Err(e),
        };
        let mut data = Vec::new();
        loop {
            match self.next()? {
                Message::FileChunk(d) => data.extend_from_slice(&d),
                Message::FileEnd => break,
                other => {
                    return Err(Stop::Failed(anyhow!(
                        "--copy-out {guest}: unexpected {other:?}"
                    )));
                }
            }
        }
        fs::write(host, &data)
            .with_context(|| format!("--copy-out: writing {}", host.display()))?;
        fs::set_permissions(host, fs::Permissions::from_mode(mode & 0o777))
            .with_context(|| format!("--copy-out: chmod {}", host.display()))?;
        Ok(())
    }

    /// Prints the result (and on failure the console tail) and returns the
    /// exit status.
    fn report(mut self, args: &RunArgs, outcome: Result<ExitStatus, Stop>) -> i32 {
        let end = Instant::now();
        // The gateway is gone: its audit pipe ends.
        if let Some(r) = self.audit_reader.take() {
            let _ = r.join();
        }
        let (code, status, error) = match &outcome {
            Ok(s) => (s.shell_code(), "exited", None),
            Err(Stop::Timeout) => (
                EXIT_TIMEOUT,
                "timeout",
                Some("the --timeout expired; the VM was killed".to_owned()),
            ),
            Err(Stop::Interrupted) => (
                EXIT_INTERRUPTED,
                "interrupted",
                Some("interrupted; the VM was killed".to_owned()),
            ),
            Err(Stop::Failed(e)) => (EXIT_LAUNCHER, "error", Some(format!("{e:#}"))),
        };
        if let Some(e) = &error {
            eprintln!("sluice: {e}");
            if matches!(outcome, Err(Stop::Failed(_))) && !args.debug {
                let console = self.console.lock().map(|c| c.clone()).unwrap_or_default();
                let text = String::from_utf8_lossy(&console);
                let tail: Vec<&str> = text.lines().rev().take(30).collect();
                eprintln!("sluice: last lines of the guest console:");
                for l in tail.iter().rev() {
                    eprintln!("  {l}");
                }
            }
        }
        if args.json {
            let t = &self.timings;
            let audit = self.audit.lock().map(|a| a.clone()).unwrap_or_default();
            // Schema-1 audit records (docs/audit.md) counted by "kind:reason"
            // (e.g. "dns:dns_answered", "connection:ip_not_resolved_for_name");
            // `denied` counts decision deny, summaries adding what they suppressed.
            let mut by_reason: BTreeMap<String, u64> = BTreeMap::new();
            let mut denied: u64 = 0;
            for rec in &audit {
                let field = |k: &str| rec.get(k).and_then(|v| v.as_str()).unwrap_or("-");
                let key = format!("{}:{}", field("kind"), field("reason"));
                *by_reason.entry(key).or_default() += 1;
                if field("decision") == "deny" {
                    denied += 1;
                }
                if let Some(list) = rec.get("suppressed").and_then(|v| v.as_array()) {
                    denied += list
                        .iter()
                        .filter_map(|s| s.get("count").and_then(|c| c.as_u64()))
                        .sum::<u64>();
                }
            }
            let signal = match outcome {
                Ok(ExitStatus::Signal(s)) => Some(s),
                _ => None,
            };
            let result = serde_json::json!({
                "exit_code": code,
                "status": status,
                "signal": signal,
                "error": error,
                "stdout": String::from_utf8_lossy(&self.stdout),
                "stderr": String::from_utf8_lossy(&self.stderr),
                "timings_ms": {
                    "setup": ms(t.start, t.qemu_started),
                    "boot": t.qemu_started.and_then(|q| ms(q, t.hello)),
                    "first_output": ms(t.start, t.first_output),
                    "run": t.exec_sent.and_then(|x| ms(x, t.exited)),
                    "total": ms(t.start, Some(end)),
                },
                "accelerator": self.accel.name,
                "image_built": self.image_built,
                "network": if self.has_gateway { "sluice-gateway" } else { "none" },
                "audit": {
                    "records": audit.len(),
                    "denied": denied,
                    "by_reason": by_reason,
                },
                "isolation": crate::doctor::layers_summary(),
            });
            let _ = writeln!(io::stdout(), "{result}");
        }
        code
    }
}

fn parse_env(env: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    env.iter()
        .map(|e| {
            let (k, v) = e
                .split_once('=')
                .ok_or_else(|| anyhow!("--env {e}: expected NAME=VALUE"))?;
            if k.is_empty() {
                bail!("--env {e}: empty name");
            }
            Ok((k.to_owned(), v.to_owned()))
        })
        .collect()
}

fn spawn_console_reader(console: UnixStream, keep: Arc<Mutex<Vec<u8>>>, debug: bool) {
    thread::spawn(move || {
        let mut console = console;
        let mut buf = [0u8; 4096];
        loop {
            let n = match console.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if debug {
                let _ = io::stderr().write_all(&buf[..n]);
            }
            if let Ok(mut k) = keep.lock() {
                k.extend_from_slice(&buf[..n]);
                if k.len() > CONSOLE_KEEP {
                    let cut = k.len() - CONSOLE_KEEP;
                    k.drain(..cut);
                }
            }
        }
    });
}

/// The gateway binary: `--gateway`/`SLUICE_GATEWAY`, else `sluice-gateway`
/// next to this executable.
fn find_gateway(explicit: Option<&Path>) -> Option<PathBuf> {
    if let Some(p) = explicit {
        return Some(p.to_owned());
    }
    let exe = std::env::current_exe().ok()?;
    let p = exe.parent()?.join("sluice-gateway");
    p.is_file().then_some(p)
}

/// Spawns `sluice-gateway --fd 3` on the host end of the network
/// socketpair. The policy is `--policy FILE`, or an inline policy in a memfd
/// handed over as `/dev/fd/4`. Audit lines go to `--audit PATH` when given,
/// else to the gateway's stdout, which is read here for the summary.
fn spawn_gateway(
    gateway: &Path,
    args: &RunArgs,
    net: OwnedFd,
    audit: Arc<Mutex<Vec<serde_json::Value>>>,
) -> anyhow::Result<(Child, thread::JoinHandle<()>)> {
    let mut cmd = Command::new(gateway);
    cmd.args(["--fd", &NET_FD.to_string()]);
    cmd.args(["--sandbox-id", &format!("sluice-{}", std::process::id())]);
    let policy_fd = match &args.policy {
        Some(p) => {
            cmd.arg("--policy").arg(p);
            None
        }
        None => {
            let yaml = if args.allow_domain.is_empty() {
                sluice_policy::DEFAULT_POLICY_YAML.to_owned()
            } else {
                // Refuse bad names here, with the policy crate's message,
                // rather than as a gateway start failure.
                let names: Vec<&str> = args.allow_domain.iter().map(String::as_str).collect();
                sluice_policy::from_domains(&names, &sluice_policy::CompileOptions::default())
                    .map_err(|e| anyhow!("--allow-domain: {e}"))?;
                inline_policy(&args.allow_domain)
            };
            let fd = rustix::fs::memfd_create("sluice-policy", rustix::fs::MemfdFlags::CLOEXEC)
                .context("memfd_create")?;
            let mut f = fs::File::from(fd);
            f.write_all(yaml.as_bytes())
                .context("writing the inline policy")?;
            cmd.args(["--policy", "/dev/fd/4"]);
            Some(OwnedFd::from(f))
        }
    };
    match &args.audit {
        Some(p) => {
            cmd.arg("--audit").arg(p);
        }
        None => {
            cmd.args(["--audit", "-"]);
        }
    }
    for p in &args.publish {
        cmd.args(["--publish", p]);
    }
    cmd.args(["--log-format", "human"]);
    cmd.stdin(Stdio::null()).stdout(Stdio::piped());
    if args.debug {
        cmd.stderr(Stdio::inherit());
    } else {
        cmd.stderr(Stdio::null());
    }
    let mut inherit = vec![Inherit {
        fd: &net,
        at: NET_FD,
    }];
    if let Some(fd) = &policy_fd {
        inherit.push(Inherit { fd, at: 4 });
    }
    let mut child = spawn_child(&mut cmd, &inherit)
        .with_context(|| format!("starting {}", gateway.display()))?;
    let stdout = child.stdout.take();
    let debug = args.debug;
    let reader = thread::spawn(move || {
        let Some(out) = stdout else { return };
        let mut lines = io::BufReader::new(out);
        let mut line = String::new();
        while matches!(io::BufRead::read_line(&mut lines, &mut line), Ok(n) if n > 0) {
            if debug {
                eprint!("sluice-gateway audit: {line}");
            }
            if let (Ok(v), Ok(mut a)) = (
                serde_json::from_str::<serde_json::Value>(&line),
                audit.lock(),
            ) {
                a.push(v);
            }
            line.clear();
        }
    });
    Ok((child, reader))
}

/// A policy allowing exactly these domains (HTTPS), the same document
/// `sluice_policy::from_domains` compiles.
fn inline_policy(domains: &[String]) -> String {
    let mut y = String::from("version: 1\nid: allow-domain\nlabel: \"--allow-domain\"\nallow:\n");
    for d in domains {
        y.push_str(&format!(
            "  - domain: {}\n",
            serde_json::Value::String(d.clone())
        ));
    }
    y
}

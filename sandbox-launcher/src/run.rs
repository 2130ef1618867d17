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
//! launcher's channels are socketpairs and pipes; its only files outside the
//! image cache are in the run dir (inline policy, CA), which the gateway's
//! jail helper removes after the gateway ends, so a SIGKILL of the launcher
//! leaves nothing behind. The guest's link (`network_mode`: socketpairs, or
//! with `--network tap` a network namespace nothing names) goes with the
//! last descriptor of it.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
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
use crate::jail::FdMap;
use crate::network_mode::{self, GuestNetwork, HeldNetwork, NetworkMode};
use crate::phases::Phases;
use crate::qemu::{self, AGENT_FD, CONSOLE_FD, NET_FD, VmConfig};
use crate::spawn::{Isolation, QemuJail, Sidecar, qemu_spec};
use gateway::{GatewayHandles, spawn_gateway};
use run_dir::{RunDir, make_run_dir};
use terminal::{DebugEcho, GuestOutput};

mod args;
mod gateway;
mod isolation;
mod logs;
mod run_dir;
pub(crate) mod terminal;

pub use args::RunArgs;
use isolation::{check_isolation, isolation_summary};
use logs::{log_tail, spawn_console_reader, spawn_log_reader};

/// Exit status when `--timeout` expired.
pub const EXIT_TIMEOUT: i32 = 124;
/// Exit status when the launcher itself failed.
pub const EXIT_LAUNCHER: i32 = 125;
/// Exit status after Ctrl-C, SIGTERM or SIGHUP.
pub const EXIT_INTERRUPTED: i32 = 130;

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

/// QEMU and the gateway, each jailed; killed, reaped and cleaned up (by
/// their helpers) when dropped.
#[derive(Default)]
struct Children {
    qemu: Option<Sidecar>,
    gateway: Option<Sidecar>,
}

impl Children {
    /// Waits up to `grace` for QEMU to exit by itself (after the guest
    /// powered off), then kills whatever is left.
    fn finish(&mut self, grace: Duration) {
        if let Some(q) = self.qemu.as_mut() {
            let _ = q.wait_timeout(grace);
        }
        self.kill_all();
    }

    /// Kills QEMU, then the gateway, each waiting for its helper's cleanup.
    fn kill_all(&mut self) {
        for mut child in [self.qemu.take(), self.gateway.take()]
            .into_iter()
            .flatten()
        {
            child.kill();
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
    /// Every phase's mark, for `phases_ms` and `SLUICE_BOOT_TIMES`.
    phases: Phases,
    children: Children,
    writer: Arc<Mutex<UnixStream>>,
    events: Receiver<Event>,
    interrupted: Arc<AtomicBool>,
    deadline: Option<Instant>,
    console: Arc<Mutex<Vec<u8>>>,
    qemu_log: Arc<Mutex<Vec<u8>>>,
    gateway: Option<GatewayHandles>,
    /// Where the guest's stdout and stderr go (`terminal`).
    guest_output: GuestOutput,
    accel: qemu::Accel,
    image_built: bool,
    /// The run dir (policy, CA); the gateway's helper removes it too.
    run_dir: Option<RunDir>,
    /// The isolation layers of both jails, for `--json`.
    isolation: serde_json::Value,
    /// The guest link's mode and (tap) its namespace, held until the run
    /// ends (`network_mode`); `None` with `--no-network`.
    network: Option<HeldNetwork>,
    /// When the launcher first saw the gateway gone (`next`).
    gateway_gone: std::sync::OnceLock<Instant>,
}

/// How long, after the gateway is gone, the guest's output is still passed
/// on before the run fails: lines it wrote before (or as) the network went
/// away are not lost.
const GATEWAY_GONE_GRACE: Duration = Duration::from_secs(1);

/// Messages from the agent read ahead of the session's loop.
const EVENTS_QUEUED: usize = 16;

/// How long to wait for the gateway's "starting" line before giving the
/// guest its CA (the gateway writes the CA before it starts serving).
const GATEWAY_READY_WAIT: Duration = Duration::from_secs(30);

impl Session {
    /// Builds or finds the image, spawns the gateway and QEMU, each jailed.
    fn new(args: &RunArgs, interrupted: Arc<AtomicBool>) -> anyhow::Result<Session> {
        let start = Instant::now();
        let phases = Phases::new(start);
        // Before any work: a run that would be refused says so at once.
        check_isolation(&args.allow_missing_isolation.iter().copied().collect())?;
        let mode = (!args.no_network)
            .then(|| network_mode::choose(args.network))
            .transpose()?;
        let agent = image::find_agent(args.agent.as_deref())?;
        let opts = ImageOptions {
            agent,
            kernel: args.kernel.clone(),
            rootfs: args.rootfs.clone(),
            cache_dir: image::default_cache_dir(),
            shared_cache: image::shared_cache_dir(),
        };
        let image = image::prepare(&opts, &mut |line| eprintln!("sluice: {line}"))?;
        phases.mark("image_ready");
        let qemu_bin = qemu::find_qemu().ok_or_else(|| {
            anyhow!("qemu-system-x86_64 not found: install qemu-system-x86 (scripts/install-deps)")
        })?;
        let qemu_bin = fs::canonicalize(&qemu_bin)
            .with_context(|| format!("resolving {}", qemu_bin.display()))?;
        let accel = qemu::choose_accel();
        if args.debug {
            eprintln!("sluice: accelerator {} ({})", accel.name, accel.reason);
        }
        let iso = Isolation {
            allow_missing: args.allow_missing_isolation.iter().copied().collect(),
            helper: None,
        };

        let sandbox_id = format!("sluice-{}", std::process::id());

        // Declared before `children`: on an error below, QEMU and the
        // gateway are killed before the link's namespace is let go.
        let (net_guest, net_gateway, held) = if let Some(mode) = mode {
            let net = GuestNetwork::open(
                mode,
                sluice_gateway::config::DEFAULT_MTU,
                &iso.allow_missing,
            )?;
            if args.debug {
                eprintln!("sluice: network mode {}", mode.name());
            }
            (net.qemu, net.gateway, Some(net.held))
        } else {
            let (host, guest) = UnixStream::pair().context("socketpair")?;
            (OwnedFd::from(guest), OwnedFd::from(host), None)
        };
        let (agent_host, agent_guest) = UnixStream::pair().context("socketpair")?;
        let (console_host, console_guest) = UnixStream::pair().context("socketpair")?;

        // Before QEMU starts: a missing gateway is an error, not a boot.
        let gateway_bin = if args.no_network {
            None
        } else {
            Some(find_gateway(args.gateway.as_deref()).ok_or_else(|| {
                anyhow!(
                    "no sluice-gateway found (--gateway, SLUICE_GATEWAY, or next to sluice); \
                     pass --no-network to run without a network"
                )
            })?)
        };
        let mut children = Children::default();
        let cfg = VmConfig {
            qemu: qemu_bin,
            accel: accel.clone(),
            kernel: image.kernel.clone(),
            initrd: image.initrd.clone(),
            memory_mib: args.memory,
            cpus: args.cpus,
            verbose_console: args.debug,
            network: held.as_ref().map_or(NetworkMode::Stream, HeldNetwork::mode),
        };
        let agent_guest = OwnedFd::from(agent_guest);
        let console_guest = OwnedFd::from(console_guest);
        let (qemu_err_read, qemu_err_write) = io::pipe().context("pipe")?;
        let qemu_log = Arc::new(Mutex::new(Vec::new()));
        // Under `--ask`, held while a question is shown once the prompt's
        // gate exists (below). The console is the guest's to write (not
        // escaped, as its output); QEMU's log is escaped, as the
        // gateway's: a compromised QEMU is not trusted with the terminal.
        let echo = args.debug.then(|| DebugEcho::new(None, false));
        let qemu_echo = echo.as_ref().map(|e| e.escaping(args.ask));
        spawn_log_reader(qemu_err_read, Arc::clone(&qemu_log), qemu_echo, "qemu");
        let fd = |f: &dyn AsRawFd, child| FdMap {
            parent: f.as_raw_fd(),
            child,
        };
        let spec = qemu_spec(
            &QemuJail {
                name: format!("{sandbox_id}-qemu"),
                qemu: &cfg.qemu,
                args: qemu::args(&cfg),
                files: vec![cfg.kernel.clone(), cfg.initrd.clone()],
                accel: accel.name,
                memory_mib: args.memory,
                cpus: args.cpus,
                fds: vec![
                    fd(&qemu_err_write, 2),
                    fd(&net_guest, NET_FD),
                    fd(&agent_guest, AGENT_FD),
                    fd(&console_guest, CONSOLE_FD),
                ],
                sandbox_id: sandbox_id.clone(),
            },
            &iso,
        )
        .context("QEMU's jail")?;
        let qemu_child = Sidecar::spawn("QEMU", &spec).context("starting QEMU in its jail")?;
        children.qemu = Some(qemu_child);
        drop((net_guest, agent_guest, console_guest, qemu_err_write));
        let qemu_started = Instant::now();
        phases.mark("qemu_started");
        let console = Arc::new(Mutex::new(Vec::new()));
        spawn_console_reader(
            console_host,
            Arc::clone(&console),
            echo.clone(),
            phases.clone(),
        );
        // The gateway starts while the guest kernel boots (it is ready long
        // before the guest's first DHCP packet, which waits in the link's
        // socket buffer until then): its jail set-up is off the boot path.
        // Its inputs are still checked before the guest can use the network;
        // an error here kills QEMU like any other.
        let mut run_dir = None;
        let gateway = if let Some(gw) = gateway_bin {
            let dir = make_run_dir(&sandbox_id)?;
            let (sidecar, handles) = spawn_gateway(
                &gw,
                args,
                &dir.0,
                &sandbox_id,
                (net_gateway, held.as_ref()),
                &iso,
            )?;
            run_dir = Some(dir);
            children.gateway = Some(sidecar);
            phases.mark("gateway_started");
            Some(handles)
        } else {
            // Hold the link open and discard what the guest sends: the
            // guest sees a cable with nobody on it.
            let net_host = UnixStream::from(net_gateway);
            thread::spawn(move || {
                let mut net_host = net_host;
                let mut sink = [0u8; 65536];
                while matches!(net_host.read(&mut sink), Ok(n) if n > 0) {}
            });
            None
        };

        let deadline = args
            .timeout
            .map(|s| qemu_started + Duration::from_secs_f64(s.max(0.0)));

        let reader = agent_host.try_clone().context("cloning the agent socket")?;
        // Bounded: while the guest's output waits (an `--ask` question with
        // a full hold) the reader stops too, and the agent's writes wait.
        let (tx, events) = mpsc::sync_channel(EVENTS_QUEUED);
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

        let gate = gateway
            .as_ref()
            .and_then(|g| g.ask.as_ref())
            .and_then(crate::ask::AskServer::gate);
        if let (Some(echo), Some(gate)) = (&echo, &gate) {
            echo.attach(Arc::clone(gate));
        }
        let isolation =
            isolation_summary(&children, gateway.as_ref().map(|g| g.egress_floor.as_str()));
        Ok(Session {
            timings: Timings {
                start,
                qemu_started: Some(qemu_started),
                hello: None,
                exec_sent: None,
                first_output: None,
                exited: None,
            },
            phases,
            writer: Arc::new(Mutex::new(agent_host)),
            events,
            interrupted,
            deadline,
            console,
            qemu_log,
            gateway,
            guest_output: GuestOutput::new(args.json, gate),
            accel,
            image_built: image.built,
            isolation,
            children,
            run_dir,
            network: held,
            gateway_gone: std::sync::OnceLock::new(),
        })
    }

    /// Gives the guest the sandbox CA when the policy inspects a host: waits
    /// for the gateway to be ready (it writes the CA, exactly when the policy
    /// inspects a host, before it serves), then sends `InstallCa`. No CA file
    /// means the policy inspects nothing: the guest gets no CA.
    fn install_ca(&self) -> Result<bool, Stop> {
        let Some(gw) = &self.gateway else {
            return Ok(false);
        };
        let ca = &gw.ca_out;
        let until = Instant::now() + GATEWAY_READY_WAIT;
        loop {
            if self.interrupted.load(Ordering::Relaxed) {
                return Err(Stop::Interrupted);
            }
            match gw.ready.recv_timeout(Duration::from_millis(100)) {
                Ok(at) => {
                    self.phases.mark_at("gateway_ready", at);
                    break;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(Stop::Failed(anyhow!(
                        "the gateway exited before it was ready{}",
                        log_tail(&gw.log)
                    )));
                }
                Err(RecvTimeoutError::Timeout) if Instant::now() < until => {}
                Err(RecvTimeoutError::Timeout) => {
                    return Err(Stop::Failed(anyhow!(
                        "the gateway was not ready after {GATEWAY_READY_WAIT:?}{}",
                        log_tail(&gw.log)
                    )));
                }
            }
        }
        if !ca.exists() {
            return Ok(false);
        }
        let pem = run_dir::read_written(ca, MAX_CA_PEM).map_err(|e| {
            Stop::Failed(anyhow!(
                "the gateway's sandbox CA {} cannot be read: {e}{}",
                ca.display(),
                log_tail(&gw.log)
            ))
        })?;
        if pem.len() > MAX_CA_PEM {
            return Err(Stop::Failed(anyhow!(
                "the sandbox CA {} is larger than {MAX_CA_PEM} bytes",
                ca.display()
            )));
        }
        self.send(&Message::InstallCa { pem })?;
        self.ack("installing the sandbox CA in the guest")?;
        Ok(true)
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
            // Without its gateway the guest would wait for a network that
            // is gone: fail with the gateway's last words instead, once
            // what the guest said until then (read or still in flight) is
            // passed on, for at most GATEWAY_GONE_GRACE.
            if let (Some(gw), Some(g)) = (self.children.gateway.as_ref(), &self.gateway)
                && gw.has_exited()
            {
                let since = *self.gateway_gone.get_or_init(Instant::now);
                let left = GATEWAY_GONE_GRACE.saturating_sub(since.elapsed());
                if let Ok(Event::Msg(m)) = self.events.recv_timeout(left)
                    && !matches!(m, Message::Error { .. })
                {
                    return Ok(m);
                }
                return Err(Stop::Failed(anyhow!(
                    "the gateway exited while the VM was running{}",
                    log_tail(&g.log)
                )));
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
        self.phases.mark("agent_hello");
        self.send(&Message::Hello { version: VERSION })?;
        self.install_ca()?;

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
        self.phases.mark("command_sent");
        let keys = self
            .gateway
            .as_mut()
            .and_then(|g| g.ask.as_mut())
            .and_then(crate::ask::AskServer::take_keys);
        terminal::forward_stdin(Arc::clone(&self.writer), keys);
        let status = loop {
            match self.next()? {
                Message::Stdout(d) => self.output(false, &d)?,
                Message::Stderr(d) => self.output(true, &d)?,
                Message::Exit(s) => break s,
                other => {
                    return Err(Stop::Failed(anyhow!(
                        "unexpected message during exec: {other:?}"
                    )));
                }
            }
        };
        self.timings.exited = Some(Instant::now());
        self.phases.mark("command_exited");
        self.guest_output.release();

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

    /// The guest's output: timed (its first byte), then passed on. While
    /// an `--ask` question holds it and the hold is full, this waits for the
    /// answer (the guest's output is not read meanwhile), or the run's end.
    fn output(&mut self, err: bool, data: &[u8]) -> Result<(), Stop> {
        if self.timings.first_output.is_none() {
            self.timings.first_output = Some(Instant::now());
            self.phases.mark("first_output");
        }
        let (interrupted, deadline) = (&self.interrupted, self.deadline);
        // A gateway that died while the output waits for a question's
        // answer will never withdraw it: stop as `next()` would.
        let (gw, handles) = (self.children.gateway.as_ref(), self.gateway.as_ref());
        self.guest_output.write(err, data, || {
            if interrupted.load(Ordering::Relaxed) {
                Err(Stop::Interrupted)
            } else if deadline.is_some_and(|d| Instant::now() >= d) {
                Err(Stop::Timeout)
            } else if let (Some(gw), Some(g)) = (gw, handles)
                && gw.has_exited()
            {
                Err(Stop::Failed(anyhow!(
                    "the gateway exited while an --ask question held the guest's output{}",
                    log_tail(&g.log)
                )))
            } else {
                Ok(())
            }
        })
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
        self.phases.mark("vm_stopped");
        self.guest_output.release();
        // Both sidecars are gone (killed by the caller, waited for here):
        // the audit pipe has ended.
        self.children.kill_all();
        self.phases.print_if_asked();
        let audit = match self.gateway.as_mut() {
            Some(g) => {
                if let Some(r) = g.audit_reader.take() {
                    let _ = r.join();
                }
                g.audit.lock().map(|a| a.clone()).unwrap_or_default()
            }
            None => Vec::new(),
        };
        drop(self.run_dir.take());
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
                let qemu = log_tail(&self.qemu_log);
                if !qemu.is_empty() {
                    eprintln!("sluice: QEMU said{qemu}");
                }
            }
        }
        if !args.json
            && let Some(line) = self
                .gateway
                .as_ref()
                .and_then(|g| g.ask.as_ref())
                .and_then(crate::ask::AskServer::summary_line)
        {
            eprintln!("{line}");
        }
        if args.json {
            let t = &self.timings;
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
                    // Summaries count allow records too: only denials add.
                    denied += list
                        .iter()
                        .filter(|s| {
                            s.get("reason")
                                .and_then(|r| r.as_str())
                                .and_then(sluice_policy::Reason::from_name)
                                .is_some_and(|r| r.decision() == sluice_policy::Decision::Deny)
                        })
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
                "stdout": String::from_utf8_lossy(self.guest_output.captured(false)),
                "stderr": String::from_utf8_lossy(self.guest_output.captured(true)),
                "timings_ms": {
                    "setup": ms(t.start, t.qemu_started),
                    "boot": t.qemu_started.and_then(|q| ms(q, t.hello)),
                    "first_output": ms(t.start, t.first_output),
                    "run": t.exec_sent.and_then(|x| ms(x, t.exited)),
                    "total": ms(t.start, Some(end)),
                },
                "phases_ms": self.phases.to_json(),
                "accelerator": self.accel.name,
                "image_built": self.image_built,
                "network": if self.gateway.is_some() { "sluice-gateway" } else { "none" },
                "network_mode": self.network.as_ref().map(HeldNetwork::summary),
                "audit": {
                    "records": audit.len(),
                    "denied": denied,
                    "by_reason": by_reason,
                },
                "isolation": self.isolation,
                "approval": self
                    .gateway
                    .as_ref()
                    .and_then(|g| g.ask.as_ref())
                    .map(crate::ask::AskServer::summary),
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

/// The largest CA PEM handed to the guest.
const MAX_CA_PEM: usize = 64 * 1024;

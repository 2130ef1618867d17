//! The gateway of a `sluice run`: its arguments, the files its jail binds,
//! the egress floor under it, and the launcher's readers of its audit
//! lines, log and readiness.

use std::fs;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};

use super::RunArgs;
use super::logs::spawn_log_reader;
use crate::egress_floor;
use crate::gateway_inputs::{
    FileView, approval_inputs, secret_inputs, without_covered, write_for_jail,
};
use crate::jail::{FdMap, Layer};
use crate::network_mode::HeldNetwork;
use crate::qemu::NET_FD;
use crate::spawn::{GatewayJail, Isolation, Sidecar, gateway_spec};
use sluice_floor::egress::EgressFloor;
use sluice_gateway::args::{GatewayArgs, LogFormat};
use sluice_gateway::flow::Transport;
use sluice_gateway::metrics::{MetricsAddr, MetricsListener};

/// The launcher's side of the gateway: its audit lines, log and readiness.
pub(super) struct GatewayHandles {
    pub(super) audit: Arc<Mutex<Vec<serde_json::Value>>>,
    pub(super) audit_reader: Option<thread::JoinHandle<()>>,
    pub(super) log: Arc<Mutex<Vec<u8>>>,
    /// When the gateway wrote its ready line; disconnected when it
    /// closed the pipe without one (it stopped first).
    pub(super) ready: Receiver<Instant>,
    /// Where the gateway writes the sandbox CA if the policy inspects a
    /// host (the gateway decides; no file otherwise).
    pub(super) ca_out: PathBuf,
    /// The egress floor's state, for `--json` (`on: ...` / `off: why`).
    pub(super) egress_floor: String,
    /// `--ask`: the prompt the gateway's questions go to.
    pub(super) ask: Option<crate::ask::AskServer>,
}

/// The gateway's end of its readiness pipe (`--ready-fd`).
const READY_FD: i32 = 4;

/// The gateway's metrics listener (`--metrics fd:5`), when `--metrics` is given.
const METRICS_FD: i32 = 5;

/// `--metrics`: an address or a unix path; `fd:N` is the gateway's alone.
pub(super) fn parse_metrics_addr(s: &str) -> Result<MetricsAddr, String> {
    match s.parse::<MetricsAddr>() {
        Ok(MetricsAddr::Fd(_)) => Err("expected [HOST:]PORT or unix:PATH".to_owned()),
        Ok(a) => Ok(a),
        Err(e) => Err(e.to_string()),
    }
}

/// Spawns `sluice-gateway --fd 3` in its jail on the gateway's end of the
/// guest's link (with `--dgram` or `--packet` as the link's mode says;
/// `network_mode`). The policy is `--policy FILE` (its directory bound
/// read-only into the jail, so reload sees a rename-replace:
/// `gateway_inputs`) or an inline policy written into the run dir. The
/// policy's secret files are bound the same way and its `env:` secrets'
/// variables passed from this process's environment. `--ca-out` is passed
/// when the policy inspects a host, `--upstream-ca` copies from the run dir.
/// Audit lines come on the gateway's stdout: they are summarised here and,
/// with `--audit PATH`, appended to that file by the launcher (the gateway
/// itself writes no file but the CA).
pub(super) fn spawn_gateway(
    gateway: &Path,
    args: &RunArgs,
    run_dir: &Path,
    sandbox_id: &str,
    (net, link): (OwnedFd, Option<&HeldNetwork>),
    iso: &Isolation,
) -> anyhow::Result<(Sidecar, GatewayHandles)> {
    let gateway =
        fs::canonicalize(gateway).with_context(|| format!("resolving {}", gateway.display()))?;
    let mut gw_args = GatewayArgs::with_fd(NET_FD);
    if let Some(link) = link {
        link.gateway_args(&mut gw_args, NET_FD);
    }
    gw_args.sandbox_id = sandbox_id.to_owned();
    let compile = sluice_policy::CompileOptions::default();
    // What the gateway's jail binds read-only: the policy (its directory,
    // so that reload sees a file replaced by rename) and secret files.
    let mut read = Vec::new();
    let (policy_path, compiled) = match &args.policy {
        Some(p) => {
            let view =
                FileView::of_policy(p).with_context(|| format!("--policy {}", p.display()))?;
            if let Some(why) = &view.file_only {
                eprintln!(
                    "sluice: --policy {}: binding the file alone into the gateway's jail ({why}): \
                     a reload sees edits made in place, not a file replaced by rename",
                    p.display()
                );
            }
            let compiled = sluice_policy::load_file(&view.path, &compile)
                .map_err(|e| anyhow!("invalid policy {}:\n{e}", view.path.display()))?;
            read.push(view.bind);
            // A file bound alone hides its overlay: bind that too (a new
            // one appears only for the next run; approved.rs).
            let overlay = sluice_policy::overlay::overlay_path(&view.path);
            if view.file_only.is_some() && overlay.is_file() {
                read.push(overlay);
            }
            (view.path, compiled)
        }
        None => {
            let (yaml, compiled) = if args.allow_domain.is_empty() {
                let compiled = sluice_policy::default_policy(&compile)
                    .map_err(|e| anyhow!("the default policy: {e}"))?;
                (sluice_policy::DEFAULT_POLICY_YAML.to_owned(), compiled)
            } else {
                // Refuse bad names here, with the policy crate's message,
                // rather than as a gateway start failure.
                let names: Vec<&str> = args.allow_domain.iter().map(String::as_str).collect();
                let compiled = sluice_policy::from_domains(&names, &compile)
                    .map_err(|e| anyhow!("--allow-domain: {e}"))?;
                (sluice_policy::allow_domains_yaml(&names), compiled)
            };
            let p = run_dir.join("policy.yaml");
            write_for_jail(&p, yaml.as_bytes())?;
            (p, compiled)
        }
    };
    gw_args.policy = Some(policy_path);
    // The policy's resolvers (`dns.upstream`) are read by the gateway from
    // the policy itself, so that a reload can change them.
    let secrets = secret_inputs(&compiled)?;
    for (path, why) in &secrets.file_only {
        eprintln!(
            "sluice: secret file {}: binding the file alone into the gateway's jail ({why}): \
             a reload sees it rewritten in place, not replaced by rename",
            path.display()
        );
    }
    read.extend(secrets.read);
    if !args.ask {
        read.extend(approval_inputs(&compiled)?);
    }
    // The gateway decides whether the policy needs a sandbox CA (it inspects
    // a host: a bound secret or `inspect:`) and writes it before it serves.
    let ca_out = super::run_dir::ca_out(run_dir);
    gw_args.ca_out = Some(ca_out.clone());
    for (i, pem) in args.upstream_ca.iter().enumerate() {
        let data = fs::read(pem).with_context(|| format!("--upstream-ca {}", pem.display()))?;
        let copy = run_dir.join(format!("upstream-ca-{i}.pem"));
        write_for_jail(&copy, &data)?;
        gw_args.upstream_ca.push(copy);
    }
    gw_args.audit = "-".to_owned();
    gw_args.audit_format = args.audit_format;
    gw_args.publish.clone_from(&args.publish);
    gw_args.allow_missing_landlock = iso.allow_missing.contains(&Layer::Landlock);
    gw_args.log_format = LogFormat::Human;
    gw_args.ready_fd = Some(READY_FD);
    // Bound here, where the path or port is the operator's, not inside the
    // jail (which has neither the path's directory nor a TCP bind right).
    let metrics = match &args.metrics {
        Some(addr) => {
            let listener =
                egress_floor::bind_metrics(addr).with_context(|| format!("--metrics {addr}"))?;
            let bound = listener.local_addr().context("--metrics")?;
            eprintln!("sluice: gateway metrics at {bound} (/metrics)");
            gw_args.metrics = Some(MetricsAddr::Fd(METRICS_FD));
            Some(listener)
        }
        None => None,
    };
    let ask = if args.ask {
        let server = crate::ask::AskServer::start(run_dir, args.json)?;
        gw_args.approval_socket = Some(server.socket.clone());
        Some(server)
    } else {
        None
    };
    // `always` answers are written beside the policy by the launcher: the
    // gateway's jail keeps the policy's directory read-only (approved.rs).
    if let Some(policy) = args.policy.as_ref().and(gw_args.policy.clone()) {
        let prompt = ask.as_ref().map(crate::ask::AskServer::served);
        let writer =
            crate::approved::OverlayWriter::start(run_dir, policy, sandbox_id.to_owned(), prompt)?;
        gw_args.approval_overlay_socket = Some(writer.socket);
    }
    // The kernel floor under the gateway's own egress: installed before the
    // gateway exists, its removal handed to the gateway's jail supervisor
    // once the gateway runs (egress_floor.rs).
    // The ports the gateway listens on: its replies from them are not its
    // own egress.
    let reply_ports: Vec<u16> = args
        .publish
        .iter()
        .map(|p| p.host.port())
        .chain(match metrics.as_ref().map(MetricsListener::local_addr) {
            Some(Ok(MetricsAddr::Tcp(a))) => Some(a.port()),
            _ => None,
        })
        .collect();
    // The webhook is resolved here, once: the floor opens those addresses
    // and the gateway connects only there (`--approval-webhook-addr`).
    let pin = egress_floor::pin_webhook(
        &compiled,
        &sluice_gateway::decide::host_addresses(),
        args.ask,
    );
    let openings = egress_floor::Openings {
        reply_ports,
        webhook: pin.as_ref().map(|p| p.addrs.clone()).unwrap_or_default(),
    };
    if let Some(pin) = pin {
        gw_args.approval_webhook_name = Some(pin.host);
        gw_args.approval_webhook_addr = pin.addrs;
    }
    let (floor, egress_floor) =
        egress_floor::install_for_run(&compiled, &iso.allow_missing, &openings)?;
    let floor_gid = floor.as_ref().map(|_| egress_floor::gateway_gid());

    let argv = gw_args
        .to_argv()
        .into_iter()
        .map(|a| {
            a.into_string()
                .map_err(|a| anyhow!("a gateway argument is not UTF-8: {}", a.display()))
        })
        .collect::<anyhow::Result<Vec<String>>>()?;

    let (audit_read, audit_write) = io::pipe().context("pipe")?;
    let (log_read, log_write) = io::pipe().context("pipe")?;
    let (ready_read, ready_write) = io::pipe().context("pipe")?;
    let mut spec = gateway_spec(
        &GatewayJail {
            name: format!("{sandbox_id}-gateway"),
            gateway: &gateway,
            args: argv,
            read: without_covered(read),
            env: secrets.env,
            run_dir,
            tcp_bind: args
                .publish
                .iter()
                .filter(|p| p.proto == Transport::Tcp)
                .map(|p| p.host.port())
                .collect(),
            fds: vec![
                FdMap {
                    parent: audit_write.as_raw_fd(),
                    child: 1,
                },
                FdMap {
                    parent: log_write.as_raw_fd(),
                    child: 2,
                },
                FdMap {
                    parent: net.as_raw_fd(),
                    child: NET_FD,
                },
                FdMap {
                    parent: ready_write.as_raw_fd(),
                    child: READY_FD,
                },
            ]
            .into_iter()
            .chain(metrics.as_ref().map(|m| FdMap {
                parent: m.as_fd().as_raw_fd(),
                child: METRICS_FD,
            }))
            .collect(),
            sandbox_id: sandbox_id.to_owned(),
        },
        iso,
    )
    .context("the gateway's jail")?;
    if !crate::jail::is_rootless() {
        // Its own gid, for the floor's match and the run dir's sockets
        // (`run_dir`: no other process is in that group); the jail's group
        // (65534) as a supplementary one, so files shared with it stay
        // readable (`chgrp 65534 FILE && chmod g+r FILE`, docs/launcher.md).
        spec.groups = vec![spec.gid];
        spec.gid = egress_floor::gateway_gid();
    }
    if let Some(floor) = &floor {
        spec.egress_floor = Some(floor.table().to_owned());
    }
    let sidecar = Sidecar::spawn("the gateway", &spec)
        .with_context(|| format!("starting {} in its jail", gateway.display()))?;
    // From here the supervisor removes the floor when the gateway ends (on
    // an error above, dropping `floor` removed it).
    let _table = floor.map(EgressFloor::hand_off);
    drop((audit_write, log_write, ready_write, net, metrics));

    let log = Arc::new(Mutex::new(Vec::new()));
    // Under `--ask`, held while a question is shown, and escaped: a
    // gateway is not trusted to write to the prompt's terminal.
    let echo = args.debug.then(|| {
        super::terminal::DebugEcho::new(
            ask.as_ref().and_then(crate::ask::AskServer::gate),
            args.ask,
        )
    });
    spawn_log_reader(log_read, Arc::clone(&log), echo.clone(), "gateway");
    let ready = spawn_ready_reader(ready_read);
    let audit = Arc::new(Mutex::new(Vec::new()));
    let mut audit_file = match &args.audit {
        Some(p) => Some(
            fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .with_context(|| format!("--audit {}", p.display()))?,
        ),
        None => None,
    };
    let keep = Arc::clone(&audit);
    // A reload the gateway applied may name other networks: the floor
    // follows the policy file (an inline policy never reloads).
    let refresh = floor_gid
        .filter(|_| args.policy.is_some())
        .zip(gw_args.policy.clone())
        .map(|(gid, path)| spawn_floor_refresher(path, gid, openings))
        .transpose()?;
    let audit_reader = thread::spawn(move || {
        let mut lines = io::BufReader::new(audit_read);
        let mut line = String::new();
        while matches!(io::BufRead::read_line(&mut lines, &mut line), Ok(n) if n > 0) {
            if let Some(echo) = &echo {
                echo.line(&format!("sluice: gateway audit: {line}"));
            }
            if let Some(f) = audit_file.as_mut()
                && let Err(e) = f.write_all(line.as_bytes())
            {
                eprintln!("sluice: --audit: {e}; no more lines written there");
                audit_file = None;
            }
            if let (Ok(v), Ok(mut a)) = (
                serde_json::from_str::<serde_json::Value>(&line),
                keep.lock(),
            ) {
                // The --json summary counts schema-1 fields, in either format.
                let v = crate::audit_cmd::entry::schema1_view(v);
                // Only a nudge: the gateway writes this line, so it may
                // forge it; the refresher decides whether anything changed.
                if v["kind"] == "policy_reload"
                    && v["reason"] == "reload_applied"
                    && let Some(refresh) = &refresh
                {
                    let _ = refresh.try_send(());
                }
                a.push(v);
            }
            line.clear();
        }
    });
    Ok((
        sidecar,
        GatewayHandles {
            audit,
            audit_reader: Some(audit_reader),
            log,
            ready,
            ca_out,
            egress_floor,
            ask,
        },
    ))
}

/// The least time between two looks at the policy file for the floor.
const FLOOR_REFRESH_EVERY: Duration = Duration::from_secs(1);

/// Starts the thread that keeps the egress floor of gid `gid` on the policy
/// file at `path`: each nudge (the gateway's `reload_applied` audit line)
/// makes it read the file, at most once per [`FLOOR_REFRESH_EVERY`], nudges
/// meanwhile coalesced into one, and reinstall the floor only when the
/// file's bytes differ from those it last installed (the first nudge
/// always reinstalls). The gateway writes the line that nudges it, so a
/// compromised gateway can only make it look at the file once a second;
/// never resolve anything (the webhook's addresses stay those pinned in
/// `open`), never block the audit reader. The returned sender is the
/// nudge: `try_send`, a full channel means one is already pending. The
/// thread ends when the sender is dropped (the audit pipe ended).
fn spawn_floor_refresher(
    path: PathBuf,
    gid: u32,
    open: egress_floor::Openings,
) -> anyhow::Result<SyncSender<()>> {
    let (tx, rx) = mpsc::sync_channel::<()>(1);
    thread::Builder::new()
        .name("sluice-floor".into())
        .spawn(move || {
            let mut installed: Option<Vec<u8>> = None;
            let mut last: Option<Instant> = None;
            while rx.recv().is_ok() {
                if let Some(at) = last {
                    thread::sleep(FLOOR_REFRESH_EVERY.saturating_sub(at.elapsed()));
                }
                // Nudges that came while waiting are this one; a gateway
                // gone meanwhile (its supervisor removes the table) ends it.
                loop {
                    match rx.try_recv() {
                        Ok(()) => {}
                        Err(TryRecvError::Empty) => break,
                        Err(TryRecvError::Disconnected) => return,
                    }
                }
                last = Some(Instant::now());
                let now = match fs::read(&path) {
                    Ok(bytes) => bytes,
                    Err(e) => {
                        eprintln!(
                            "sluice: the egress floor: reading {}: {e}; it keeps the previous policy's networks",
                            path.display()
                        );
                        continue;
                    }
                };
                if installed.as_ref() == Some(&now) {
                    continue;
                }
                match egress_floor::refresh(&path, gid, &open) {
                    Ok(()) => installed = Some(now),
                    Err(e) => eprintln!(
                        "sluice: {e:#}; the egress floor keeps the previous policy's networks"
                    ),
                }
            }
        })
        .context("starting the egress floor's refresher")?;
    Ok(tx)
}

/// Reads the gateway's `--ready-fd` pipe: sends once when the ready line
/// arrives; the sender is dropped (the receiver sees "disconnected") when
/// the pipe closes without it, i.e. the gateway stopped before serving.
fn spawn_ready_reader(pipe: io::PipeReader) -> Receiver<Instant> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut line = String::new();
        let read = io::BufRead::read_line(&mut io::BufReader::new(pipe), &mut line);
        // A message sent before the sender drops is still received first.
        if read.is_ok() && line == "ready\n" {
            let _ = tx.send(Instant::now());
        }
    });
    rx
}

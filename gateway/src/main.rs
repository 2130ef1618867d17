//! `sluice-gateway` binary: wiring only; the logic lives in the library.

#[allow(unsafe_code)]
mod attach;
#[allow(unsafe_code)]
mod fds;
mod inherited;
#[allow(unsafe_code)]
mod pages;

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Parser;
use sluice_gateway::args::{GatewayArgs, Isolation, LogFormat};
use sluice_gateway::audit::AuditSink;
use sluice_gateway::config::{self, Config};
use sluice_gateway::decide::{
    Decider, HostAddresses, PlatformDecider, PlatformDenySet, PolicyDecider, host_addresses,
};
use sluice_gateway::flow::Transport;
use sluice_gateway::link::GuestLink;
use sluice_gateway::metrics::{Metrics, MetricsAddr, MetricsListener};
use sluice_gateway::reload::ReloadSource;
use sluice_gateway::{GuestSource, ReadySignal, serve_with_reload};

use crate::inherited::{GuestFd, Inherited};
use sluice_floor::ingress::Ended;
use sluice_intercept::{Interceptor, InterceptorConfig};
use sluice_policy::{CompileOptions, CompiledPolicy};
use sluice_secrets::SecretStore;

/// Large blocks are page-aligned mappings of their own: an idle flow's
/// buffers cost no resident memory (`pages`).
#[global_allocator]
static ALLOC: pages::PageAlloc = pages::PageAlloc;

/// When start-up's text pages are unmapped ([`pages::unmap_startup_text`]):
/// after the listener is bound and the first accept waits.
const STARTUP_TEXT_AFTER: std::time::Duration = std::time::Duration::from_secs(2);

fn main() -> anyhow::Result<()> {
    pin_mmap_threshold();
    let args = GatewayArgs::parse();
    match (&args.dgram, args.fd) {
        (Some(Some(_)), Some(_)) => bail!(
            "--dgram PATH and --fd exclude each other (use --fd N --dgram for an inherited socket)"
        ),
        (Some(None), None) => {
            bail!("--dgram without a PATH needs --fd (an inherited datagram socket)")
        }
        _ => {}
    }
    if !args.dgram_peer_uid.is_empty() && !matches!(args.dgram, Some(Some(_))) {
        bail!(
            "--dgram-peer-uid applies to --dgram PATH only (an inherited socket has its one peer)"
        );
    }
    // Before anything opens a file or a socket (`inherited` module docs).
    let mut inherited = Inherited::take(&args)?;
    inherited.close_the_rest();
    let ready = match inherited.ready.take() {
        Some(fd) => ReadySignal::new(std::fs::File::from(fd)),
        None => ReadySignal::default(),
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match args.log_format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    let cfg = Config::new(&args.subnet, args.mtu)?;

    // Attached, and the floor keeper forked, before the policy, its
    // secrets or anything else is read: the keeper is never jailed and
    // must hold nothing secret (docs/attach.md). Entering the namespace,
    // running nft and forking are also what the jail forbids.
    let (guest, ended) = match (&args.attach, &args.netns) {
        (Some(iface), Some(netns)) => {
            let allow = args.allow_missing_isolation.contains(&Isolation::Nftables);
            let a = attach::attach(iface, netns, cfg.mtu, allow)?;
            let watch = match a.keeper.as_ref().map(|k| k.watch(&a.link)).transpose() {
                Ok(watch) => watch,
                Err(e) => {
                    // Never served, but attached: the normal end all the
                    // same (the link cut, the keeper asked), so the keeper
                    // never sees its channel close without a request.
                    if let Err(end) = end_attached(iface, &a.link, a.keeper) {
                        tracing::error!(error = %format!("{end:#}"), iface, "ending the floor");
                    }
                    return Err(e);
                }
            };
            (
                Some(GuestFd::Packet(a.socket)),
                Some((iface, a.link, a.keeper, watch)),
            )
        }
        _ => (inherited.guest.take(), None),
    };
    let (ended, watch) = match ended {
        Some((iface, link, keeper, watch)) => (Some((iface, link, keeper)), watch),
        None => (None, None),
    };
    let served = prepare_and_serve(&args, cfg, guest, inherited.metrics.take(), ready, watch);
    let Some((iface, link, keeper)) = ended else {
        return served;
    };
    let ended = end_attached(iface, &link, keeper);
    served?;
    ended
}

/// The end of an attached gateway, served or not (docs/attach.md): the
/// gateway sets the guest's link down itself (which holds with no floor
/// or a dead keeper), then the keeper sets it down too and keeps the
/// floor on it while it exists: fail closed even if something sets it up
/// again. Logs the outcome; the error is the keeper's answer.
fn end_attached(
    iface: &str,
    link: &attach::LinkCutter,
    keeper: Option<attach::FloorKeeper>,
) -> anyhow::Result<()> {
    if let Err(e) = link.cut() {
        tracing::warn!(error = %e, iface, "could not set the guest's interface down");
    }
    let ended = match keeper {
        Some(keeper) => keeper.remove().map(Some),
        None => Ok(None),
    };
    match &ended {
        Ok(Some(Ended::Kept)) => tracing::info!(
            iface,
            "ended: the guest's interface is down and its floor stays on it (fail closed) until the interface or its namespace is gone"
        ),
        Ok(Some(Ended::Removed)) => tracing::info!(
            iface,
            "ended: the guest's interface is gone, and so is its floor"
        ),
        Ok(None) => tracing::warn!(
            iface,
            "ended with no floor (--allow-missing-isolation nftables): the guest's interface is down, nothing stops it being set up again"
        ),
        Err(_) => {}
    }
    ended.map(|_| ())
}

/// Reads the policy, its secrets and the rest of the configuration, then
/// serves the guest on `guest` (or on the `--socket`/`--dgram` path) until
/// the end.
fn prepare_and_serve(
    args: &GatewayArgs,
    mut cfg: Config,
    guest: Option<GuestFd>,
    metrics_fd: Option<std::os::fd::OwnedFd>,
    ready: ReadySignal,
    watch: Option<attach::KeeperWatch>,
) -> anyhow::Result<()> {
    cfg.publish = args.publish.clone();
    cfg.max_flows = args.max_flows.max(1);
    cfg.udp.max_flows = args.max_udp_flows;
    cfg.flow_buffer = flow_buffer("--flow-buffer-kib", args.flow_buffer_kib)?;
    cfg.flow_send_buffer = flow_buffer("--flow-send-buffer-kib", args.flow_send_buffer_kib)?;
    cfg.release_pages = pages::release;
    raise_nofile(cfg.max_flows);
    cfg.udp.idle = std::time::Duration::from_secs(args.udp_idle_secs.max(1));
    cfg.udp.idle_unanswered = cfg.udp.idle / 2;
    cfg.sandbox_id = args.sandbox_id.clone();
    cfg.approval = config::ApprovalSetup {
        socket: args.approval_socket.clone(),
        policy_path: args.policy.clone(),
        overlay_socket: args.approval_overlay_socket.clone(),
        webhook_pin: args.approval_webhook_name.as_ref().map(|host| {
            sluice_approval::backend::webhook::WebhookPin {
                host: host.clone(),
                addrs: args.approval_webhook_addr.clone(),
            }
        }),
    };
    let mut options = CompileOptions::default();
    options.host_addresses = host_addresses();
    let policy = match &args.policy {
        Some(p) => {
            let compiled = sluice_policy::load_file(p, &options)
                .map_err(|e| anyhow::anyhow!("invalid policy {}:\n{e}", p.display()))?;
            Some(Arc::new(compiled))
        }
        None => None,
    };
    // Resolvers: the flags; else the policy's `dns.upstream` list (re-read
    // on reload); else the host's (also the fallback for `upstream: system`).
    if args.dns_upstream.is_empty() {
        let policy_names_servers = policy
            .as_ref()
            .is_some_and(|p| matches!(p.upstream_resolvers(), sluice_policy::Upstream::Servers(_)));
        cfg.dns_upstreams_from_policy = policy.is_some();
        cfg.dns_upstreams = match config::host_resolvers() {
            Ok(found) => found,
            // Needed only while the policy says `system`: a reload to it then
            // answers SERVFAIL (no resolver), as does a query now without one.
            Err(_) if policy_names_servers => Vec::new(),
            Err(e) => return Err(e.into()),
        };
    } else {
        cfg.dns_upstreams = args.dns_upstream.clone();
    }
    if cfg.dns_upstreams.iter().any(|u| u.ip().is_loopback()) {
        bail!("a loopback DNS upstream would expose the host's resolver to the guest");
    }

    let out: Box<dyn Write + Send> = if args.audit == "-" {
        Box::new(std::io::stdout())
    } else {
        Box::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&args.audit)
                .with_context(|| format!("opening audit file {}", args.audit))?,
        )
    };
    // Secret files are re-read on reload: their directories stay readable.
    let mut secret_dirs = Vec::new();
    if let Some(policy) = &policy {
        // A webhook backend reads its token at each question and its TLS
        // files at the first: their directories stay readable too.
        if let Some(sluice_policy::ApprovalBackend::Webhook {
            bearer_token_file,
            client_cert,
            client_key,
            ca,
            ..
        }) = policy.approval().map(|a| &a.backend)
        {
            for path in [bearer_token_file, client_cert, client_key, ca]
                .into_iter()
                .flatten()
            {
                secret_dirs.push(policy_dir(path));
            }
        }
        cfg.intercept = interceptor(policy, args.ca_out.as_deref(), &args.upstream_ca)?;
        for s in policy.secrets() {
            if let sluice_policy::SecretSource::File(path) = &s.source {
                secret_dirs.push(policy_dir(path));
            }
        }
    }
    let mut audit = AuditSink::new(out, &cfg.sandbox_id);
    audit.set_format(args.audit_format);
    audit.set_policy(policy.clone());
    // Bound (and /proc/self opened) before the self-restriction, which
    // allows neither later.
    let metrics = match &args.metrics {
        Some(addr) => {
            let listener = match addr {
                MetricsAddr::Fd(fd) => MetricsListener::adopt(
                    metrics_fd
                        .with_context(|| format!("--metrics fd:{fd}: not adopted at start"))?,
                ),
                _ => MetricsListener::bind(addr),
            }
            .with_context(|| format!("--metrics {addr}"))?;
            if let Ok(MetricsAddr::Tcp(bound)) = listener.local_addr()
                && !bound.ip().is_loopback()
            {
                // Unauthenticated: the policy's id, version and label, the
                // names (never the values) of its secrets, flow and byte
                // counts (docs/metrics.md).
                tracing::warn!(metrics = %bound, "--metrics is bound to a non-loopback address: anyone who reaches it reads the policy's id and label, secret names and traffic counts");
            }
            let metrics = Arc::new(Metrics::new());
            audit.set_metrics(Arc::clone(&metrics));
            Some((listener, metrics))
        }
        None => None,
    };
    let broadcast = cfg.subnet.broadcast();
    // Read now, kept current by a refresher on the runtime (`decide::platform` module docs).
    let hosts = Arc::new(HostAddresses::read());
    let deny = PlatformDenySet::with_host_addresses(Arc::clone(&hosts), cfg.gateway_ip, broadcast);
    let mut reload = None;
    let policy_always = policy
        .as_ref()
        .and_then(|p| p.approval())
        .is_some_and(|a| a.always);
    let decider: Arc<dyn Decider> = match (policy, &args.policy) {
        (Some(policy), Some(path)) => {
            tracing::info!(policy = %path.display(), "enforcing policy (SIGHUP or a file change reloads it)");
            let decider = Arc::new(PolicyDecider::new(policy, deny));
            reload = Some(ReloadSource::new(
                path.clone(),
                Arc::clone(&decider),
                options,
            ));
            decider
        }
        _ => {
            tracing::warn!("no --policy: only the platform deny set applies");
            Arc::new(PlatformDecider::new(deny))
        }
    };

    // `always` answers write the overlay beside the policy: its directory
    // then stays writable (docs/approval.md says what that costs), unless
    // the entries go to the launcher, which writes the overlay itself.
    let overlay_dir = match (policy_always, &args.policy, &args.approval_overlay_socket) {
        (true, Some(p), None) => Some(policy_dir(p)),
        _ => None,
    };
    serve_jailed(
        args,
        secret_dirs,
        overlay_dir,
        guest,
        cfg,
        decider,
        audit,
        hosts,
        reload,
        ready,
        metrics,
        watch,
    )
}

/// Restricts the gateway and serves the guest until the end.
#[allow(clippy::too_many_arguments)]
fn serve_jailed(
    args: &GatewayArgs,
    secret_dirs: Vec<PathBuf>,
    overlay_dir: Option<PathBuf>,
    guest: Option<GuestFd>,
    cfg: Config,
    decider: Arc<dyn Decider>,
    audit: AuditSink,
    hosts: Arc<HostAddresses>,
    reload: Option<ReloadSource>,
    ready: ReadySignal,
    metrics: Option<(MetricsListener, Arc<Metrics>)>,
    watch: Option<attach::KeeperWatch>,
) -> anyhow::Result<()> {
    self_restrict(args, secret_dirs, overlay_dir)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        // The floor keeper's death ends the session (fail closed).
        if let Some(watch) = watch {
            watch.start()?;
        }
        hosts.spawn_refresher();
        if let Some((listener, metrics)) = metrics {
            let addr = listener.local_addr()?;
            tracing::info!(metrics = %addr, "serving Prometheus metrics at /metrics");
            tokio::spawn(async move {
                if let Err(e) = sluice_gateway::metrics::http::serve(listener, metrics).await {
                    tracing::error!(error = %e, "metrics endpoint stopped");
                }
            });
        }
        let source = match guest {
            Some(GuestFd::Packet(sock)) => GuestSource::Connected(
                GuestLink::packet(sock).context("registering the packet socket")?,
            ),
            Some(GuestFd::Dgram(sock)) => GuestSource::Connected(
                GuestLink::dgram(tokio_dgram(sock)?).context("registering the datagram socket")?,
            ),
            Some(GuestFd::Stream(sock)) => GuestSource::Connected(
                GuestLink::stream(tokio_stream(sock)?).context("registering the stream socket")?,
            ),
            None => match (&args.socket, &args.dgram) {
                (Some(path), _) => GuestSource::Socket(path.clone()),
                (None, Some(Some(path))) => GuestSource::Dgram {
                    path: path.clone(),
                    peer_uids: if args.dgram_peer_uid.is_empty() {
                        vec![rustix::process::geteuid().as_raw(), 0]
                    } else {
                        args.dgram_peer_uid.clone()
                    },
                },
                _ => bail!("one of --socket, --fd, --dgram PATH or --attach is required"),
            },
        };
        tracing::info!(
            gateway = %cfg.gateway_ip, guest = %cfg.guest_ip, mtu = cfg.mtu,
            upstreams = ?cfg.dns_upstreams, "sluice-gateway starting"
        );
        // Start-up is over once the loop waits for its guest; its code
        // need not stay counted in the idle gateway's RSS (pages.rs).
        tokio::spawn(async {
            tokio::time::sleep(STARTUP_TEXT_AFTER).await;
            pages::unmap_startup_text();
        });
        serve_with_reload(cfg, decider, audit, source, reload, ready).await?;
        Ok(())
    })
}

/// The interception proxy when `policy` inspects any host: its CA is written
/// to `ca_out`, and secret values are read now (a missing one stops the start).
fn interceptor(
    policy: &CompiledPolicy,
    ca_out: Option<&std::path::Path>,
    upstream_ca: &[PathBuf],
) -> anyhow::Result<Option<Arc<Interceptor>>> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    if policy.inspected_patterns().is_empty() {
        return Ok(None);
    }
    let mut extra_roots = Vec::new();
    for path in upstream_ca {
        for cert in CertificateDer::pem_file_iter(path)
            .with_context(|| format!("--upstream-ca {}", path.display()))?
        {
            extra_roots.push(cert.with_context(|| format!("--upstream-ca {}", path.display()))?);
        }
    }
    let secrets = SecretStore::load(policy).context("loading the policy's secret values")?;
    let config = InterceptorConfig {
        extra_roots,
        ..InterceptorConfig::default()
    };
    let proxy = Interceptor::new(policy.inspected_patterns(), Arc::new(secrets), config)
        .context("starting the interception proxy")?;
    if let Some(path) = ca_out {
        proxy.ca().write_pem(path)?;
    }
    tracing::info!(
        constraints = ?proxy.ca().subtrees(),
        "TLS interception on for the inspected hosts (sandbox CA generated)"
    );
    Ok(Some(Arc::new(proxy)))
}

/// The gateway's own jail (docs/isolation.md), applied once everything it
/// reads at start is read and before the runtime starts any thread: no
/// exec, no new processes, no file writes but the audit log, reads only of
/// the policy file's directory (reload re-reads it) and of the directories of
/// the policy's secret files (reload re-reads them: rotation); writes in
/// the policy's directory only when its `approval.always` lets answers
/// write the overlay there; TCP bind only on `--publish` ports. With `--socket`,
/// the socket's directory stays writable (the listener is bound later).
fn self_restrict(
    args: &GatewayArgs,
    secret_dirs: Vec<PathBuf>,
    overlay_dir: Option<PathBuf>,
) -> anyhow::Result<()> {
    use sluice_confine::{GatewayConfinement, gateway_self_restrict};
    let mut conf = GatewayConfinement {
        audit_path: (args.audit != "-").then(|| PathBuf::from(&args.audit)),
        // The policy's directory, not the file: reload follows editors and
        // tools that replace the file by rename, and Landlock binds a file
        // rule to the inode that existed when the rule was made.
        read_paths: args
            .policy
            .iter()
            .map(|p| policy_dir(p))
            .chain(secret_dirs)
            .collect(),
        tcp_bind: args
            .publish
            .iter()
            .filter(|p| p.proto == Transport::Tcp)
            .map(|p| p.host.port())
            .collect(),
        allow_missing_landlock: args.allow_missing_landlock,
        write_dirs: overlay_dir.into_iter().collect(),
        ..GatewayConfinement::default()
    };
    let bound_later = args
        .socket
        .as_ref()
        .or(args.dgram.as_ref().and_then(|d| d.as_ref()));
    if let Some(dir) = bound_later.and_then(|s| s.parent()) {
        let dir = if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir.to_path_buf()
        };
        conf.socket_dirs.push(dir);
    }
    let applied = gateway_self_restrict(&conf).context("restricting the gateway")?;
    tracing::info!(landlock = ?applied.landlock, seccomp = ?applied.seccomp, "self-restricted");
    Ok(())
}

/// The directory holding the policy file (`.` for a bare file name).
/// A flow buffer size given in KiB on the command line, in bytes, or a
/// one-line error naming the flag.
fn flow_buffer(flag: &str, kib: usize) -> anyhow::Result<usize> {
    let (min, max) = (
        config::MIN_FLOW_BUFFER / 1024,
        config::MAX_FLOW_BUFFER / 1024,
    );
    if !(min..=max).contains(&kib) {
        bail!("{flag} {kib}: must be {min}..={max}");
    }
    Ok(kib * 1024)
}

fn policy_dir(path: &std::path::Path) -> PathBuf {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Serves every allocation of [`MMAP_THRESHOLD`] or more (each TCP flow's two
/// smoltcp buffers, the guest read buffer) from its own fresh anonymous mapping,
/// returned to the kernel on free.
///
/// Why: glibc raises its mmap threshold dynamically after the first such block
/// is freed; from then on flow buffers come from the heap, where `calloc` clears
/// (touches) recycled memory and freed memory is rarely returned. Measured with
/// 1,000 idle flows (`benches/datapath.sh`): 282 MB RSS without, 15 MB with. With
/// fresh mappings a flow's buffers cost RSS only for the pages its data has
/// touched. No effect on other C libraries.
const MMAP_THRESHOLD: i32 = 64 * 1024;

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn pin_mmap_threshold() {
    // SAFETY: mallopt only sets a glibc malloc tuning parameter. It has no
    // memory-safety preconditions and is called at the start of main, before
    // this process starts any thread.
    let ok = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) };
    if ok != 1 {
        eprintln!(
            "sluice-gateway: mallopt(M_MMAP_THRESHOLD) failed; flow memory may stay resident"
        );
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn pin_mmap_threshold() {}

/// Raises the soft open-file limit to the hard one: every TCP flow holds a
/// host socket, so `--max-flows` needs as many descriptors (and a few dozen
/// more). Warns when even the hard limit is lower: flows past it fail their
/// host connect (audited `connect_failed`) instead of getting a descriptor.
fn raise_nofile(max_flows: usize) {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let lim = getrlimit(Resource::Nofile);
    if lim.current != lim.maximum {
        let raised = rustix::process::Rlimit {
            current: lim.maximum,
            maximum: lim.maximum,
        };
        if let Err(e) = setrlimit(Resource::Nofile, raised) {
            tracing::warn!(error = %e, "could not raise the open-file limit");
        }
    }
    let have = getrlimit(Resource::Nofile).current;
    let need = u64::try_from(max_flows)
        .unwrap_or(u64::MAX)
        .saturating_add(64);
    if have.is_some_and(|n| n < need) {
        tracing::warn!(
            limit = have,
            max_flows,
            "open-file limit below --max-flows + 64: flows past it fail to connect"
        );
    }
}

/// The inherited datagram socket (`--fd N --dgram`) on the runtime.
fn tokio_dgram(sock: std::os::fd::OwnedFd) -> anyhow::Result<tokio::net::UnixDatagram> {
    let std_sock = std::os::unix::net::UnixDatagram::from(sock);
    std_sock
        .set_nonblocking(true)
        .context("setting --fd non-blocking")?;
    tokio::net::UnixDatagram::from_std(std_sock).context("--fd: registering the datagram socket")
}

/// The inherited stream socket (`--fd N`) on the runtime.
fn tokio_stream(sock: std::os::fd::OwnedFd) -> anyhow::Result<tokio::net::UnixStream> {
    let std_stream = std::os::unix::net::UnixStream::from(sock);
    std_stream
        .set_nonblocking(true)
        .context("setting --fd non-blocking")?;
    tokio::net::UnixStream::from_std(std_stream).context("--fd: registering the stream socket")
}

#[cfg(test)]
mod tests {
    use super::flow_buffer;

    #[test]
    fn flow_buffer_sizes_outside_the_bounds_are_one_line_errors_naming_the_flag() {
        assert_eq!(
            flow_buffer("--flow-send-buffer-kib", 4096).ok(),
            Some(4 << 20)
        );
        assert_eq!(flow_buffer("--flow-buffer-kib", 64).ok(), Some(64 << 10));
        for kib in [0, 63, 16385] {
            let e = flow_buffer("--flow-send-buffer-kib", kib)
                .expect_err("out of bounds")
                .to_string();
            assert_eq!(
                e,
                format!("--flow-send-buffer-kib {kib}: must be 64..=16384")
            );
        }
    }
}

//! `sluice-gateway` binary: wiring only; the logic lives in the library.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::{Parser, ValueEnum};
use sluice_gateway::audit::AuditSink;
use sluice_gateway::config::{self, Config, PublishSpec};
use sluice_gateway::decide::{Decider, PlatformDecider, PlatformDenySet, host_addresses};
use sluice_gateway::enforce::PolicyDecider;
use sluice_gateway::hostaddrs::HostAddresses;
use sluice_gateway::reload::ReloadSource;
use sluice_gateway::{GuestSource, serve_with_reload};
use sluice_intercept::{Interceptor, InterceptorConfig};
use sluice_policy::{CompileOptions, CompiledPolicy};
use sluice_secrets::SecretStore;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Human,
    Json,
}

/// The per-VM network sidecar: a userspace network for one QEMU guest in which
/// every flow is decided before it leaves the host.
///
/// Defaults: subnet 10.0.2.0/24, gateway (router, DHCP and DNS server) 10.0.2.2,
/// guest 10.0.2.15, MTU 65520. IPv6 is off (v6 frames dropped, AAAA withheld).
#[derive(Debug, Parser)]
#[command(name = "sluice-gateway", version)]
struct Args {
    /// Listen on this unix socket path for the guest (QEMU `-netdev stream,server=off`); one
    /// guest at a time, re-accepting after a disconnect.
    #[arg(long, conflicts_with = "fd", required_unless_present = "fd")]
    socket: Option<PathBuf>,
    /// Use this inherited, already-connected stream socket fd (e.g. one end of a socketpair);
    /// the gateway exits when the guest closes it.
    #[arg(long)]
    fd: Option<i32>,
    /// Policy file (YAML), compiled at start (exit non-zero if invalid) and enforced on every
    /// flow and DNS query. Without it only the platform deny set applies. Reloaded on SIGHUP
    /// and when the file changes (also by rename); an invalid new file is rejected and the
    /// running policy stays (audit `reload_rejected`); open flows the new policy denies are
    /// reset (audit `reload_revoked`).
    #[arg(long)]
    policy: Option<PathBuf>,
    /// Audit JSON lines destination: a file path (appended) or `-` for stdout.
    #[arg(long, default_value = "-")]
    audit: String,
    /// Log format on stderr.
    #[arg(long, value_enum, default_value = "human")]
    log_format: LogFormat,
    /// Sandbox id written in every audit line.
    #[arg(long, default_value = "sandbox")]
    sandbox_id: String,
    /// Virtual IPv4 subnet (/27 or larger); the gateway is .2, the guest .15.
    #[arg(long, default_value = config::DEFAULT_SUBNET)]
    subnet: String,
    /// MTU advertised by DHCP (option 26) and used by the stack, 1280..=65520.
    #[arg(long, default_value_t = config::DEFAULT_MTU)]
    mtu: u16,
    /// Publish a guest port on the host: [HOST_ADDR:]HOST_PORT:GUEST_PORT[/tcp|/udp]
    /// (host address defaults to 127.0.0.1). Repeatable.
    #[arg(long)]
    publish: Vec<PublishSpec>,
    /// Upstream DNS resolver IP[:PORT] (repeatable); overrides the policy's `dns.upstream`.
    /// Default: the policy's `dns.upstream` list (a reload applies a new one), else the
    /// host's non-loopback resolvers from /etc/resolv.conf or /run/systemd/resolve/resolv.conf.
    #[arg(long)]
    dns_upstream: Vec<String>,
    /// Write the sandbox CA certificate (PEM, mode 0644) to this path, for the guest's trust
    /// store. The CA is generated at start only when the policy inspects some host (a secret
    /// bound to it, or `inspect:`); otherwise no file is written.
    #[arg(long)]
    ca_out: Option<PathBuf>,
    /// Extra CA certificates (PEM file, may hold several) trusted for the upstreams of
    /// intercepted connections besides the compiled-in webpki roots. Repeatable.
    #[arg(long)]
    upstream_ca: Vec<PathBuf>,
    /// Maximum concurrent flows; new connections beyond it are refused with RST.
    #[arg(long, default_value_t = config::DEFAULT_MAX_FLOWS)]
    max_flows: usize,
    /// Start even where the kernel enforces no Landlock (the gateway's
    /// self-restriction then has only its seccomp filter).
    #[arg(long)]
    allow_missing_landlock: bool,
    /// Maximum concurrent forwarded UDP flows (guest endpoint, destination) the policy
    /// allowed; a new one beyond it is dropped and audited `too_many_flows`.
    #[arg(long, default_value_t = sluice_gateway::udp::DEFAULT_MAX_UDP_FLOWS)]
    max_udp_flows: usize,
    /// Seconds without a datagram after which a forwarded UDP flow closes (a flow the
    /// destination never answered closes after half of it).
    #[arg(long, default_value_t = sluice_gateway::udp::DEFAULT_UDP_IDLE.as_secs())]
    udp_idle_secs: u64,
    /// Size in KiB of each of a TCP flow's two buffers (receive window towards the guest,
    /// unacknowledged data to the guest), 64..=16384. Bounds per-flow memory; smaller
    /// windows cost throughput (docs/gateway.md, "Memory").
    #[arg(long, default_value_t = config::DEFAULT_FLOW_BUFFER / 1024)]
    flow_buffer_kib: usize,
}

fn main() -> anyhow::Result<()> {
    pin_mmap_threshold();
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match args.log_format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().init(),
    }

    let mut cfg = Config::new(&args.subnet, args.mtu)?;
    cfg.publish = args.publish.clone();
    cfg.max_flows = args.max_flows.max(1);
    cfg.udp.max_flows = args.max_udp_flows;
    if !(config::MIN_FLOW_BUFFER / 1024..=16384).contains(&args.flow_buffer_kib) {
        bail!(
            "--flow-buffer-kib {}: must be 64..=16384",
            args.flow_buffer_kib
        );
    }
    cfg.flow_buffer = args.flow_buffer_kib * 1024;
    cfg.udp.idle = std::time::Duration::from_secs(args.udp_idle_secs.max(1));
    cfg.udp.idle_unanswered = cfg.udp.idle / 2;
    cfg.sandbox_id = args.sandbox_id.clone();
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
        cfg.dns_upstreams = args
            .dns_upstream
            .iter()
            .map(|s| config::parse_upstream(s))
            .collect::<Result<_, _>>()?;
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
        cfg.intercept = interceptor(policy, args.ca_out.as_deref(), &args.upstream_ca)?;
        for s in policy.secrets() {
            if let sluice_policy::SecretSource::File(path) = &s.source {
                secret_dirs.push(policy_dir(path));
            }
        }
    }
    let mut audit = AuditSink::new(out, &cfg.sandbox_id);
    audit.set_policy(policy.clone());
    let broadcast = cfg.subnet.broadcast();
    // Read now, kept current by a refresher on the runtime (hostaddrs module docs).
    let hosts = Arc::new(HostAddresses::read());
    let deny = PlatformDenySet::with_host_addresses(Arc::clone(&hosts), cfg.gateway_ip, broadcast);
    let mut reload = None;
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

    self_restrict(&args, secret_dirs)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        hosts.spawn_refresher();
        let source = match (args.socket, args.fd) {
            (Some(path), _) => GuestSource::Socket(path),
            (None, Some(fd)) => GuestSource::Connected(adopt_fd(fd)?),
            (None, None) => bail!("one of --socket or --fd is required"),
        };
        tracing::info!(
            gateway = %cfg.gateway_ip, guest = %cfg.guest_ip, mtu = cfg.mtu,
            upstreams = ?cfg.dns_upstreams, "sluice-gateway starting"
        );
        serve_with_reload(cfg, decider, audit, source, reload).await?;
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
/// the policy's secret files (reload re-reads them: rotation); TCP bind only on `--publish` ports. With `--socket`,
/// the socket's directory stays writable (the listener is bound later).
fn self_restrict(args: &Args, secret_dirs: Vec<PathBuf>) -> anyhow::Result<()> {
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
            .filter(|p| p.proto == config::Proto::Tcp)
            .map(|p| p.host.port())
            .collect(),
        allow_missing_landlock: args.allow_missing_landlock,
        ..GatewayConfinement::default()
    };
    if let Some(dir) = args.socket.as_ref().and_then(|s| s.parent()) {
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

/// Adopts the inherited stream socket `fd`.
#[allow(unsafe_code)]
fn adopt_fd(fd: i32) -> anyhow::Result<tokio::net::UnixStream> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    if fd < 3 {
        bail!("--fd {fd}: refusing to adopt a standard stream");
    }
    // Check the fd is open before taking ownership of it (by fcntl, not
    // /proc: the jailed gateway has no /proc).
    // SAFETY: F_GETFD on an integer only reads the descriptor table.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        bail!("--fd {fd}: not an open file descriptor");
    }
    // SAFETY: `fd` is >= 3, open (checked above), was inherited from the parent
    // for this purpose, and nothing else in this process owns or closes it; the
    // OwnedFd becomes its only owner.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let std_stream = std::os::unix::net::UnixStream::from(owned);
    std_stream
        .set_nonblocking(true)
        .context("setting --fd non-blocking")?;
    let raw = std_stream.as_raw_fd();
    tokio::net::UnixStream::from_std(std_stream)
        .with_context(|| format!("--fd {raw}: not a stream socket"))
}

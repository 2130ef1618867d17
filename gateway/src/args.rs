//! The gateway's command line, as one type: [`GatewayArgs`]. The binary
//! parses it; the launcher builds one and renders it with
//! [`GatewayArgs::to_argv`], so the two can never disagree on a flag's name
//! or format (a round-trip test holds them together).

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, ValueEnum};

use crate::config::{self, PublishSpec};
use crate::metrics::MetricsAddr;

/// How the gateway's log lines on stderr are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    Human,
    /// One JSON object per line (tracing's JSON format).
    Json,
}

impl LogFormat {
    fn as_flag(self) -> &'static str {
        match self {
            Self::Human => "human",
            Self::Json => "json",
        }
    }
}

/// How audit records are written (`--audit-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum AuditFormat {
    /// sluice's own schema-1 JSON lines (docs/audit.md).
    #[default]
    Schema1,
    /// OCSF 1.1.0 events, one JSON object per line (docs/audit.md, "OCSF").
    Ocsf,
}

impl AuditFormat {
    fn as_flag(self) -> &'static str {
        match self {
            Self::Schema1 => "schema1",
            Self::Ocsf => "ocsf",
        }
    }
}

/// An isolation layer `--allow-missing-isolation` may waive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Isolation {
    /// The nftables floor under `--attach` (docs/attach.md).
    Nftables,
}

impl Isolation {
    fn as_flag(self) -> &'static str {
        match self {
            Self::Nftables => "nftables",
        }
    }
}

/// The per-VM network sidecar: a userspace network for one QEMU guest in which
/// every flow is decided before it leaves the host.
///
/// Defaults: subnet 10.0.2.0/24, gateway (router, DHCP and DNS server) 10.0.2.2,
/// guest 10.0.2.15, MTU 65520. IPv6 is off (v6 frames dropped, AAAA withheld).
#[derive(Debug, Clone, PartialEq, Eq, Parser)]
#[command(name = "sluice-gateway", version)]
pub struct GatewayArgs {
    /// Listen on this unix socket path for the guest (QEMU `-netdev stream,server=off`); one
    /// guest at a time, re-accepting after a disconnect.
    #[arg(
        long,
        conflicts_with_all = ["fd", "dgram", "attach"],
        required_unless_present_any = ["fd", "dgram", "attach"]
    )]
    pub socket: Option<PathBuf>,
    /// Use this inherited, already-connected stream socket fd (e.g. one end of a socketpair);
    /// the gateway exits when the guest closes it. With `--dgram` (no path): a unix datagram
    /// socket, one frame per datagram.
    #[arg(long, conflicts_with = "attach")]
    pub fd: Option<i32>,
    /// One Ethernet frame per unix datagram (QEMU `-netdev dgram`, vfkit, libkrun, krunkit).
    /// With a PATH: bind a datagram socket there; the peer is whoever sends the first
    /// datagram from a bound path (the gateway connects back to it; vfkit's `VFKT` handshake
    /// datagram is consumed). Without one: the `--fd` socket is a datagram socket.
    #[arg(long, num_args = 0..=1, conflicts_with = "attach")]
    pub dgram: Option<Option<PathBuf>>,
    /// With `--dgram PATH`: a uid whose processes may be the guest (repeatable). The
    /// kernel's credentials on each datagram are checked, so only these users' VMMs can
    /// send frames, whoever can write the socket file. Default: the gateway's own uid and
    /// root.
    #[arg(long = "dgram-peer-uid")]
    pub dgram_peer_uid: Vec<u32>,
    /// With `--fd N`: N is an `AF_PACKET` socket already bound to the guest's layer-2
    /// interface, with `PACKET_VNET_HDR` and `PACKET_IGNORE_OUTGOING` set (what `--attach`
    /// opens). The caller made the interface and its namespace and installed the floor
    /// (`sluice run --network tap`); the gateway needs no privilege for it.
    #[arg(long, requires = "fd", conflicts_with_all = ["dgram", "attach", "socket"])]
    pub packet: bool,
    /// Serve the guest behind this existing layer-2 interface (a TAP a VMM holds, or a veth
    /// end) in the network namespace `--netns`, through a packet socket opened there; the
    /// gateway's own sockets stay in its own namespace. An nftables floor on the interface
    /// (docs/attach.md) is installed first and removed on exit.
    #[arg(long, requires = "netns")]
    pub attach: Option<String>,
    /// The network namespace holding `--attach`'s interface (`/run/netns/NAME`,
    /// `/proc/PID/ns/net`).
    #[arg(long, requires = "attach")]
    pub netns: Option<PathBuf>,
    /// Serve even where an isolation layer cannot be installed: `nftables` (the floor under
    /// `--attach`). Repeatable.
    #[arg(long, value_enum)]
    pub allow_missing_isolation: Vec<Isolation>,
    /// Write the line `ready` to this inherited fd (the write end of a pipe), then close it,
    /// once the gateway serves: policy compiled, sandbox CA written, published ports and the
    /// guest socket bound. A launcher waits on it instead of reading the log. If the gateway
    /// stops before that, the fd is closed with nothing written.
    #[arg(long)]
    pub ready_fd: Option<i32>,
    /// Policy file (YAML), compiled at start (exit non-zero if invalid) and enforced on every
    /// flow and DNS query. Without it only the platform deny set applies. Reloaded on SIGHUP
    /// and when the file changes (also by rename); an invalid new file is rejected and the
    /// running policy stays (audit `reload_rejected`); open flows the new policy denies are
    /// reset (audit `reload_revoked`).
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// Audit JSON lines destination: a file path (appended) or `-` for stdout.
    #[arg(long, default_value = "-")]
    pub audit: String,
    /// Audit record format: `schema1` (sluice's schema, docs/audit.md) or `ocsf` (the same
    /// records as OCSF 1.1.0 events).
    #[arg(long, value_enum, default_value = "schema1")]
    pub audit_format: AuditFormat,
    /// Serve Prometheus metrics at `/metrics` on `[HOST:]PORT` (TCP; the host defaults to
    /// 127.0.0.1; port 0 picks a free port, logged) or `unix:PATH` (docs/metrics.md). The
    /// guest can never reach it: the platform deny set refuses loopback and the host's
    /// addresses. Also from the environment (`SLUICE_METRICS`, e.g. a systemd env file).
    #[arg(long, value_name = "ADDR", env = "SLUICE_METRICS")]
    pub metrics: Option<MetricsAddr>,
    /// Log format on stderr.
    #[arg(long, value_enum, default_value = "human")]
    pub log_format: LogFormat,
    /// Sandbox id written in every audit line.
    #[arg(long, default_value = "sandbox")]
    pub sandbox_id: String,
    /// Virtual IPv4 subnet (/27 or larger); the gateway is .2, the guest .15.
    #[arg(long, default_value = config::DEFAULT_SUBNET)]
    pub subnet: String,
    /// MTU advertised by DHCP (option 26) and used by the stack, 1280..=65520.
    #[arg(long, default_value_t = config::DEFAULT_MTU)]
    pub mtu: u16,
    /// Publish a guest port on the host: [HOST_ADDR:]HOST_PORT:GUEST_PORT[/tcp|/udp]
    /// (host address defaults to 127.0.0.1). Repeatable.
    #[arg(long)]
    pub publish: Vec<PublishSpec>,
    /// Upstream DNS resolver IP[:PORT] (repeatable); overrides the policy's `dns.upstream`.
    /// Default: the policy's `dns.upstream` list (a reload applies a new one), else the
    /// host's non-loopback resolvers from /etc/resolv.conf or /run/systemd/resolve/resolv.conf.
    #[arg(long, value_parser = parse_upstream_arg)]
    pub dns_upstream: Vec<SocketAddr>,
    /// Write the sandbox CA certificate (PEM, mode 0644) to this path, for the guest's trust
    /// store. The CA is generated at start only when the policy inspects some host (a secret
    /// bound to it, or `inspect:`); otherwise no file is written.
    #[arg(long)]
    pub ca_out: Option<PathBuf>,
    /// Extra CA certificates (PEM file, may hold several) trusted for the upstreams of
    /// intercepted connections besides the compiled-in webpki roots. Repeatable.
    #[arg(long)]
    pub upstream_ca: Vec<PathBuf>,
    /// Maximum concurrent flows; new connections beyond it are refused with RST.
    #[arg(long, default_value_t = config::DEFAULT_MAX_FLOWS)]
    pub max_flows: usize,
    /// Start even where the kernel enforces no Landlock (the gateway's
    /// self-restriction then has only its seccomp filter).
    #[arg(long)]
    pub allow_missing_landlock: bool,
    /// Maximum concurrent forwarded UDP flows (guest endpoint, destination) the policy
    /// allowed; a new one beyond it is dropped and audited `too_many_flows`.
    #[arg(long, default_value_t = crate::udp::DEFAULT_MAX_UDP_FLOWS)]
    pub max_udp_flows: usize,
    /// Seconds without a datagram after which a forwarded UDP flow closes (a flow the
    /// destination never answered closes after half of it).
    #[arg(long, default_value_t = crate::udp::DEFAULT_UDP_IDLE.as_secs())]
    pub udp_idle_secs: u64,
    /// Size in KiB of a TCP flow's receive buffer (the window the guest may fill),
    /// 64..=16384. Bounds per-flow memory; smaller windows cost throughput
    /// (docs/gateway.md, "Memory").
    #[arg(long, default_value_t = config::DEFAULT_FLOW_BUFFER / 1024)]
    pub flow_buffer_kib: usize,
    /// Size in KiB of a TCP flow's send buffer (data to the guest not yet
    /// acknowledged), 64..=16384. Given back while the flow is idle.
    #[arg(long, default_value_t = config::DEFAULT_FLOW_SEND_BUFFER / 1024)]
    pub flow_send_buffer_kib: usize,
    /// Ask runtime approval questions (`unlisted: ask`, docs/approval.md)
    /// over this unix socket, one JSON line each way, instead of the
    /// policy's `approval.backend`: `sluice run --ask` serves its terminal
    /// prompt there. The policy's `terminal` backend needs it.
    #[arg(long)]
    pub approval_socket: Option<PathBuf>,
    /// Hand each `always` approval to the process serving this unix socket
    /// (one JSON line each way) instead of writing the policy's
    /// `.approved.yaml` overlay itself: `sluice run` serves it, validates
    /// the entry and writes the overlay beside the policy, so the gateway's
    /// jail keeps the policy's directory read-only (docs/approval.md).
    #[arg(long)]
    pub approval_overlay_socket: Option<PathBuf>,
    /// Pin the policy's approval webhook: connect to the
    /// `--approval-webhook-addr` addresses given, never resolving the URL's
    /// host, which must be this one (it still names the server in TLS and
    /// `Host`). `sluice run` resolves the host once, opens exactly those
    /// addresses in the egress floor and passes them here. With no address,
    /// or a URL naming another host after a reload, every question is
    /// denied. Without it the gateway resolves the host at each question.
    #[arg(long, value_name = "HOST")]
    pub approval_webhook_name: Option<String>,
    /// An address of the pinned approval webhook (repeatable; needs
    /// `--approval-webhook-name`).
    #[arg(long, value_name = "IP:PORT", requires = "approval_webhook_name")]
    pub approval_webhook_addr: Vec<SocketAddr>,
}

fn parse_upstream_arg(s: &str) -> Result<SocketAddr, config::ConfigError> {
    config::parse_upstream(s)
}

impl GatewayArgs {
    /// The arguments of a gateway serving the guest on the inherited stream
    /// socket `fd`, every other setting at its default.
    pub fn with_fd(fd: i32) -> Self {
        Self {
            socket: None,
            fd: Some(fd),
            dgram: None,
            dgram_peer_uid: Vec::new(),
            packet: false,
            attach: None,
            netns: None,
            allow_missing_isolation: Vec::new(),
            ready_fd: None,
            policy: None,
            audit: "-".to_owned(),
            audit_format: AuditFormat::Schema1,
            metrics: None,
            log_format: LogFormat::Human,
            sandbox_id: "sandbox".to_owned(),
            subnet: config::DEFAULT_SUBNET.to_owned(),
            mtu: config::DEFAULT_MTU,
            publish: Vec::new(),
            dns_upstream: Vec::new(),
            ca_out: None,
            upstream_ca: Vec::new(),
            max_flows: config::DEFAULT_MAX_FLOWS,
            allow_missing_landlock: false,
            max_udp_flows: crate::udp::DEFAULT_MAX_UDP_FLOWS,
            udp_idle_secs: crate::udp::DEFAULT_UDP_IDLE.as_secs(),
            flow_buffer_kib: config::DEFAULT_FLOW_BUFFER / 1024,
            flow_send_buffer_kib: config::DEFAULT_FLOW_SEND_BUFFER / 1024,
            approval_socket: None,
            approval_overlay_socket: None,
            approval_webhook_name: None,
            approval_webhook_addr: Vec::new(),
        }
    }

    /// The command line (without the program name) that parses back to
    /// `self`. Every field is written, defaults included, so a reader of the
    /// jail's argv sees the whole configuration.
    pub fn to_argv(&self) -> Vec<OsString> {
        let mut argv: Vec<OsString> = Vec::new();
        let mut flag = |name: &str, value: OsString| {
            argv.push(format!("--{name}").into());
            argv.push(value);
        };
        if let Some(path) = &self.socket {
            flag("socket", path.into());
        }
        if let Some(fd) = self.fd {
            flag("fd", fd.to_string().into());
        }
        if let Some(iface) = &self.attach {
            flag("attach", iface.into());
        }
        if let Some(path) = &self.netns {
            flag("netns", path.into());
        }
        for i in &self.allow_missing_isolation {
            flag("allow-missing-isolation", i.as_flag().into());
        }
        if let Some(fd) = self.ready_fd {
            flag("ready-fd", fd.to_string().into());
        }
        if let Some(path) = &self.policy {
            flag("policy", path.into());
        }
        flag("audit", self.audit.clone().into());
        flag("audit-format", self.audit_format.as_flag().into());
        if let Some(m) = &self.metrics {
            flag("metrics", m.to_string().into());
        }
        flag("log-format", self.log_format.as_flag().into());
        flag("sandbox-id", self.sandbox_id.clone().into());
        flag("subnet", self.subnet.clone().into());
        flag("mtu", self.mtu.to_string().into());
        for p in &self.publish {
            flag("publish", p.to_string().into());
        }
        for u in &self.dns_upstream {
            flag("dns-upstream", u.to_string().into());
        }
        if let Some(path) = &self.ca_out {
            flag("ca-out", path.into());
        }
        for path in &self.upstream_ca {
            flag("upstream-ca", path.into());
        }
        flag("max-flows", self.max_flows.to_string().into());
        flag("max-udp-flows", self.max_udp_flows.to_string().into());
        flag("udp-idle-secs", self.udp_idle_secs.to_string().into());
        flag("flow-buffer-kib", self.flow_buffer_kib.to_string().into());
        flag(
            "flow-send-buffer-kib",
            self.flow_send_buffer_kib.to_string().into(),
        );
        if let Some(path) = &self.approval_socket {
            flag("approval-socket", path.into());
        }
        if let Some(path) = &self.approval_overlay_socket {
            flag("approval-overlay-socket", path.into());
        }
        if let Some(host) = &self.approval_webhook_name {
            flag("approval-webhook-name", host.into());
        }
        for a in &self.approval_webhook_addr {
            flag("approval-webhook-addr", a.to_string().into());
        }
        for uid in &self.dgram_peer_uid {
            flag("dgram-peer-uid", uid.to_string().into());
        }
        if self.allow_missing_landlock {
            argv.push("--allow-missing-landlock".into());
        }
        if self.packet {
            argv.push("--packet".into());
        }
        // Last: without a path, `--dgram` takes no value.
        match &self.dgram {
            Some(Some(path)) => {
                argv.push("--dgram".into());
                argv.push(path.into());
            }
            Some(None) => argv.push("--dgram".into()),
            None => {}
        }
        argv
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(argv: Vec<OsString>) -> GatewayArgs {
        let mut full: Vec<OsString> = vec!["sluice-gateway".into()];
        full.extend(argv);
        GatewayArgs::try_parse_from(full).expect("argv parses")
    }

    #[test]
    fn with_fd_equals_the_parsed_defaults() {
        assert_eq!(
            GatewayArgs::with_fd(3),
            parse(vec!["--fd".into(), "3".into()])
        );
    }

    #[test]
    fn every_field_round_trips_through_the_argv() {
        let mut a = GatewayArgs::with_fd(3);
        a.ready_fd = Some(5);
        a.policy = Some("/p/policy.yaml".into());
        a.audit = "/a/audit.jsonl".into();
        a.audit_format = AuditFormat::Ocsf;
        a.log_format = LogFormat::Json;
        a.sandbox_id = "sb-1".into();
        a.subnet = "10.9.0.0/24".into();
        a.mtu = 1500;
        a.publish = vec![
            "8080:80".parse().expect("spec"),
            "[::1]:9000:90/udp".parse().expect("spec"),
        ];
        a.dns_upstream = vec!["192.0.2.53:5353".parse().expect("addr")];
        a.ca_out = Some("/run/ca.pem".into());
        a.upstream_ca = vec!["/x/1.pem".into(), "/x/2.pem".into()];
        a.max_flows = 7;
        a.allow_missing_landlock = true;
        a.max_udp_flows = 9;
        a.udp_idle_secs = 11;
        a.flow_buffer_kib = 128;
        a.flow_send_buffer_kib = 256;
        a.approval_socket = Some("/run/approve.sock".into());
        a.approval_overlay_socket = Some("/run/approved.sock".into());
        a.approval_webhook_name = Some("hook.example".into());
        a.approval_webhook_addr = vec![
            "192.0.2.8:8443".parse().expect("addr"),
            "[2001:db8::8]:8443".parse().expect("addr"),
        ];
        a.metrics = Some("127.0.0.1:9464".parse().expect("addr"));
        assert_eq!(parse(a.to_argv()), a);
        a.metrics = Some("unix:/run/sluice/m.sock".parse().expect("path"));
        assert_eq!(parse(a.to_argv()), a);

        let mut s = GatewayArgs::with_fd(3);
        s.fd = None;
        s.socket = Some("/tmp/g.sock".into());
        assert_eq!(parse(s.to_argv()), s);
    }

    #[test]
    fn the_transports_round_trip_and_exclude_each_other() {
        let mut d = GatewayArgs::with_fd(3);
        d.dgram = Some(None);
        assert_eq!(parse(d.to_argv()), d);
        d.fd = None;
        d.dgram = Some(Some("/tmp/g.dgram".into()));
        assert_eq!(parse(d.to_argv()), d);
        d.dgram_peer_uid = vec![65534, 1000];
        assert_eq!(parse(d.to_argv()), d);
        let mut a = GatewayArgs::with_fd(3);
        a.fd = None;
        a.attach = Some("tap0".into());
        a.netns = Some("/run/netns/vm1".into());
        a.allow_missing_isolation = vec![Isolation::Nftables];
        assert_eq!(parse(a.to_argv()), a);
        let mut p = GatewayArgs::with_fd(3);
        p.packet = true;
        assert_eq!(parse(p.to_argv()), p);
        let bad: [&[&str]; 7] = [
            &["--attach", "tap0"],
            &["--netns", "/run/netns/x"],
            &["--socket", "/s", "--dgram", "/d"],
            &["--attach", "tap0", "--netns", "/n", "--fd", "3"],
            &["--packet", "--socket", "/s"],
            &["--packet", "--fd", "3", "--dgram"],
            &["--packet"],
        ];
        for argv in bad {
            let mut full = vec!["sluice-gateway"];
            full.extend_from_slice(argv);
            assert!(GatewayArgs::try_parse_from(full).is_err(), "{argv:?}");
        }
    }

    #[test]
    fn the_audit_format_defaults_to_schema1_and_round_trips() {
        assert_eq!(GatewayArgs::with_fd(3).audit_format, AuditFormat::Schema1);
        for f in [AuditFormat::Schema1, AuditFormat::Ocsf] {
            let mut a = GatewayArgs::with_fd(3);
            a.audit_format = f;
            let argv = a.to_argv();
            assert!(argv.contains(&f.as_flag().into()), "{argv:?}");
            assert_eq!(parse(argv).audit_format, f);
        }
    }

    #[test]
    fn a_bare_upstream_ip_gets_port_53() {
        let a = parse(vec![
            "--fd".into(),
            "3".into(),
            "--dns-upstream".into(),
            "192.0.2.1".into(),
        ]);
        assert_eq!(a.dns_upstream, vec!["192.0.2.1:53".parse().expect("addr")]);
    }
}

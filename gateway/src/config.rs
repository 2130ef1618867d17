//! Gateway configuration: the virtual network's addresses, limits, published
//! ports and upstream resolvers. Built by the binary from its flags.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use ipnet::Ipv4Net;
use thiserror::Error;

use crate::flow::Transport;

/// Default virtual subnet (the guest sees a /24).
pub const DEFAULT_SUBNET: &str = "10.0.2.0/24";
/// Default MTU advertised to the guest by DHCP (option 26), as passt does.
pub const DEFAULT_MTU: u16 = 65520;
/// Smallest MTU accepted (the IPv6 minimum, kept as the floor for IPv4 too).
pub const MIN_MTU: u16 = 1280;
/// Default maximum of concurrent TCP/UDP flows; beyond it new SYNs get a RST.
pub const DEFAULT_MAX_FLOWS: usize = 4096;
/// Default size of a TCP flow's smoltcp receive ring: the window the guest
/// may fill; see docs/gateway.md "Memory".
pub const DEFAULT_FLOW_BUFFER: usize = 1024 * 1024;
/// Default size of a TCP flow's smoltcp send ring: what the gateway may have
/// in flight towards the guest, unacknowledged. Larger than the receive
/// ring because a guest's acknowledgements come back late (it shares CPUs
/// with the gateway and its VMM), and with 1 MiB in flight a download
/// stalled on them: docs/benchmarks.md "Session 13". An idle flow's send
/// ring is given back ([`Config::release_pages`]).
pub const DEFAULT_FLOW_SEND_BUFFER: usize = 4 * 1024 * 1024;
/// Smallest accepted flow buffer: one maximal segment.
pub const MIN_FLOW_BUFFER: usize = 64 * 1024;
/// Largest accepted flow buffer.
pub const MAX_FLOW_BUFFER: usize = 16 * 1024 * 1024;

/// A configuration error, reported before the gateway starts.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The subnet is not an IPv4 network with room for gateway, DNS and guest.
    #[error("subnet {0}: need an IPv4 network of /27 or larger")]
    Subnet(String),
    /// The MTU is outside what the stream protocol and IPv4 can carry.
    #[error("mtu {0}: must be within {MIN_MTU}..={DEFAULT_MTU}")]
    Mtu(u16),
    /// A `--publish` value that does not parse.
    #[error("publish {spec:?}: {why}")]
    Publish {
        /// The value given.
        spec: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A `--dns-upstream` value that does not parse.
    #[error("dns upstream {0:?}: expected IP or IP:PORT")]
    Upstream(String),
    /// No usable (non-loopback) resolver on the host.
    #[error(
        "no non-loopback DNS resolver found in /etc/resolv.conf or /run/systemd/resolve/resolv.conf; pass --dns-upstream"
    )]
    NoResolver,
}

/// One `--publish [HOST_ADDR:]HOST_PORT:GUEST_PORT[/tcp|/udp]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublishSpec {
    /// Where the host listens (default 127.0.0.1).
    pub host: SocketAddr,
    /// The guest port connections are forwarded to.
    pub guest_port: u16,
    /// TCP or UDP.
    pub proto: Transport,
}

impl FromStr for PublishSpec {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |why| ConfigError::Publish {
            spec: s.to_owned(),
            why,
        };
        let (body, proto) = match s.rsplit_once('/') {
            Some((b, "tcp")) => (b, Transport::Tcp),
            Some((b, "udp")) => (b, Transport::Udp),
            Some(_) => return Err(err("protocol must be tcp or udp")),
            None => (s, Transport::Tcp),
        };
        let (host_part, guest) = body
            .rsplit_once(':')
            .ok_or_else(|| err("missing GUEST_PORT"))?;
        let guest_port: u16 = guest.parse().map_err(|_| err("bad guest port"))?;
        let (addr, host_port) = match host_part.rsplit_once(':') {
            Some((a, p)) => {
                let a = a.trim_start_matches('[').trim_end_matches(']');
                (a.parse::<IpAddr>().map_err(|_| err("bad host address"))?, p)
            }
            None => (IpAddr::V4(Ipv4Addr::LOCALHOST), host_part),
        };
        let host_port: u16 = host_port.parse().map_err(|_| err("bad host port"))?;
        if guest_port == 0 {
            return Err(err("guest port 0"));
        }
        Ok(Self {
            host: SocketAddr::new(addr, host_port),
            guest_port,
            proto,
        })
    }
}

impl std::fmt::Display for PublishSpec {
    /// The form [`PublishSpec::from_str`] reads: `HOST_ADDR:HOST_PORT:GUEST_PORT/PROTO`
    /// (an IPv6 host address in brackets).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let proto = match self.proto {
            Transport::Tcp => "tcp",
            Transport::Udp => "udp",
        };
        write!(f, "{}:{}/{proto}", self.host, self.guest_port)
    }
}

/// Parses `IP` or `IP:PORT` (port 53 by default).
pub fn parse_upstream(s: &str) -> Result<SocketAddr, ConfigError> {
    if let Ok(sa) = s.parse::<SocketAddr>() {
        return Ok(sa);
    }
    s.parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, 53))
        .map_err(|_| ConfigError::Upstream(s.to_owned()))
}

/// Non-loopback `nameserver` lines of a resolv.conf text.
pub fn resolvers_from_resolv_conf(text: &str) -> Vec<SocketAddr> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|rest| rest.trim().parse::<IpAddr>().ok())
        .filter(|ip| !ip.is_loopback() && !ip.is_unspecified())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

/// The host's resolvers: /etc/resolv.conf, else systemd-resolved's upstream
/// list; loopback resolvers are never used (the guest must not reach the host's).
pub fn host_resolvers() -> Result<Vec<SocketAddr>, ConfigError> {
    for path in ["/etc/resolv.conf", "/run/systemd/resolve/resolv.conf"] {
        if let Ok(text) = std::fs::read_to_string(path) {
            let found = resolvers_from_resolv_conf(&text);
            if !found.is_empty() {
                return Ok(found);
            }
        }
    }
    Err(ConfigError::NoResolver)
}

/// Where the gateway's runtime approval questions (`unlisted: ask`,
/// docs/approval.md) go besides the policy's own backend, and where an
/// `always` answer is written.
#[derive(Debug, Clone, Default)]
pub struct ApprovalSetup {
    /// A unix socket that answers every question instead of the policy's
    /// backend (`--approval-socket`; `sluice run --ask` serves its terminal
    /// prompt there). The policy's `terminal` backend needs it.
    pub socket: Option<PathBuf>,
    /// The policy file, beside which `allow_always` writes its overlay
    /// (`None`: no policy file, `always` counts as `allow_sandbox`).
    pub policy_path: Option<PathBuf>,
    /// The socket `allow_always` entries are handed to instead of writing
    /// the overlay (`--approval-overlay-socket`: `sluice run`'s launcher
    /// writes it beside the policy after validating the entry).
    pub overlay_socket: Option<PathBuf>,
    /// The approval webhook's pinned addresses (`--approval-webhook-name`
    /// and `--approval-webhook-addr`): connected to instead of resolving
    /// the URL's host. `None`: resolve it at each question.
    pub webhook_pin: Option<sluice_approval::backend::webhook::WebhookPin>,
}

/// Everything the datapath needs to know, fixed for the process lifetime.
#[derive(Debug, Clone)]
pub struct Config {
    /// The virtual subnet.
    pub subnet: Ipv4Net,
    /// The gateway's address: router, DHCP and DNS server (subnet + 2).
    pub gateway_ip: Ipv4Addr,
    /// The one guest's address (subnet + 15, as QEMU's user networking).
    pub guest_ip: Ipv4Addr,
    /// The gateway's MAC address.
    pub gateway_mac: [u8; 6],
    /// The MTU advertised to the guest and used by the stack.
    pub mtu: u16,
    /// DHCP lease time.
    pub lease: Duration,
    /// Upstream DNS resolvers, tried in order: the `--dns-upstream` flags, or
    /// the host's resolvers (policy `dns.upstream: system`, or no policy).
    pub dns_upstreams: Vec<SocketAddr>,
    /// No `--dns-upstream` flag was given: a `dns.upstream` list in the
    /// policy in force (after any reload) replaces [`Config::dns_upstreams`].
    pub dns_upstreams_from_policy: bool,
    /// Published ports.
    pub publish: Vec<PublishSpec>,
    /// Maximum concurrent flows.
    pub max_flows: usize,
    /// Host connect timeout for guest flows.
    pub connect_timeout: Duration,
    /// Sandbox id written in audit lines.
    pub sandbox_id: String,
    /// The TLS-terminating proxy for inspected hosts (secret injection);
    /// `None` when the policy inspects nothing: every flow is spliced.
    pub intercept: Option<std::sync::Arc<sluice_intercept::Interceptor>>,
    /// Size of a TCP flow's smoltcp receive ring (the window the guest
    /// sees).
    pub flow_buffer: usize,
    /// Size of a TCP flow's smoltcp send ring (data to the guest not yet
    /// acknowledged).
    pub flow_send_buffer: usize,
    /// Gives the whole pages inside a buffer nothing needs back to the
    /// kernel (they read as zeros after). The binary passes
    /// `madvise(MADV_DONTNEED)`, which this library (no unsafe code) cannot
    /// call itself; the default does nothing. Applied to the drained send
    /// ring of an idle open flow (`crate::tcp`): an idle flow holds no
    /// touched send pages.
    pub release_pages: fn(&mut [u8]),
    /// Bounds for forwarded guest UDP flows (count, idle expiry).
    pub udp: crate::udp::UdpLimits,
    /// Where runtime approval questions go besides the policy's backend,
    /// and the policy file the `always` overlay is written beside.
    pub approval: ApprovalSetup,
}

impl Config {
    /// A configuration for `subnet` with the documented address layout.
    pub fn new(subnet: &str, mtu: u16) -> Result<Self, ConfigError> {
        let net: Ipv4Net = subnet
            .parse()
            .map_err(|_| ConfigError::Subnet(subnet.to_owned()))?;
        if net.prefix_len() > 27 {
            return Err(ConfigError::Subnet(subnet.to_owned()));
        }
        if !(MIN_MTU..=DEFAULT_MTU).contains(&mtu) {
            return Err(ConfigError::Mtu(mtu));
        }
        let base = u32::from(net.network());
        Ok(Self {
            subnet: net,
            gateway_ip: Ipv4Addr::from(base + 2),
            guest_ip: Ipv4Addr::from(base + 15),
            gateway_mac: [0x52, 0x55, 0x0a, 0x00, 0x02, 0x02],
            mtu,
            lease: Duration::from_secs(3600),
            dns_upstreams: Vec::new(),
            dns_upstreams_from_policy: false,
            publish: Vec::new(),
            max_flows: DEFAULT_MAX_FLOWS,
            connect_timeout: Duration::from_secs(10),
            sandbox_id: String::from("sandbox"),
            intercept: None,
            flow_buffer: DEFAULT_FLOW_BUFFER,
            flow_send_buffer: DEFAULT_FLOW_SEND_BUFFER,
            release_pages: |_| {},
            udp: crate::udp::UdpLimits::default(),
            approval: ApprovalSetup::default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_layout() {
        let c = Config::new(DEFAULT_SUBNET, DEFAULT_MTU).unwrap();
        assert_eq!(c.gateway_ip, Ipv4Addr::new(10, 0, 2, 2));
        assert_eq!(c.guest_ip, Ipv4Addr::new(10, 0, 2, 15));
        assert!(Config::new("10.0.0.0/30", 1500).is_err());
        assert!(Config::new(DEFAULT_SUBNET, 1000).is_err());
        assert!(Config::new("fd00::/64", 1500).is_err());
    }

    #[test]
    fn publish_specs() {
        let p: PublishSpec = "8080:80".parse().unwrap();
        assert_eq!(p.host, "127.0.0.1:8080".parse().unwrap());
        assert_eq!((p.guest_port, p.proto), (80, Transport::Tcp));
        let p: PublishSpec = "0.0.0.0:5353:53/udp".parse().unwrap();
        assert_eq!(p.host, "0.0.0.0:5353".parse().unwrap());
        assert_eq!(p.proto, Transport::Udp);
        let p: PublishSpec = "[::1]:9000:22/tcp".parse().unwrap();
        assert_eq!(p.host, "[::1]:9000".parse().unwrap());
        for bad in ["80", "a:80", "80:b", "1:2/sctp", "99999:1", "1:0"] {
            assert!(bad.parse::<PublishSpec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn resolv_conf_skips_loopback() {
        let text = "# x\nnameserver 127.0.0.53\nnameserver 192.0.2.1\nnameserver ::1\nsearch x\n";
        assert_eq!(
            resolvers_from_resolv_conf(text),
            vec!["192.0.2.1:53".parse().unwrap()]
        );
        assert_eq!(
            parse_upstream("192.0.2.9").unwrap(),
            "192.0.2.9:53".parse().unwrap()
        );
        assert_eq!(
            parse_upstream("192.0.2.9:5353").unwrap(),
            "192.0.2.9:5353".parse().unwrap()
        );
        assert!(parse_upstream("nope").is_err());
    }
}

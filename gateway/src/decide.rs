//! The decision points: every new guest flow is put to a [`Decider`] before
//! anything leaves the host.
//!
//! [`PlatformDecider`] is the default: it denies only the non-overridable set
//! (loopback, unspecified, link-local, multicast, broadcast, the host's own
//! interface addresses, the gateway's virtual addresses) and allows other TCP;
//! it denies all UDP except DNS to the gateway, which the datapath serves
//! itself. The enforcement layer implements [`Decider`] with the policy.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_policy::platform::classify;

use crate::approval::Approvals;
use crate::dns::DnsTable;
use crate::hostaddrs::HostAddresses;

/// Transport of a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

/// A guest flow as seen in its first packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlowKey {
    /// TCP or UDP.
    pub transport: Transport,
    /// The guest's endpoint.
    pub src: SocketAddr,
    /// The destination the guest asked for.
    pub dst: SocketAddr,
}

/// Why a flow was denied. `as_str` is the audit `reason` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DenyReason {
    /// Destination in the platform deny set (loopback, link-local, host addresses, ...).
    PlatformDenied,
    /// The gateway's own address on a port it does not serve.
    GatewayAddress,
    /// UDP other than DNS to the gateway, with no rule allowing it.
    UdpNotAllowed,
    /// The flow table is full.
    TooManyFlows,
    /// The host could not connect to the destination.
    ConnectFailed,
    /// The inspected first bytes did not arrive before the deadline or bound.
    InspectTimeout,
    /// The policy denied the flow; the string is the enforcement layer's reason code.
    Policy(&'static str),
}

impl DenyReason {
    /// The audit reason code.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::PlatformDenied => "platform_denied",
            Self::GatewayAddress => "gateway_address",
            Self::UdpNotAllowed => "udp_not_allowed",
            Self::TooManyFlows => "too_many_flows",
            Self::ConnectFailed => "connect_failed",
            Self::InspectTimeout => "inspect_timeout",
            Self::Policy(r) => r,
        }
    }
}

/// The answer to a new flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Connect from the host, then complete the guest handshake.
    Allow,
    /// Answer RST (TCP) or drop (UDP), and audit the reason.
    Deny(DenyReason),
    /// Complete the guest handshake first, read up to `max_bytes` (until
    /// `deadline`), and ask [`Decider::inspect`] before connecting.
    Inspect {
        /// Bound on the bytes buffered for inspection.
        max_bytes: usize,
        /// How long to wait for them.
        deadline: Duration,
    },
}

/// The answer after reading a flow's first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InspectVerdict {
    /// Not enough bytes yet (the datapath denies when the bound or deadline is reached).
    NeedMore,
    /// Connect and replay the bytes upstream.
    Allow,
    /// Reset the guest connection.
    Deny(DenyReason),
}

/// What a decider may consult besides the flow itself.
#[derive(Debug)]
pub struct DecideContext<'a> {
    /// The sandbox's name-to-address table, filled by the DNS forwarder.
    pub dns: &'a DnsTable,
    /// The sandbox's runtime approvals (`unlisted: ask`): a name the
    /// policy does not list but a standing decision approved opens the
    /// ports the `approval:` section names. `None` where nothing was asked.
    pub approved: Option<&'a Approvals>,
    /// The current time (for TTL checks).
    pub now: Instant,
}

/// A decision point for new flows. Called on the datapath task: must not block.
pub trait Decider: Send + Sync {
    /// Decides a new guest TCP connection (on its SYN).
    fn decide_tcp(&self, flow: &FlowKey, ctx: &DecideContext<'_>) -> Decision;

    /// Decides a new guest UDP flow (its first datagram).
    fn decide_udp(&self, flow: &FlowKey, ctx: &DecideContext<'_>) -> Decision;

    /// Decides an inspected flow from its first bytes (called as bytes arrive).
    fn inspect(
        &self,
        flow: &FlowKey,
        first_bytes: &[u8],
        ctx: &DecideContext<'_>,
    ) -> InspectVerdict {
        let _ = (flow, first_bytes, ctx);
        InspectVerdict::Allow
    }

    /// Whether an allowed TLS flow whose ClientHello named `sni` is to be
    /// intercepted (TLS terminated by the proxy) rather than spliced. Asked
    /// only after [`Decider::inspect`] allowed the flow. The default (no
    /// policy) intercepts nothing.
    fn intercepts(&self, flow: &FlowKey, sni: &str) -> bool {
        let _ = (flow, sni);
        false
    }

    /// Whether an allowed plain-HTTP flow (its first request's Host checked
    /// by [`Decider::inspect`]) is to be served by the plain-HTTP proxy,
    /// which checks every later request's Host too, rather than spliced.
    /// Asked only after [`Decider::inspect`] allowed the flow. The default
    /// (no policy) splices.
    fn proxies_plain_http(&self, flow: &FlowKey) -> bool {
        let _ = flow;
        false
    }

    /// The DNS resolvers the policy in force names (`dns.upstream: [..]`);
    /// `None` without a policy or for `upstream: system` (the host's). Asked
    /// for every forwarded query, so a reload applies to the next one.
    fn policy_dns_upstreams(&self) -> Option<Vec<SocketAddr>> {
        None
    }

    /// Decides a guest DNS query on its normalised name before anything is
    /// forwarded: `None` forwards it upstream; `Some((rcode, reason))`
    /// answers `rcode` locally and audits `reason`. The default (no policy)
    /// forwards every name.
    fn dns_query(&self, qname: &str) -> Option<(hickory_proto::op::ResponseCode, &'static str)> {
        let _ = qname;
        None
    }

    /// The policy in force when a query for `qname` (normalised) would be
    /// asked about rather than refused (`unlisted: ask` and a plain
    /// allowlist miss: [`sluice_policy::CompiledPolicy::would_ask`]);
    /// `None` otherwise. The default (no policy) asks about nothing.
    fn asks_about(&self, qname: &str) -> Option<Arc<sluice_policy::CompiledPolicy>> {
        let _ = qname;
        None
    }

    /// Whether an upstream answer address may reach the guest and the DNS
    /// table. The default keeps every address.
    fn keep_dns_answer(&self, ip: IpAddr) -> bool {
        let _ = ip;
        true
    }

    /// The `(min, max)` TTL bounds for the DNS table and for the TTLs the
    /// guest is told; `None` keeps the table's defaults and upstream TTLs.
    fn dns_ttl_bounds(&self) -> Option<(Duration, Duration)> {
        None
    }

    /// Whether an upstream answer must be refused because its CNAME chain
    /// passes through `target` (a normalised name): `Some(reason)` refuses
    /// it (REFUSED to the guest, nothing recorded), `None` lets it through.
    /// The default refuses nothing.
    fn dns_cname_target(&self, target: &str) -> Option<&'static str> {
        let _ = target;
        None
    }
}

/// The non-overridable deny set, shared by every decider.
#[derive(Debug, Clone, Default)]
pub struct PlatformDenySet {
    host_addrs: Arc<HostAddresses>,
    gateway_ip: Option<Ipv4Addr>,
    subnet_broadcast: Option<Ipv4Addr>,
}

impl PlatformDenySet {
    /// A deny set for the given (fixed) host addresses and virtual network.
    pub fn new(
        host_addrs: impl IntoIterator<Item = IpAddr>,
        gateway_ip: Ipv4Addr,
        subnet_broadcast: Ipv4Addr,
    ) -> Self {
        Self::with_host_addresses(
            Arc::new(HostAddresses::from_addrs(host_addrs)),
            gateway_ip,
            subnet_broadcast,
        )
    }

    /// A deny set sharing `hosts`, which a refresher may keep growing
    /// ([`HostAddresses::spawn_refresher`]).
    pub fn with_host_addresses(
        hosts: Arc<HostAddresses>,
        gateway_ip: Ipv4Addr,
        subnet_broadcast: Ipv4Addr,
    ) -> Self {
        Self {
            host_addrs: hosts,
            gateway_ip: Some(gateway_ip),
            subnet_broadcast: Some(subnet_broadcast),
        }
    }

    /// Whether `ip` may never be reached from the guest: the always-denied
    /// classes of [`sluice_policy::platform::classify`] (loopback,
    /// unspecified incl. `0.0.0.0/8`, link-local incl. `169.254.169.254`,
    /// cloud host services such as `168.63.129.16`, multicast, broadcast;
    /// IPv6 forms embedding an IPv4 address are classified by that
    /// address), the host's own addresses, and the
    /// virtual network's gateway and broadcast addresses. The gateway
    /// address itself counts as denied: DHCP and DNS are served before flows
    /// are decided.
    pub fn denies(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
            v4 => v4,
        };
        if classify(ip).is_always_denied() || self.host_addrs.contains(&ip) {
            return true;
        }
        match ip {
            IpAddr::V4(v4) => Some(v4) == self.gateway_ip || Some(v4) == self.subnet_broadcast,
            IpAddr::V6(_) => false,
        }
    }
}

/// The default decider: platform deny set only; TCP allowed, UDP denied.
#[derive(Debug, Clone, Default)]
pub struct PlatformDecider {
    deny: PlatformDenySet,
}

impl PlatformDecider {
    /// A decider enforcing `deny`.
    pub fn new(deny: PlatformDenySet) -> Self {
        Self { deny }
    }
}

impl Decider for PlatformDecider {
    fn decide_tcp(&self, flow: &FlowKey, _ctx: &DecideContext<'_>) -> Decision {
        if self.deny.denies(flow.dst.ip()) {
            Decision::Deny(DenyReason::PlatformDenied)
        } else {
            Decision::Allow
        }
    }

    fn decide_udp(&self, flow: &FlowKey, _ctx: &DecideContext<'_>) -> Decision {
        if self.deny.denies(flow.dst.ip()) {
            Decision::Deny(DenyReason::PlatformDenied)
        } else {
            Decision::Deny(DenyReason::UdpNotAllowed)
        }
    }
}

/// The host's own IPv4 and IPv6 addresses, read from procfs (`/proc/net/fib_trie`
/// LOCAL entries and `/proc/net/if_inet6`). This is a snapshot: the gateway keeps
/// it current with [`HostAddresses`] (crate::hostaddrs).
pub fn host_addresses() -> Vec<IpAddr> {
    let mut out = Vec::new();
    if let Ok(text) = std::fs::read_to_string("/proc/net/fib_trie") {
        let mut last: Option<Ipv4Addr> = None;
        for line in text.lines() {
            let t = line.trim_start_matches([' ', '|', '-', '+']).trim();
            if let Ok(ip) = t.parse::<Ipv4Addr>() {
                last = Some(ip);
            } else if t.contains("host LOCAL")
                && let Some(ip) = last
            {
                out.push(IpAddr::V4(ip));
            }
        }
    }
    if let Ok(text) = std::fs::read_to_string("/proc/net/if_inet6") {
        for line in text.lines() {
            let Some(hex) = line.split_whitespace().next() else {
                continue;
            };
            if let Ok(v) = u128::from_str_radix(hex, 16) {
                out.push(IpAddr::V6(v.into()));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx_table() -> DnsTable {
        DnsTable::new(16)
    }

    #[test]
    fn platform_set_denies_the_fixed_classes_and_allows_public() {
        let d = PlatformDenySet::new(
            ["192.0.2.77".parse().unwrap()],
            Ipv4Addr::new(10, 0, 2, 2),
            Ipv4Addr::new(10, 0, 2, 255),
        );
        for bad in [
            "127.0.0.1",
            "0.0.0.0",
            "169.254.169.254",
            "224.0.0.1",
            "255.255.255.255",
            "192.0.2.77",
            "10.0.2.2",
            "10.0.2.255",
            "::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "0.1.2.3",
        ] {
            assert!(d.denies(bad.parse().unwrap()), "{bad}");
        }
        for ok in ["93.184.216.34", "10.9.0.1", "2001:db8::1", "10.0.2.3"] {
            assert!(!d.denies(ok.parse().unwrap()), "{ok}");
        }
    }

    #[test]
    fn platform_decider_allows_tcp_and_denies_udp() {
        let d = PlatformDecider::new(PlatformDenySet::new(
            [],
            Ipv4Addr::new(10, 0, 2, 2),
            Ipv4Addr::new(10, 0, 2, 255),
        ));
        let table = ctx_table();
        let ctx = DecideContext {
            dns: &table,
            approved: None,
            now: Instant::now(),
        };
        let mut f = FlowKey {
            transport: Transport::Tcp,
            src: "10.0.2.15:4000".parse().unwrap(),
            dst: "198.51.100.1:443".parse().unwrap(),
        };
        assert_eq!(d.decide_tcp(&f, &ctx), Decision::Allow);
        f.dst = "127.0.0.1:22".parse().unwrap();
        assert_eq!(
            d.decide_tcp(&f, &ctx),
            Decision::Deny(DenyReason::PlatformDenied)
        );
        f.transport = Transport::Udp;
        f.dst = "198.51.100.1:443".parse().unwrap();
        assert_eq!(
            d.decide_udp(&f, &ctx),
            Decision::Deny(DenyReason::UdpNotAllowed)
        );
    }

    #[test]
    fn host_addresses_include_loopback() {
        // Every Linux host has 127.0.0.1 as a LOCAL route.
        let addrs = host_addresses();
        assert!(addrs.contains(&"127.0.0.1".parse().unwrap()), "{addrs:?}");
    }
}

//! The platform deny set: what no guest flow may reach whatever the policy
//! says ([`PlatformDenySet`]), the decider that enforces only it
//! ([`PlatformDecider`]), and the host's own addresses in it, kept current
//! while the gateway runs ([`HostAddresses`]).
//!
//! At start the host's addresses are read from procfs ([`host_addresses`]:
//! every LOCAL route in `/proc/net/fib_trie`, which also covers local routes
//! that are not interface addresses, and `/proc/net/if_inet6`). Afterwards
//! [`HostAddresses::spawn_refresher`] adds the interfaces' current addresses
//! (`getifaddrs`, one netlink dump, cost proportional to the number of
//! addresses, not routes) every [`REFRESH_INTERVAL`]. The set only grows: an
//! address the host drops stays denied (fail closed).
//!
//! The window between an address appearing and the next refresh is covered
//! for UDP by the route check in [`crate::udp`] (a connected UDP socket whose
//! kernel-chosen source is the destination itself routes locally) and for TCP
//! by the same check after the host connect (the datapath refuses a
//! connection whose local and peer addresses are equal before any guest byte
//! is written to it).

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use sluice_policy::Reason;
use sluice_policy::platform::classify;

use super::{DecideContext, Decider, Decision, DenyReason, FlowKey, Verdict};

/// How often interface addresses are re-read.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(5);

/// A shared, atomically replaced set of the host's addresses.
#[derive(Debug, Default)]
pub struct HostAddresses {
    set: ArcSwap<HashSet<IpAddr>>,
}

impl HostAddresses {
    /// A set holding exactly `addrs` (tests, and callers that read them
    /// themselves).
    pub fn from_addrs(addrs: impl IntoIterator<Item = IpAddr>) -> Self {
        Self {
            set: ArcSwap::from_pointee(addrs.into_iter().collect()),
        }
    }

    /// The host's addresses now: procfs LOCAL routes plus interface addresses.
    pub fn read() -> Self {
        let s = Self::from_addrs(host_addresses());
        s.refresh();
        s
    }

    /// Whether `ip` is one of the host's addresses (as of the last refresh).
    pub fn contains(&self, ip: &IpAddr) -> bool {
        self.set.load().contains(ip)
    }

    /// How many addresses are held.
    pub fn len(&self) -> usize {
        self.set.load().len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds the interfaces' current addresses; returns how many were new.
    /// A failing `getifaddrs` leaves the set as it was.
    pub fn refresh(&self) -> usize {
        match if_addrs::get_if_addrs() {
            Ok(ifs) => self.add(ifs.iter().map(if_addrs::Interface::ip)),
            Err(e) => {
                tracing::warn!(error = %e, "reading host interface addresses failed");
                0
            }
        }
    }

    /// Adds `addrs`; returns how many were new. The set is swapped only when
    /// something changed (readers never block).
    pub fn add(&self, addrs: impl IntoIterator<Item = IpAddr>) -> usize {
        let current = self.set.load();
        let new: Vec<IpAddr> = addrs.into_iter().filter(|a| !current.contains(a)).collect();
        if new.is_empty() {
            return 0;
        }
        let mut next = HashSet::clone(&current);
        next.extend(new.iter().copied());
        let added = next.len() - current.len();
        self.set.store(Arc::new(next));
        tracing::info!(added = ?new, "new host addresses: now denied to the guest");
        added
    }

    /// Spawns a task on the current tokio runtime that calls
    /// [`HostAddresses::refresh`] every [`REFRESH_INTERVAL`] for as long as the
    /// runtime runs.
    pub fn spawn_refresher(self: &Arc<Self>) {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(REFRESH_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                me.refresh();
            }
        });
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
            Decision::Deny(DenyReason::PlatformDenied.into())
        } else {
            Decision::Allow(Verdict::of(Reason::Allowlisted))
        }
    }

    fn decide_udp(&self, flow: &FlowKey, _ctx: &DecideContext<'_>) -> Decision {
        if self.deny.denies(flow.dst.ip()) {
            Decision::Deny(DenyReason::PlatformDenied.into())
        } else {
            Decision::Deny(DenyReason::UdpNotAllowed.into())
        }
    }
}

/// The host's own IPv4 and IPv6 addresses, read from procfs (`/proc/net/fib_trie`
/// LOCAL entries and `/proc/net/if_inet6`). This is a snapshot: the gateway keeps
/// it current with [`HostAddresses`].
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
    use crate::dns::DnsTable;
    use crate::flow::Transport;
    use std::time::Instant;

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
        assert_eq!(
            d.decide_tcp(&f, &ctx),
            Decision::Allow(Verdict::of(Reason::Allowlisted))
        );
        f.dst = "127.0.0.1:22".parse().unwrap();
        assert_eq!(
            d.decide_tcp(&f, &ctx),
            Decision::Deny(DenyReason::PlatformDenied.into())
        );
        f.transport = Transport::Udp;
        f.dst = "198.51.100.1:443".parse().unwrap();
        assert_eq!(
            d.decide_udp(&f, &ctx),
            Decision::Deny(DenyReason::UdpNotAllowed.into())
        );
    }

    #[test]
    fn host_addresses_include_loopback() {
        // Every Linux host has 127.0.0.1 as a LOCAL route.
        let addrs = host_addresses();
        assert!(addrs.contains(&"127.0.0.1".parse().unwrap()), "{addrs:?}");
    }

    #[test]
    fn read_holds_loopback_and_add_only_grows() {
        let h = HostAddresses::read();
        assert!(h.contains(&"127.0.0.1".parse().unwrap()));
        let before = h.len();
        let extra: IpAddr = "192.0.2.250".parse().unwrap();
        assert_eq!(h.add([extra, "127.0.0.1".parse().unwrap()]), 1);
        assert!(h.contains(&extra));
        assert_eq!(h.len(), before + 1);
        // A refresh never forgets an address the host no longer has.
        h.refresh();
        assert!(h.contains(&extra));
    }

    #[test]
    fn refresh_finds_every_interface_address() {
        let h = HostAddresses::from_addrs([]);
        let n = h.refresh();
        let ifs = if_addrs::get_if_addrs().unwrap();
        assert!(n > 0 && n <= ifs.len(), "{n} of {ifs:?}");
        for i in ifs {
            assert!(h.contains(&i.ip()), "{i:?}");
        }
    }
}

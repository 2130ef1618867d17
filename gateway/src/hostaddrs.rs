//! The host's own addresses, which no guest flow may reach, kept current
//! while the gateway runs.
//!
//! At start the set is read from procfs ([`crate::decide::host_addresses`]:
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
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

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
        let s = Self::from_addrs(crate::decide::host_addresses());
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

#[cfg(test)]
mod tests {
    use super::*;

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

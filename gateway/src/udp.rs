//! Forwarding of policy-allowed guest UDP through connected host sockets.
//!
//! A UDP "flow" is one (guest endpoint, destination) pair. Its first datagram
//! is decided by the datapath (platform deny set, then the policy through the
//! [`Decider`](crate::decide::Decider)); an allowed flow gets its own host
//! socket, bound to an ephemeral port and `connect`ed to the destination, so
//! the kernel delivers only that destination's datagrams to it and answers
//! anyone else with port-unreachable. Datagrams then go both ways without
//! further decisions until the flow expires.
//!
//! # Limits (defaults in [`UdpLimits::default`])
//! - At most [`DEFAULT_MAX_UDP_FLOWS`] flows at once; a new flow beyond it is
//!   denied (`too_many_flows`), never evicting an existing one.
//! - A flow expires after [`DEFAULT_UDP_IDLE`] (60 s) without a datagram in
//!   either direction, or after [`DEFAULT_UDP_IDLE_UNANSWERED`] (30 s) when the
//!   destination never answered (request/response traffic such as DNS or NTP
//!   that got no reply, and scans, are not kept a full minute). Expiry is
//!   checked about once a second.
//! - A datagram from the destination larger than the guest MTU allows (the
//!   gateway does not fragment) is dropped and counted, as are guest datagrams
//!   the host socket cannot take now (UDP gives no delivery guarantee; the
//!   kernel's send buffer is the only queue).
//!
//! # Host addresses
//! `connect` on a UDP socket sends nothing: it only picks the route and the
//! source address. When the kernel picks the destination itself (or a
//! loopback address) as the source, the destination is one of the host's own
//! addresses and the flow is refused (`platform_denied`) before any datagram
//! leaves, even if the host gained that address after the deny set was last
//! refreshed.

mod forward;

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::task::Context;
use std::time::{Duration, Instant};

use thiserror::Error;
use tokio::net::UdpSocket;

use crate::audit::FlowTotals;
use crate::decide::FlowKey;
use crate::flow::{Admission, FlowEnd, Transport};

/// Default bound on concurrent UDP flows.
pub(crate) const DEFAULT_MAX_UDP_FLOWS: usize = 256;
/// Default idle expiry of a UDP flow that has seen traffic both ways.
pub(crate) const DEFAULT_UDP_IDLE: Duration = Duration::from_secs(60);
/// Default idle expiry of a UDP flow the destination never answered.
pub(crate) const DEFAULT_UDP_IDLE_UNANSWERED: Duration = Duration::from_secs(30);
/// Datagrams read from one flow's host socket per [`UdpFlows::recv_ready`]
/// call, so one busy flow cannot starve the others or the guest input.
const RECV_BUDGET_PER_FLOW: usize = 64;
/// Largest UDP payload read from a host socket (larger ones are truncated by
/// the kernel and then dropped here as oversized).
const MAX_DATAGRAM: usize = 65536;

/// Bounds for the UDP flow table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpLimits {
    /// Concurrent flows at most.
    pub max_flows: usize,
    /// Idle expiry once the destination has answered.
    pub idle: Duration,
    /// Idle expiry while the destination has never answered.
    pub idle_unanswered: Duration,
}

impl Default for UdpLimits {
    fn default() -> Self {
        Self {
            max_flows: DEFAULT_MAX_UDP_FLOWS,
            idle: DEFAULT_UDP_IDLE,
            idle_unanswered: DEFAULT_UDP_IDLE_UNANSWERED,
        }
    }
}

/// Why a UDP flow could not be opened.
#[derive(Debug, Error)]
pub(crate) enum UdpOpenError {
    /// The table holds [`UdpLimits::max_flows`] flows already.
    #[error("too many UDP flows ({0})")]
    TooMany(usize),
    /// The route to the destination is local: it is one of the host's own
    /// addresses.
    #[error("destination {0} is an address of this host")]
    HostAddress(IpAddr),
    /// The host socket could not be created or connected.
    #[error("host UDP socket to {dst}: {source}")]
    Socket {
        /// The destination.
        dst: SocketAddr,
        /// The cause.
        source: io::Error,
    },
}

/// How a UDP flow ended (its `flow_close` line says [`UdpEnd::end`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UdpEnd {
    /// No datagram for the idle period.
    Idle,
    /// The host socket failed with an error other than an ICMP refusal.
    Error,
    /// The session ended (guest gone, shutdown).
    Closed,
}

impl UdpEnd {
    /// The flow end it is.
    pub(crate) fn end(self) -> FlowEnd {
        match self {
            Self::Idle => FlowEnd::IdleTimeout,
            Self::Error => FlowEnd::UpstreamError,
            Self::Closed => FlowEnd::Closed,
        }
    }
}

/// What happened to a guest datagram handed to [`UdpFlows::send`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SendOutcome {
    /// Written to the host socket.
    Sent,
    /// Dropped: the host socket's send buffer is full, or the destination
    /// refused a previous datagram (ICMP port unreachable).
    Dropped,
    /// No flow for this key.
    NoFlow,
}

/// A flow that ended, for the close audit line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClosedUdpFlow {
    /// The flow id given at open.
    pub id: u64,
    /// Guest endpoint and destination.
    pub key: FlowKey,
    /// Payload bytes guest -> destination.
    pub up: u64,
    /// Payload bytes destination -> guest.
    pub down: u64,
    /// Lifetime.
    pub duration: Duration,
    /// Why it ended.
    pub end: UdpEnd,
}

impl ClosedUdpFlow {
    /// Its identity and totals, for its `flow_close` audit line.
    pub(crate) fn totals(&self) -> FlowTotals {
        FlowTotals {
            flow: self.id,
            transport: Transport::Udp,
            src: self.key.src,
            dst: self.key.dst,
            bytes_up: self.up,
            bytes_down: self.down,
            duration_ms: FlowTotals::millis(self.duration),
        }
    }
}

struct UdpFlow {
    id: u64,
    socket: UdpSocket,
    opened: Instant,
    last: Instant,
    up: u64,
    down: u64,
    answered: bool,
    /// What admitted the flow (its names are rechecked on reload).
    admission: Option<Admission>,
}

impl UdpFlow {
    /// A flow opened at `now` on its connected host `socket`.
    fn new(id: u64, socket: UdpSocket, now: Instant) -> Self {
        Self {
            id,
            socket,
            opened: now,
            last: now,
            up: 0,
            down: 0,
            answered: false,
            admission: None,
        }
    }

    fn closed(&self, key: FlowKey, end: UdpEnd, now: Instant) -> ClosedUdpFlow {
        ClosedUdpFlow {
            id: self.id,
            key,
            up: self.up,
            down: self.down,
            duration: now.saturating_duration_since(self.opened),
            end,
        }
    }
}

/// Counters of the UDP forwarder.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UdpCounters {
    /// Guest datagrams written to host sockets.
    pub dgrams_up: u64,
    /// Datagrams delivered to the guest.
    pub dgrams_down: u64,
    /// Guest datagrams dropped (host send buffer full, destination refused).
    pub dropped_up: u64,
    /// Datagrams from destinations dropped because they exceed the guest MTU.
    pub dropped_oversize: u64,
}

/// The table of open UDP flows and their host sockets.
pub(crate) struct UdpFlows {
    flows: HashMap<FlowKey, UdpFlow>,
    limits: UdpLimits,
    counters: UdpCounters,
    buf: Vec<u8>,
}

impl std::fmt::Debug for UdpFlows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpFlows")
            .field("flows", &self.flows.len())
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl UdpFlows {
    /// An empty table with these bounds.
    pub(crate) fn new(limits: UdpLimits) -> Self {
        Self {
            flows: HashMap::new(),
            limits,
            counters: UdpCounters::default(),
            buf: Vec::new(),
        }
    }

    /// Whether no flow is open.
    pub(crate) fn is_empty(&self) -> bool {
        self.flows.is_empty()
    }

    /// The open flows.
    pub(crate) fn len(&self) -> usize {
        self.flows.len()
    }

    /// The counters so far.
    #[cfg(test)]
    pub(crate) fn counters(&self) -> UdpCounters {
        self.counters
    }

    /// Whether a flow for `key` is open.
    #[cfg(test)]
    pub(crate) fn contains(&self, key: &FlowKey) -> bool {
        self.flows.contains_key(key)
    }

    /// Opens a flow for an allowed `key` with a host socket connected to
    /// `key.dst`. Must be called inside a tokio runtime.
    pub(crate) fn open(&mut self, id: u64, key: FlowKey, now: Instant) -> Result<(), UdpOpenError> {
        if self.flows.len() >= self.limits.max_flows {
            return Err(UdpOpenError::TooMany(self.limits.max_flows));
        }
        let socket = connect_host_socket(key.dst)?;
        self.flows.insert(key, UdpFlow::new(id, socket, now));
        Ok(())
    }

    /// Remembers what admitted the open flow for `key` (its names: the
    /// DNS table's names for its destination at open), for
    /// [`UdpFlows::revoke`].
    pub(crate) fn admit(&mut self, key: &FlowKey, admission: Admission) {
        if let Some(flow) = self.flows.get_mut(key) {
            flow.admission = Some(admission);
        }
    }

    /// Removes and returns the flows `deny` refuses (given each flow's key
    /// and admitting names), with the reason it gave: a policy reload
    /// revoking what the new policy denies. The host sockets are closed.
    pub(crate) fn revoke<R>(
        &mut self,
        now: Instant,
        mut deny: impl FnMut(&FlowKey, &[&str]) -> Option<R>,
    ) -> Vec<(ClosedUdpFlow, R)> {
        let mut out = Vec::new();
        self.flows.retain(|key, flow| {
            let names = flow
                .admission
                .as_ref()
                .map(Admission::names)
                .unwrap_or_default();
            match deny(key, &names) {
                Some(why) => {
                    out.push((flow.closed(*key, UdpEnd::Closed, now), why));
                    false
                }
                None => true,
            }
        });
        out
    }

    /// Writes a guest datagram to the flow's host socket (never blocks).
    pub(crate) fn send(&mut self, key: &FlowKey, payload: &[u8], now: Instant) -> SendOutcome {
        let Some(flow) = self.flows.get_mut(key) else {
            return SendOutcome::NoFlow;
        };
        flow.last = now;
        // Straight to the socket: tokio's `try_send` refuses (WouldBlock)
        // until its reactor has seen the socket writable once, which would
        // lose a new flow's first datagram. Writability is never waited for.
        match socket2::SockRef::from(&flow.socket).send(payload) {
            Ok(_) => {
                flow.up += payload.len() as u64;
                self.counters.dgrams_up += 1;
                SendOutcome::Sent
            }
            // Full send buffer, or an ICMP refusal of an earlier datagram
            // reported now: UDP semantics, the datagram is lost.
            Err(_) => {
                self.counters.dropped_up += 1;
                SendOutcome::Dropped
            }
        }
    }

    /// Registers `cx`'s waker with every host socket; true when one has a
    /// datagram (or an error) to read now.
    pub(crate) fn poll_ready(&self, cx: &mut Context<'_>) -> bool {
        let mut ready = false;
        for flow in self.flows.values() {
            if flow.socket.poll_recv_ready(cx).is_ready() {
                ready = true;
            }
        }
        ready
    }

    /// Reads what the host sockets hold and hands each datagram to `deliver`
    /// (the flow's key, the payload), which returns whether the guest output
    /// has room for more; reading stops when it says no (the rest waits in the
    /// kernel). Call only when there is room. Datagrams larger than
    /// `max_payload` are dropped and counted. Returns the flows whose socket
    /// failed (already removed).
    pub(crate) fn recv_ready(
        &mut self,
        max_payload: usize,
        now: Instant,
        mut deliver: impl FnMut(&FlowKey, &[u8]) -> bool,
    ) -> Vec<ClosedUdpFlow> {
        if self.buf.len() < MAX_DATAGRAM {
            self.buf.resize(MAX_DATAGRAM, 0);
        }
        let mut failed = Vec::new();
        let mut room = true;
        for (key, flow) in &mut self.flows {
            for _ in 0..RECV_BUDGET_PER_FLOW {
                if !room {
                    break;
                }
                match flow.socket.try_recv(&mut self.buf) {
                    Ok(n) => {
                        flow.last = now;
                        flow.answered = true;
                        if n > max_payload {
                            self.counters.dropped_oversize += 1;
                            continue;
                        }
                        let Some(payload) = self.buf.get(..n) else {
                            continue;
                        };
                        flow.down += n as u64;
                        self.counters.dgrams_down += 1;
                        room = deliver(key, payload);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    // An ICMP port/host unreachable for an earlier datagram:
                    // the flow stays (the destination may come up), nothing
                    // reaches the guest.
                    Err(e) if is_icmp_refusal(&e) => {}
                    Err(e) => {
                        tracing::debug!(dst = %key.dst, error = %e, "UDP host socket failed");
                        failed.push(flow.closed(*key, UdpEnd::Error, now));
                        break;
                    }
                }
            }
        }
        for c in &failed {
            self.flows.remove(&c.key);
        }
        failed
    }

    /// Removes and returns the flows idle past their expiry at `now`.
    pub(crate) fn expire(&mut self, now: Instant) -> Vec<ClosedUdpFlow> {
        let limits = self.limits;
        let mut out = Vec::new();
        self.flows.retain(|key, flow| {
            let idle = if flow.answered {
                limits.idle
            } else {
                limits.idle_unanswered
            };
            if now.saturating_duration_since(flow.last) >= idle {
                out.push(flow.closed(*key, UdpEnd::Idle, now));
                false
            } else {
                true
            }
        });
        out
    }

    /// Removes and returns every flow (session end).
    pub(crate) fn close_all(&mut self, now: Instant) -> Vec<ClosedUdpFlow> {
        self.flows
            .drain()
            .map(|(key, flow)| flow.closed(key, UdpEnd::Closed, now))
            .collect()
    }
}

/// Whether `e` reports an ICMP error for an earlier datagram on a connected
/// UDP socket (the socket stays usable).
fn is_icmp_refusal(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::HostUnreachable
            | io::ErrorKind::NetworkUnreachable
    )
}

/// A non-blocking UDP socket on an ephemeral port, connected to `dst`; refused
/// when the kernel routes `dst` locally (see the module docs).
fn connect_host_socket(dst: SocketAddr) -> Result<UdpSocket, UdpOpenError> {
    let err = |source| UdpOpenError::Socket { dst, source };
    let bind: SocketAddr = match dst {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = std::net::UdpSocket::bind(bind).map_err(err)?;
    socket.connect(dst).map_err(err)?;
    let local = socket.local_addr().map_err(err)?.ip();
    if local == dst.ip() || local.is_loopback() {
        return Err(UdpOpenError::HostAddress(dst.ip()));
    }
    socket.set_nonblocking(true).map_err(err)?;
    UdpSocket::from_std(socket).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::Transport;

    fn key(dst: SocketAddr) -> FlowKey {
        FlowKey {
            transport: Transport::Udp,
            src: "10.0.2.15:40000".parse().unwrap(),
            dst,
        }
    }

    /// Opens a flow to the loopback `key.dst` by hand, through the same
    /// table: [`UdpFlows::open`] refuses loopback (a host address).
    fn insert_loopback_flow(flows: &mut UdpFlows, key: FlowKey, id: u64, now: Instant) {
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.connect(key.dst).unwrap();
        sock.set_nonblocking(true).unwrap();
        let socket = UdpSocket::from_std(sock).unwrap();
        flows.flows.insert(key, UdpFlow::new(id, socket, now));
    }

    /// The first non-loopback local IPv4 address, if the test host has one.
    fn host_ipv4() -> Option<IpAddr> {
        crate::decide::host_addresses()
            .into_iter()
            .find(|a| a.is_ipv4() && !a.is_loopback())
    }

    #[tokio::test]
    async fn datagrams_flow_both_ways_and_are_counted() {
        // A loopback "destination": the host-address check refuses loopback,
        // so the test opens the flow's socket by hand through the same table.
        let server = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let dst = server.local_addr().unwrap();
        let mut flows = UdpFlows::new(UdpLimits::default());
        let now = Instant::now();
        assert!(matches!(
            flows.open(1, key(dst), now),
            Err(UdpOpenError::HostAddress(_))
        ));
        assert!(flows.is_empty());
        insert_loopback_flow(&mut flows, key(dst), 7, now);
        assert_eq!(flows.send(&key(dst), b"ping", now), SendOutcome::Sent);
        let other = key("127.0.0.1:9".parse().unwrap());
        assert_eq!(flows.send(&other, b"x", now), SendOutcome::NoFlow);
        let mut buf = [0u8; 64];
        let (n, from) = server.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"ping");
        server.send_to(b"pong", from).unwrap();
        server.send_to(&[0u8; 2000], from).unwrap();
        // Wait for readiness the way the datapath does.
        std::future::poll_fn(|cx| {
            if flows.poll_ready(cx) {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
        .await;
        let mut got = Vec::new();
        let mut tries = 0;
        while got.is_empty() || flows.counters().dropped_oversize == 0 {
            let failed = flows.recv_ready(1472, Instant::now(), |k, p| {
                got.push((*k, p.to_vec()));
                true
            });
            assert!(failed.is_empty());
            tries += 1;
            assert!(tries < 1000, "datagrams never arrived");
            tokio::task::yield_now().await;
        }
        assert_eq!(got, vec![(key(dst), b"pong".to_vec())]);
        let c = flows.counters();
        assert_eq!((c.dgrams_up, c.dgrams_down, c.dropped_oversize), (1, 1, 1));

        // Idle expiry: answered flows last `idle`.
        let later = Instant::now() + DEFAULT_UDP_IDLE_UNANSWERED + Duration::from_secs(1);
        assert!(
            flows.expire(later).is_empty(),
            "answered flow expired early"
        );
        let closed = flows.expire(Instant::now() + DEFAULT_UDP_IDLE + Duration::from_secs(1));
        assert_eq!(closed.len(), 1);
        assert_eq!(
            (closed[0].id, closed[0].up, closed[0].down, closed[0].end),
            (7, 4, 4, UdpEnd::Idle)
        );
        assert!(flows.is_empty());
    }

    #[tokio::test]
    async fn table_is_bounded_and_unanswered_flows_expire_sooner() {
        // Destinations in TEST-NET-2: connect() sends nothing, so nothing
        // leaves the host; a host without a default route cannot route them
        // and the test has nothing to check.
        let limits = UdpLimits {
            max_flows: 2,
            ..UdpLimits::default()
        };
        let mut flows = UdpFlows::new(limits);
        let now = Instant::now();
        let dst = |p: u16| SocketAddr::from(([198, 51, 100, 1], p));
        if let Err(UdpOpenError::Socket { source, .. }) = flows.open(1, key(dst(1)), now)
            && sluice_test_skip::may_skip("route", &format!("no route to TEST-NET-2 ({source})"))
        {
            return;
        }
        flows.open(2, key(dst(2)), now).unwrap();
        assert!(matches!(
            flows.open(3, key(dst(3)), now),
            Err(UdpOpenError::TooMany(2))
        ));
        let at = now + DEFAULT_UDP_IDLE_UNANSWERED;
        let closed = flows.expire(at);
        assert_eq!(closed.len(), 2);
        assert!(closed.iter().all(|c| c.end == UdpEnd::Idle));
        let closed = flows.close_all(at);
        assert!(closed.is_empty());
    }

    #[tokio::test]
    async fn a_host_address_is_refused_before_sending() {
        let Some(ip) = host_ipv4() else {
            sluice_test_skip::may_skip("host-ipv4", "no non-loopback IPv4 address on this host");
            return;
        };
        let mut flows = UdpFlows::new(UdpLimits::default());
        let r = flows.open(1, key(SocketAddr::new(ip, 9)), Instant::now());
        assert!(
            matches!(r, Err(UdpOpenError::HostAddress(a)) if a == ip),
            "{r:?}"
        );
    }

    #[tokio::test]
    async fn revoke_removes_only_the_flows_refused_on_their_names() {
        let mut flows = UdpFlows::new(UdpLimits::default());
        let now = Instant::now();
        let server = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let dst = server.local_addr().unwrap();
        let keys = [
            FlowKey {
                src: "10.0.2.15:1".parse().unwrap(),
                ..key(dst)
            },
            FlowKey {
                src: "10.0.2.15:2".parse().unwrap(),
                ..key(dst)
            },
        ];
        for (i, k) in keys.iter().enumerate() {
            insert_loopback_flow(&mut flows, *k, u64::try_from(i).unwrap(), now);
        }
        let admitted = |names: &[&str]| Admission {
            names: names.iter().map(|n| Box::from(*n)).collect(),
            ..Admission::new(
                crate::decide::Verdict::of(sluice_policy::Reason::Allowlisted),
                None,
            )
        };
        flows.admit(&keys[0], admitted(&["kept.example"]));
        flows.admit(&keys[1], admitted(&["gone.example", "other.example"]));
        assert_eq!(flows.send(&keys[1], b"data", now), SendOutcome::Sent);
        let revoked = flows.revoke(now, |_, names| {
            (!names.contains(&"kept.example")).then_some("not_allowlisted")
        });
        assert_eq!(revoked.len(), 1);
        let (closed, why) = &revoked[0];
        assert_eq!(
            (closed.key, closed.up, *why),
            (keys[1], 4, "not_allowlisted")
        );
        assert!(flows.contains(&keys[0]) && !flows.contains(&keys[1]));
        assert_eq!(flows.send(&keys[1], b"more", now), SendOutcome::NoFlow);
    }
}

//! The datapath: one task owns the smoltcp interface, the socket set, the
//! guest stream and every host socket, and moves bytes between them.
//!
//! Each loop iteration: read a large chunk from the guest and split it into
//! frames; classify each frame before smoltcp sees it (ARP/ICMP only for the
//! gateway, DHCP and DNS served here, new SYNs decided); feed the rest to
//! smoltcp one frame at a time; copy between smoltcp socket buffers and host
//! sockets with `try_read`/`try_write` (one copy each way); emit queued
//! segments into one output batch and write it with as few syscalls as the
//! guest socket takes. Then wait for any readiness: guest, host sockets (their
//! readiness wakers all point at this task), events from helper tasks (host
//! connects, DNS upstream replies, published-port accepts, signals), or
//! smoltcp's next timer.
//!
//! SYN handling: a new SYN is decided first. A denied SYN gets a crafted RST.
//! An allowed SYN is held while the host connects (with a timeout); only then
//! is a listening socket created for exactly that destination and the held SYN
//! fed to it alone, so concurrent SYNs cannot be cross-wired. Duplicate SYNs
//! while a connect is pending are dropped. An inspected flow is accepted
//! first; its first bytes are peeked (left in the socket buffer, so they are
//! replayed upstream for free) and put to the decider before connecting.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use hickory_proto::op::ResponseCode;
use smoltcp::iface::{Config as IfaceConfig, Interface, SocketHandle, SocketSet};
use smoltcp::phy::{Device, DeviceCapabilities, Medium, RxToken, TxToken};
use smoltcp::socket::tcp;
use smoltcp::time::Instant as SmolInstant;
use smoltcp::wire::{
    EthernetAddress, HardwareAddress, IpAddress, IpCidr, IpEndpoint, IpListenEndpoint,
};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::mpsc;

use crate::audit::{AuditEvent, AuditSink, FlowTotals};
use crate::config::Config;
use crate::decide::{
    DecideContext, Decider, Decision, DenyReason, FlowKey, InspectVerdict, Transport,
};
use crate::dhcp::{self, DhcpServer};
use crate::dns::{self, DnsTable, Question};
use crate::enforce::{WireName, sniff_wire_name};
use crate::frames::{FrameError, FrameReader, TxBatch};
use crate::packet::{self, Addresses, Class, DropReason};
use crate::udp::{ClosedUdpFlow, SendOutcome, UdpFlows, UdpOpenError};

mod intercept;
mod revoke;

use intercept::HostStream;

/// Bytes read from the guest per syscall.
const GUEST_READ_CHUNK: usize = 256 * 1024;
/// Output queued for the guest beyond which the stack stops emitting and guest input pauses.
const TX_HIGH_WATER: usize = 1024 * 1024;
/// SO_SNDBUF asked for the guest stream (the kernel caps it at
/// `net.core.wmem_max` and doubles it).
const GUEST_SNDBUF: usize = 4 * 1024 * 1024;
/// Emit-and-write rounds per loop turn while the guest socket takes everything.
const EGRESS_ROUNDS: usize = 4;
/// Idle output time after which the output batch's storage is trimmed.
const TX_TRIM_IDLE: Duration = Duration::from_secs(1);
/// DNS-over-TCP connection buffers.
const DNS_TCP_BUF: usize = 64 * 1024 + 2;
/// DNS queries forwarded at once; beyond it the guest gets SERVFAIL.
const MAX_DNS_IN_FLIGHT: usize = 256;
/// DNS table capacity (address, name pairs).
const DNS_TABLE_CAPACITY: usize = 65536;
/// Per-upstream DNS timeout.
const DNS_TIMEOUT: Duration = Duration::from_secs(3);
/// Counters are logged this often.
const COUNTER_LOG_INTERVAL: Duration = Duration::from_secs(60);
/// First local port for published-port connections into the guest.
const PUBLISH_PORT_BASE: u16 = 49152;
/// Host peers of published UDP ports remembered at once (for replies).
const MAX_UDP_PUBLISH_PEERS: usize = 1024;

/// Messages from helper tasks to the datapath.
#[derive(Debug)]
pub enum Event {
    /// A host connect for flow `id` finished.
    Connected {
        /// The flow.
        id: u64,
        /// The connected stream or the error.
        result: io::Result<TcpStream>,
    },
    /// An upstream answer (or none) for a guest DNS query over UDP.
    DnsUdpReply {
        /// The guest endpoint that asked.
        guest: SocketAddrV4,
        /// The question asked.
        question: Question,
        /// The upstream response, `None` on timeout.
        reply: Option<Vec<u8>>,
    },
    /// An upstream answer for a guest DNS query over TCP flow `id`.
    DnsTcpReply {
        /// The DNS-over-TCP flow.
        id: u64,
        /// The question asked.
        question: Question,
        /// The upstream response, `None` on failure.
        reply: Option<Vec<u8>>,
    },
    /// A host connection to a published TCP port.
    PublishTcp {
        /// The accepted host connection.
        stream: TcpStream,
        /// Guest port to connect to.
        guest_port: u16,
    },
    /// A datagram to a published UDP port.
    PublishUdp {
        /// The host socket it arrived on (replies leave through it).
        socket: Arc<tokio::net::UdpSocket>,
        /// The host peer that sent it.
        peer: SocketAddr,
        /// Guest port to deliver to.
        guest_port: u16,
        /// The payload.
        data: Vec<u8>,
    },
    /// Log the counters now (SIGUSR1).
    DumpCounters,
    /// A policy reload was attempted (SIGHUP or a change of the policy
    /// file): swap it in and revoke what it denies, or audit the rejection.
    Reload(Box<crate::reload::PolicyReload>),
    /// An event of the interception proxy (an `http` request line, or an
    /// intercepted connection's failure), written to the audit sink.
    Intercept(Box<sluice_intercept::HttpEvent>),
    /// Close flows and stop (SIGTERM/SIGINT).
    Shutdown,
}

/// Why a guest session ended.
#[derive(Debug)]
pub enum SessionEnd {
    /// The guest closed its stream (go back to accepting).
    GuestClosed,
    /// The guest violated the stream protocol; the connection was dropped.
    ProtocolError(FrameError),
    /// An I/O error on the guest stream.
    GuestIo(io::Error),
    /// Shutdown was requested.
    Shutdown,
}

/// Frame and flow counters, logged periodically, on SIGUSR1 and at exit.
#[derive(Debug, Default, Clone)]
pub struct Counters {
    /// Frames received from the guest.
    pub frames_in: u64,
    /// Frames dropped before the stack, by [`DropReason::index`].
    pub dropped: [u64; DropReason::ALL.len()],
    /// Flows opened.
    pub flows_opened: u64,
    /// Flows denied (RST or drop).
    pub flows_denied: u64,
    /// Flows closed.
    pub flows_closed: u64,
    /// Duplicate SYNs dropped while a connect was pending.
    pub syn_duplicates: u64,
    /// SYNs the stack did not take (guest will retransmit).
    pub syn_not_taken: u64,
    /// DNS queries from the guest.
    pub dns_queries: u64,
    /// DNS queries denied by the policy (name refused or every answer
    /// address refused).
    pub dns_denied: u64,
    /// UDP datagrams denied.
    pub udp_denied: u64,
    /// UDP flows opened (allowed and given a host socket).
    pub udp_flows_opened: u64,
}

impl Counters {
    fn log(&self, flows_open: usize) {
        let dropped: Vec<String> = DropReason::ALL
            .iter()
            .filter(|r| self.dropped[r.index()] > 0)
            .map(|r| format!("{}={}", r.as_str(), self.dropped[r.index()]))
            .collect();
        tracing::info!(
            frames_in = self.frames_in,
            dropped = %dropped.join(","),
            flows_open,
            flows_opened = self.flows_opened,
            flows_denied = self.flows_denied,
            flows_closed = self.flows_closed,
            syn_duplicates = self.syn_duplicates,
            syn_not_taken = self.syn_not_taken,
            dns_queries = self.dns_queries,
            dns_denied = self.dns_denied,
            udp_denied = self.udp_denied,
            udp_flows_opened = self.udp_flows_opened,
            "counters"
        );
    }
}

/// The smoltcp device for one step: at most one received frame, and the output batch.
struct GuestDevice<'a> {
    rx: Option<&'a [u8]>,
    tx: &'a mut TxBatch,
    mtu: usize,
}

struct GuestRx<'a>(&'a [u8]);
struct GuestTx<'a>(&'a mut TxBatch);

impl RxToken for GuestRx<'_> {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(self.0)
    }
}

impl TxToken for GuestTx<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        self.0.push_with(len, f)
    }
}

impl Device for GuestDevice<'_> {
    type RxToken<'b>
        = GuestRx<'b>
    where
        Self: 'b;
    type TxToken<'b>
        = GuestTx<'b>
    where
        Self: 'b;

    fn receive(&mut self, _t: SmolInstant) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        let frame = self.rx.take()?;
        Some((GuestRx(frame), GuestTx(&mut *self.tx)))
    }

    fn transmit(&mut self, _t: SmolInstant) -> Option<Self::TxToken<'_>> {
        (self.tx.queued() < TX_HIGH_WATER).then_some(GuestTx(&mut *self.tx))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = self.mtu + 14;
        caps.max_burst_size = None;
        caps
    }
}

/// What to do once the host connect completes.
enum FlowState {
    /// SYN held, host connect in flight.
    Connecting { syn: Vec<u8> },
    /// Guest handshake done, waiting for the first bytes.
    Inspecting {
        handle: SocketHandle,
        deadline: Instant,
        max_bytes: usize,
        /// Bytes queued when the decider last answered `NeedMore`: the
        /// bytes are put to it again only once more have arrived.
        peeked: usize,
    },
    /// Inspection allowed, host connect in flight.
    InspectConnecting { handle: SocketHandle },
    /// Both sides connected: bytes flow.
    Open {
        handle: SocketHandle,
        host: HostStream,
        host_eof: bool,
        host_write_shut: bool,
    },
    /// A DNS-over-TCP connection to the gateway.
    DnsTcp {
        handle: SocketHandle,
        inbuf: Vec<u8>,
        waiting: bool,
    },
}

struct Flow {
    key: FlowKey,
    state: FlowState,
    opened: Instant,
    up: u64,
    down: u64,
    /// Whether the flow's `connection` (allow) line was written (a close line follows only then).
    audited_open: bool,
    /// The SNI or Host that admitted an inspected flow.
    wire: Option<WireName>,
    /// The names that admitted the flow (rechecked on reload): the wire
    /// name, or the table's names for the destination at open.
    names: Vec<Box<str>>,
}

impl Flow {
    /// The TCP flow `id`'s identity and totals so far, for its close line.
    fn totals(&self, id: u64) -> FlowTotals {
        FlowTotals {
            flow: id,
            proto: "tcp",
            src: self.key.src,
            dst: self.key.dst,
            bytes_up: self.up,
            bytes_down: self.down,
            duration_ms: FlowTotals::millis(self.opened.elapsed()),
        }
    }
}

/// One guest session's datapath state.
pub struct Datapath {
    cfg: Arc<Config>,
    decider: Arc<dyn Decider>,
    audit: AuditSink,
    counters: Counters,
    dns: DnsTable,
    iface: Interface,
    sockets: SocketSet<'static>,
    tx: TxBatch,
    dhcp: DhcpServer,
    guest_mac: Option<[u8; 6]>,
    flows: HashMap<u64, Flow>,
    by_key: HashMap<FlowKey, u64>,
    next_id: u64,
    next_publish_port: u16,
    dns_in_flight: usize,
    /// Published UDP: gateway-side port -> (host socket, host peer).
    udp_published: HashMap<u16, (Arc<tokio::net::UdpSocket>, SocketAddr)>,
    /// Published UDP: (host socket address, host peer) -> gateway-side port.
    udp_published_by_peer: HashMap<(SocketAddr, SocketAddr), u16>,
    /// Forwarded guest UDP flows (crate::udp).
    udp: UdpFlows,
    /// When idle UDP flows were last expired.
    udp_swept: Instant,
    events: mpsc::UnboundedSender<Event>,
    epoch: Instant,
}

impl std::fmt::Debug for Datapath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Datapath")
            .field("flows", &self.flows.len())
            .finish_non_exhaustive()
    }
}

fn ip4(a: Ipv4Addr) -> IpAddress {
    IpAddress::Ipv4(a)
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

impl Datapath {
    /// A fresh datapath (new interface, no flows) for one guest session.
    pub fn new(
        cfg: Arc<Config>,
        decider: Arc<dyn Decider>,
        audit: AuditSink,
        events: mpsc::UnboundedSender<Event>,
    ) -> Self {
        let epoch = Instant::now();
        let mut tx = TxBatch::default();
        let mut dev = GuestDevice {
            rx: None,
            tx: &mut tx,
            mtu: usize::from(cfg.mtu),
        };
        let mut icfg =
            IfaceConfig::new(HardwareAddress::Ethernet(EthernetAddress(cfg.gateway_mac)));
        icfg.random_seed =
            u64::from(std::process::id()) ^ u64::from(epoch.elapsed().subsec_nanos());
        let mut iface = Interface::new(icfg, &mut dev, SmolInstant::from_micros(0));
        iface.update_ip_addrs(|addrs| {
            let _ = addrs.push(IpCidr::new(ip4(cfg.gateway_ip), cfg.subnet.prefix_len()));
        });
        let _ = iface.routes_mut().add_default_ipv4_route(cfg.gateway_ip);
        iface.set_any_ip(true);
        let mut dns = DnsTable::new(DNS_TABLE_CAPACITY);
        if let Some((min, max)) = decider.dns_ttl_bounds() {
            dns.set_ttl_bounds(min, max);
        }
        let udp_limits = cfg.udp;
        Self {
            dhcp: DhcpServer::new(&cfg),
            cfg,
            decider,
            audit,
            counters: Counters::default(),
            dns,
            iface,
            sockets: SocketSet::new(Vec::new()),
            tx,
            guest_mac: None,
            flows: HashMap::new(),
            by_key: HashMap::new(),
            next_id: 1,
            next_publish_port: PUBLISH_PORT_BASE,
            dns_in_flight: 0,
            udp_published: HashMap::new(),
            udp_published_by_peer: HashMap::new(),
            udp: UdpFlows::new(udp_limits),
            udp_swept: epoch,
            events,
            epoch,
        }
    }

    /// Ends the session, handing back the audit sink.
    pub fn into_audit(self) -> AuditSink {
        self.audit
    }

    /// The counters so far.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The DNS table.
    pub fn dns_table(&self) -> &DnsTable {
        &self.dns
    }

    fn now(&self) -> SmolInstant {
        SmolInstant::from_micros(
            i64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(i64::MAX),
        )
    }

    fn addresses(&self) -> Addresses {
        Addresses {
            gateway_ip: self.cfg.gateway_ip,
            guest_ip: self.cfg.guest_ip,
            guest_mac: self.guest_mac,
        }
    }

    /// Runs until the guest disconnects, breaks the protocol, or shutdown.
    pub async fn run(
        &mut self,
        guest: &UnixStream,
        events: &mut mpsc::UnboundedReceiver<Event>,
    ) -> SessionEnd {
        let mut reader = FrameReader::new(GUEST_READ_CHUNK, usize::from(self.cfg.mtu) + 14);
        let mut pending_events: Vec<Event> = Vec::new();
        let mut last_counters = Instant::now();
        let mut timer = Box::pin(tokio::time::sleep(Duration::from_secs(3600)));
        let mut last_output = Instant::now();
        // A deep guest socket queue: the kernel holds the backlog, each write
        // moves more and the loop wakes less often. Capped by the kernel
        // (net.core.wmem_max); best effort.
        let sock = socket2::SockRef::from(guest);
        if let Err(e) = sock.set_send_buffer_size(GUEST_SNDBUF) {
            tracing::debug!(error = %e, "guest socket: SO_SNDBUF not set");
        }
        tracing::debug!(
            sndbuf = sock.send_buffer_size().unwrap_or(0),
            "guest socket send buffer"
        );
        loop {
            // 1. Guest input (paused while the output batch is over its bound).
            if self.tx.queued() < TX_HIGH_WATER {
                for _ in 0..8 {
                    let spare = reader.spare();
                    let want = spare.len();
                    match guest.try_read(spare) {
                        Ok(0) => {
                            self.close_all("guest_closed");
                            return SessionEnd::GuestClosed;
                        }
                        Ok(n) => {
                            reader.filled(n);
                            loop {
                                match reader.next_frame() {
                                    Ok(Some(frame)) => self.on_frame(frame),
                                    Ok(None) => break,
                                    Err(e) => {
                                        self.close_all("protocol_error");
                                        return SessionEnd::ProtocolError(e);
                                    }
                                }
                            }
                            if n < want || self.tx.queued() >= TX_HIGH_WATER {
                                break;
                            }
                        }
                        Err(e) if would_block(&e) => break,
                        Err(e) => {
                            self.close_all("guest_error");
                            return SessionEnd::GuestIo(e);
                        }
                    }
                }
            }
            // 2. Events from helper tasks.
            while let Ok(ev) = events.try_recv() {
                pending_events.push(ev);
            }
            for ev in pending_events.drain(..) {
                if self.on_event(ev) {
                    self.close_all("shutdown");
                    self.flush_best_effort(guest);
                    return SessionEnd::Shutdown;
                }
            }
            // 3. Host <-> smoltcp copies, inspection, DNS-over-TCP, closes;
            // datagrams from forwarded UDP flows.
            self.pump_flows();
            self.pump_udp();
            // 4-5. Segments out, written to the guest. smoltcp emits only
            // into a drained batch: what the guest socket did not take waits
            // in the batch (never grows past the high-water mark) and the
            // loop waits for writability instead of queueing more.
            for _ in 0..EGRESS_ROUNDS {
                if self.tx.queued() == 0 {
                    self.egress();
                }
                if self.tx.queued() == 0 {
                    break;
                }
                while self.tx.queued() > 0 {
                    match guest.try_write(self.tx.unwritten()) {
                        Ok(n) => self.tx.consume(n),
                        Err(e) if would_block(&e) => break,
                        Err(e) => {
                            self.close_all("guest_error");
                            return SessionEnd::GuestIo(e);
                        }
                    }
                }
                if self.tx.queued() > 0 {
                    break;
                }
                last_output = Instant::now();
            }
            // Ends the audit rate-limit window (summary of suppressed denies).
            self.audit.tick();
            if last_counters.elapsed() >= COUNTER_LOG_INTERVAL {
                last_counters = Instant::now();
                self.counters.log(self.flows.len());
                self.dns.purge_expired(Instant::now());
            }
            // 6. Wait for anything to do.
            let now = self.now();
            let delay = self
                .iface
                .poll_delay(now, &self.sockets)
                .map(|d| Duration::from_micros(d.total_micros()));
            let delay = delay
                .unwrap_or(Duration::from_secs(1))
                .min(self.next_inspect_deadline());
            // With output waiting for the guest socket, smoltcp's "poll now"
            // cannot make progress (it emits only into a drained batch): wait
            // for writability instead of spinning.
            let delay = if self.tx.queued() > 0 {
                delay.max(Duration::from_millis(100))
            } else if self.tx.holds_surplus() {
                // Give the batch's storage back once output has been idle a while.
                if last_output.elapsed() >= TX_TRIM_IDLE {
                    self.tx.trim();
                }
                delay.min(TX_TRIM_IDLE)
            } else {
                delay
            };
            if delay.is_zero() {
                tokio::task::yield_now().await;
                continue;
            }
            timer.as_mut().reset(tokio::time::Instant::now() + delay);
            let want_read = self.tx.queued() < TX_HIGH_WATER;
            let want_write = self.tx.queued() > 0;
            std::future::poll_fn(|cx| {
                let mut ready = false;
                if want_read && guest.poll_read_ready(cx).is_ready() {
                    ready = true;
                }
                if want_write && guest.poll_write_ready(cx).is_ready() {
                    ready = true;
                }
                while let Poll::Ready(Some(ev)) = events.poll_recv(cx) {
                    pending_events.push(ev);
                    ready = true;
                }
                if timer.as_mut().poll(cx).is_ready() {
                    ready = true;
                }
                if self.poll_hosts(cx) {
                    ready = true;
                }
                if want_read && self.udp.poll_ready(cx) {
                    ready = true;
                }
                if ready {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            })
            .await;
        }
    }

    fn next_inspect_deadline(&self) -> Duration {
        let now = Instant::now();
        self.flows
            .values()
            .filter_map(|f| match f.state {
                FlowState::Inspecting { deadline, .. } => {
                    Some(deadline.saturating_duration_since(now))
                }
                _ => None,
            })
            .min()
            .unwrap_or(Duration::from_secs(3600))
    }

    /// Registers this task's waker with every host socket that has something
    /// to do; true when one is ready now.
    fn poll_hosts(&mut self, cx: &mut std::task::Context<'_>) -> bool {
        let mut ready = false;
        for flow in self.flows.values() {
            if let FlowState::Open {
                handle,
                host,
                host_eof,
                host_write_shut,
            } = &flow.state
            {
                let sock = self.sockets.get::<tcp::Socket<'_>>(*handle);
                if !*host_eof && sock.can_send() && host.poll_read_ready(cx).is_ready() {
                    ready = true;
                }
                if !*host_write_shut && sock.can_recv() && host.poll_write_ready(cx).is_ready() {
                    ready = true;
                }
            }
        }
        ready
    }

    /// Handles one guest frame.
    pub fn on_frame(&mut self, frame: &[u8]) {
        self.counters.frames_in += 1;
        match packet::classify(frame, &self.addresses()) {
            Class::Stack => self.ingress(frame),
            Class::IcmpEcho => packet::write_echo_reply(&mut self.tx, self.cfg.gateway_mac, frame),
            Class::TcpSyn { src, dst, seq } => self.on_syn(frame, src, dst, seq),
            Class::Dhcp { start, end } => {
                if let Some(payload) = frame.get(start..end) {
                    self.on_dhcp(payload);
                }
            }
            Class::Udp {
                src,
                dst,
                start,
                end,
            } => {
                if let Some(payload) = frame.get(start..end) {
                    self.on_udp(frame, src, dst, payload);
                }
            }
            Class::Drop(reason) => {
                self.counters.dropped[reason.index()] += 1;
                tracing::trace!(reason = reason.as_str(), "guest frame dropped");
                if let Some(audit) = reason.audit_reason() {
                    self.audit.record(&AuditEvent::FrameDrop {
                        reason: audit,
                        detail: reason.as_str(),
                    });
                }
            }
        }
    }

    fn ingress(&mut self, frame: &[u8]) {
        let now = self.now();
        let mut dev = GuestDevice {
            rx: Some(frame),
            tx: &mut self.tx,
            mtu: usize::from(self.cfg.mtu),
        };
        let _ = self
            .iface
            .poll_ingress_single(now, &mut dev, &mut self.sockets);
    }

    fn egress(&mut self) {
        let now = self.now();
        let mut dev = GuestDevice {
            rx: None,
            tx: &mut self.tx,
            mtu: usize::from(self.cfg.mtu),
        };
        self.iface.poll_maintenance(now);
        for _ in 0..256 {
            if matches!(
                self.iface.poll_egress(now, &mut dev, &mut self.sockets),
                smoltcp::iface::PollResult::None
            ) {
                break;
            }
        }
    }

    fn frame_src_mac(frame: &[u8]) -> [u8; 6] {
        frame
            .get(6..12)
            .and_then(|m| m.try_into().ok())
            .unwrap_or([0xff; 6])
    }

    fn on_dhcp(&mut self, payload: &[u8]) {
        let Some(reply) = self.dhcp.handle(payload) else {
            return;
        };
        if self.dhcp.leased() {
            self.guest_mac = self.dhcp.client_mac();
        }
        packet::write_udp(
            &mut self.tx,
            self.cfg.gateway_mac,
            reply.client_mac,
            SocketAddrV4::new(self.cfg.gateway_ip, dhcp::SERVER_PORT),
            SocketAddrV4::new(reply.dst_ip, dhcp::CLIENT_PORT),
            &reply.payload,
        );
    }

    fn deny_audit(&mut self, key: &FlowKey, reason: DenyReason) {
        self.counters.flows_denied += 1;
        let proto = if key.transport == Transport::Tcp {
            "tcp"
        } else {
            "udp"
        };
        self.audit.record(&AuditEvent::FlowDeny {
            proto,
            src: key.src,
            dst: key.dst,
            reason: reason.as_str(),
        });
    }

    fn rst_syn(&mut self, frame: &[u8], src: SocketAddrV4, dst: SocketAddrV4, seq: u32) {
        let mac = Self::frame_src_mac(frame);
        packet::write_rst_for_syn(&mut self.tx, self.cfg.gateway_mac, mac, src, dst, seq);
    }

    fn on_syn(&mut self, frame: &[u8], src: SocketAddrV4, dst: SocketAddrV4, seq: u32) {
        let key = FlowKey {
            transport: Transport::Tcp,
            src: src.into(),
            dst: dst.into(),
        };
        if let Some(id) = self.by_key.get(&key) {
            match self.flows.get(id).map(|f| &f.state) {
                Some(FlowState::Connecting { .. }) | Some(FlowState::InspectConnecting { .. }) => {
                    self.counters.syn_duplicates += 1;
                }
                // A retransmitted SYN for a socket that exists: smoltcp answers it.
                _ => self.ingress(frame),
            }
            return;
        }
        // Every guest-initiated connection counts, DNS over TCP to the
        // gateway included: each holds socket buffers and a slot in every poll.
        if self.flows.len() >= self.cfg.max_flows {
            self.rst_syn(frame, src, dst, seq);
            self.deny_audit(&key, DenyReason::TooManyFlows);
            return;
        }
        if *dst.ip() == self.cfg.gateway_ip {
            if dst.port() == 53 {
                if let Some(handle) = self.accept_syn(frame, src, dst) {
                    self.insert_flow(
                        key,
                        FlowState::DnsTcp {
                            handle,
                            inbuf: Vec::new(),
                            waiting: false,
                        },
                    );
                }
                return;
            }
            self.rst_syn(frame, src, dst, seq);
            self.deny_audit(&key, DenyReason::GatewayAddress);
            return;
        }
        let decision = {
            let ctx = DecideContext {
                dns: &self.dns,
                now: Instant::now(),
            };
            self.decider.decide_tcp(&key, &ctx)
        };
        match decision {
            Decision::Deny(reason) => {
                self.rst_syn(frame, src, dst, seq);
                self.deny_audit(&key, reason);
            }
            Decision::Allow => {
                let id = self.insert_flow(
                    key,
                    FlowState::Connecting {
                        syn: frame.to_vec(),
                    },
                );
                self.spawn_connect(id, key.dst);
            }
            Decision::Inspect {
                max_bytes,
                deadline,
            } => {
                if let Some(handle) = self.accept_syn(frame, src, dst) {
                    let deadline = Instant::now() + deadline;
                    self.insert_flow(
                        key,
                        FlowState::Inspecting {
                            handle,
                            deadline,
                            max_bytes,
                            peeked: 0,
                        },
                    );
                }
            }
        }
    }

    fn insert_flow(&mut self, key: FlowKey, state: FlowState) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.flows.insert(
            id,
            Flow {
                key,
                state,
                opened: Instant::now(),
                up: 0,
                down: 0,
                audited_open: false,
                wire: None,
                names: Vec::new(),
            },
        );
        self.by_key.insert(key, id);
        id
    }

    fn spawn_connect(&self, id: u64, dst: SocketAddr) {
        let events = self.events.clone();
        let timeout = self.cfg.connect_timeout;
        tokio::spawn(async move {
            let result = match tokio::time::timeout(timeout, TcpStream::connect(dst)).await {
                Ok(r) => r,
                Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "connect timed out")),
            };
            let _ = events.send(Event::Connected { id, result });
        });
    }

    /// Creates a socket listening on exactly `dst`, feeds it `syn` alone, and
    /// keeps it only if it took the SYN from `src`.
    fn accept_syn(
        &mut self,
        syn: &[u8],
        src: SocketAddrV4,
        dst: SocketAddrV4,
    ) -> Option<SocketHandle> {
        let dns = *dst.ip() == self.cfg.gateway_ip;
        let (rx, tx) = if dns {
            (DNS_TCP_BUF, DNS_TCP_BUF)
        } else {
            (self.cfg.flow_buffer, self.cfg.flow_buffer)
        };
        let mut sock = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0u8; rx]),
            tcp::SocketBuffer::new(vec![0u8; tx]),
        );
        sock.set_nagle_enabled(false);
        sock.set_ack_delay(None);
        sock.set_keep_alive(Some(smoltcp::time::Duration::from_secs(60)));
        sock.set_timeout(Some(smoltcp::time::Duration::from_secs(300)));
        let ep = IpListenEndpoint {
            addr: Some(ip4(*dst.ip())),
            port: dst.port(),
        };
        if sock.listen(ep).is_err() {
            return None;
        }
        let handle = self.sockets.add(sock);
        self.ingress(syn);
        let sock = self.sockets.get::<tcp::Socket<'_>>(handle);
        let want = IpEndpoint::new(ip4(*src.ip()), src.port());
        if sock.state() == tcp::State::SynReceived && sock.remote_endpoint() == Some(want) {
            Some(handle)
        } else {
            self.counters.syn_not_taken += 1;
            self.sockets.remove(handle);
            None
        }
    }

    fn on_publish_udp(
        &mut self,
        socket: Arc<tokio::net::UdpSocket>,
        peer: SocketAddr,
        guest_port: u16,
        data: &[u8],
    ) {
        let Ok(local) = socket.local_addr() else {
            return;
        };
        let port = match self.udp_published_by_peer.get(&(local, peer)) {
            Some(p) => *p,
            None => {
                if self.udp_published.len() >= MAX_UDP_PUBLISH_PEERS {
                    self.udp_published.clear();
                    self.udp_published_by_peer.clear();
                }
                let mut p = self.next_publish_port;
                while self.udp_published.contains_key(&p) {
                    p = p.checked_add(1).unwrap_or(PUBLISH_PORT_BASE);
                }
                self.next_publish_port = p.checked_add(1).unwrap_or(PUBLISH_PORT_BASE);
                self.udp_published.insert(p, (socket, peer));
                self.udp_published_by_peer.insert((local, peer), p);
                p
            }
        };
        let mac = self.guest_mac.unwrap_or([0xff; 6]);
        packet::write_udp(
            &mut self.tx,
            self.cfg.gateway_mac,
            mac,
            SocketAddrV4::new(self.cfg.gateway_ip, port),
            SocketAddrV4::new(self.cfg.guest_ip, guest_port),
            data,
        );
    }

    fn on_udp(&mut self, frame: &[u8], src: SocketAddrV4, dst: SocketAddrV4, payload: &[u8]) {
        if *dst.ip() == self.cfg.gateway_ip && dst.port() == 53 {
            self.on_dns_udp(frame, src, payload);
            return;
        }
        if *dst.ip() == self.cfg.gateway_ip {
            // A guest reply on a published UDP port goes back to the host peer.
            if let Some((sock, peer)) = self.udp_published.get(&dst.port()) {
                let _ = sock.try_send_to(payload, *peer);
                return;
            }
        }
        let key = FlowKey {
            transport: Transport::Udp,
            src: src.into(),
            dst: dst.into(),
        };
        let now = Instant::now();
        if self.udp.send(&key, payload, now) != SendOutcome::NoFlow {
            return;
        }
        let decision = {
            let ctx = DecideContext {
                dns: &self.dns,
                now,
            };
            self.decider.decide_udp(&key, &ctx)
        };
        let reason = match decision {
            Decision::Deny(r) => r,
            Decision::Allow => match self.open_udp(key, now) {
                Ok(()) => {
                    self.udp.send(&key, payload, now);
                    return;
                }
                Err(r) => r,
            },
            // UDP has no first bytes to inspect: fail closed.
            Decision::Inspect { .. } => DenyReason::UdpNotAllowed,
        };
        self.counters.udp_denied += 1;
        self.deny_audit(&key, reason);
    }

    /// Opens an allowed UDP flow (its host socket) and audits the open.
    fn open_udp(&mut self, key: FlowKey, now: Instant) -> Result<(), DenyReason> {
        let id = self.next_id;
        match self.udp.open(id, key, now) {
            Ok(()) => {}
            Err(UdpOpenError::TooMany(_)) => return Err(DenyReason::TooManyFlows),
            Err(UdpOpenError::HostAddress(ip)) => {
                tracing::warn!(%ip, "UDP destination routes locally: a host address; denied");
                return Err(DenyReason::PlatformDenied);
            }
            Err(e) => {
                tracing::debug!(error = %e, "UDP flow could not be opened");
                return Err(DenyReason::ConnectFailed);
            }
        }
        self.next_id += 1;
        self.counters.udp_flows_opened += 1;
        let names: Vec<&str> = self.dns.names_for(key.dst.ip(), now).take(8).collect();
        self.udp.set_names(&key, &names);
        self.audit.record(&AuditEvent::FlowOpen {
            flow: id,
            proto: "udp",
            src: key.src,
            dst: key.dst,
            names: &names,
        });
        Ok(())
    }

    /// Moves datagrams from forwarded UDP flows' host sockets to the guest
    /// (while the output batch has room) and expires idle flows about once a
    /// second; audits the closes.
    fn pump_udp(&mut self) {
        if self.udp.is_empty() {
            return;
        }
        let now = Instant::now();
        // IPv4 + UDP headers; the gateway does not fragment.
        let max_payload = usize::from(self.cfg.mtu).saturating_sub(28);
        let gateway_mac = self.cfg.gateway_mac;
        let guest_mac = self.guest_mac.unwrap_or([0xff; 6]);
        let tx = &mut self.tx;
        if tx.queued() >= TX_HIGH_WATER {
            return;
        }
        let failed = self.udp.recv_ready(max_payload, now, |key, payload| {
            if let (SocketAddr::V4(from), SocketAddr::V4(to)) = (key.dst, key.src) {
                packet::write_udp(tx, gateway_mac, guest_mac, from, to, payload);
            }
            tx.queued() < TX_HIGH_WATER
        });
        for c in &failed {
            self.audit_udp_close(c, c.end.as_str());
        }
        if now.saturating_duration_since(self.udp_swept) >= Duration::from_secs(1) {
            self.udp_swept = now;
            for c in self.udp.expire(now) {
                self.audit_udp_close(&c, c.end.as_str());
            }
        }
    }

    /// Audits the close of a UDP flow; `end` is [`crate::udp::UdpEnd::as_str`]
    /// or, at session end, why the session ended.
    fn audit_udp_close(&mut self, c: &ClosedUdpFlow, end: &'static str) {
        self.counters.flows_closed += 1;
        self.audit.record(&AuditEvent::FlowClose {
            totals: c.totals(),
            end,
        });
    }

    fn on_dns_udp(&mut self, frame: &[u8], src: SocketAddrV4, payload: &[u8]) {
        self.counters.dns_queries += 1;
        let mac = Self::frame_src_mac(frame);
        let question = match sluice_inspect::dns::parse_query(payload) {
            Ok(q) => q,
            Err(e) => {
                if let Some(b) = self.dns_reject(payload, &e) {
                    self.reply_udp(mac, src, &b);
                }
                return;
            }
        };
        if let Some(local) = self.dns_local(&question) {
            self.reply_udp(mac, src, &local);
            return;
        }
        if !dns::forwarded_type(question.qtype)
            || self.dns_in_flight >= MAX_DNS_IN_FLIGHT
            || self.dns_upstreams().is_empty()
        {
            // A local answer that could not be encoded: nothing to send.
            return;
        }
        // Never the guest's bytes: a query rebuilt from what was checked.
        let Some(query) = dns::upstream_query(&question) else {
            if let Some(b) = sluice_inspect::dns::error_response(&question, ResponseCode::ServFail)
            {
                self.reply_udp(mac, src, &b);
            }
            return;
        };
        self.dns_in_flight += 1;
        let events = self.events.clone();
        let upstreams = self.dns_upstreams();
        tokio::spawn(async move {
            let reply = dns::forward_udp(&query, &upstreams, DNS_TIMEOUT).await;
            let _ = events.send(Event::DnsUdpReply {
                guest: src,
                question,
                reply,
            });
        });
    }

    /// The resolvers for the next forwarded query: the policy's
    /// `dns.upstream` list when [`Config::dns_upstreams_from_policy`] and the
    /// policy in force names one (read per query, so a reload applies to the
    /// next query), else [`Config::dns_upstreams`].
    fn dns_upstreams(&self) -> Vec<SocketAddr> {
        if self.cfg.dns_upstreams_from_policy
            && let Some(servers) = self.decider.policy_dns_upstreams()
        {
            return servers;
        }
        self.cfg.dns_upstreams.clone()
    }

    fn reply_udp(&mut self, mac: [u8; 6], to: SocketAddrV4, payload: &[u8]) {
        let mac = self.guest_mac.unwrap_or(mac);
        packet::write_udp(
            &mut self.tx,
            self.cfg.gateway_mac,
            mac,
            SocketAddrV4::new(self.cfg.gateway_ip, 53),
            to,
            payload,
        );
    }

    fn audit_dns(
        &mut self,
        q: &Question,
        rcode: ResponseCode,
        answers: &[IpAddr],
        outcome: &'static str,
    ) {
        self.audit_dns_reason(q, rcode, answers, outcome, None);
    }

    fn audit_dns_reason(
        &mut self,
        q: &Question,
        rcode: ResponseCode,
        answers: &[IpAddr],
        outcome: &'static str,
        reason: Option<&'static str>,
    ) {
        let qtype = q.qtype.to_string();
        self.audit.record(&AuditEvent::Dns {
            qname: &q.name,
            qtype: &qtype,
            rcode: crate::audit::rcode_mnemonic(rcode),
            answers,
            outcome,
            reason,
        });
    }

    /// The answer for guest bytes sluice-inspect's reader refused (FORMERR
    /// for undecodable messages and names that do not normalise, NOTIMP for
    /// other opcodes, REFUSED for other classes), audited `dns_formerr`.
    /// `None` when nothing may be answered (no header, or a response).
    fn dns_reject(
        &mut self,
        payload: &[u8],
        e: &sluice_inspect::dns::DnsReject,
    ) -> Option<Vec<u8>> {
        tracing::debug!(error = %e, "bad DNS query from guest");
        self.counters.dns_denied += 1;
        self.audit.record(&AuditEvent::Dns {
            qname: "",
            qtype: "",
            rcode: crate::audit::rcode_mnemonic(e.rcode()),
            answers: &[],
            outcome: "denied",
            reason: Some("dns_formerr"),
        });
        sluice_inspect::dns::reject_response(payload, e)
    }

    /// The local answer for a query the guest must not get forwarded: a
    /// policy denial of the name (audited with its reason), a withheld type
    /// (anything but A, see [`dns::forwarded_type`]: an empty NOERROR,
    /// audited `dns_type_withheld`), or SERVFAIL when no upstream / too busy.
    /// `None` when the query is to be forwarded.
    fn dns_local(&mut self, question: &Question) -> Option<Vec<u8>> {
        if let Some((rcode, reason)) = self.decider.dns_query(&question.name) {
            self.counters.dns_denied += 1;
            self.audit_dns_reason(question, rcode, &[], "denied", Some(reason));
            return sluice_inspect::dns::error_response(question, rcode);
        }
        if !dns::forwarded_type(question.qtype) {
            self.audit_dns_reason(
                question,
                ResponseCode::NoError,
                &[],
                "denied",
                Some("dns_type_withheld"),
            );
            return sluice_inspect::dns::error_response(question, ResponseCode::NoError);
        }
        if self.dns_in_flight < MAX_DNS_IN_FLIGHT && !self.dns_upstreams().is_empty() {
            return None;
        }
        self.audit_dns(question, ResponseCode::ServFail, &[], "local");
        sluice_inspect::dns::error_response(question, ResponseCode::ServFail)
    }

    /// Filters an upstream reply into the table; the bytes for the guest.
    fn dns_answer(&mut self, question: &Question, reply: Option<Vec<u8>>) -> Option<Vec<u8>> {
        let decider = Arc::clone(&self.decider);
        let keep = move |ip: IpAddr| decider.keep_dns_answer(ip);
        let ttl = match self.decider.dns_ttl_bounds() {
            Some((min, max)) => {
                let secs = |d: Duration| u32::try_from(d.as_secs()).unwrap_or(u32::MAX);
                secs(min)..=secs(max)
            }
            None => 0..=u32::MAX,
        };
        let filtered = reply.map(|r| dns::sanitize(question, &r, keep, ttl));
        // A chain through a denied name is refused before anything is recorded.
        let chain_denied = match &filtered {
            Some(Ok(ans)) => ans
                .cname_chain
                .iter()
                .find_map(|target| self.decider.dns_cname_target(target)),
            _ => None,
        };
        if let Some(reason) = chain_denied {
            self.counters.dns_denied += 1;
            self.audit_dns_reason(question, ResponseCode::Refused, &[], "denied", Some(reason));
            return sluice_inspect::dns::refused_response(question);
        }
        if let Some(Ok(ans)) = &filtered {
            dns::record(question, ans, &mut self.dns, Instant::now());
        }
        match filtered {
            Some(Ok(ans)) if ans.private_answer() => {
                self.counters.dns_denied += 1;
                self.audit_dns_reason(
                    question,
                    ResponseCode::Refused,
                    &[],
                    "denied",
                    Some("private_answer"),
                );
                sluice_inspect::dns::refused_response(question)
            }
            Some(Ok(ans)) => {
                let addresses: Vec<IpAddr> = ans.answers.iter().map(|(_, ip, _)| *ip).collect();
                self.audit_dns(question, ans.rcode, &addresses, "forwarded");
                Some(ans.bytes)
            }
            other => {
                if let Some(Err(e)) = other {
                    tracing::debug!(error = %e, name = %question.name, "upstream DNS answer rejected");
                }
                self.audit_dns(question, ResponseCode::ServFail, &[], "failed");
                sluice_inspect::dns::error_response(question, ResponseCode::ServFail)
            }
        }
    }

    /// Handles one event; true when the session must stop.
    fn on_event(&mut self, ev: Event) -> bool {
        match ev {
            Event::Shutdown => return true,
            Event::DumpCounters => self.counters.log(self.flows.len()),
            Event::Reload(reload) => self.on_reload(*reload),
            Event::Intercept(event) => self.on_intercept_event(&event),
            Event::Connected { id, result } => self.on_connected(id, result),
            Event::DnsUdpReply {
                guest,
                question,
                reply,
            } => {
                self.dns_in_flight = self.dns_in_flight.saturating_sub(1);
                if let Some(bytes) = self.dns_answer(&question, reply) {
                    // Too big for the guest's UDP payload: TC, retry over TCP.
                    let bytes = if bytes.len() > question.max_udp_payload() {
                        sluice_inspect::dns::truncated(&question)
                    } else {
                        Some(bytes)
                    };
                    if let Some(bytes) = bytes {
                        self.reply_udp([0xff; 6], guest, &bytes);
                    }
                }
            }
            Event::DnsTcpReply {
                id,
                question,
                reply,
            } => {
                self.dns_in_flight = self.dns_in_flight.saturating_sub(1);
                let bytes = self.dns_answer(&question, reply);
                if let Some(Flow {
                    state:
                        FlowState::DnsTcp {
                            handle, waiting, ..
                        },
                    ..
                }) = self.flows.get_mut(&id)
                {
                    *waiting = false;
                    let sock = self.sockets.get_mut::<tcp::Socket<'_>>(*handle);
                    match bytes.and_then(|b| u16::try_from(b.len()).ok().map(|l| (l, b))) {
                        Some((len, b))
                            if sock.send_capacity() - sock.send_queue() >= b.len() + 2 =>
                        {
                            let _ = sock.send_slice(&len.to_be_bytes());
                            let _ = sock.send_slice(&b);
                        }
                        _ => sock.abort(),
                    }
                }
            }
            Event::PublishTcp { stream, guest_port } => self.on_publish(stream, guest_port),
            Event::PublishUdp {
                socket,
                peer,
                guest_port,
                data,
            } => self.on_publish_udp(socket, peer, guest_port, &data),
        }
        false
    }

    fn on_connected(&mut self, id: u64, result: io::Result<TcpStream>) {
        let Some(flow) = self.flows.get_mut(&id) else {
            return;
        };
        let key = flow.key;
        let state = std::mem::replace(&mut flow.state, FlowState::Connecting { syn: Vec::new() });
        // A host address the refresher has not seen yet (crate::hostaddrs):
        // refused before any guest byte is written to it.
        let mut failure = DenyReason::ConnectFailed;
        let result = match result {
            Ok(host) if is_local_route(&host) => {
                tracing::warn!(dst = %key.dst, "host connect routed locally: a host address; denied");
                let _ = socket2::SockRef::from(&host).set_linger(Some(Duration::ZERO));
                failure = DenyReason::PlatformDenied;
                Err(io::Error::other("destination is a host address"))
            }
            other => other,
        };
        match (state, result) {
            (FlowState::Connecting { syn }, Ok(host)) => {
                let (SocketAddr::V4(src), SocketAddr::V4(dst)) = (key.src, key.dst) else {
                    return;
                };
                match self.accept_syn(&syn, src, dst) {
                    Some(handle) => {
                        let _ = host.set_nodelay(true);
                        self.open_flow(id, handle, host);
                    }
                    // The SYN did not take; the guest retransmits and the flow is decided again.
                    None => self.remove_flow(id),
                }
            }
            (FlowState::Connecting { syn }, Err(e)) => {
                tracing::debug!(dst = %key.dst, error = %e, "host connect failed");
                if let (SocketAddr::V4(src), SocketAddr::V4(dst)) = (key.src, key.dst) {
                    let seq = syn_seq(&syn);
                    self.rst_syn(&syn, src, dst, seq);
                }
                self.deny_audit(&key, failure);
                self.remove_flow(id);
            }
            (FlowState::InspectConnecting { handle }, Ok(host)) => {
                let _ = host.set_nodelay(true);
                self.open_flow(id, handle, host);
            }
            (FlowState::InspectConnecting { handle }, Err(_)) => {
                self.sockets.get_mut::<tcp::Socket<'_>>(handle).abort();
                self.deny_audit(&key, failure);
                if let Some(f) = self.flows.get_mut(&id) {
                    f.state = FlowState::InspectConnecting { handle };
                }
                self.finish_flow(id, "connect_failed");
            }
            (other, _) => {
                if let Some(f) = self.flows.get_mut(&id) {
                    f.state = other;
                }
            }
        }
    }

    fn open_flow(&mut self, id: u64, handle: SocketHandle, host: impl Into<HostStream>) {
        let Some(flow) = self.flows.get_mut(&id) else {
            return;
        };
        flow.state = FlowState::Open {
            handle,
            host: host.into(),
            host_eof: false,
            host_write_shut: false,
        };
        flow.audited_open = true;
        self.counters.flows_opened += 1;
        let key = flow.key;
        if key.src.ip() == IpAddr::V4(self.cfg.gateway_ip) {
            self.audit.record(&AuditEvent::PublishedOpen {
                flow: id,
                proto: "tcp",
                src: key.src,
                dst: key.dst,
            });
            return;
        }
        if let Some(wire) = &flow.wire {
            flow.names = vec![wire.as_str().into()];
            self.audit.record(&AuditEvent::InspectedOpen {
                flow: id,
                src: key.src,
                dst: key.dst,
                wire,
            });
            return;
        }
        let now = Instant::now();
        let names: Vec<&str> = self
            .dns
            .names_for(key.dst.ip(), now)
            .take(crate::enforce::MAX_NAMES_PER_IP)
            .collect();
        flow.names = names.iter().map(|n| Box::from(*n)).collect();
        self.audit.record(&AuditEvent::FlowOpen {
            flow: id,
            proto: "tcp",
            src: key.src,
            dst: key.dst,
            names: &names,
        });
    }

    fn on_publish(&mut self, stream: TcpStream, guest_port: u16) {
        if self.flows.len() >= self.cfg.max_flows {
            return;
        }
        let local_port = self.next_publish_port;
        self.next_publish_port = self
            .next_publish_port
            .checked_add(1)
            .unwrap_or(PUBLISH_PORT_BASE);
        let mut sock = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0u8; self.cfg.flow_buffer]),
            tcp::SocketBuffer::new(vec![0u8; self.cfg.flow_buffer]),
        );
        sock.set_nagle_enabled(false);
        sock.set_ack_delay(None);
        let remote = IpEndpoint::new(ip4(self.cfg.guest_ip), guest_port);
        let local = IpListenEndpoint {
            addr: Some(ip4(self.cfg.gateway_ip)),
            port: local_port,
        };
        if let Err(e) = sock.connect(self.iface.context(), remote, local) {
            tracing::warn!(error = %e, "publish: cannot connect into the guest");
            return;
        }
        let handle = self.sockets.add(sock);
        let _ = stream.set_nodelay(true);
        let key = FlowKey {
            transport: Transport::Tcp,
            src: SocketAddr::new(IpAddr::V4(self.cfg.gateway_ip), local_port),
            dst: SocketAddr::new(IpAddr::V4(self.cfg.guest_ip), guest_port),
        };
        let id = self.insert_flow(key, FlowState::Connecting { syn: Vec::new() });
        self.open_flow(id, handle, stream);
    }

    /// Copies between host sockets and smoltcp buffers; advances inspection and DNS-over-TCP.
    fn pump_flows(&mut self) {
        let ids: Vec<u64> = self.flows.keys().copied().collect();
        for id in ids {
            let Some(flow) = self.flows.get_mut(&id) else {
                continue;
            };
            match &mut flow.state {
                FlowState::Open {
                    handle,
                    host,
                    host_eof,
                    host_write_shut,
                } => {
                    let sock = self.sockets.get_mut::<tcp::Socket<'_>>(*handle);
                    // Guest -> host.
                    while !*host_write_shut && sock.can_recv() {
                        match sock.recv(|b| match host.try_write(b) {
                            Ok(n) => (n, Ok(n)),
                            Err(e) => (0, Err(e)),
                        }) {
                            Ok(Ok(0)) | Err(_) => break,
                            Ok(Ok(n)) => flow.up += n as u64,
                            Ok(Err(e)) if would_block(&e) => break,
                            Ok(Err(_)) => {
                                sock.abort();
                                *host_eof = true;
                                *host_write_shut = true;
                            }
                        }
                    }
                    if !*host_write_shut && guest_finished(sock) {
                        *host_write_shut = true;
                        let _ = socket2::SockRef::from(&*host).shutdown(std::net::Shutdown::Write);
                    }
                    // Host -> guest.
                    while !*host_eof && sock.can_send() {
                        match sock.send(|b| match host.try_read(b) {
                            Ok(n) => (n, Ok(n)),
                            Err(e) => (0, Err(e)),
                        }) {
                            Ok(Ok(0)) => {
                                *host_eof = true;
                                sock.close();
                            }
                            Ok(Ok(n)) => flow.down += n as u64,
                            Ok(Err(e)) if would_block(&e) => break,
                            Ok(Err(_)) => {
                                *host_eof = true;
                                *host_write_shut = true;
                                sock.abort();
                            }
                            Err(_) => break,
                        }
                    }
                    let state = sock.state();
                    if matches!(state, tcp::State::Closed | tcp::State::TimeWait) {
                        let clean = *host_eof && *host_write_shut;
                        if !clean {
                            // Propagate the guest's RST (or our abort) to the host side.
                            let _ = socket2::SockRef::from(&*host).set_linger(Some(Duration::ZERO));
                        }
                        self.finish_flow(id, if clean { "closed" } else { "reset" });
                    }
                }
                FlowState::Inspecting {
                    handle,
                    deadline,
                    max_bytes,
                    peeked,
                } => {
                    let (handle, deadline, max_bytes, peeked) =
                        (*handle, *deadline, *max_bytes, *peeked);
                    self.advance_inspection(id, handle, deadline, max_bytes, peeked);
                }
                FlowState::DnsTcp {
                    handle,
                    inbuf,
                    waiting,
                } => {
                    let handle = *handle;
                    let sock = self.sockets.get_mut::<tcp::Socket<'_>>(handle);
                    if !*waiting {
                        while sock.can_recv() && inbuf.len() < dns::MAX_TCP_MESSAGE + 2 {
                            let room = dns::MAX_TCP_MESSAGE + 2 - inbuf.len();
                            let _ = sock.recv(|b| {
                                let n = b.len().min(room);
                                inbuf.extend_from_slice(&b[..n]);
                                (n, ())
                            });
                        }
                        if let Some(query) = dns::take_tcp_message(inbuf) {
                            *waiting = true;
                            self.start_dns_tcp(id, query);
                            continue;
                        }
                        if guest_finished(sock) {
                            sock.close();
                        }
                    }
                    let sock = self.sockets.get::<tcp::Socket<'_>>(handle);
                    if matches!(sock.state(), tcp::State::Closed | tcp::State::TimeWait) {
                        self.remove_flow(id);
                    }
                }
                FlowState::Connecting { .. } | FlowState::InspectConnecting { .. } => {}
            }
        }
    }

    fn start_dns_tcp(&mut self, id: u64, query: Vec<u8>) {
        self.counters.dns_queries += 1;
        let Some(Flow {
            state: FlowState::DnsTcp {
                handle, waiting, ..
            },
            ..
        }) = self.flows.get_mut(&id)
        else {
            return;
        };
        let handle = *handle;
        *waiting = false;
        let local = match sluice_inspect::dns::parse_query(&query) {
            Ok(question) => match self.dns_local(&question) {
                Some(b) => Err(Some(b)),
                None => Ok(question),
            },
            Err(e) => Err(self.dns_reject(&query, &e)),
        };
        // Never the guest's bytes upstream: a query rebuilt from what was checked.
        let local = local.and_then(|q| match dns::upstream_query(&q) {
            Some(rebuilt) => Ok((q, rebuilt)),
            None => Err(sluice_inspect::dns::error_response(
                &q,
                ResponseCode::ServFail,
            )),
        });
        let (question, query) = match local {
            Ok((q, rebuilt))
                if dns::forwarded_type(q.qtype)
                    && self.dns_in_flight < MAX_DNS_IN_FLIGHT
                    && !self.dns_upstreams().is_empty() =>
            {
                (q, rebuilt)
            }
            other => {
                let reply = other.err().flatten();
                let sock = self.sockets.get_mut::<tcp::Socket<'_>>(handle);
                match reply.and_then(|b| u16::try_from(b.len()).ok().map(|l| (l, b))) {
                    Some((l, b)) => {
                        let _ = sock.send_slice(&l.to_be_bytes());
                        let _ = sock.send_slice(&b);
                    }
                    None => sock.abort(),
                }
                return;
            }
        };
        if let Some(Flow {
            state: FlowState::DnsTcp { waiting, .. },
            ..
        }) = self.flows.get_mut(&id)
        {
            *waiting = true;
        }
        self.dns_in_flight += 1;
        let events = self.events.clone();
        let upstreams = self.dns_upstreams();
        tokio::spawn(async move {
            let reply = dns::forward_tcp(&query, &upstreams, DNS_TIMEOUT).await;
            let _ = events.send(Event::DnsTcpReply {
                id,
                question,
                reply,
            });
        });
    }

    /// Puts an inspected flow's first bytes to the decider, only when more
    /// have arrived since it last answered `NeedMore` (`peeked` bytes): a
    /// loop turn without new bytes re-parses nothing. The bound and the
    /// deadline are checked on every turn.
    fn advance_inspection(
        &mut self,
        id: u64,
        handle: SocketHandle,
        deadline: Instant,
        max_bytes: usize,
        peeked: usize,
    ) {
        let Some(key) = self.flows.get(&id).map(|f| f.key) else {
            return;
        };
        let sock = self.sockets.get_mut::<tcp::Socket<'_>>(handle);
        if matches!(sock.state(), tcp::State::Closed | tcp::State::TimeWait) {
            self.remove_flow(id);
            return;
        }
        let queued = sock.recv_queue();
        let verdict = match sock.peek(max_bytes) {
            Ok(bytes) if !bytes.is_empty() && queued != peeked => {
                let ctx = DecideContext {
                    dns: &self.dns,
                    now: Instant::now(),
                };
                self.decider.inspect(&key, bytes, &ctx)
            }
            _ => InspectVerdict::NeedMore,
        };
        // Bytes past the ring buffer's wrap are not visible to peek; bound by what is queued.
        // While the guest's handshake is still in progress `may_recv` is
        // false too: that is not an end of stream.
        let handshaking = matches!(sock.state(), tcp::State::Listen | tcp::State::SynReceived);
        let full = sock.recv_queue() >= max_bytes || (!handshaking && !sock.may_recv());
        let verdict = match verdict {
            InspectVerdict::NeedMore if full || Instant::now() >= deadline => {
                InspectVerdict::Deny(DenyReason::InspectTimeout)
            }
            v => v,
        };
        if matches!(verdict, InspectVerdict::NeedMore) {
            if let Some(Flow {
                state: FlowState::Inspecting { peeked, .. },
                ..
            }) = self.flows.get_mut(&id)
            {
                *peeked = queued;
            }
            return;
        }
        let wire = sock.peek(max_bytes).ok().and_then(sniff_wire_name);
        match verdict {
            InspectVerdict::NeedMore => {}
            InspectVerdict::Allow => {
                if let Some(f) = self.flows.get_mut(&id) {
                    f.state = FlowState::InspectConnecting { handle };
                    f.wire = wire;
                }
                if !self.try_intercept(id, handle, &key) {
                    self.spawn_connect(id, key.dst);
                }
            }
            InspectVerdict::Deny(reason) => {
                sock.abort();
                self.counters.flows_denied += 1;
                self.audit.record(&AuditEvent::InspectedDeny {
                    flow: id,
                    src: key.src,
                    dst: key.dst,
                    reason: reason.as_str(),
                    wire: wire.as_ref(),
                });
                self.remove_flow(id);
            }
        }
    }

    /// Audits a close (when an open was audited) and removes the flow.
    fn finish_flow(&mut self, id: u64, end: &'static str) {
        if let Some(f) = self.flows.get(&id)
            && f.audited_open
        {
            self.counters.flows_closed += 1;
            self.audit.record(&AuditEvent::FlowClose {
                totals: f.totals(id),
                end,
            });
        }
        self.remove_flow(id);
    }

    fn remove_flow(&mut self, id: u64) {
        let Some(flow) = self.flows.remove(&id) else {
            return;
        };
        self.by_key.remove(&flow.key);
        let handle = match flow.state {
            FlowState::Open { handle, .. }
            | FlowState::Inspecting { handle, .. }
            | FlowState::InspectConnecting { handle }
            | FlowState::DnsTcp { handle, .. } => Some(handle),
            FlowState::Connecting { .. } => None,
        };
        if let Some(h) = handle {
            self.sockets.remove(h);
        }
    }

    /// Resets every flow (guest side RST; host side closed) and audits the closes.
    fn close_all(&mut self, end: &'static str) {
        let ids: Vec<u64> = self.flows.keys().copied().collect();
        for id in ids {
            if let Some(f) = self.flows.get_mut(&id) {
                match &f.state {
                    FlowState::Open { handle, .. }
                    | FlowState::Inspecting { handle, .. }
                    | FlowState::InspectConnecting { handle }
                    | FlowState::DnsTcp { handle, .. } => {
                        self.sockets.get_mut::<tcp::Socket<'_>>(*handle).abort()
                    }
                    FlowState::Connecting { .. } => {}
                }
            }
        }
        self.egress();
        for id in self.flows.keys().copied().collect::<Vec<_>>() {
            self.finish_flow(id, end);
        }
        for c in self.udp.close_all(Instant::now()) {
            self.audit_udp_close(&c, end);
        }
        self.counters.log(0);
        self.audit.flush();
    }

    fn flush_best_effort(&mut self, guest: &UnixStream) {
        while self.tx.queued() > 0 {
            match guest.try_write(self.tx.unwritten()) {
                Ok(n) if n > 0 => self.tx.consume(n),
                _ => break,
            }
        }
    }
}

/// Whether the guest has sent its FIN (or the connection is gone) and every
/// received byte has been read. False before the handshake completes (a
/// `SynSent`/`SynReceived` socket cannot receive yet either).
fn guest_finished(sock: &tcp::Socket<'_>) -> bool {
    use tcp::State::{CloseWait, Closed, Closing, LastAck, TimeWait};
    matches!(
        sock.state(),
        CloseWait | LastAck | Closing | TimeWait | Closed
    ) && !sock.can_recv()
}

/// Whether a connected host stream's route was local: the kernel picked the
/// destination itself as the source, so the destination is one of the host's
/// own addresses. Loopback destinations are left to the deciders (the
/// platform deny set refuses them by class before any connect).
fn is_local_route(host: &TcpStream) -> bool {
    match (host.local_addr(), host.peer_addr()) {
        (Ok(local), Ok(peer)) => local.ip() == peer.ip() && !peer.ip().is_loopback(),
        // Cannot tell: fail closed.
        _ => true,
    }
}

/// The sequence number of a held SYN frame (0 when it cannot be read).
fn syn_seq(frame: &[u8]) -> u32 {
    let ihl = frame.get(14).map_or(20, |b| usize::from(b & 0x0f) * 4);
    let at = 14 + ihl + 4;
    frame
        .get(at..at + 4)
        .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DEFAULT_SUBNET;
    use crate::packet::tests::{GUEST_MAC, tcp_frame, udp_frame};
    use smoltcp::wire::{
        ArpOperation, ArpPacket, ArpRepr, EthernetFrame, EthernetProtocol, IpProtocol, Ipv4Packet,
        TcpControl, TcpPacket,
    };
    use std::sync::Mutex;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// Allows everything except port 9, which the "policy" denies.
    struct TestDecider;
    impl Decider for TestDecider {
        fn decide_tcp(&self, flow: &FlowKey, _ctx: &DecideContext<'_>) -> Decision {
            if flow.dst.port() == 9 {
                Decision::Deny(DenyReason::Policy("not_allowlisted"))
            } else {
                Decision::Allow
            }
        }
        fn decide_udp(&self, _flow: &FlowKey, _ctx: &DecideContext<'_>) -> Decision {
            Decision::Deny(DenyReason::UdpNotAllowed)
        }
    }

    #[derive(Clone, Default)]
    struct SharedBuf(Arc<Mutex<Vec<u8>>>);
    impl io::Write for SharedBuf {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    struct Guest {
        stream: UnixStream,
        buf: Vec<u8>,
    }

    impl Guest {
        async fn send(&mut self, frames: &[Vec<u8>]) {
            let mut out = Vec::new();
            for f in frames {
                out.extend_from_slice(&u32::try_from(f.len()).unwrap().to_be_bytes());
                out.extend_from_slice(f);
            }
            self.stream.write_all(&out).await.unwrap();
        }

        /// Next frame from the gateway; a generous bound keeps a broken gateway from hanging the test.
        async fn recv(&mut self) -> Vec<u8> {
            loop {
                if self.buf.len() >= 4 {
                    let n = u32::from_be_bytes(self.buf[..4].try_into().unwrap()) as usize;
                    if self.buf.len() >= 4 + n {
                        let f = self.buf[4..4 + n].to_vec();
                        self.buf.drain(..4 + n);
                        return f;
                    }
                }
                let mut chunk = vec![0u8; 65536];
                let n = tokio::time::timeout(Duration::from_secs(30), self.stream.read(&mut chunk))
                    .await
                    .expect("gateway sent nothing")
                    .unwrap();
                assert!(n > 0, "gateway closed the stream");
                self.buf.extend_from_slice(&chunk[..n]);
            }
        }

        /// Next TCP segment (answering ARP requests for the guest on the way).
        async fn recv_tcp(&mut self) -> (SocketAddrV4, SocketAddrV4, TcpControl, u32, Option<u32>) {
            loop {
                let f = self.recv().await;
                let eth = EthernetFrame::new_checked(&f[..]).unwrap();
                if eth.ethertype() == EthernetProtocol::Arp {
                    let arp = ArpPacket::new_checked(eth.payload()).unwrap();
                    assert_eq!(arp.operation(), ArpOperation::Request);
                    let reply = ArpRepr::EthernetIpv4 {
                        operation: ArpOperation::Reply,
                        source_hardware_addr: EthernetAddress(GUEST_MAC),
                        source_protocol_addr: Ipv4Addr::new(10, 0, 2, 15),
                        target_hardware_addr: eth.src_addr(),
                        target_protocol_addr: Ipv4Addr::from(
                            <[u8; 4]>::try_from(arp.source_protocol_addr()).unwrap(),
                        ),
                    };
                    let mut buf = vec![0u8; 14 + reply.buffer_len()];
                    let mut e = EthernetFrame::new_unchecked(&mut buf[..]);
                    e.set_src_addr(EthernetAddress(GUEST_MAC));
                    e.set_dst_addr(eth.src_addr());
                    e.set_ethertype(EthernetProtocol::Arp);
                    reply.emit(&mut ArpPacket::new_unchecked(e.payload_mut()));
                    self.send(&[buf]).await;
                    continue;
                }
                let ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
                if ip.next_header() != IpProtocol::Tcp {
                    continue;
                }
                let tcp = TcpPacket::new_checked(ip.payload()).unwrap();
                let control = if tcp.rst() {
                    TcpControl::Rst
                } else if tcp.syn() {
                    TcpControl::Syn
                } else if tcp.fin() {
                    TcpControl::Fin
                } else {
                    TcpControl::None
                };
                let ack = tcp.ack().then(|| tcp.ack_number().0 as u32);
                return (
                    SocketAddrV4::new(ip.src_addr(), tcp.src_port()),
                    SocketAddrV4::new(ip.dst_addr(), tcp.dst_port()),
                    control,
                    tcp.seq_number().0 as u32,
                    ack,
                );
            }
        }
    }

    fn start(decider: Arc<dyn Decider>) -> (Guest, SharedBuf, tokio::task::JoinHandle<SessionEnd>) {
        start_cfg(Config::new(DEFAULT_SUBNET, 1500).unwrap(), decider)
    }

    fn start_cfg(
        cfg: Config,
        decider: Arc<dyn Decider>,
    ) -> (Guest, SharedBuf, tokio::task::JoinHandle<SessionEnd>) {
        let (gw_end, test_end) = UnixStream::pair().unwrap();
        let cfg = Arc::new(cfg);
        let audit_buf = SharedBuf::default();
        let audit = AuditSink::new(Box::new(audit_buf.clone()), "test");
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut dp = Datapath::new(cfg, decider, audit, tx);
        let task = tokio::spawn(async move { dp.run(&gw_end, &mut rx).await });
        (
            Guest {
                stream: test_end,
                buf: Vec::new(),
            },
            audit_buf,
            task,
        )
    }

    #[tokio::test]
    async fn spoofed_frames_are_audited() {
        let (mut guest, audit, _task) = start(Arc::new(TestDecider));
        let g = Ipv4Addr::new(10, 0, 2, 15);
        let denied = SocketAddrV4::new(Ipv4Addr::new(198, 51, 100, 1), 9);
        // A SYN from an address that is not the guest's, then a denied SYN
        // whose RST shows the first frame was processed.
        guest
            .send(&[
                tcp_frame(
                    SocketAddrV4::new(Ipv4Addr::new(10, 0, 2, 99), 1000),
                    denied,
                    TcpControl::Syn,
                    1,
                    None,
                ),
                tcp_frame(
                    SocketAddrV4::new(g, 1002),
                    denied,
                    TcpControl::Syn,
                    77,
                    None,
                ),
            ])
            .await;
        let (_, to, control, _, _) = guest.recv_tcp().await;
        assert_eq!((to.port(), control), (1002, TcpControl::Rst));
        let text = String::from_utf8(audit.0.lock().unwrap().clone()).unwrap();
        let lines = crate::audit::tests::parse_all(&text);
        assert!(
            lines.iter().any(|l| l["kind"] == "connection"
                && l["decision"] == "deny"
                && l["reason"] == "spoofed_source"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn concurrent_syns_are_not_cross_wired_and_denied_syns_get_rst() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (mut guest, audit, task) = start(Arc::new(TestDecider));
        let g = Ipv4Addr::new(10, 0, 2, 15);
        let dst = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
        let (a, b) = (SocketAddrV4::new(g, 1000), SocketAddrV4::new(g, 1001));
        // Two SYNs to the same destination in one write, then a duplicate of the first.
        guest
            .send(&[
                tcp_frame(a, dst, TcpControl::Syn, 100, None),
                tcp_frame(b, dst, TcpControl::Syn, 5000, None),
                tcp_frame(a, dst, TcpControl::Syn, 100, None),
            ])
            .await;
        let mut seen = HashMap::new();
        while seen.len() < 2 {
            let (src, to, control, _seq, ack) = guest.recv_tcp().await;
            assert_eq!(control, TcpControl::Syn, "expected SYN-ACK");
            assert_eq!(src, dst);
            seen.insert(to.port(), ack);
        }
        assert_eq!(
            seen[&1000],
            Some(101),
            "SYN-ACK for port 1000 acknowledges its own SYN"
        );
        assert_eq!(
            seen[&1001],
            Some(5001),
            "SYN-ACK for port 1001 acknowledges its own SYN"
        );
        let (_c1, _) = listener.accept().await.unwrap();
        let (_c2, _) = listener.accept().await.unwrap();

        // A denied destination gets a RST acknowledging the SYN, and an audit line.
        let denied = SocketAddrV4::new(Ipv4Addr::new(198, 51, 100, 1), 9);
        guest
            .send(&[tcp_frame(
                SocketAddrV4::new(g, 1002),
                denied,
                TcpControl::Syn,
                77,
                None,
            )])
            .await;
        let (src, to, control, _, ack) = guest.recv_tcp().await;
        assert_eq!(
            (src, to.port(), control, ack),
            (denied, 1002, TcpControl::Rst, Some(78))
        );
        let text = String::from_utf8(audit.0.lock().unwrap().clone()).unwrap();
        let lines = crate::audit::tests::parse_all(&text);
        assert!(
            lines.iter().any(|l| l["kind"] == "connection"
                && l["reason"] == "not_allowlisted"
                && l["dst"]["port"] == 9),
            "{text}"
        );
        let opens = lines
            .iter()
            .filter(|l| l["kind"] == "connection" && l["decision"] == "allow")
            .count();
        assert_eq!(opens, 2, "{text}");

        // A frame length below 14 ends the session cleanly.
        guest.stream.write_all(&5u32.to_be_bytes()).await.unwrap();
        guest.stream.write_all(&[0u8; 5]).await.unwrap();
        let end = task.await.unwrap();
        assert!(
            matches!(
                end,
                SessionEnd::ProtocolError(FrameError::BadLength { len: 5, .. })
            ),
            "{end:?}"
        );
    }

    #[tokio::test]
    async fn platform_decider_refuses_loopback_and_garbage_is_counted() {
        let deny = crate::decide::PlatformDenySet::new(
            [],
            Ipv4Addr::new(10, 0, 2, 2),
            Ipv4Addr::new(10, 0, 2, 255),
        );
        let (mut guest, audit, task) = start(Arc::new(crate::decide::PlatformDecider::new(deny)));
        let g = SocketAddrV4::new(Ipv4Addr::new(10, 0, 2, 15), 2000);
        // Garbage and IPv6 frames first: dropped, the session goes on.
        let mut v6 = vec![0u8; 60];
        v6[12..14].copy_from_slice(&[0x86, 0xdd]);
        let udp = udp_frame(
            g,
            SocketAddrV4::new(Ipv4Addr::new(198, 51, 100, 2), 443),
            b"quic",
        );
        guest
            .send(&[vec![0u8; 14], v6, vec![0xffu8; 100], udp])
            .await;
        guest
            .send(&[tcp_frame(
                g,
                SocketAddrV4::new(Ipv4Addr::LOCALHOST, 22),
                TcpControl::Syn,
                9,
                None,
            )])
            .await;
        let (_, to, control, _, ack) = guest.recv_tcp().await;
        assert_eq!((to, control, ack), (g, TcpControl::Rst, Some(10)));
        let text = String::from_utf8(audit.0.lock().unwrap().clone()).unwrap();
        crate::audit::tests::parse_all(&text);
        assert!(text.contains(r#""reason":"platform_denied""#), "{text}");
        assert!(text.contains(r#""reason":"udp_blocked""#), "{text}");
        drop(guest);
        assert!(matches!(task.await.unwrap(), SessionEnd::GuestClosed));
    }

    #[tokio::test]
    async fn a_flood_of_denied_syns_is_bounded_in_the_audit_and_later_flows_are_served() {
        const N: u32 = 10_000;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (guest, audit, task) = start(Arc::new(TestDecider));
        let g = Ipv4Addr::new(10, 0, 2, 15);
        let denied = SocketAddrV4::new(Ipv4Addr::new(198, 51, 100, 1), 9);
        let started = Instant::now();
        // 10,000 SYNs to a denied destination, from distinct ports, in
        // batches of 500 frames per write.
        let syns: Vec<Vec<u8>> = (0..N)
            .map(|i| {
                let src = SocketAddrV4::new(g, 10_000 + u16::try_from(i).unwrap());
                tcp_frame(src, denied, TcpControl::Syn, i, None)
            })
            .collect();
        let (mut rd, mut wr) = guest.stream.into_split();
        let writer = tokio::spawn(async move {
            for chunk in syns.chunks(500) {
                let mut out = Vec::new();
                for f in chunk {
                    out.extend_from_slice(&u32::try_from(f.len()).unwrap().to_be_bytes());
                    out.extend_from_slice(f);
                }
                wr.write_all(&out).await.unwrap();
            }
            wr
        });
        // Every one is answered with a RST (read while writing: the gateway
        // never waits for us).
        let mut resets = 0;
        let mut buf = Vec::new();
        while resets < N {
            let mut chunk = vec![0u8; 65536];
            let n = tokio::time::timeout(Duration::from_secs(60), rd.read(&mut chunk))
                .await
                .expect("gateway stopped answering the flood")
                .unwrap();
            assert!(n > 0, "gateway closed the stream");
            buf.extend_from_slice(&chunk[..n]);
            while buf.len() >= 4 {
                let len = u32::from_be_bytes(buf[..4].try_into().unwrap()) as usize;
                if buf.len() < 4 + len {
                    break;
                }
                let f: Vec<u8> = buf.drain(..4 + len).skip(4).collect();
                let eth = EthernetFrame::new_checked(&f[..]).unwrap();
                if eth.ethertype() != EthernetProtocol::Ipv4 {
                    continue;
                }
                let ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
                if ip.next_header() == IpProtocol::Tcp
                    && TcpPacket::new_checked(ip.payload()).unwrap().rst()
                {
                    resets += 1;
                }
            }
        }
        let wr = writer.await.unwrap();
        let mut guest = Guest {
            stream: rd.reunite(wr).unwrap(),
            buf,
        };
        // The datapath is still responsive: an allowed flow is served.
        let dst = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
        guest
            .send(&[tcp_frame(
                SocketAddrV4::new(g, 999),
                dst,
                TcpControl::Syn,
                1,
                None,
            )])
            .await;
        loop {
            let (src, to, control, _, ack) = guest.recv_tcp().await;
            if src == dst && to.port() == 999 {
                assert_eq!(
                    (control, ack),
                    (TcpControl::Syn, Some(2)),
                    "expected SYN-ACK"
                );
                break;
            }
        }
        let (_conn, _) = listener.accept().await.unwrap();
        drop(guest);
        assert!(matches!(task.await.unwrap(), SessionEnd::GuestClosed));
        let elapsed = started.elapsed().as_secs() + 1;

        let text = String::from_utf8(audit.0.lock().unwrap().clone()).unwrap();
        let lines = crate::audit::tests::parse_all(&text);
        let written = lines
            .iter()
            .filter(|l| l["kind"] == "connection" && l["reason"] == "not_allowlisted")
            .count() as u64;
        let suppressed: u64 = lines
            .iter()
            .filter(|l| l["kind"] == "summary")
            .flat_map(|l| l["suppressed"].as_array().unwrap().clone())
            .filter(|s| s["reason"] == "not_allowlisted")
            .map(|s| s["count"].as_u64().unwrap())
            .sum();
        // Bounded: at most the per-reason budget for each second the flood
        // lasted (plus the window it started in) ...
        let bound = u64::from(crate::audit::DENY_LINES_PER_SEC) * (elapsed + 1);
        assert!(written <= bound, "{written} deny lines in {elapsed} s");
        // ... and nothing lost: the summaries count the rest.
        assert!(suppressed > 0, "no summary of suppressed lines: {text}");
        assert_eq!(written + suppressed, u64::from(N));
        // The whole log likewise: those deny lines, one summary per second,
        // and a handful of others (start, the allowed flow, stop). Relative
        // to how long the flood took, so a slow (loaded, debug) run is not
        // mistaken for a flooded log.
        let all = u64::try_from(lines.len()).unwrap();
        assert!(
            all <= bound + (elapsed + 1) + 10,
            "{all} lines in {elapsed} s"
        );
        // The allowed flow has its connection line after the flood.
        assert!(
            lines.iter().any(|l| l["kind"] == "connection"
                && l["decision"] == "allow"
                && l["dst"]["port"] == port),
            "{text}"
        );
    }

    #[tokio::test]
    async fn dns_over_tcp_connections_count_against_the_flow_limit() {
        let mut cfg = Config::new(DEFAULT_SUBNET, 1500).unwrap();
        cfg.max_flows = 2;
        let (mut guest, audit, task) = start_cfg(cfg, Arc::new(TestDecider));
        let g = Ipv4Addr::new(10, 0, 2, 15);
        let dns = SocketAddrV4::new(Ipv4Addr::new(10, 0, 2, 2), 53);
        // Three connections to the gateway's DNS port; the third is over the limit.
        for (i, port) in [3000u16, 3001, 3002].into_iter().enumerate() {
            let seq = 1000 * u32::try_from(i).unwrap();
            guest
                .send(&[tcp_frame(
                    SocketAddrV4::new(g, port),
                    dns,
                    TcpControl::Syn,
                    seq,
                    None,
                )])
                .await;
        }
        let mut answers = HashMap::new();
        while answers.len() < 3 {
            let (src, to, control, _, _) = guest.recv_tcp().await;
            assert_eq!(src, dns);
            answers.insert(to.port(), control);
        }
        assert_eq!(answers[&3000], TcpControl::Syn, "SYN-ACK: {answers:?}");
        assert_eq!(answers[&3001], TcpControl::Syn, "SYN-ACK: {answers:?}");
        assert_eq!(
            answers[&3002],
            TcpControl::Rst,
            "over the limit: {answers:?}"
        );
        let text = String::from_utf8(audit.0.lock().unwrap().clone()).unwrap();
        let lines = crate::audit::tests::parse_all(&text);
        assert!(
            lines
                .iter()
                .any(|l| l["reason"] == "flow_limit" && l["src"]["port"] == 3002),
            "{text}"
        );
        drop(guest);
        assert!(matches!(task.await.unwrap(), SessionEnd::GuestClosed));
    }

    #[tokio::test]
    async fn upstream_gets_a_rebuilt_query_not_the_guests_bytes() {
        use hickory_proto::op::Message;
        let upstream = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let mut cfg = Config::new(DEFAULT_SUBNET, 1500).unwrap();
        cfg.dns_upstreams = vec![upstream.local_addr().unwrap()];
        let (mut guest, _audit, _task) = start_cfg(cfg, Arc::new(TestDecider));
        // One question whose first label holds a dot ("x.Origin", "TeSt":
        // the policy sees x.origin.test), an additional record and an EDNS
        // option carrying data.
        let mut q = vec![0x42, 0x42, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 2];
        q.push(8);
        q.extend_from_slice(b"x.Origin");
        q.push(4);
        q.extend_from_slice(b"TeSt");
        q.extend_from_slice(&[0, 0, 1, 0, 1]);
        q.extend_from_slice(&[0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4]);
        q.extend_from_slice(b"SEKR");
        q.extend_from_slice(&[0, 0, 41, 0x10, 0, 0, 0, 0, 0, 0, 14, 0xfd, 0xe9, 0, 10]);
        q.extend_from_slice(b"EXFILTRATE");
        assert!(sluice_inspect::dns::parse_query(&q).is_ok());
        let g = SocketAddrV4::new(Ipv4Addr::new(10, 0, 2, 15), 5353);
        let gw = SocketAddrV4::new(Ipv4Addr::new(10, 0, 2, 2), 53);
        guest.send(&[udp_frame(g, gw, &q)]).await;
        let mut buf = vec![0u8; 4096];
        let (n, _) = tokio::time::timeout(Duration::from_secs(30), upstream.recv_from(&mut buf))
            .await
            .expect("nothing forwarded")
            .unwrap();
        let sent = &buf[..n];
        let has = |needle: &[u8]| sent.windows(needle.len()).any(|w| w == needle);
        assert!(!has(b"EXFILTRATE") && !has(b"SEKR"), "{sent:?}");
        let m = Message::from_vec(sent).unwrap();
        assert_eq!(m.metadata.id, 0x4242);
        assert_eq!(m.queries.len(), 1);
        let name = &m.queries[0].name;
        assert_eq!(name.num_labels(), 3, "{name:?}");
        assert_eq!(name.to_ascii(), "x.origin.test.");
        assert!(m.additionals.is_empty(), "{m:?}");
        assert!(
            m.edns
                .as_ref()
                .is_none_or(|e| e.options().as_ref().is_empty()),
            "{m:?}"
        );
    }

    /// A decider whose policy names `servers` as its `dns.upstream` (`None`:
    /// `upstream: system`); swapped by the test as a reload would.
    struct UpstreamDecider(Mutex<Option<Vec<SocketAddr>>>);
    impl Decider for UpstreamDecider {
        fn decide_tcp(&self, _flow: &FlowKey, _ctx: &DecideContext<'_>) -> Decision {
            Decision::Allow
        }
        fn decide_udp(&self, _flow: &FlowKey, _ctx: &DecideContext<'_>) -> Decision {
            Decision::Deny(DenyReason::UdpNotAllowed)
        }
        fn policy_dns_upstreams(&self) -> Option<Vec<SocketAddr>> {
            self.0.lock().unwrap().clone()
        }
    }

    #[tokio::test]
    async fn queries_follow_the_policys_upstream_list_across_a_swap() {
        let configured = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let first = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let second = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let mut cfg = Config::new(DEFAULT_SUBNET, 1500).unwrap();
        cfg.dns_upstreams = vec![configured.local_addr().unwrap()];
        cfg.dns_upstreams_from_policy = true;
        let decider = Arc::new(UpstreamDecider(Mutex::new(Some(vec![
            first.local_addr().unwrap(),
        ]))));
        let (mut guest, _audit, _task) = start_cfg(cfg, Arc::clone(&decider) as Arc<dyn Decider>);
        let g = SocketAddrV4::new(Ipv4Addr::new(10, 0, 2, 15), 5353);
        let gw = SocketAddrV4::new(Ipv4Addr::new(10, 0, 2, 2), 53);
        let query = |id: u8| {
            let mut q = vec![id, id, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
            q.extend_from_slice(b"\x06origin\x04test\x00\x00\x01\x00\x01");
            q
        };
        // Which of the three sockets gets query `id` (the others get nothing
        // before it: each query goes to the first upstream of the list).
        let mut buf = vec![0u8; 4096];
        let mut expect = async |id: u8, at: &tokio::net::UdpSocket| {
            guest.send(&[udp_frame(g, gw, &query(id))]).await;
            let (n, _) = tokio::time::timeout(Duration::from_secs(30), at.recv_from(&mut buf))
                .await
                .unwrap_or_else(|_| panic!("query {id} not forwarded where expected"))
                .unwrap();
            assert_eq!(&buf[..2], &[id, id], "{:?}", &buf[..n]);
        };
        expect(1, &first).await;
        *decider.0.lock().unwrap() = Some(vec![second.local_addr().unwrap()]);
        expect(2, &second).await;
        *decider.0.lock().unwrap() = None;
        expect(3, &configured).await;
        // Nothing went anywhere else.
        let mut other = [0u8; 512];
        for s in [&first, &second, &configured] {
            assert!(s.try_recv_from(&mut other).is_err());
        }
    }

    /// Serves A queries from `upstream`: `alias.example.org` is a CNAME to
    /// the denied `bad.example.org`, `ok.example.org` a CNAME to
    /// `cdn.example.net`; both chains end in a public address.
    fn serve_cname_chains(upstream: tokio::net::UdpSocket) {
        use hickory_proto::op::{Message, OpCode};
        use hickory_proto::rr::rdata::{A, CNAME};
        use hickory_proto::rr::{Name, RData, Record};
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            while let Ok((n, peer)) = upstream.recv_from(&mut buf).await {
                let q = Message::from_vec(&buf[..n]).unwrap();
                let qname = q.queries[0].name.clone();
                let target = if qname.to_ascii().starts_with("alias.") {
                    "bad.example.org."
                } else {
                    "cdn.example.net."
                };
                let target = Name::from_ascii(target).unwrap();
                let mut r = Message::response(q.metadata.id, OpCode::Query);
                r.add_queries(q.queries.clone());
                r.add_answer(Record::from_rdata(
                    qname,
                    60,
                    RData::CNAME(CNAME(target.clone())),
                ));
                r.add_answer(Record::from_rdata(
                    target,
                    60,
                    RData::A(A::new(93, 184, 216, 34)),
                ));
                let _ = upstream.send_to(&r.to_vec().unwrap(), peer).await;
            }
        });
    }

    #[tokio::test]
    async fn an_answer_whose_cname_chain_reaches_a_denied_name_is_refused() {
        use hickory_proto::op::{Message, Query};
        use hickory_proto::rr::{Name, RecordType};
        const POLICY: &str = "version: 1\nid: cname-test\nallow:\n  - domain: \"*.example.org\"\n    ports: [443]\ndeny:\n  - \"bad.example.org\"\n";
        let policy = sluice_policy::from_yaml_str(POLICY, "p.yaml", &Default::default()).unwrap();
        let decider = crate::enforce::PolicyDecider::new(
            Arc::new(policy),
            crate::decide::PlatformDenySet::default(),
        );
        let upstream = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let mut cfg = Config::new(DEFAULT_SUBNET, 1500).unwrap();
        cfg.dns_upstreams = vec![upstream.local_addr().unwrap()];
        serve_cname_chains(upstream);
        let (mut guest, audit, _task) = start_cfg(cfg, Arc::new(decider));
        let g = SocketAddrV4::new(Ipv4Addr::new(10, 0, 2, 15), 5353);
        let gw = SocketAddrV4::new(Ipv4Addr::new(10, 0, 2, 2), 53);
        let mut ask = async |name: &str| {
            let mut m = Message::query();
            m.metadata.id = 7;
            m.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
            guest.send(&[udp_frame(g, gw, &m.to_vec().unwrap())]).await;
            loop {
                let f = guest.recv().await;
                let eth = EthernetFrame::new_checked(&f[..]).unwrap();
                let Ok(ip) = Ipv4Packet::new_checked(eth.payload()) else {
                    continue;
                };
                if ip.next_header() == IpProtocol::Udp {
                    return Message::from_vec(&ip.payload()[8..]).unwrap();
                }
            }
        };
        let denied = ask("alias.example.org.").await;
        assert_eq!(
            denied.metadata.response_code,
            ResponseCode::Refused,
            "{denied:?}"
        );
        assert!(denied.answers.is_empty(), "{denied:?}");
        // Control: a chain through a name no rule mentions is answered.
        let ok = ask("ok.example.org.").await;
        assert_eq!(ok.metadata.response_code, ResponseCode::NoError, "{ok:?}");
        assert_eq!(ok.answers.len(), 2, "{ok:?}");
        let text = String::from_utf8(audit.0.lock().unwrap().clone()).unwrap();
        let lines = crate::audit::tests::parse_all(&text);
        assert!(
            lines.iter().any(|l| l["kind"] == "dns"
                && l["qname"] == "alias.example.org"
                && l["reason"] == "denylisted"
                && l["rule"]["pattern"] != "*.example.org"),
            "{text}"
        );
    }

    /// Inspects port-443 flows with sluice-inspect's ClientHello reader and
    /// counts how often the bytes were put to it.
    #[derive(Default)]
    struct CountingInspector {
        calls: std::sync::atomic::AtomicUsize,
    }
    impl Decider for CountingInspector {
        fn decide_tcp(&self, _flow: &FlowKey, _ctx: &DecideContext<'_>) -> Decision {
            Decision::Inspect {
                max_bytes: 16 * 1024,
                deadline: Duration::from_secs(60),
            }
        }
        fn decide_udp(&self, _flow: &FlowKey, _ctx: &DecideContext<'_>) -> Decision {
            Decision::Deny(DenyReason::UdpNotAllowed)
        }
        fn inspect(
            &self,
            _flow: &FlowKey,
            first_bytes: &[u8],
            _ctx: &DecideContext<'_>,
        ) -> InspectVerdict {
            use sluice_inspect::tls::{ClientHelloReader, Progress};
            self.calls
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            match ClientHelloReader::new(16 * 1024).push(first_bytes) {
                Progress::NeedMore => InspectVerdict::NeedMore,
                Progress::Done(_) => InspectVerdict::Allow,
                Progress::Reject(_) => InspectVerdict::Deny(DenyReason::Policy("sni_unreadable")),
            }
        }
    }

    #[tokio::test]
    async fn a_split_client_hello_is_parsed_once_per_arrival_and_allowed() {
        use crate::packet::tests::tcp_segment;
        let hello = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../inspect/testdata/tls/curl-https.bin"
        ))
        .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dst = SocketAddrV4::new(Ipv4Addr::LOCALHOST, listener.local_addr().unwrap().port());
        let decider = Arc::new(CountingInspector::default());
        let (mut guest, _audit, _task) = start(decider.clone());
        let g = SocketAddrV4::new(Ipv4Addr::new(10, 0, 2, 15), 1000);
        guest
            .send(&[tcp_frame(g, dst, TcpControl::Syn, 999, None)])
            .await;
        let (_, _, control, their_seq, ack) = guest.recv_tcp().await;
        assert_eq!((control, ack), (TcpControl::Syn, Some(1000)), "SYN-ACK");
        let ack = Some(their_seq.wrapping_add(1));
        let bare_ack = tcp_segment(g, dst, TcpControl::None, 1000, ack, &[]);
        guest.send(std::slice::from_ref(&bare_ack)).await;
        // Three segments; between them, frames without data (repeated ACKs),
        // each sent on its own so the datapath turns its loop for it.
        let cuts = [0, 5, hello.len() / 2, hello.len()];
        let mut seq = 1000u32;
        for part in cuts.windows(2) {
            let bytes = &hello[part[0]..part[1]];
            guest
                .send(&[tcp_segment(g, dst, TcpControl::Psh, seq, ack, bytes)])
                .await;
            seq += u32::try_from(bytes.len()).unwrap();
            let again = tcp_segment(g, dst, TcpControl::None, seq, ack, &[]);
            for _ in 0..4 {
                tokio::time::sleep(Duration::from_millis(5)).await;
                guest.send(std::slice::from_ref(&again)).await;
            }
        }
        // The decision was taken: the gateway connected and replayed the hello.
        let (mut host, _) = tokio::time::timeout(Duration::from_secs(30), listener.accept())
            .await
            .expect("the split hello was never allowed")
            .unwrap();
        let mut got = vec![0u8; hello.len()];
        tokio::time::timeout(Duration::from_secs(30), host.read_exact(&mut got))
            .await
            .expect("the hello was not replayed")
            .unwrap();
        assert_eq!(got, hello);
        // Once per arrival of new bytes at most, not once per loop turn.
        let calls = decider.calls.load(std::sync::atomic::Ordering::Relaxed);
        assert!((1..=3).contains(&calls), "inspected {calls} times");
    }
}

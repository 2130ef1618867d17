//! The session: one task owns the guest stream, the smoltcp stack
//! ([`crate::stack`]), the flow tables and every host socket, and runs the
//! event loop that moves bytes between them.
//!
//! Each loop iteration: read a large chunk from the guest and split it into
//! frames; classify each frame before smoltcp sees it ([`crate::packet`])
//! and route it: ARP/ICMP for the gateway, DHCP ([`crate::dhcp`]) and DNS
//! ([`crate::dns::session`]) served here, new TCP SYNs to the TCP table
//! ([`crate::tcp`]), other UDP to the forwarded-UDP table ([`crate::udp`]),
//! the rest to the stack; handle events from helper tasks (host connects,
//! DNS upstream replies, published-port accepts ([`crate::publish`]),
//! reloads ([`crate::revoke`]), signals); pump the flows; emit queued
//! segments into one output batch and write it with as few syscalls as the
//! guest socket takes. Then wait for any readiness: guest, host sockets
//! (their readiness wakers all point at this task), events, or smoltcp's
//! next timer.

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use smoltcp::iface::{Interface, SocketSet};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::audit::{AuditEvent, AuditSink};
use crate::config::Config;
use crate::decide::{Decider, FlowKey, Verdict};
use crate::dhcp::{self, DhcpServer};
use crate::dns::{DnsServer, UpstreamReply};
use crate::flow::FlowEnd;
use crate::frames::{FrameError, TxBatch};
use crate::link::{GuestLink, LinkFailure, Received};
use crate::packet::{self, Addresses, Class, DropReason};
use crate::publish::Published;
use crate::stack::TX_HIGH_WATER;
use crate::tcp::park::Parking;
use crate::tcp::{Flow, FlowState};
use crate::udp::UdpFlows;

#[cfg(test)]
mod tests;

/// Emit-and-write rounds per loop turn while the guest socket takes everything.
const EGRESS_ROUNDS: usize = 4;
/// Idle output time after which the output batch's storage is trimmed.
const TX_TRIM_IDLE: Duration = Duration::from_secs(1);
/// DNS table capacity (address, name pairs).
const DNS_TABLE_CAPACITY: usize = 65536;
/// Idle flows' send rings are given back this often
/// ([`Datapath::release_idle_buffers`]).
const BUFFER_SWEEP_INTERVAL: Duration = Duration::from_secs(1);
/// Counters are logged this often.
const COUNTER_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// Messages from helper tasks to the datapath.
#[derive(Debug)]
#[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
pub enum Event {
    /// A host connect for flow `id` finished.
    Connected {
        /// The flow.
        id: u64,
        /// The connected stream or the error.
        result: io::Result<TcpStream>,
    },
    /// The upstream answer (or none) to a question guest DNS queries wait on.
    DnsUpstream(UpstreamReply),
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
    /// The answer (or failure) of a runtime approval question.
    Approval(Box<crate::dns::approval::ApprovalReply>),
    /// Close flows and stop (SIGTERM/SIGINT).
    Shutdown,
}

/// Why a guest session ended.
#[derive(Debug)]
#[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
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
pub(crate) struct Counters {
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
    /// DNS queries answered from the sandbox's cache.
    pub dns_cached: u64,
    /// Upstream DNS datagrams dropped: wrong source, id or question.
    pub dns_upstream_dropped: u64,
    /// UDP datagrams denied.
    pub udp_denied: u64,
    /// UDP flows opened (allowed and given a host socket).
    pub udp_flows_opened: u64,
    /// Runtime approval questions sent to the backend.
    pub approval_questions: u64,
    /// Approval questions answered deny (or timed out, or failed).
    pub approval_denied: u64,
    /// Queries refused without asking (too many pending, rate limit).
    pub approval_limited: u64,
}

impl Counters {
    pub(crate) fn log(&self, flows_open: usize) {
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
            dns_cached = self.dns_cached,
            dns_upstream_dropped = self.dns_upstream_dropped,
            udp_denied = self.udp_denied,
            udp_flows_opened = self.udp_flows_opened,
            approval_questions = self.approval_questions,
            approval_denied = self.approval_denied,
            approval_limited = self.approval_limited,
            "counters"
        );
    }
}

/// One guest session's datapath state.
#[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
pub struct Datapath {
    pub(crate) cfg: Arc<Config>,
    pub(crate) decider: Arc<dyn Decider>,
    pub(crate) audit: AuditSink,
    pub(crate) counters: Counters,
    pub(crate) dns: DnsServer,
    pub(crate) iface: Interface,
    pub(crate) sockets: SocketSet<'static>,
    pub(crate) tx: TxBatch,
    pub(crate) dhcp: DhcpServer,
    pub(crate) guest_mac: Option<[u8; 6]>,
    /// Guest TCP flows by id ([`crate::tcp`]).
    pub(crate) flows: HashMap<u64, Flow>,
    pub(crate) by_key: HashMap<FlowKey, u64>,
    pub(crate) next_id: u64,
    /// Which flows are active and what brings a parked one back
    /// ([`crate::tcp::park`]).
    pub(crate) parking: Parking,
    /// Published ports ([`crate::publish`]).
    pub(crate) published: Published,
    /// Forwarded guest UDP flows ([`crate::udp`]).
    pub(crate) udp: UdpFlows,
    /// When idle UDP flows were last expired.
    pub(crate) udp_swept: Instant,
    /// Where UDP DNS answers go until the guest's MAC is known (the MAC of
    /// the last query; broadcast before any).
    pub(crate) dns_reply_mac: [u8; 6],
    pub(crate) events: mpsc::UnboundedSender<Event>,
    pub(crate) epoch: Instant,
}

impl std::fmt::Debug for Datapath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Datapath")
            .field("flows", &self.flows.len())
            .field("parked", &self.parking.parked())
            .finish_non_exhaustive()
    }
}

pub(crate) fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

impl Datapath {
    /// A fresh datapath (new interface, no flows) for one guest session.
    #[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
    pub fn new(
        cfg: Arc<Config>,
        decider: Arc<dyn Decider>,
        audit: AuditSink,
        events: mpsc::UnboundedSender<Event>,
    ) -> Self {
        let epoch = Instant::now();
        let mut tx = TxBatch::default();
        let iface = crate::stack::interface(&cfg, &mut tx, epoch);
        let approvals = crate::dns::approval::Approvals::new(&cfg.sandbox_id, cfg.approval.clone());
        let mut dns = DnsServer::with_approvals(DNS_TABLE_CAPACITY, approvals);
        if let Some((min, max)) = decider.dns_ttl_bounds() {
            dns.table_mut().set_ttl_bounds(min, max);
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
            parking: Parking::default(),
            published: Published::default(),
            udp: UdpFlows::new(udp_limits),
            udp_swept: epoch,
            dns_reply_mac: [0xff; 6],
            events,
            epoch,
        }
    }

    /// Ends the session, handing back the audit sink.
    pub(crate) fn into_audit(self) -> AuditSink {
        if let Some(m) = self.audit.metrics() {
            m.set_active_flows(0, 0);
        }
        self.audit
    }

    pub(crate) fn addresses(&self) -> Addresses {
        Addresses {
            gateway_ip: self.cfg.gateway_ip,
            guest_ip: self.cfg.guest_ip,
            guest_mac: self.guest_mac,
        }
    }

    /// Runs until the guest disconnects, breaks the protocol, or shutdown.
    #[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
    pub async fn run(
        &mut self,
        guest: &GuestLink,
        events: &mut mpsc::UnboundedReceiver<Event>,
    ) -> SessionEnd {
        let mut rx = guest.rx(usize::from(self.cfg.mtu) + 14);
        let mut pending_events: Vec<Event> = Vec::new();
        let mut last_counters = Instant::now();
        let mut last_sweep = Instant::now();
        let mut timer = Box::pin(tokio::time::sleep(Duration::from_secs(3600)));
        let mut last_output = Instant::now();
        loop {
            // 1. Guest input (paused while the output batch is over its bound).
            if self.tx.queued() < TX_HIGH_WATER {
                for _ in 0..8 {
                    match guest.receive(&mut rx, |frame| self.on_frame(frame)) {
                        Ok(Received::Closed) => {
                            self.close_all(FlowEnd::GuestClosed);
                            return SessionEnd::GuestClosed;
                        }
                        Ok(Received::Idle) => break,
                        Ok(Received::Frames { more, dropped }) => {
                            for _ in 0..dropped {
                                self.drop_frame(DropReason::Malformed);
                            }
                            if !more || self.tx.queued() >= TX_HIGH_WATER {
                                break;
                            }
                        }
                        Err(LinkFailure::Protocol(e)) => {
                            self.close_all(FlowEnd::ProtocolError);
                            return SessionEnd::ProtocolError(e);
                        }
                        Err(LinkFailure::Io(e)) => {
                            self.close_all(FlowEnd::GuestError);
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
                    self.close_all(FlowEnd::Shutdown);
                    self.flush_best_effort(guest);
                    return SessionEnd::Shutdown;
                }
            }
            // Parked flows with something to do come back first.
            self.unpark_due();
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
                if let Err(e) = guest.transmit(&mut self.tx) {
                    self.close_all(FlowEnd::GuestError);
                    return SessionEnd::GuestIo(e);
                }
                if self.tx.queued() > 0 {
                    break;
                }
                last_output = Instant::now();
            }
            // Ends the audit rate-limit window (summary of suppressed records).
            self.audit.tick();
            if let Some(m) = self.audit.metrics() {
                m.set_active_flows(self.flows.len(), self.udp.len());
            }
            if last_sweep.elapsed() >= BUFFER_SWEEP_INTERVAL {
                last_sweep = Instant::now();
                self.release_idle_buffers();
            }
            if last_counters.elapsed() >= COUNTER_LOG_INTERVAL {
                last_counters = Instant::now();
                self.counters.log(self.flows.len());
                self.dns.table_mut().purge_expired(Instant::now());
            }
            // 6. Wait for anything to do.
            let now = self.now();
            let delay = self
                .iface
                .poll_delay(now, &self.sockets)
                .map(|d| Duration::from_micros(d.total_micros()));
            let parked = self
                .parking
                .next_timer(now)
                .map(|d| Duration::from_micros(d.total_micros()));
            let mut delay = delay
                .unwrap_or(Duration::from_secs(1))
                .min(parked.unwrap_or(Duration::MAX))
                .min(self.next_inspect_deadline());
            if !self.flows.is_empty() {
                // The next sweep is due within a second (an idle flow with
                // keep-alives alone would sleep for a minute).
                delay = delay.min(BUFFER_SWEEP_INTERVAL.saturating_sub(last_sweep.elapsed()));
            }
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
                if want_read && guest.poll_read_ready(cx) {
                    ready = true;
                }
                if want_write && guest.poll_write_ready(cx) {
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
                if self.parking.poll_ready(cx) {
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

    pub(crate) fn next_inspect_deadline(&self) -> Duration {
        let now = Instant::now();
        // Inspected flows are never parked.
        self.parking
            .active
            .iter()
            .filter_map(|id| self.flows.get(id))
            .filter_map(|f| match f.state {
                FlowState::Inspecting { deadline, .. } => {
                    Some(deadline.saturating_duration_since(now))
                }
                _ => None,
            })
            .min()
            .unwrap_or(Duration::from_secs(3600))
    }

    /// Handles one guest frame.
    pub(crate) fn on_frame(&mut self, frame: &[u8]) {
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
            Class::Drop(reason) => self.drop_frame(reason),
        }
    }

    /// Counts a guest frame dropped before the stack (by the classifier, or
    /// by the link: a packet it could not read whole) and audits the drops
    /// the schema names.
    fn drop_frame(&mut self, reason: DropReason) {
        self.counters.dropped[reason.index()] += 1;
        if let Some(m) = self.audit.metrics() {
            m.frame_dropped(reason.as_str());
        }
        tracing::trace!(reason = reason.as_str(), "guest frame dropped");
        if let Some(audit) = reason.audit_reason() {
            self.audit.record(&AuditEvent::FrameDrop {
                reason: audit,
                detail: reason.as_str(),
            });
        }
    }

    pub(crate) fn frame_src_mac(frame: &[u8]) -> [u8; 6] {
        frame
            .get(6..12)
            .and_then(|m| m.try_into().ok())
            .unwrap_or([0xff; 6])
    }

    pub(crate) fn on_dhcp(&mut self, payload: &[u8]) {
        let reply = match self.dhcp.handle(payload) {
            Ok(Some(reply)) => reply,
            Ok(None) => return,
            Err(dhcp::Malformed) => return self.drop_frame(DropReason::Malformed),
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

    pub(crate) fn deny_audit(&mut self, key: &FlowKey, verdict: impl Into<Verdict>) {
        self.counters.flows_denied += 1;
        self.audit.record(&AuditEvent::FlowDeny {
            transport: key.transport,
            src: key.src,
            dst: key.dst,
            verdict: &verdict.into(),
        });
    }

    /// Handles one event; true when the session must stop.
    pub(crate) fn on_event(&mut self, ev: Event) -> bool {
        match ev {
            Event::Shutdown => return true,
            Event::DumpCounters => self.counters.log(self.flows.len()),
            Event::Reload(reload) => self.on_reload(*reload),
            Event::Intercept(event) => self.on_intercept_event(&event),
            Event::Connected { id, result } => self.on_connected(id, result),
            Event::DnsUpstream(reply) => self.on_dns_upstream(reply),
            Event::Approval(reply) => self.on_approval(*reply),
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

    pub(crate) fn flush_best_effort(&mut self, guest: &GuestLink) {
        // One pass: what the socket does not take now is dropped with the session.
        let _ = guest.transmit(&mut self.tx);
    }
}

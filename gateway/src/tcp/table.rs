//! The TCP flow table's state machine on the session: a SYN decided, held
//! while the host connects, accepted into a socket listening on exactly its
//! destination; a flow opened, pumped, finished (its `flow_close` line) and
//! removed; every flow reset at the end of a session.

use std::io;
use std::net::{IpAddr, SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use smoltcp::iface::SocketHandle;
use smoltcp::socket::tcp;
use smoltcp::wire::{IpEndpoint, IpListenEndpoint};
use tokio::net::TcpStream;

use super::{Flow, FlowState, HostStream, is_local_route, syn_seq};
use crate::audit::AuditEvent;
use crate::decide::{DecideContext, Decision, DenyReason, FlowKey, Transport, Verdict};
use crate::dns::session::DNS_TCP_BUF;
use crate::flow::{Admission, FlowEnd};
use crate::packet;
use crate::session::{Datapath, Event};
use crate::stack::ip4;

/// What a flow's host connect was started for.
enum Waiting {
    /// A held guest SYN, to be fed to a new listening socket.
    Syn(Vec<u8>),
    /// The socket of an inspected flow, already accepted.
    Accepted(SocketHandle),
}

impl Datapath {
    pub(crate) fn rst_syn(&mut self, frame: &[u8], src: SocketAddrV4, dst: SocketAddrV4, seq: u32) {
        let mac = Self::frame_src_mac(frame);
        packet::write_rst_for_syn(&mut self.tx, self.cfg.gateway_mac, mac, src, dst, seq);
    }

    pub(crate) fn on_syn(&mut self, frame: &[u8], src: SocketAddrV4, dst: SocketAddrV4, seq: u32) {
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
                dns: self.dns.table(),
                approved: Some(self.dns.approvals()),
                now: Instant::now(),
            };
            self.decider.decide_tcp(&key, &ctx)
        };
        match decision {
            Decision::Deny(verdict) => {
                self.rst_syn(frame, src, dst, seq);
                self.deny_audit(&key, verdict);
            }
            Decision::Allow(verdict) => {
                let id = self.insert_flow(
                    key,
                    FlowState::Connecting {
                        syn: frame.to_vec(),
                    },
                );
                if let Some(f) = self.flows.get_mut(&id) {
                    f.admission = Some(Admission::new(verdict, None));
                }
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

    pub(crate) fn insert_flow(&mut self, key: FlowKey, state: FlowState) -> u64 {
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
                admission: None,
                down_at_release: 0,
                down_at_sweep: 0,
                parked: None,
                waker: None,
            },
        );
        self.parking.activate(id);
        self.by_key.insert(key, id);
        id
    }

    pub(crate) fn spawn_connect(&self, id: u64, dst: SocketAddr) {
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
    pub(crate) fn accept_syn(
        &mut self,
        syn: &[u8],
        src: SocketAddrV4,
        dst: SocketAddrV4,
    ) -> Option<SocketHandle> {
        let dns = *dst.ip() == self.cfg.gateway_ip;
        let (rx, tx) = if dns {
            (DNS_TCP_BUF, DNS_TCP_BUF)
        } else {
            (self.cfg.flow_buffer, self.cfg.flow_send_buffer)
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

    pub(crate) fn on_connected(&mut self, id: u64, result: io::Result<TcpStream>) {
        let Some(flow) = self.flows.get_mut(&id) else {
            return;
        };
        let key = flow.key;
        // What the connect was waiting for: a held SYN (taken: the flow is
        // opened or removed below) or an accepted, inspected socket.
        let waiting = match &mut flow.state {
            FlowState::Connecting { syn } => Waiting::Syn(std::mem::take(syn)),
            FlowState::InspectConnecting { handle } => Waiting::Accepted(*handle),
            // No connect is pending in any other state.
            _ => return,
        };
        // A host address the refresher has not seen yet (crate::decide::HostAddresses):
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
        match (waiting, result) {
            (Waiting::Syn(syn), Ok(host)) => {
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
            (Waiting::Syn(syn), Err(e)) => {
                tracing::debug!(dst = %key.dst, error = %e, "host connect failed");
                if let (SocketAddr::V4(src), SocketAddr::V4(dst)) = (key.src, key.dst) {
                    let seq = syn_seq(&syn);
                    self.rst_syn(&syn, src, dst, seq);
                }
                self.deny_audit(&key, failure);
                self.remove_flow(id);
            }
            (Waiting::Accepted(handle), Ok(host)) => {
                let _ = host.set_nodelay(true);
                self.open_flow(id, handle, host);
            }
            (Waiting::Accepted(handle), Err(_)) => {
                self.sockets.get_mut::<tcp::Socket<'_>>(handle).abort();
                self.deny_audit(&key, failure);
                self.finish_flow(id, FlowEnd::ConnectFailed);
            }
        }
    }

    pub(crate) fn open_flow(&mut self, id: u64, handle: SocketHandle, host: impl Into<HostStream>) {
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
                transport: Transport::Tcp,
                src: key.src,
                dst: key.dst,
            });
            return;
        }
        // Every flow that reaches here but a published one was admitted
        // by the decider; fail closed on one that was not.
        let Some(admission) = flow.admission.as_mut() else {
            tracing::error!(flow = id, "flow opened without an admission; reset");
            let denied = Verdict::of(sluice_policy::Reason::NotAllowlisted);
            self.sockets.get_mut::<tcp::Socket<'_>>(handle).abort();
            self.deny_audit(&key, denied);
            self.remove_flow(id);
            return;
        };
        if let Some(wire) = &admission.wire {
            admission.names = vec![wire.as_str().into()];
            // The name the flow was admitted with stays in the table while it lives.
            self.dns.table_mut().pin(id, key.dst.ip(), [wire.as_str()]);
            self.audit.record(&AuditEvent::InspectedOpen {
                flow: id,
                src: key.src,
                dst: key.dst,
                wire,
                verdict: &admission.verdict,
            });
            return;
        }
        let now = Instant::now();
        let names: Vec<&str> = self
            .dns
            .table()
            .names_for(key.dst.ip(), now)
            .take(crate::decide::policy::MAX_NAMES_PER_IP)
            .collect();
        admission.names = names.iter().map(|n| Box::from(*n)).collect();
        self.audit.record(&AuditEvent::FlowOpen {
            flow: id,
            transport: Transport::Tcp,
            src: key.src,
            dst: key.dst,
            verdict: &admission.verdict,
        });
        self.dns
            .table_mut()
            .pin(id, key.dst.ip(), admission.names.iter().map(|n| &**n));
    }

    /// Copies between host sockets and smoltcp buffers ([`super::splice`]);
    /// advances inspection ([`super::inspect`]) and DNS-over-TCP
    /// ([`crate::dns::session`]).
    /// Only active flows are pumped: a parked one has nothing to move
    /// ([`super::park`]).
    pub(crate) fn pump_flows(&mut self) {
        let ids: Vec<u64> = self.parking.active.iter().copied().collect();
        for id in ids {
            let Some(flow) = self.flows.get_mut(&id) else {
                continue;
            };
            match &flow.state {
                FlowState::Open { handle, .. } => {
                    let sock = self.sockets.get_mut::<tcp::Socket<'_>>(*handle);
                    if let Some(end) = super::splice::pump(sock, flow) {
                        self.finish_flow(id, end);
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
                FlowState::DnsTcp { .. } => self.pump_dns_tcp(id),
                FlowState::Connecting { .. } | FlowState::InspectConnecting { .. } => {}
            }
        }
    }

    /// Audits a close (when an open was audited) and removes the flow.
    pub(crate) fn finish_flow(&mut self, id: u64, end: FlowEnd) {
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

    pub(crate) fn remove_flow(&mut self, id: u64) {
        let Some(flow) = self.flows.remove(&id) else {
            return;
        };
        self.dns.table_mut().unpin(id);
        self.by_key.remove(&flow.key);
        if !self.parking.active.remove(&id) {
            // Parked: its socket is not in the set and goes with the flow.
            self.parking.unparked_gone();
            return;
        }
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
    pub(crate) fn close_all(&mut self, end: FlowEnd) {
        self.unpark_all();
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
}

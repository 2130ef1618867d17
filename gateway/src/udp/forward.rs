//! Forwarded guest UDP on the session: a datagram of a known flow goes
//! straight to its host socket; the first of a new pair is decided and, if
//! allowed, opens a flow in [`super::UdpFlows`]; datagrams from the host
//! sockets go back to the guest; idle flows expire; closes are audited.

use std::net::{SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use super::{ClosedUdpFlow, SendOutcome, UdpOpenError};
use crate::audit::AuditEvent;
use crate::decide::{DecideContext, Decision, DenyReason, FlowKey, Transport, Verdict};
use crate::flow::{Admission, FlowEnd};
use crate::packet;
use crate::session::Datapath;
use crate::stack::TX_HIGH_WATER;

impl Datapath {
    pub(crate) fn on_udp(
        &mut self,
        frame: &[u8],
        src: SocketAddrV4,
        dst: SocketAddrV4,
        payload: &[u8],
    ) {
        if *dst.ip() == self.cfg.gateway_ip && dst.port() == 53 {
            self.on_dns_udp(frame, src, payload);
            return;
        }
        if *dst.ip() == self.cfg.gateway_ip {
            // A guest reply on a published UDP port goes back to the host peer.
            if let Some((sock, peer)) = self.published.udp_peer(dst.port()) {
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
                dns: self.dns.table(),
                approved: Some(self.dns.approvals()),
                now,
            };
            self.decider.decide_udp(&key, &ctx)
        };
        let verdict = match decision {
            Decision::Deny(verdict) => verdict,
            Decision::Allow(verdict) => match self.open_udp(key, now, verdict) {
                Ok(()) => {
                    self.udp.send(&key, payload, now);
                    return;
                }
                Err(r) => r.verdict(),
            },
            // UDP has no first bytes to inspect: fail closed.
            Decision::Inspect { .. } => DenyReason::UdpNotAllowed.verdict(),
        };
        self.counters.udp_denied += 1;
        self.deny_audit(&key, verdict);
    }

    /// Opens a UDP flow the decider allowed with `verdict` (its host
    /// socket) and audits the open.
    pub(crate) fn open_udp(
        &mut self,
        key: FlowKey,
        now: Instant,
        verdict: Verdict,
    ) -> Result<(), DenyReason> {
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
        let mut admission = Admission::new(verdict, None);
        admission.names = self
            .dns
            .table()
            .names_for(key.dst.ip(), now)
            .take(8)
            .map(Box::from)
            .collect();
        // The names the flow was admitted with stay in the table while it lives.
        self.dns
            .table_mut()
            .pin(id, key.dst.ip(), admission.names.iter().map(|n| &**n));
        self.audit.record(&AuditEvent::FlowOpen {
            flow: id,
            transport: Transport::Udp,
            src: key.src,
            dst: key.dst,
            verdict: &admission.verdict,
        });
        self.udp.admit(&key, admission);
        Ok(())
    }

    /// Moves datagrams from forwarded UDP flows' host sockets to the guest
    /// (while the output batch has room) and expires idle flows about once a
    /// second; audits the closes.
    pub(crate) fn pump_udp(&mut self) {
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
            self.audit_udp_close(c, c.end.end());
        }
        if now.saturating_duration_since(self.udp_swept) >= Duration::from_secs(1) {
            self.udp_swept = now;
            for c in self.udp.expire(now) {
                self.audit_udp_close(&c, c.end.end());
            }
        }
    }

    /// Audits the close of a UDP flow; `end` is [`crate::udp::UdpEnd::end`]
    /// or, at session end, why the session ended.
    pub(crate) fn audit_udp_close(&mut self, c: &ClosedUdpFlow, end: FlowEnd) {
        self.dns.table_mut().unpin(c.id);
        self.counters.flows_closed += 1;
        self.audit.record(&AuditEvent::FlowClose {
            totals: c.totals(),
            end,
        });
    }
}

//! Inspected TCP flows: the first bytes, peeked from the socket, put to the
//! decider until it allows or denies, the bound is reached or the deadline
//! passes; then connect (or hand over to a proxy) or reset.

use std::time::Instant;

use smoltcp::iface::SocketHandle;
use smoltcp::socket::tcp;

use super::{Flow, FlowState};
use crate::audit::AuditEvent;
use crate::decide::policy::sniff_wire_name;
use crate::decide::{DecideContext, DenyReason, InspectVerdict};
use crate::flow::Admission;
use crate::session::Datapath;

impl Datapath {
    /// Puts an inspected flow's first bytes to the decider, only when more
    /// have arrived since it last answered `NeedMore` (`peeked` bytes): a
    /// loop turn without new bytes re-parses nothing. The bound and the
    /// deadline are checked on every turn.
    pub(crate) fn advance_inspection(
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
                    dns: self.dns.table(),
                    approved: Some(self.dns.approvals()),
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
                InspectVerdict::Deny(DenyReason::InspectTimeout.into())
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
            InspectVerdict::Allow(verdict) => {
                if let Some(f) = self.flows.get_mut(&id) {
                    f.state = FlowState::InspectConnecting { handle };
                    f.admission = Some(Admission::new(verdict, wire));
                }
                if !self.try_intercept(id, handle, &key) {
                    self.spawn_connect(id, key.dst);
                }
            }
            InspectVerdict::Deny(verdict) => {
                sock.abort();
                self.counters.flows_denied += 1;
                self.audit.record(&AuditEvent::InspectedDeny {
                    flow: id,
                    src: key.src,
                    dst: key.dst,
                    verdict: &verdict,
                    wire: wire.as_ref(),
                });
                self.remove_flow(id);
            }
        }
    }
}

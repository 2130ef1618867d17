//! Parking of idle TCP flows, so that a loop turn costs in proportion to
//! the flows that have something to do rather than to the flows open.
//!
//! smoltcp walks its whole socket set on every egress poll, every
//! `poll_at`, and (up to the match) for every TCP segment it is given; the
//! session's own pump and readiness walks did the same over the flow
//! table. With ten thousand idle flows that made every turn, and so every
//! new connection, slow. A parked flow's socket is taken out of the set
//! and kept beside its flow ([`super::Flow::parked`]); it comes back
//! (unparked) when
//! - a guest segment for it arrives ([`Datapath::unpark_for_frame`], before
//!   smoltcp sees the segment: a segment for a socket not in the set would
//!   be answered with a RST),
//! - its host stream becomes readable (a waker of the flow's own, fed
//!   into [`Parking`]'s ready list, registered when it was parked),
//! - its socket's next timer (keep-alive, idle timeout) is due: read at
//!   parking from smoltcp itself (`Interface::poll_at` over a one-socket
//!   set), kept in a timer heap,
//! - or the session needs every socket (reload revocations, close-all).
//!
//! Only a quiet flow is parked: open both ways, `Established`, nothing
//! queued in either ring, no timer due within [`PARK_MIN_QUIET`], and its
//! host not readable. A parked socket needs nothing from smoltcp until one
//! of the above happens: it has nothing to send, acknowledge or retransmit.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Wake, Waker};

use smoltcp::iface::SocketSet;
use smoltcp::socket::{Socket, tcp};
use smoltcp::time::{Duration as SmolDuration, Instant as SmolInstant};
use smoltcp::wire::{EthernetFrame, EthernetProtocol, IpProtocol, Ipv4Packet, TcpPacket};
use std::net::SocketAddrV4;

use super::FlowState;
use crate::session::Datapath;

/// A socket is parked only if smoltcp wants it no sooner than this.
const PARK_MIN_QUIET: SmolDuration = SmolDuration::from_secs(2);

/// The socket set is rebuilt (its slots compacted) when it has this many
/// more slots than twice the active flows: smoltcp's walks visit every
/// slot, empty ones included, and the set never shrinks by itself.
const COMPACT_SLACK: usize = 64;

/// Ids of parked flows whose host stream became readable, and the session
/// task's waker to wake when one is added.
#[derive(Default)]
struct ReadyList {
    ids: Mutex<Vec<u64>>,
    task: Mutex<Option<Waker>>,
}

/// The waker a parked flow registers with its host stream.
struct FlowWaker {
    id: u64,
    list: Arc<ReadyList>,
}

impl Wake for FlowWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.list
            .ids
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(self.id);
        let task = self
            .list
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(t) = task {
            t.wake();
        }
    }
}

/// Which flows are active (their socket in smoltcp's set) and what brings
/// a parked one back.
pub(crate) struct Parking {
    /// Flows whose socket (if they have one yet) is in the socket set.
    pub(crate) active: HashSet<u64>,
    /// Parked flows by the time their socket's next timer is due. Entries
    /// of flows unparked since are stale and skipped when popped.
    timers: BinaryHeap<Reverse<(SmolInstant, u64)>>,
    ready: Arc<ReadyList>,
    /// A one-slot set used to ask smoltcp when one socket next needs a poll.
    probe: SocketSet<'static>,
    /// Slots the socket set may hold (the most active flows since it was
    /// last rebuilt): an upper bound, as flows without a socket count too.
    slots: usize,
    /// Flows parked now.
    parked: usize,
}

impl Default for Parking {
    fn default() -> Self {
        Self {
            active: HashSet::new(),
            timers: BinaryHeap::new(),
            ready: Arc::default(),
            probe: SocketSet::new(Vec::with_capacity(1)),
            slots: 0,
            parked: 0,
        }
    }
}

impl std::fmt::Debug for Parking {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parking")
            .field("active", &self.active.len())
            .field("parked", &self.parked)
            .finish_non_exhaustive()
    }
}

impl Parking {
    /// Records a new active flow.
    pub(crate) fn activate(&mut self, id: u64) {
        self.active.insert(id);
        self.slots = self.slots.max(self.active.len());
    }

    /// Flows parked now.
    pub(crate) fn parked(&self) -> usize {
        self.parked
    }

    /// Counts a parked flow removed with its socket.
    pub(crate) fn unparked_gone(&mut self) {
        self.parked = self.parked.saturating_sub(1);
    }

    /// Registers the session task's waker and says whether a parked flow's
    /// host became readable since the ready list was last drained.
    pub(crate) fn poll_ready(&self, cx: &Context<'_>) -> bool {
        {
            let mut task = self
                .ready
                .task
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if !task.as_ref().is_some_and(|t| t.will_wake(cx.waker())) {
                *task = Some(cx.waker().clone());
            }
        }
        !self
            .ready
            .ids
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    }

    /// The time until the earliest parked socket's timer (stale entries
    /// included: waking early for one is harmless).
    pub(crate) fn next_timer(&self, now: SmolInstant) -> Option<SmolDuration> {
        self.timers.peek().map(|Reverse((at, _))| {
            if *at > now {
                *at - now
            } else {
                SmolDuration::ZERO
            }
        })
    }
}

impl Datapath {
    /// Brings back every parked flow that has something to do now: its
    /// host became readable or its socket's timer is due.
    pub(crate) fn unpark_due(&mut self) {
        let ready = std::mem::take(
            &mut *self
                .parking
                .ready
                .ids
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for id in ready {
            self.unpark(id);
        }
        let now = self.now();
        while let Some(Reverse((at, id))) = self.parking.timers.peek().copied() {
            if at > now {
                break;
            }
            self.parking.timers.pop();
            self.unpark(id);
        }
    }

    /// Unparks the flow a guest TCP segment belongs to, if it is parked,
    /// so that smoltcp finds its socket.
    pub(crate) fn unpark_for_frame(&mut self, frame: &[u8]) {
        if self.parking.parked == 0 {
            return;
        }
        let Some((src, dst)) = tcp_endpoints(frame) else {
            return;
        };
        for (src, dst) in [(src, dst), (dst, src)] {
            let key = crate::decide::FlowKey {
                transport: crate::decide::Transport::Tcp,
                src: src.into(),
                dst: dst.into(),
            };
            if let Some(&id) = self.by_key.get(&key) {
                self.unpark(id);
                return;
            }
        }
    }

    /// Puts a parked flow's socket back into the set (a new handle).
    pub(crate) fn unpark(&mut self, id: u64) {
        let Some(flow) = self.flows.get_mut(&id) else {
            return;
        };
        let Some(sock) = flow.parked.take() else {
            return;
        };
        let handle = self.sockets.add(*sock);
        if let FlowState::Open { handle: h, .. } = &mut flow.state {
            *h = handle;
        }
        self.parking.parked -= 1;
        self.parking.activate(id);
    }

    /// Unparks every parked flow (before a walk that needs every socket).
    pub(crate) fn unpark_all(&mut self) {
        let parked: Vec<u64> = self
            .flows
            .iter()
            .filter(|(_, f)| f.parked.is_some())
            .map(|(id, _)| *id)
            .collect();
        for id in parked {
            self.unpark(id);
        }
        self.parking.timers.clear();
    }

    /// Parks the active flow `id` if it is quiet; true when it did.
    pub(crate) fn park_if_quiet(&mut self, id: u64) -> bool {
        let now = self.now();
        let Some(flow) = self.flows.get_mut(&id) else {
            return false;
        };
        let FlowState::Open {
            handle,
            host,
            host_eof: false,
            host_write_shut: false,
        } = &flow.state
        else {
            return false;
        };
        let handle = *handle;
        let sock = self.sockets.get::<tcp::Socket<'_>>(handle);
        if sock.state() != tcp::State::Established || sock.send_queue() > 0 || sock.recv_queue() > 0
        {
            return false;
        }
        let waker = flow.waker.get_or_insert_with(|| {
            Waker::from(Arc::new(FlowWaker {
                id,
                list: self.parking.ready.clone(),
            }))
        });
        // Registers the flow's own waker with its host stream (replacing
        // the session's): readiness from here on names this flow.
        if host
            .poll_read_ready(&mut Context::from_waker(waker))
            .is_ready()
        {
            return false;
        }
        // When smoltcp next needs this socket, asked of smoltcp itself
        // over a set that holds only it.
        let probe = self.parking.probe.add(self.sockets.remove(handle));
        let due = self.iface.poll_at(now, &self.parking.probe);
        let sock = match self.parking.probe.remove(probe) {
            Socket::Tcp(sock) if due.is_none_or(|at| at >= now + PARK_MIN_QUIET) => sock,
            // Due soon (or, impossibly, not a TCP socket): back in the set.
            other => {
                let handle = self.sockets.add(other);
                if let FlowState::Open { handle: h, .. } = &mut flow.state {
                    *h = handle;
                }
                return false;
            }
        };
        flow.parked = Some(Box::new(sock));
        if let Some(at) = due {
            self.parking.timers.push(Reverse((at, id)));
        }
        self.parking.active.remove(&id);
        self.parking.parked += 1;
        true
    }

    /// Rebuilds the socket set when it has far more slots than active
    /// flows (after many were parked or closed): smoltcp's walks visit
    /// every slot, and the set never gives slots back.
    pub(crate) fn compact_sockets(&mut self) {
        if self.parking.slots <= 2 * self.parking.active.len() + COMPACT_SLACK {
            return;
        }
        let mut fresh = SocketSet::new(Vec::with_capacity(self.parking.active.len()));
        for id in &self.parking.active {
            let Some(flow) = self.flows.get_mut(id) else {
                continue;
            };
            let handle = match &mut flow.state {
                FlowState::Open { handle, .. }
                | FlowState::Inspecting { handle, .. }
                | FlowState::InspectConnecting { handle }
                | FlowState::DnsTcp { handle, .. } => handle,
                FlowState::Connecting { .. } => continue,
            };
            *handle = fresh.add(self.sockets.remove(*handle));
        }
        // Every socket in the set belongs to an active flow; anything
        // left is dropped with the old set.
        self.sockets = fresh;
        self.parking.slots = self.parking.active.len();
    }
}

/// The source and destination of a guest frame that is an IPv4 TCP
/// segment (checked lengths only: smoltcp validates the rest).
fn tcp_endpoints(frame: &[u8]) -> Option<(SocketAddrV4, SocketAddrV4)> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    if eth.ethertype() != EthernetProtocol::Ipv4 {
        return None;
    }
    let ip = Ipv4Packet::new_checked(eth.payload()).ok()?;
    if ip.next_header() != IpProtocol::Tcp {
        return None;
    }
    let tcp = TcpPacket::new_checked(ip.payload()).ok()?;
    Some((
        SocketAddrV4::new(ip.src_addr(), tcp.src_port()),
        SocketAddrV4::new(ip.dst_addr(), tcp.dst_port()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flow_waker_lists_its_flow_and_wakes_the_task() {
        let list = Arc::new(ReadyList::default());
        let waker = Waker::from(Arc::new(FlowWaker {
            id: 7,
            list: list.clone(),
        }));
        waker.wake_by_ref();
        waker.wake();
        assert_eq!(*list.ids.lock().unwrap(), vec![7, 7]);
    }

    #[test]
    fn handles_of_a_one_slot_probe_are_reused() {
        let mut probe = SocketSet::new(Vec::with_capacity(1));
        let sock = || {
            tcp::Socket::new(
                tcp::SocketBuffer::new(vec![0u8; 64]),
                tcp::SocketBuffer::new(vec![0u8; 64]),
            )
        };
        let a = probe.add(sock());
        probe.remove(a);
        let b = probe.add(sock());
        assert_eq!(a, b);
    }
}

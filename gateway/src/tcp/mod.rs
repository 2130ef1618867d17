//! Guest TCP flows: the table of flows and their states ([`table`]: SYN,
//! host connect, open, close), the byte pump between a smoltcp socket and
//! its host stream ([`splice`]), the first-bytes decision of inspected
//! flows ([`inspect`]) and the hand-over to the interception and
//! plain-HTTP proxies ([`handoff`]).
//!
//! SYN handling: a new SYN is decided first. A denied SYN gets a crafted RST.
//! An allowed SYN is held while the host connects (with a timeout); only then
//! is a listening socket created for exactly that destination and the held SYN
//! fed to it alone, so concurrent SYNs cannot be cross-wired. Duplicate SYNs
//! while a connect is pending are dropped. An inspected flow is accepted
//! first; its first bytes are peeked (left in the socket buffer, so they are
//! replayed upstream for free) and put to the decider before connecting.

use std::time::Instant;

use smoltcp::iface::SocketHandle;
use smoltcp::socket::tcp;
use tokio::net::TcpStream;

use crate::audit::FlowTotals;
use crate::decide::FlowKey;
use crate::flow::{Admission, Transport};

pub(crate) mod handoff;
mod inspect;
pub(crate) mod park;
mod pipe;
mod splice;
mod table;

pub(crate) use handoff::HostStream;

/// What to do once the host connect completes.
pub(crate) enum FlowState {
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

pub(crate) struct Flow {
    pub(crate) key: FlowKey,
    pub(crate) state: FlowState,
    pub(crate) opened: Instant,
    pub(crate) up: u64,
    pub(crate) down: u64,
    /// Whether the flow's `connection` (allow) line was written (a close line follows only then).
    pub(crate) audited_open: bool,
    /// What admitted it: `None` until the decider allowed it, and for
    /// DNS over TCP and published flows (no decider is asked).
    pub(crate) admission: Option<Admission>,
    /// `down` when the send ring's pages were last given back
    /// ([`Datapath::release_idle_buffers`](crate::session::Datapath)).
    pub(crate) down_at_release: u64,
    /// `down` at the last sweep: unchanged since means idle.
    pub(crate) down_at_sweep: u64,
    /// The flow's socket while it is parked ([`park`]): out of smoltcp's
    /// socket set, and the handle in `state` stale until it is unparked.
    pub(crate) parked: Option<Box<tcp::Socket<'static>>>,
    /// The waker a parked flow registers with its host stream, made at
    /// its first parking.
    pub(crate) waker: Option<std::task::Waker>,
}

impl Flow {
    /// The TCP flow `id`'s identity and totals so far, for its close line.
    pub(crate) fn totals(&self, id: u64) -> FlowTotals {
        FlowTotals {
            flow: id,
            transport: Transport::Tcp,
            src: self.key.src,
            dst: self.key.dst,
            bytes_up: self.up,
            bytes_down: self.down,
            duration_ms: FlowTotals::millis(self.opened.elapsed()),
        }
    }
}

/// Whether the guest has sent its FIN (or the connection is gone) and every
/// received byte has been read. False before the handshake completes (a
/// `SynSent`/`SynReceived` socket cannot receive yet either).
pub(crate) fn guest_finished(sock: &tcp::Socket<'_>) -> bool {
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
pub(crate) fn is_local_route(host: &TcpStream) -> bool {
    match (host.local_addr(), host.peer_addr()) {
        (Ok(local), Ok(peer)) => local.ip() == peer.ip() && !peer.ip().is_loopback(),
        // Cannot tell: fail closed.
        _ => true,
    }
}

/// The sequence number of a held SYN frame (0 when it cannot be read).
pub(crate) fn syn_seq(frame: &[u8]) -> u32 {
    let ihl = frame.get(14).map_or(20, |b| usize::from(b & 0x0f) * 4);
    let at = 14 + ihl + 4;
    frame
        .get(at..at + 4)
        .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

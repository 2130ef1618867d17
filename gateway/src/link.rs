//! The guest's link: how Ethernet frames travel between the guest and the
//! session. Three transports carry the same frames to one unchanged session:
//!
//! - **stream** ([`GuestLink::stream`]): QEMU's `-netdev stream`, each frame
//!   behind a 4-byte big-endian length ([`crate::frames`]); many frames per
//!   read and per write.
//! - **datagram** ([`GuestLink::dgram`]): one frame per unix datagram, as
//!   QEMU's `-netdev dgram` and the vfkit/libkrun/krunkit unixgram protocol
//!   (gvproxy's `-listen-vfkit`). As gvproxy does, a socket that is not
//!   connected learns its peer from the first datagram that carries a
//!   sender path and sends to that path (it does not `connect`: a restarted
//!   peer binding the same path is reached again); datagrams from any other
//!   sender are dropped. The 4-byte `VFKT` datagram older vfkit releases
//!   send first is consumed. When sending to the peer is refused (its
//!   socket is gone), the link forgets it and learns the next sender.
//! - **packet** ([`GuestLink::packet`]): an `AF_PACKET` socket bound to one
//!   interface (`--attach`: a TAP a VMM holds, or a veth end), opened with
//!   `PACKET_VNET_HDR` so each frame carries a virtio-net header: a frame
//!   whose checksum the sender left to offload (`NEEDS_CSUM`, as a veth
//!   peer's or a VMM's TAP writes are) is completed here before the session
//!   parses it, and a segmentation-offload frame arrives whole (one large
//!   IP packet, which the stack accepts up to the frame limit).
//!
//! Invariant: no input makes these types panic, and nothing the guest
//! sends ends a datagram or packet session: a datagram or packet that is
//! not a frame is handed to the session, whose parser drops it; one the
//! kernel cannot hand over whole (a receive error about that one packet, a
//! truncated datagram) is dropped here and counted by the session as a
//! malformed frame. Only an error that means the link itself is gone
//! ([`link_gone`]) ends the session. A stream is different: a read error
//! or a broken length prefix leaves no frame boundary to resume at, so it
//! ends the session (the guest sees its link close; with `--socket` the
//! gateway accepts the next connection).

use std::io::{self, IoSlice};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Context;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::net::{UnixDatagram, UnixStream};

use crate::frames::{FrameError, FrameReader, MIN_FRAME, TxBatch};
use crate::writable::{WriteWait, borrowed, register_readable};

/// Bytes read from a stream guest per syscall.
const STREAM_READ_CHUNK: usize = 256 * 1024;
/// SO_SNDBUF asked for the guest socket (the kernel caps it at
/// `net.core.wmem_max` and doubles it).
const GUEST_SNDBUF: usize = 4 * 1024 * 1024;
/// SO_RCVBUF asked for datagram and packet sockets: frames queue in the
/// kernel one by one, so a burst needs room.
const GUEST_RCVBUF: usize = 4 * 1024 * 1024;
/// Datagrams or packets received per call of [`GuestLink::receive`].
const DATAGRAM_BATCH: usize = 64;
/// Receive buffer for one datagram: the largest frame plus the virtio-net
/// header, with room to spare so an oversized datagram shows as truncated.
const DATAGRAM_BUF: usize = 65536 + VNET_HDR_LEN + 1;
/// `struct virtio_net_hdr` (no `num_buffers`): what `PACKET_VNET_HDR` puts
/// before every frame, both ways.
const VNET_HDR_LEN: usize = 10;
/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`.
const VNET_F_NEEDS_CSUM: u8 = 1;
/// The header the gateway sends: no offload asked (every frame it builds
/// carries complete checksums).
const VNET_HDR_NONE: [u8; VNET_HDR_LEN] = [0; VNET_HDR_LEN];
/// The handshake datagram older vfkit releases send before any frame.
const VFKIT_MAGIC: &[u8] = b"VFKT";

/// The transport between the guest and the gateway (module docs).
#[derive(Debug)]
pub enum GuestLink {
    /// QEMU's stream protocol on a connected unix stream socket.
    Stream(StreamLink),
    /// One frame per datagram on a unix datagram socket.
    Dgram(DgramLink),
    /// An `AF_PACKET` socket with virtio-net headers, bound to one interface.
    Packet(PacketLink),
}

/// A connected unix stream socket, registered for reading; writability is
/// watched only while output is blocked ([`crate::writable`]).
#[derive(Debug)]
pub struct StreamLink {
    fd: AsyncFd<std::os::unix::net::UnixStream>,
    write: WriteWait,
}

/// A unix datagram socket and what is known of its peer.
#[derive(Debug)]
pub struct DgramLink {
    sock: AsyncFd<std::os::unix::net::UnixDatagram>,
    write: WriteWait,
    /// Connected by whoever handed it over (a socketpair end): `send` goes
    /// to that peer and only it can send here.
    connected: bool,
    /// Otherwise: the peer's path, learnt from its first datagram.
    peer: std::sync::Mutex<Option<std::path::PathBuf>>,
    /// A datagram without a sender path arrived before any peer was known
    /// (warned once).
    warned_unnamed: AtomicBool,
    /// For a bound socket: the uids whose datagrams are the guest's (the
    /// kernel's `SCM_CREDENTIALS`, not forgeable without privilege); `None`
    /// for a connected socket, whose one peer the kernel already enforces.
    peer_uids: Option<Vec<u32>>,
    /// A datagram from another uid arrived (warned once).
    warned_uid: AtomicBool,
}

/// A non-blocking `AF_PACKET` socket (opened by the binary: see
/// `docs/attach.md`), registered with the runtime.
#[derive(Debug)]
pub struct PacketLink {
    fd: AsyncFd<OwnedFd>,
    write: WriteWait,
}

/// What one [`GuestLink::receive`] call saw.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Received {
    /// The guest closed the stream.
    Closed,
    /// Nothing was waiting.
    Idle,
    /// Frames were handed on or dropped; `more` when the read filled its
    /// budget (more may be waiting).
    Frames {
        /// Read again before waiting.
        more: bool,
        /// Datagrams or packets dropped by the link (count them as
        /// malformed frames).
        dropped: u32,
    },
}

impl Received {
    /// A batch that ended because nothing more was waiting, after `read`
    /// datagrams were taken and `dropped` of them were dropped.
    fn drained(read: usize, dropped: u32) -> Self {
        if read == 0 && dropped == 0 {
            Received::Idle
        } else {
            Received::Frames {
                more: false,
                dropped,
            }
        }
    }
}

/// A failure that ends the guest session.
#[derive(Debug)]
pub(crate) enum LinkFailure {
    /// The stream peer broke the framing.
    Protocol(FrameError),
    /// The socket failed.
    Io(io::Error),
}

/// Per-session receive state: the stream reassembly buffer, or one
/// datagram's buffer.
#[derive(Debug)]
pub(crate) enum LinkRx {
    Stream(FrameReader),
    Datagram(Vec<u8>),
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

/// Whether a receive error on a datagram or packet socket means the link
/// itself is gone, which ends the session. Any other error concerns one
/// datagram or packet that the kernel has already taken off the queue: it
/// is dropped and counted, and reading goes on. The guest must not be able
/// to end the session (and so have the floor removed) by what it sends: a
/// TAP accepts a UDP segmentation-offload frame (`VIRTIO_NET_HDR_GSO_UDP`)
/// that a packet socket cannot describe in a virtio-net header, and the
/// receive of that one packet fails with `EINVAL`.
fn link_gone(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        // The interface was set down or removed (the VMM ended and its TAP
        // went with it): a packet socket reports ENETDOWN once. ENODEV and
        // ENXIO: no device behind the socket. EBADF, ENOTSOCK: the
        // descriptor itself is unusable.
        Some(libc::ENETDOWN | libc::ENODEV | libc::ENXIO | libc::EBADF | libc::ENOTSOCK)
    )
}

impl GuestLink {
    /// A connected stream socket (QEMU `-netdev stream`). Must be called
    /// inside a tokio runtime.
    ///
    /// # Errors
    /// The runtime could not register the descriptor.
    pub fn stream(sock: UnixStream) -> io::Result<Self> {
        let s = socket2::SockRef::from(&sock);
        if let Err(e) = s.set_send_buffer_size(GUEST_SNDBUF) {
            tracing::debug!(error = %e, "guest socket: SO_SNDBUF not set");
        }
        // `into_std` deregisters it and leaves it non-blocking.
        let fd = register_readable(sock.into_std()?)?;
        Ok(Self::Stream(StreamLink {
            fd,
            write: WriteWait::default(),
        }))
    }

    /// A unix datagram socket: bound and waiting for its peer's first
    /// datagram, or already connected (an inherited socketpair end). Must
    /// be called inside a tokio runtime.
    ///
    /// # Errors
    /// The runtime could not register the descriptor.
    pub fn dgram(sock: UnixDatagram) -> io::Result<Self> {
        let s = socket2::SockRef::from(&sock);
        if let Err(e) = s
            .set_send_buffer_size(GUEST_SNDBUF)
            .and_then(|()| s.set_recv_buffer_size(GUEST_RCVBUF))
        {
            tracing::debug!(error = %e, "guest socket: buffer sizes not set");
        }
        // A connected socket has a peer; a socketpair end's has no path.
        let connected = sock.peer_addr().is_ok();
        let sock = register_readable(sock.into_std()?)?;
        Ok(Self::Dgram(DgramLink {
            sock,
            write: WriteWait::default(),
            connected,
            peer: std::sync::Mutex::new(None),
            warned_unnamed: AtomicBool::new(false),
            peer_uids: None,
            warned_uid: AtomicBool::new(false),
        }))
    }

    /// A unix datagram socket bound at a path (`--dgram PATH`): only
    /// datagrams sent by a process of one of `peer_uids` are the guest's,
    /// whoever can write the socket file. Set before any datagram can have
    /// arrived unchecked: a datagram without credentials is dropped.
    ///
    /// # Errors
    /// `SO_PASSCRED` could not be set.
    pub fn dgram_bound(sock: UnixDatagram, peer_uids: Vec<u32>) -> io::Result<Self> {
        rustix::net::sockopt::set_socket_passcred(&sock, true)?;
        let mut link = Self::dgram(sock)?;
        if let Self::Dgram(d) = &mut link {
            d.peer_uids = Some(peer_uids);
        }
        Ok(link)
    }

    /// An `AF_PACKET` socket bound to the guest's interface with
    /// `PACKET_VNET_HDR` and `PACKET_IGNORE_OUTGOING` set, non-blocking.
    /// Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// The runtime could not register the descriptor.
    pub fn packet(fd: OwnedFd) -> io::Result<Self> {
        let s = socket2::SockRef::from(&fd);
        if let Err(e) = s
            .set_send_buffer_size(GUEST_SNDBUF)
            .and_then(|()| s.set_recv_buffer_size(GUEST_RCVBUF))
        {
            tracing::debug!(error = %e, "packet socket: buffer sizes not set");
        }
        let fd = register_readable(fd)?;
        Ok(Self::Packet(PacketLink {
            fd,
            write: WriteWait::default(),
        }))
    }

    /// Fresh receive state for a session whose frames are at most `max_frame` bytes.
    pub(crate) fn rx(&self, max_frame: usize) -> LinkRx {
        match self {
            Self::Stream(_) => LinkRx::Stream(FrameReader::new(STREAM_READ_CHUNK, max_frame)),
            Self::Dgram(_) | Self::Packet(_) => LinkRx::Datagram(vec![0; DATAGRAM_BUF]),
        }
    }

    /// Reads what is waiting without blocking and hands each frame to `on_frame`.
    pub(crate) fn receive(
        &self,
        rx: &mut LinkRx,
        mut on_frame: impl FnMut(&[u8]),
    ) -> Result<Received, LinkFailure> {
        match (self, rx) {
            (Self::Stream(link), LinkRx::Stream(reader)) => {
                let spare = reader.spare();
                let want = spare.len();
                let got = link.fd.try_io(Interest::READABLE, |s| {
                    rustix::io::read(s, &mut *spare).map_err(io::Error::from)
                });
                match got {
                    Ok(0) => Ok(Received::Closed),
                    Ok(n) => {
                        reader.filled(n);
                        while let Some(frame) =
                            reader.next_frame().map_err(LinkFailure::Protocol)?
                        {
                            on_frame(frame);
                        }
                        Ok(Received::Frames {
                            more: n == want,
                            dropped: 0,
                        })
                    }
                    Err(e) if would_block(&e) => Ok(Received::Idle),
                    Err(e) => Err(LinkFailure::Io(e)),
                }
            }
            (Self::Dgram(link), LinkRx::Datagram(buf)) => link.receive(buf, on_frame),
            (Self::Packet(link), LinkRx::Datagram(buf)) => link.receive(buf, on_frame),
            // `rx` is always made by `Self::rx` of the same link.
            _ => Ok(Received::Idle),
        }
    }

    /// Writes queued frames until the socket would block or the batch is
    /// empty. Only an error that ends the session is returned: a datagram or
    /// packet the kernel refuses (no peer yet, peer gone, queue full) is
    /// dropped, as a cable would drop it.
    pub(crate) fn transmit(&self, tx: &mut TxBatch) -> io::Result<()> {
        match self {
            Self::Stream(link) => {
                while tx.queued() > 0 {
                    match rustix::io::write(link.fd.get_ref(), tx.unwritten()) {
                        Ok(n) => tx.consume(n),
                        Err(rustix::io::Errno::AGAIN) => break,
                        Err(rustix::io::Errno::INTR) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            Self::Dgram(link) => transmit_frames(tx, |frame| link.send(frame)),
            Self::Packet(link) => transmit_frames(tx, |frame| link.send(frame)),
        }
        let write = self.write_wait();
        if tx.queued() > 0 {
            write.blocked();
        } else {
            write.drained();
        }
        Ok(())
    }

    fn write_wait(&self) -> &WriteWait {
        match self {
            Self::Stream(l) => &l.write,
            Self::Dgram(l) => &l.write,
            Self::Packet(l) => &l.write,
        }
    }

    /// Whether the socket is (or may be) readable; registers the waker.
    pub(crate) fn poll_read_ready(&self, cx: &mut Context<'_>) -> bool {
        match self {
            Self::Stream(s) => s.fd.poll_read_ready(cx).is_ready(),
            Self::Dgram(d) => d.sock.poll_read_ready(cx).is_ready(),
            Self::Packet(p) => p.fd.poll_read_ready(cx).is_ready(),
        }
    }

    /// Whether the socket is (or may be) writable; registers the waker.
    /// Only asked while output waits ([`crate::writable`]).
    pub(crate) fn poll_write_ready(&self, cx: &mut Context<'_>) -> bool {
        match self {
            Self::Stream(s) => s.write.poll_ready(borrowed(&s.fd), cx),
            Self::Dgram(d) => d.write.poll_ready(borrowed(&d.sock), cx),
            Self::Packet(p) => p.write.poll_ready(borrowed(&p.fd), cx),
        }
    }

    /// The transport's name in logs and audit details.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Stream(_) => "stream",
            Self::Dgram(_) => "dgram",
            Self::Packet(_) => "packet",
        }
    }
}

/// What sending one frame did.
enum Sent {
    /// Taken by the kernel, or refused for good (dropped).
    Done,
    /// The socket would block: keep the frame for later.
    Blocked,
}

/// Sends the batch's frames one per datagram until one would block.
fn transmit_frames(tx: &mut TxBatch, mut send: impl FnMut(&[u8]) -> Sent) {
    while tx.queued() > 0 {
        let queued = tx.unwritten();
        let Some(prefix) = queued.get(..4) else {
            // A partial prefix cannot be queued (push_with writes prefix and
            // frame together); drop the remainder rather than loop.
            tx.consume(queued.len());
            break;
        };
        let len = u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
        let Some(frame) = queued.get(4..4 + len) else {
            tx.consume(queued.len());
            break;
        };
        match send(frame) {
            Sent::Done => tx.consume(4 + len),
            Sent::Blocked => break,
        }
    }
}

impl DgramLink {
    fn peer(&self) -> std::sync::MutexGuard<'_, Option<std::path::PathBuf>> {
        // Only the session task uses the link; a poisoned lock still holds a path.
        self.peer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a datagram from `from` (its sender's bound path, if any),
    /// sent by `uid`, is the guest's: from an allowed uid, and the known
    /// peer's or the first one from a bound path (which becomes the peer).
    fn accept_sender(&self, from: Option<&std::path::Path>, uid: Option<u32>) -> bool {
        if self.connected {
            return true;
        }
        if let Some(allowed) = &self.peer_uids
            && !uid.is_some_and(|u| allowed.contains(&u))
        {
            if !self.warned_uid.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    uid = ?uid,
                    allowed = ?allowed,
                    "datagram from another user: dropped (--dgram-peer-uid names who may be the guest)"
                );
            }
            return false;
        }
        let Some(path) = from else {
            if !self.warned_unnamed.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "datagram from an unbound socket: dropped (the peer must bind a path to get replies)"
                );
            }
            return false;
        };
        let mut peer = self.peer();
        match peer.as_deref() {
            Some(known) => known == path,
            None => {
                tracing::info!(peer = %path.display(), "datagram peer learnt");
                *peer = Some(path.to_owned());
                true
            }
        }
    }

    /// One datagram into `buf`: its full length (more than `buf` holds
    /// when the kernel cut it), its sender's bound path and its uid.
    fn recv_one(
        &self,
        buf: &mut [u8],
    ) -> io::Result<(usize, Option<std::path::PathBuf>, Option<u32>)> {
        use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SocketAddrUnix};
        use std::os::unix::ffi::OsStrExt as _;
        self.sock.try_io(Interest::READABLE, |sock| {
            let mut space =
                [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmCredentials(1))];
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let msg = rustix::net::recvmsg(
                sock,
                &mut [io::IoSliceMut::new(buf)],
                &mut control,
                RecvFlags::TRUNC,
            )?;
            let uid = control.drain().find_map(|m| match m {
                RecvAncillaryMessage::ScmCredentials(c) => Some(c.uid.as_raw()),
                _ => None,
            });
            let from = msg
                .address
                .and_then(|a| SocketAddrUnix::try_from(a).ok())
                .and_then(|u| {
                    u.path_bytes()
                        .map(|b| std::path::PathBuf::from(std::ffi::OsStr::from_bytes(b)))
                });
            Ok((msg.bytes, from, uid))
        })
    }

    fn receive(
        &self,
        buf: &mut [u8],
        mut on_frame: impl FnMut(&[u8]),
    ) -> Result<Received, LinkFailure> {
        let mut dropped = 0;
        for i in 0..DATAGRAM_BATCH {
            let (n, from, uid) = match self.recv_one(buf) {
                Ok(r) => r,
                Err(e) if would_block(&e) => {
                    return Ok(Received::drained(i, dropped));
                }
                // A connected unix datagram socket reports its peer's
                // earlier refusal here; the next datagram may go through.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => continue,
                Err(e) if link_gone(&e) => return Err(LinkFailure::Io(e)),
                Err(e) => {
                    tracing::debug!(error = %e, "datagram from the guest dropped");
                    dropped += 1;
                    continue;
                }
            };
            if !self.accept_sender(from.as_deref(), uid) {
                continue;
            }
            // A datagram that filled the buffer was longer than any frame
            // (the buffer has a byte to spare): the kernel cut it, so it is
            // dropped, never handed on shortened.
            if n >= buf.len() {
                dropped += 1;
                continue;
            }
            let Some(data) = buf.get(..n) else { continue };
            if data == VFKIT_MAGIC {
                continue;
            }
            on_frame(data);
        }
        Ok(Received::Frames {
            more: true,
            dropped,
        })
    }

    fn send(&self, frame: &[u8]) -> Sent {
        let sock = self.sock.get_ref();
        let sent = if self.connected {
            sock.send(frame)
        } else {
            let peer = self.peer().clone();
            match peer {
                Some(path) => sock.send_to(frame, path),
                // No peer yet: nobody to deliver to.
                None => return Sent::Done,
            }
        };
        match sent {
            Ok(_) => Sent::Done,
            Err(e) if would_block(&e) => Sent::Blocked,
            Err(e) => {
                // The peer's socket is gone (the VMM ended or restarts): the
                // next sender from a bound path becomes the peer.
                if !self.connected
                    && matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound
                    )
                {
                    *self.peer() = None;
                }
                tracing::debug!(error = %e, "datagram to the guest dropped");
                Sent::Done
            }
        }
    }
}

impl PacketLink {
    fn receive(
        &self,
        buf: &mut [u8],
        mut on_frame: impl FnMut(&[u8]),
    ) -> Result<Received, LinkFailure> {
        if let Some(e) = self.pending_error()
            && link_gone(&e)
        {
            return Err(LinkFailure::Io(e));
        }
        let mut dropped = 0;
        for i in 0..DATAGRAM_BATCH {
            let got = self.fd.try_io(Interest::READABLE, |fd| {
                rustix::net::recv(fd, &mut *buf, rustix::net::RecvFlags::TRUNC)
                    .map_err(io::Error::from)
            });
            let (n, full) = match got {
                Ok(r) => r,
                Err(e) if would_block(&e) => {
                    return Ok(Received::drained(i, dropped));
                }
                // The interface went down or away (the VMM ended): the
                // session ends; the floor stays until the gateway removes it.
                Err(e) if link_gone(&e) => return Err(LinkFailure::Io(e)),
                // One packet the socket could not hand over (module docs).
                Err(e) => {
                    tracing::debug!(error = %e, "packet from the guest interface dropped");
                    dropped += 1;
                    continue;
                }
            };
            if full > n {
                // Larger than any frame: not from a guest we serve.
                dropped += 1;
                continue;
            }
            let Some(packet) = buf.get_mut(..n) else {
                continue;
            };
            if let Some(frame) = complete_vnet_frame(packet) {
                on_frame(frame);
            } else {
                dropped += 1;
            }
        }
        Ok(Received::Frames {
            more: true,
            dropped,
        })
    }

    /// The socket's pending error, read (and cleared) when the runtime saw
    /// `EPOLLERR`. When the interface goes down or away the packet socket
    /// reports `ENETDOWN` with `EPOLLERR` alone (no `EPOLLIN`), which read
    /// readiness does not show; the session's loop comes here at least
    /// once a second.
    fn pending_error(&self) -> Option<io::Error> {
        let pending = self.fd.try_io(Interest::ERROR, |fd| {
            match rustix::net::sockopt::socket_error(fd) {
                Ok(Err(errno)) => Ok(io::Error::from(errno)),
                Err(errno) => Ok(io::Error::from(errno)),
                // Nothing pending: WouldBlock clears the readiness.
                Ok(Ok(())) => Err(io::ErrorKind::WouldBlock.into()),
            }
        });
        pending.ok()
    }

    fn send(&self, frame: &[u8]) -> Sent {
        let sent = rustix::net::sendmsg(
            self.fd.get_ref(),
            &[IoSlice::new(&VNET_HDR_NONE), IoSlice::new(frame)],
            &mut rustix::net::SendAncillaryBuffer::default(),
            rustix::net::SendFlags::DONTWAIT,
        )
        .map_err(io::Error::from);
        match sent {
            Ok(_) => Sent::Done,
            Err(e) if would_block(&e) => Sent::Blocked,
            Err(e) => {
                tracing::debug!(error = %e, "frame to the guest interface dropped");
                Sent::Done
            }
        }
    }
}

/// The frame behind a virtio-net header, with the checksum the sender left
/// to offload filled in. `None` for a packet too short to hold a header and
/// an Ethernet header, or whose checksum position lies outside the frame.
pub(crate) fn complete_vnet_frame(packet: &mut [u8]) -> Option<&[u8]> {
    let (hdr, frame) = packet.split_at_mut_checked(VNET_HDR_LEN)?;
    if frame.len() < MIN_FRAME {
        return None;
    }
    if hdr[0] & VNET_F_NEEDS_CSUM != 0 {
        let start = usize::from(u16::from_le_bytes([hdr[6], hdr[7]]));
        let offset = usize::from(u16::from_le_bytes([hdr[8], hdr[9]]));
        let at = start.checked_add(offset)?;
        if at.checked_add(2)? > frame.len() || start > frame.len() {
            return None;
        }
        // The field holds the pseudo-header sum; the sum over everything
        // from `start` (that field included) completes it.
        let sum = !internet_sum(&frame[start..]);
        frame[at..at + 2].copy_from_slice(&sum.to_be_bytes());
    }
    Some(frame)
}

/// The folded 16-bit ones'-complement sum of `data` (RFC 1071), not inverted.
fn internet_sum(data: &[u8]) -> u16 {
    let mut sum: u64 = 0;
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u64::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u64::from(*last) << 8;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    // Folded to 16 bits by the loop above.
    u16::try_from(sum).unwrap_or(0xffff)
}

#[cfg(test)]
mod tests;

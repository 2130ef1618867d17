//! The in-process byte stream between a proxied flow and its proxy task.
//!
//! A flow handed to a proxy ([`super::handoff`]) needs a host side the
//! datapath pumps exactly like a host socket (`try_read`, `try_write`,
//! readiness with a waker), and the proxy needs an `AsyncRead + AsyncWrite`
//! it can run TLS and HTTP over. Both run on the gateway's one runtime
//! thread, so a kernel socket pair between them only added two system calls,
//! two readiness events and a socket buffer per chunk each way. Here the
//! bytes go through two bounded rings in memory: one copy in, one copy out,
//! as with the socket pair, and nothing else.
//!
//! Semantics follow a stream socket pair:
//! - a side that shuts down writing gives the other side end of stream once
//!   the ring is drained;
//! - a dropped side gives the other end of stream on reading and
//!   `BrokenPipe` on writing;
//! - [`DatapathEnd::reset`] (the guest reset the flow) makes the proxy's
//!   next read or write fail with `ConnectionReset`, as a reset TCP
//!   connection would.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bytes each direction holds before the writer must wait. Allocated on the
/// first write, so an idle proxied flow holds no ring memory.
const CAPACITY: usize = 128 * 1024;

/// A bounded byte ring, allocated lazily.
#[derive(Debug, Default)]
struct Ring {
    buf: Vec<u8>,
    head: usize,
    len: usize,
}

impl Ring {
    fn free(&self) -> usize {
        CAPACITY - self.len
    }

    /// Copies as much of `src` as fits; returns how much.
    fn push(&mut self, src: &[u8]) -> usize {
        if self.buf.is_empty() {
            self.buf = vec![0; CAPACITY];
        }
        let n = src.len().min(self.free());
        let tail = (self.head + self.len) % CAPACITY;
        let first = n.min(CAPACITY - tail);
        self.buf[tail..tail + first].copy_from_slice(&src[..first]);
        self.buf[..n - first].copy_from_slice(&src[first..n]);
        self.len += n;
        n
    }

    /// Copies as much as `dst` takes; returns how much.
    fn pop(&mut self, dst: &mut [u8]) -> usize {
        let n = dst.len().min(self.len);
        let first = n.min(CAPACITY - self.head);
        dst[..first].copy_from_slice(&self.buf[self.head..self.head + first]);
        dst[first..n].copy_from_slice(&self.buf[..n - first]);
        self.head = (self.head + n) % CAPACITY;
        self.len -= n;
        if self.len == 0 {
            self.head = 0;
        }
        n
    }
}

/// One direction: its ring, whether its writer is done, and who waits.
#[derive(Debug, Default)]
struct Direction {
    ring: Ring,
    /// The writer shut down or went away: end of stream once drained.
    writer_done: bool,
    /// The reader went away: writes fail with `BrokenPipe`.
    reader_gone: bool,
    /// Woken when bytes arrive or the writer is done.
    reader: Option<Waker>,
    /// Woken when room appears or the reader goes.
    writer: Option<Waker>,
}

impl Direction {
    fn read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        if self.ring.len == 0 {
            return if self.writer_done || dst.is_empty() {
                Ok(0)
            } else {
                Err(io::ErrorKind::WouldBlock.into())
            };
        }
        let n = self.ring.pop(dst);
        if let Some(w) = self.writer.take() {
            w.wake();
        }
        Ok(n)
    }

    fn write(&mut self, src: &[u8]) -> io::Result<usize> {
        if self.reader_gone || self.writer_done {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        if src.is_empty() {
            return Ok(0);
        }
        if self.ring.free() == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = self.ring.push(src);
        if let Some(w) = self.reader.take() {
            w.wake();
        }
        Ok(n)
    }

    fn readable(&self) -> bool {
        self.ring.len > 0 || self.writer_done
    }

    fn writable(&self) -> bool {
        self.ring.free() > 0 || self.reader_gone || self.writer_done
    }

    fn end_writer(&mut self) {
        self.writer_done = true;
        if let Some(w) = self.reader.take() {
            w.wake();
        }
    }

    fn end_reader(&mut self) {
        self.reader_gone = true;
        self.ring = Ring::default();
        if let Some(w) = self.writer.take() {
            w.wake();
        }
    }
}

#[derive(Debug, Default)]
struct Shared {
    /// Guest to proxy: the datapath writes, the proxy reads.
    up: Direction,
    /// Proxy to guest: the proxy writes, the datapath reads.
    down: Direction,
    /// The guest reset the flow: the proxy's reads and writes fail.
    reset: bool,
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    // A panic while holding the lock leaves plain ring state behind, which
    // is still consistent enough to close the flow.
    shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A connected pair: the datapath's end and the proxy's end.
pub(crate) fn pair() -> (DatapathEnd, ProxyEnd) {
    let shared = Arc::new(Mutex::new(Shared::default()));
    (
        DatapathEnd {
            shared: shared.clone(),
        },
        ProxyEnd { shared },
    )
}

/// The flow's host side, pumped by the datapath (non-blocking calls and
/// readiness wakers, like a host socket's).
#[derive(Debug)]
pub(crate) struct DatapathEnd {
    shared: Arc<Mutex<Shared>>,
}

impl DatapathEnd {
    /// Reads what the proxy wrote towards the guest; `Ok(0)` at end of
    /// stream, `WouldBlock` when nothing waits.
    pub(crate) fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        lock(&self.shared).down.read(buf)
    }

    /// Passes guest bytes to the proxy; `WouldBlock` when its ring is full.
    pub(crate) fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        lock(&self.shared).up.write(buf)
    }

    /// Ready when a read would not block; otherwise `cx` is woken when it
    /// would not.
    pub(crate) fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut s = lock(&self.shared);
        if s.down.readable() {
            return Poll::Ready(Ok(()));
        }
        s.down.reader = Some(cx.waker().clone());
        Poll::Pending
    }

    /// Ready when a write would not block; otherwise `cx` is woken when it
    /// would not.
    pub(crate) fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut s = lock(&self.shared);
        if s.up.writable() {
            return Poll::Ready(Ok(()));
        }
        s.up.writer = Some(cx.waker().clone());
        Poll::Pending
    }

    /// The guest finished sending: the proxy reads end of stream once it
    /// has everything before it.
    pub(crate) fn shutdown_write(&self) {
        lock(&self.shared).up.end_writer();
    }

    /// The guest reset the flow: the proxy's next read or write fails.
    pub(crate) fn reset(&self) {
        let mut s = lock(&self.shared);
        s.reset = true;
        s.up.end_writer();
        s.down.end_reader();
    }
}

impl Drop for DatapathEnd {
    fn drop(&mut self) {
        let mut s = lock(&self.shared);
        s.up.end_writer();
        s.down.end_reader();
    }
}

/// The proxy's end: an ordinary async byte stream.
#[derive(Debug)]
pub(crate) struct ProxyEnd {
    shared: Arc<Mutex<Shared>>,
}

impl ProxyEnd {
    fn reset_error() -> io::Error {
        io::ErrorKind::ConnectionReset.into()
    }
}

impl AsyncRead for ProxyEnd {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let mut s = lock(&self.shared);
        if s.reset {
            return Poll::Ready(Err(Self::reset_error()));
        }
        match s.up.read(buf.initialize_unfilled()) {
            Ok(n) => {
                buf.advance(n);
                Poll::Ready(Ok(()))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                s.up.reader = Some(cx.waker().clone());
                Poll::Pending
            }
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl AsyncWrite for ProxyEnd {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut s = lock(&self.shared);
        if s.reset {
            return Poll::Ready(Err(Self::reset_error()));
        }
        match s.down.write(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                s.down.writer = Some(cx.waker().clone());
                Poll::Pending
            }
            r => Poll::Ready(r),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let mut s = lock(&self.shared);
        if s.reset {
            return Poll::Ready(Err(Self::reset_error()));
        }
        let mut total = 0;
        for b in bufs.iter().filter(|b| !b.is_empty()) {
            match s.down.write(b) {
                Ok(n) => {
                    total += n;
                    if n < b.len() {
                        break;
                    }
                }
                Err(e) if total > 0 && e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    s.down.writer = Some(cx.waker().clone());
                    return Poll::Pending;
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        Poll::Ready(Ok(total))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        lock(&self.shared).down.end_writer();
        Poll::Ready(Ok(()))
    }
}

impl Drop for ProxyEnd {
    fn drop(&mut self) {
        let mut s = lock(&self.shared);
        s.down.end_writer();
        s.up.end_reader();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn bytes_cross_both_ways_and_wrap_the_ring() {
        let (dp, mut px) = pair();
        // Fill, drain part, fill again: the ring wraps.
        let chunk: Vec<u8> = (0..=250u8).cycle().take(CAPACITY).collect();
        assert_eq!(dp.try_write(&chunk).unwrap(), CAPACITY);
        assert_eq!(
            dp.try_write(b"x").unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        let mut got = vec![0; 1000];
        px.read_exact(&mut got).await.unwrap();
        assert_eq!(got, chunk[..1000]);
        assert_eq!(dp.try_write(&chunk[..1000]).unwrap(), 1000);
        let mut rest = vec![0; CAPACITY];
        px.read_exact(&mut rest).await.unwrap();
        assert_eq!(rest[..CAPACITY - 1000], chunk[1000..]);
        assert_eq!(rest[CAPACITY - 1000..], chunk[..1000]);

        px.write_all(b"down").await.unwrap();
        let mut b = [0; 8];
        assert_eq!(dp.try_read(&mut b).unwrap(), 4);
        assert_eq!(&b[..4], b"down");
        assert_eq!(
            dp.try_read(&mut b).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
    }

    #[tokio::test]
    async fn readiness_wakes_the_datapath_when_the_proxy_writes_or_drains() {
        let (dp, mut px) = pair();
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(dp.poll_read_ready(&mut cx).is_pending());
        px.write_all(b"a").await.unwrap();
        assert!(dp.poll_read_ready(&mut cx).is_ready());

        let full = vec![0; CAPACITY];
        dp.try_write(&full).unwrap();
        assert!(dp.poll_write_ready(&mut cx).is_pending());
        let mut b = [0; 1];
        px.read_exact(&mut b).await.unwrap();
        assert!(dp.poll_write_ready(&mut cx).is_ready());
    }

    #[tokio::test]
    async fn shutdown_and_drop_end_the_stream_like_a_socket_pair() {
        let (dp, mut px) = pair();
        dp.try_write(b"last").unwrap();
        dp.shutdown_write();
        let mut all = Vec::new();
        px.read_to_end(&mut all).await.unwrap();
        assert_eq!(all, b"last");

        px.write_all(b"bye").await.unwrap();
        px.shutdown().await.unwrap();
        let mut b = [0; 8];
        assert_eq!(dp.try_read(&mut b).unwrap(), 3);
        assert_eq!(dp.try_read(&mut b).unwrap(), 0);

        drop(px);
        assert_eq!(
            dp.try_write(b"x").unwrap_err().kind(),
            io::ErrorKind::BrokenPipe
        );
    }

    #[tokio::test]
    async fn a_guest_reset_fails_the_proxy_and_a_dropped_datapath_ends_it() {
        let (dp, mut px) = pair();
        dp.reset();
        let mut b = [0; 1];
        assert_eq!(
            px.read(&mut b).await.unwrap_err().kind(),
            io::ErrorKind::ConnectionReset
        );
        assert_eq!(
            px.write(b"x").await.unwrap_err().kind(),
            io::ErrorKind::ConnectionReset
        );

        let (dp, mut px) = pair();
        drop(dp);
        assert_eq!(px.read(&mut b).await.unwrap(), 0);
        assert_eq!(
            px.write(b"x").await.unwrap_err().kind(),
            io::ErrorKind::BrokenPipe
        );
    }
}

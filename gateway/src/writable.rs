//! Write readiness on demand, for the guest's link.
//!
//! tokio registers a socket for both directions, edge-triggered. For a
//! unix socket or a packet socket the kernel signals "writable" each time
//! the peer consumes data or a sent buffer is freed, whether or not anyone
//! waits to write, and each signal wakes the gateway's one thread from
//! `epoll_wait` for nothing: on the stream link that was every frame sent,
//! half the gateway's wake-ups per connection and per DNS answer. A
//! wake-up is cheap on one CPU and costly across two (an inter-processor
//! interrupt, worse under a hypervisor), so the link's own descriptor is
//! registered for reading only, and a duplicate registered for writing
//! only exists while output is blocked.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// A write-only registration of a link's descriptor, made when a write
/// would block and dropped once the output is written.
#[derive(Debug, Default)]
pub(crate) struct WriteWait {
    /// The duplicate descriptor registered for `EPOLLOUT`. Only the
    /// session's task touches it; the lock keeps the link `Sync`.
    reg: Mutex<Option<AsyncFd<OwnedFd>>>,
}

impl WriteWait {
    fn reg(&self) -> MutexGuard<'_, Option<AsyncFd<OwnedFd>>> {
        self.reg.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `fd` may be writable; registers the waker (and, the first
    /// time after output blocked, the descriptor) for the next change.
    /// When the registration itself fails the answer is "ready": the
    /// caller's write then finds out, and the session's loop bounds how
    /// often it retries.
    pub(crate) fn poll_ready(&self, fd: BorrowedFd<'_>, cx: &mut Context<'_>) -> bool {
        let mut reg = self.reg();
        if reg.is_none() {
            match register(fd) {
                Ok(r) => *reg = Some(r),
                Err(e) => {
                    tracing::debug!(error = %e, "guest link: write registration failed");
                    return true;
                }
            }
        }
        match reg.as_ref().map(|r| r.poll_write_ready(cx)) {
            Some(Poll::Ready(_)) | None => true,
            Some(Poll::Pending) => false,
        }
    }

    /// A write would block: the readiness seen so far is stale.
    pub(crate) fn blocked(&self) {
        if let Some(r) = self.reg().as_ref() {
            // `try_io` clears the readiness when the closure says WouldBlock.
            let _ = r.try_io(Interest::WRITABLE, |_| -> io::Result<()> {
                Err(io::ErrorKind::WouldBlock.into())
            });
        }
    }

    /// Everything queued was written: stop watching for writability.
    pub(crate) fn drained(&self) {
        // Dropping the AsyncFd deregisters the duplicate, then closes it.
        self.reg().take();
    }
}

fn register(fd: BorrowedFd<'_>) -> io::Result<AsyncFd<OwnedFd>> {
    let dup = rustix::io::fcntl_dupfd_cloexec(fd, 0)?;
    // `with_interest` is deprecated for owners that may close or swap the
    // descriptor under the registration; an `OwnedFd` can do neither while
    // the AsyncFd owns it.
    #[allow(deprecated)]
    AsyncFd::with_interest(dup, Interest::WRITABLE)
}

/// Registers `fd` for reading only (see the module docs).
pub(crate) fn register_readable<T: std::os::fd::AsRawFd>(fd: T) -> io::Result<AsyncFd<T>> {
    #[allow(deprecated)]
    AsyncFd::with_interest(fd, Interest::READABLE)
}

/// A borrowed descriptor of an [`AsyncFd`]'s inner value.
pub(crate) fn borrowed<T: AsFd + std::os::fd::AsRawFd>(fd: &AsyncFd<T>) -> BorrowedFd<'_> {
    fd.get_ref().as_fd()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read as _, Write as _};
    use std::os::unix::net::UnixStream;

    fn noop_cx() -> Context<'static> {
        Context::from_waker(std::task::Waker::noop())
    }

    /// The write registration reports a full socket as not ready, the
    /// peer's read as ready, and is gone once drained.
    #[tokio::test]
    async fn readiness_follows_the_peer_and_the_registration_goes_when_drained() {
        let (a, mut b) = UnixStream::pair().expect("pair");
        a.set_nonblocking(true).expect("nonblocking");
        let mut w = &a;
        let chunk = [0u8; 65536];
        while w.write(&chunk).is_ok() {}
        let wait = WriteWait::default();
        wait.blocked();
        let mut cx = noop_cx();
        // Registration happens here; the socket is full, so no readiness yet
        // once the runtime has looked.
        let _ = wait.poll_ready(a.as_fd(), &mut cx);
        tokio::task::yield_now().await;
        wait.blocked();
        assert!(
            !wait.poll_ready(a.as_fd(), &mut cx),
            "a full socket is not writable"
        );
        let mut sink = vec![0u8; 1 << 20];
        b.set_nonblocking(true).expect("nonblocking");
        while b.read(&mut sink).is_ok_and(|n| n > 0) {}
        let ready = std::future::poll_fn(|cx| {
            if wait.poll_ready(a.as_fd(), cx) {
                Poll::Ready(true)
            } else {
                Poll::Pending
            }
        });
        let ready = tokio::time::timeout(std::time::Duration::from_secs(10), ready).await;
        assert_eq!(ready.ok(), Some(true), "the peer's reads make it writable");
        wait.drained();
        assert!(wait.reg().is_none());
    }
}

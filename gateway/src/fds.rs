//! Closing every descriptor of the process but a few named ones: the
//! gateway at start (what it inherited without a flag naming it) and the
//! floor keeper (what it inherited from the gateway at fork).

use std::os::fd::RawFd;

/// Closes every descriptor from 3 up except those in `keep` (stdin,
/// stdout and stderr always stay).
///
/// # Safety
/// No object of this process may own a descriptor that is closed here
/// and be used afterwards (the caller has owned every descriptor it
/// needs, and named each in `keep`).
pub(crate) unsafe fn close_all_but(keep: &[RawFd]) {
    let mut keep: Vec<RawFd> = keep.iter().copied().filter(|fd| *fd >= 3).collect();
    keep.sort_unstable();
    keep.dedup();
    let mut first: RawFd = 3;
    for k in keep {
        if k > first {
            // SAFETY: the caller's contract.
            unsafe { close_range(first, k - 1) };
        }
        first = k + 1;
    }
    // SAFETY: the caller's contract.
    unsafe { close_range(first, RawFd::MAX) };
}

/// Closes descriptors `first..=last`, with `close_range(2)` (Linux 5.9),
/// else one by one up to the open-file limit.
unsafe fn close_range(first: RawFd, last: RawFd) {
    let (Ok(lo), Ok(hi)) = (u32::try_from(first), u32::try_from(last)) else {
        return;
    };
    // SAFETY: close_range only closes descriptors; the caller vouches
    // that nothing uses them afterwards.
    let rc = unsafe { libc::syscall(libc::SYS_close_range, lo, hi, 0u32) };
    if rc == 0 {
        return;
    }
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(65_536)
        .min(1 << 20);
    let top = RawFd::try_from(limit.saturating_sub(1))
        .unwrap_or(RawFd::MAX)
        .min(last);
    for fd in first..=top {
        // SAFETY: as above; a descriptor that is not open gives EBADF.
        unsafe { libc::close(fd) };
    }
}

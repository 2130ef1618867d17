//! Spawning the sidecar processes (QEMU, the gateway) so that they never
//! outlive the launcher: each child gets its own process group, is killed by
//! the kernel when the launcher dies (`PR_SET_PDEATHSIG`), and inherits
//! exactly the descriptors it is given, at fixed numbers.
//!
//! This is the one place that switches to the jail (`crate::jail`) once it
//! is wired in: [`spawn_child`] is what `run` calls for QEMU and the gateway.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};

/// A descriptor handed to a child at a fixed number.
pub(crate) struct Inherit<'a> {
    /// The parent's descriptor (close-on-exec in the parent).
    pub(crate) fd: &'a OwnedFd,
    /// The number it gets in the child (3 and up).
    pub(crate) at: RawFd,
}

/// Spawns `cmd` in its own process group with a parent-death SIGKILL and the
/// given descriptors placed at their numbers (every other descriptor of the
/// launcher is close-on-exec, as std and our socketpairs create them).
pub(crate) fn spawn_child(cmd: &mut Command, inherit: &[Inherit<'_>]) -> io::Result<Child> {
    let parent = std::process::id();
    let fds: Vec<(RawFd, RawFd)> = inherit.iter().map(|i| (i.fd.as_raw_fd(), i.at)).collect();
    if fds.len() > 16 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many inherited fds",
        ));
    }
    cmd.process_group(0);
    // SAFETY: the closure runs in the forked child before exec and calls only
    // async-signal-safe functions (prctl, getppid, fcntl, dup2, _exit) on
    // plain integers; it allocates nothing (`fds` was built before the fork).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The launcher may have died before prctl: then nobody kills us.
            if u32::try_from(libc::getppid()).ok() != Some(parent) {
                libc::_exit(125);
            }
            // First move every source above the target range so that a
            // source numbered like another target is not overwritten.
            let mut moved = [0 as RawFd; 16];
            for (slot, (src, _)) in moved.iter_mut().zip(&fds) {
                let high = libc::fcntl(*src, libc::F_DUPFD_CLOEXEC, 64);
                if high < 0 {
                    return Err(io::Error::last_os_error());
                }
                *slot = high;
            }
            for (high, (_, at)) in moved.iter().zip(&fds) {
                // dup2 clears close-on-exec on the new descriptor.
                if libc::dup2(*high, *at) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// Sends `signal` to the process group led by `pid` (our children lead
/// their own groups), ignoring groups that are already gone.
pub(crate) fn kill_group(pid: u32, signal: i32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill has no memory effects; a negative pid names the group we
    // created with process_group(0) for this child.
    unsafe {
        libc::kill(-pid, signal);
    }
}

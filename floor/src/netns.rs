//! Running a closure inside another network namespace, known by an open
//! descriptor.
//!
//! `setns` changes only the calling thread, so the closure runs on a thread
//! of its own that enters the namespace first and ends afterwards; the
//! `nft` processes it spawns inherit that thread's namespace. The
//! caller's threads never move.
//!
//! A path names a namespace only for as long as nobody moves it: a
//! `/run/netns/NAME` can be deleted and made again, a `/proc/PID/ns/net`
//! names whatever process got PID next. So a path is opened once, and
//! every later entry is by that descriptor: whatever the path names later,
//! the floor is installed, checked and removed in the namespace it was
//! first given, which the descriptor also keeps alive.

use std::os::fd::{AsFd as _, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};

use crate::nft::FloorError;

pub(crate) fn netns_err(path: &Path, message: impl Into<String>) -> FloorError {
    FloorError::Netns {
        path: path.to_owned(),
        message: message.into(),
    }
}

/// Opens the namespace at `path` (close-on-exec: the tools run later never
/// inherit it).
pub(crate) fn open(path: &Path) -> Result<OwnedFd, FloorError> {
    std::fs::File::open(path)
        .map(OwnedFd::from)
        .map_err(|e| netns_err(path, e.to_string()))
}

/// Runs `f` on a thread that entered the namespace `ns` (`label` names it
/// in messages), or on the calling thread when `ns` is `None` (the
/// caller's namespace).
///
/// # Errors
/// `f`'s, or [`FloorError::Netns`] (transient) when no thread could be
/// had (a full `pids.max`, say): never a panic, which in the floor's
/// keeper would unwind through the floor it holds.
pub(crate) fn run_in<T: Send>(
    ns: Option<BorrowedFd<'_>>,
    label: &Path,
    f: impl FnOnce() -> Result<T, FloorError> + Send,
) -> Result<T, FloorError> {
    run_in_on(std::thread::Builder::new(), ns, label, f)
}

/// [`run_in`] with the thread made by `thread` (tests give one that
/// cannot be made).
fn run_in_on<T: Send>(
    thread: std::thread::Builder,
    ns: Option<BorrowedFd<'_>>,
    label: &Path,
    f: impl FnOnce() -> Result<T, FloorError> + Send,
) -> Result<T, FloorError> {
    let Some(ns) = ns else {
        return f();
    };
    std::thread::scope(|s| {
        let entered = thread
            .spawn_scoped(s, || {
                move_into_link_name_space(ns.as_fd(), Some(LinkNameSpaceType::Network))
                    .map_err(|e| netns_err(label, format!("not a network namespace ({e})")))?;
                f()
            })
            .map_err(|e| netns_err(label, format!("cannot start a thread to enter it ({e})")))?;
        entered
            .join()
            .unwrap_or_else(|_| Err(netns_err(label, "the namespace thread panicked")))
    })
}
/// Runs `f` in the namespace at `path` (opened now), or in the caller's
/// when `None`: for the egress floor, which lives in the gateway's own
/// namespace (tests give one of theirs).
pub(crate) fn run_in_path<T: Send>(
    path: Option<&Path>,
    f: impl FnOnce() -> Result<T, FloorError> + Send,
) -> Result<T, FloorError> {
    let Some(path) = path else {
        return f();
    };
    let ns = open(path)?;
    run_in(Some(ns.as_fd()), path, f)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread that cannot be made (here: a stack no address space
    /// holds; in the keeper: `pids.max` reached) is an error, not a panic.
    #[test]
    fn a_thread_that_cannot_be_made_is_an_error() {
        let here = open(Path::new("/proc/self/ns/net")).expect("this namespace");
        let huge = std::thread::Builder::new().stack_size(1 << 60);
        let e = run_in_on(
            huge,
            Some(here.as_fd()),
            Path::new("/proc/self/ns/net"),
            || Ok(()),
        )
        .unwrap_err();
        assert!(matches!(e, FloorError::Netns { .. }), "{e}");
        assert!(e.is_transient());
        assert!(e.to_string().contains("cannot start a thread"), "{e}");
    }
}

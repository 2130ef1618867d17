//! Running a closure inside another network namespace, known by identity.
//!
//! `setns` changes only the calling thread, so the closure runs on a thread
//! of its own that enters the namespace first and ends afterwards; the
//! `nft` process it spawns inherits that thread's namespace. The caller's
//! threads never move.
//!
//! A path names a namespace only for as long as nobody moves it: a
//! `/run/netns/NAME` can be deleted and made again, a `/proc/PID/ns/net`
//! names whatever process got PID next. So a namespace is also known by
//! its [`NsId`] (the device and inode of its nsfs file), and
//! [`run_in_same`] enters the path only if it still names that namespace.

use std::fs::File;
use std::os::fd::AsFd as _;
use std::path::Path;

use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};

use crate::nft::FloorError;

/// A namespace's identity: the device and inode of its nsfs file (what
/// `ip netns identify` and `/proc/PID/ns/net`'s `net:[INODE]` compare).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NsId {
    /// `st_dev` of the nsfs file.
    dev: u64,
    /// `st_ino` of the nsfs file: the namespace's number.
    ino: u64,
}

impl std::fmt::Display for NsId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "net:[{}] on device {}", self.ino, self.dev)
    }
}

fn netns_err(path: &Path, message: impl Into<String>) -> FloorError {
    FloorError::Netns {
        path: path.to_owned(),
        message: message.into(),
    }
}

/// Opens the namespace at `path` and reads its identity.
fn open(path: &Path) -> Result<(File, NsId), FloorError> {
    let ns = File::open(path).map_err(|e| netns_err(path, e.to_string()))?;
    let st = rustix::fs::fstat(&ns).map_err(|e| netns_err(path, e.to_string()))?;
    Ok((
        ns,
        NsId {
            dev: st.st_dev,
            ino: st.st_ino,
        },
    ))
}

/// Runs `f` on a thread that entered `ns` (opened from `path`).
fn enter<T: Send>(
    ns: &File,
    path: &Path,
    f: impl FnOnce() -> Result<T, FloorError> + Send,
) -> Result<T, FloorError> {
    std::thread::scope(|s| {
        s.spawn(|| {
            move_into_link_name_space(ns.as_fd(), Some(LinkNameSpaceType::Network))
                .map_err(|e| netns_err(path, format!("not a network namespace ({e})")))?;
            f()
        })
        .join()
        .unwrap_or_else(|_| Err(netns_err(path, "the namespace thread panicked")))
    })
}

/// Runs `f` in the network namespace at `netns` (a `/proc/PID/ns/net` or
/// `/run/netns/NAME` path), or in the caller's when `None`, and returns
/// the identity of the namespace it ran in (`None` for the caller's).
pub(crate) fn run_in_id<T: Send>(
    netns: Option<&Path>,
    f: impl FnOnce() -> Result<T, FloorError> + Send,
) -> Result<(T, Option<NsId>), FloorError> {
    let Some(path) = netns else {
        return Ok((f()?, None));
    };
    let (ns, id) = open(path)?;
    Ok((enter(&ns, path, f)?, Some(id)))
}

/// Runs `f` in the namespace at `netns` only if that path still names the
/// namespace `expect` (the one [`run_in_id`] ran in before): the identity is
/// read from the very descriptor that is then entered, so the check and
/// the entry cannot see two different namespaces.
///
/// # Errors
/// [`FloorError::Netns`] when the path now names another namespace (or
/// none that can be opened); `f`'s own errors.
pub(crate) fn run_in_same<T: Send>(
    netns: Option<&Path>,
    expect: Option<NsId>,
    f: impl FnOnce() -> Result<T, FloorError> + Send,
) -> Result<T, FloorError> {
    let Some(path) = netns else {
        return f();
    };
    // A path without the identity it named would run `f` in whatever the
    // path names now, or (worse) in the caller's namespace: refuse.
    let Some(expect) = expect else {
        return Err(netns_err(
            path,
            "the identity of the namespace the floor was installed in is unknown; refusing to touch it",
        ));
    };
    let (ns, id) = open(path)?;
    if id != expect {
        return Err(netns_err(
            path,
            format!(
                "now names another namespace ({id}) than the one the floor was installed in ({expect}); refusing to touch it"
            ),
        ));
    }
    enter(&ns, path, f)
}

/// [`run_in_id`] without the identity.
pub(crate) fn run_in<T: Send>(
    netns: Option<&Path>,
    f: impl FnOnce() -> Result<T, FloorError> + Send,
) -> Result<T, FloorError> {
    run_in_id(netns, f).map(|(t, _)| t)
}

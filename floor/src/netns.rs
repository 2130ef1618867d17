//! Running a closure inside another network namespace.
//!
//! `setns` changes only the calling thread, so the closure runs on a thread
//! of its own that enters the namespace first and ends afterwards; the
//! `nft` process it spawns inherits that thread's namespace. The caller's
//! threads never move.

use std::fs::File;
use std::os::fd::AsFd as _;
use std::path::Path;

use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};

use crate::nft::FloorError;

/// Runs `f` in the network namespace at `netns` (a `/proc/PID/ns/net` or
/// `/run/netns/NAME` path), or in the caller's when `None`.
pub(crate) fn run_in<T: Send>(
    netns: Option<&Path>,
    f: impl FnOnce() -> Result<T, FloorError> + Send,
) -> Result<T, FloorError> {
    let Some(path) = netns else { return f() };
    let ns = File::open(path).map_err(|e| FloorError::Netns {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    std::thread::scope(|s| {
        s.spawn(|| {
            move_into_link_name_space(ns.as_fd(), Some(LinkNameSpaceType::Network)).map_err(
                |e| FloorError::Netns {
                    path: path.to_owned(),
                    message: format!("not a network namespace ({e})"),
                },
            )?;
            f()
        })
        .join()
        .unwrap_or_else(|_| {
            Err(FloorError::Netns {
                path: path.to_owned(),
                message: "the namespace thread panicked".into(),
            })
        })
    })
}

//! Rootless `sluice run --network tap`: the TAP helper (`sluice
//! __tap-netns MTU FLOOR`), a short-lived process that makes the run's
//! namespace, TAP, packet socket and floor where an ordinary user may.
//!
//! The launcher is multi-threaded, and the kernel lets only a
//! single-threaded process `unshare(CLONE_NEWUSER)`. So [`create`] runs the
//! launcher's own binary again with the hidden argument [`HELPER_ARG`]; as
//! its first act, `main` hands it to [`helper_main_if_requested`], which:
//! 1. enters a new user namespace mapping only the caller's uid and gid,
//!    each to itself, `setgroups` denied (the jail's:
//!    `jail::enter_user_namespace`); there it holds every capability, and
//!    none in the initial user namespace;
//! 2. makes a network namespace owned by that user namespace, and in it
//!    turns IPv6 off, creates the TAP, sets its MTU and up, and opens the
//!    packet socket (`tap::make_tap`, the same steps as root);
//! 3. raises CAP_NET_ADMIN into its ambient set, so the `nft` it runs
//!    (uid not 0 there) keeps it across `execve`, and installs and
//!    verifies the ingress floor there (`tap::install_floor`);
//! 4. sends one reply on its stdin, a `SOCK_SEQPACKET` socket: JSON
//!    ([`Reply`]) and, on success, the namespace, the TAP's queue and the
//!    packet socket as `SCM_RIGHTS`; then exits.
//!
//! Nothing names either namespace: once the helper has exited, the
//! launcher's descriptors (then QEMU's queue and the gateway's socket)
//! are all that hold them, as with root. A helper that fails or dies
//! leaves nothing; the launcher reports its one line and gives up.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd as _, BorrowedFd, OwnedFd};
use std::process::{Command, Stdio};

use anyhow::{Context as _, anyhow, bail};
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketFlags, SocketType,
};
use serde::{Deserialize, Serialize};

use super::tap;
use crate::jail;

/// The hidden argument that makes the launcher binary act as the TAP helper.
pub const HELPER_ARG: &str = "__tap-netns";

/// The helper's third argument when the run may go on without the floor.
const ALLOW_MISSING_FLOOR: &str = "allow-missing-floor";
/// The helper's third argument when the floor is required.
const REQUIRE_FLOOR: &str = "require-floor";

/// `CAP_NET_ADMIN` (`<linux/capability.h>`): what `nft` needs.
const CAP_NET_ADMIN: u32 = 12;

/// The descriptors a successful reply carries, in this order: the network
/// namespace, the TAP's queue, the packet socket.
const FDS: usize = 3;

/// The largest reply (a JSON line; an error is one line of text).
const REPLY_MAX: usize = 8192;

/// The helper's one reply.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Reply {
    /// Made; [`FDS`] descriptors come with it.
    Made {
        /// The floor's state (`on: ...` / `off: why`).
        floor: String,
        /// What the launcher says on stderr (running without the floor).
        warning: Option<String>,
    },
    /// Not made; one line saying why. Nothing is left.
    Failed {
        /// The error.
        error: String,
    },
}

/// Call first thing in `main` (before any thread exists): when `argv[1]`
/// is [`HELPER_ARG`], runs the helper and exits the process; otherwise
/// returns.
pub fn helper_main_if_requested() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) != Some(HELPER_ARG) {
        return;
    }
    let stdin = std::io::stdin();
    let reply = match helper(&args[1..]) {
        Ok((netns, queue, packet, floor)) => {
            let fds = [netns.as_fd(), queue.as_fd(), packet.as_fd()];
            send(
                stdin.as_fd(),
                &Reply::Made {
                    floor: floor.state,
                    warning: floor.warning,
                },
                &fds,
            )
        }
        Err(e) => send(
            stdin.as_fd(),
            &Reply::Failed {
                error: format!("{e:#}"),
            },
            &[],
        ),
    };
    // Nobody to tell when the launcher is gone; it then sees no reply.
    std::process::exit(i32::from(reply.is_err()));
}

/// Steps 1-3 of the module docs. `args`: the MTU and [`ALLOW_MISSING_FLOOR`]
/// or [`REQUIRE_FLOOR`].
fn helper(args: &[String]) -> anyhow::Result<(OwnedFd, OwnedFd, OwnedFd, tap::FloorState)> {
    let [mtu, floor] = args else {
        bail!("the TAP helper takes MTU and {REQUIRE_FLOOR}|{ALLOW_MISSING_FLOOR}");
    };
    let mtu: u32 = mtu
        .parse()
        .with_context(|| format!("the TAP helper: MTU `{mtu}`"))?;
    let allow_missing_floor = match floor.as_str() {
        ALLOW_MISSING_FLOOR => true,
        REQUIRE_FLOOR => false,
        other => {
            bail!("the TAP helper: `{other}` is neither {REQUIRE_FLOOR} nor {ALLOW_MISSING_FLOOR}")
        }
    };
    let (uid, gid) = jail::default_ids();
    jail::enter_user_namespace(uid, gid).context("--network tap")?;
    jail::unshare(libc::CLONE_NEWNET).map_err(|e| {
        let hint = if e.raw_os_error() == Some(libc::ENOSPC) {
            " (the limit user.max_net_namespaces is reached)"
        } else {
            ""
        };
        anyhow!("--network tap: a new network namespace in the user namespace: {e}{hint}")
    })?;
    let (netns, queue, packet) = tap::make_tap(mtu)?;
    jail::raise_ambient(&[CAP_NET_ADMIN])
        .context("--network tap: keeping CAP_NET_ADMIN (in the run's user namespace) for nft")?;
    let floor = tap::install_floor(None, allow_missing_floor)?;
    Ok((netns, queue, packet, floor))
}

/// Sends `reply` with `fds` as one message.
fn send(sock: BorrowedFd<'_>, reply: &Reply, fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
    let body = serde_json::to_vec(reply).map_err(std::io::Error::other)?;
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(std::io::Error::other("the descriptors do not fit"));
    }
    rustix::net::sendmsg(
        sock,
        &[IoSlice::new(&body)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    Ok(())
}

/// What the helper made: the namespace, the TAP's queue, the packet socket,
/// the floor's state.
pub(super) type Made = (OwnedFd, OwnedFd, OwnedFd, String);

/// Runs the helper (module docs) and takes what it made. A warning it
/// returns (the floor missing but allowed) goes to stderr.
///
/// # Errors
/// The helper could not be started, failed (its one line), or died
/// without a reply; nothing is left behind.
pub(super) fn create(mtu: u32, allow_missing_floor: bool) -> anyhow::Result<Made> {
    let (ours, theirs) = rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .context("--network tap: a socketpair for the TAP helper")?;
    let exe = std::env::current_exe().context("--network tap: finding the sluice binary")?;
    let floor = if allow_missing_floor {
        ALLOW_MISSING_FLOOR
    } else {
        REQUIRE_FLOOR
    };
    let mut cmd = Command::new(&exe);
    cmd.arg(HELPER_ARG)
        .arg(mtu.to_string())
        .arg(floor)
        // Nothing of the launcher's environment (a secret's value may be
        // in it); `nft` is found in the sbin directories. The run's id, as
        // its jailed processes carry it, names the helper and its `nft`s
        // as the run's.
        .env_clear()
        .env(
            "SLUICE_SANDBOX_ID",
            format!("sluice-{}", std::process::id()),
        )
        .stdin(Stdio::from(theirs))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    jail::close_fds_across_exec(&mut cmd);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("--network tap: starting the TAP helper {}", exe.display()))?;
    // The helper's end lives only in the helper now: when it exits, the
    // read below ends.
    drop(cmd);
    let received = receive(ours.as_fd());
    let status = child
        .wait()
        .context("--network tap: waiting for the TAP helper")?;
    match received? {
        Some((Reply::Made { floor, warning }, fds)) => {
            let [netns, queue, packet]: [OwnedFd; FDS] = fds.try_into().map_err(|v: Vec<_>| {
                anyhow!(
                    "--network tap: the TAP helper sent {} descriptors, not {FDS}",
                    v.len()
                )
            })?;
            if let Some(warning) = warning {
                eprintln!("sluice: {warning}");
            }
            Ok((netns, queue, packet, floor))
        }
        Some((Reply::Failed { error }, _)) => Err(anyhow!(error)),
        None => bail!("--network tap: the TAP helper ended ({status}) without a reply"),
    }
}

/// Reads the helper's reply and its descriptors; `None` when it closed
/// its end without one.
fn receive(sock: BorrowedFd<'_>) -> anyhow::Result<Option<(Reply, Vec<OwnedFd>)>> {
    let mut body = vec![0u8; REPLY_MAX];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        sock,
        &mut [IoSliceMut::new(&mut body)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )
    .context("--network tap: reading the TAP helper's reply")?;
    // Owned at once, so that they close on any error below.
    let fds: Vec<OwnedFd> = control
        .drain()
        .filter_map(|m| match m {
            RecvAncillaryMessage::ScmRights(fds) => Some(fds),
            _ => None,
        })
        .flatten()
        .collect();
    if got.bytes == 0 {
        return Ok(None);
    }
    if got
        .flags
        .intersects(rustix::net::ReturnFlags::TRUNC | rustix::net::ReturnFlags::CTRUNC)
    {
        bail!("--network tap: the TAP helper's reply was cut short");
    }
    let reply = body
        .get(..got.bytes)
        .and_then(|b| serde_json::from_slice(b).ok())
        .ok_or_else(|| anyhow!("--network tap: the TAP helper's reply does not parse"))?;
    Ok(Some((reply, fds)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_and_its_descriptors_cross_the_socketpair_and_a_silent_helper_is_none() {
        let (a, b) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        let (p, q) = std::os::unix::net::UnixStream::pair().unwrap();
        let r = std::fs::File::open("/dev/null").unwrap();
        let fds = [p.as_fd(), q.as_fd(), r.as_fd()];
        let made = Reply::Made {
            floor: "on: test".to_owned(),
            warning: None,
        };
        send(a.as_fd(), &made, &fds).unwrap();
        let (reply, got) = receive(b.as_fd()).unwrap().unwrap();
        assert!(matches!(reply, Reply::Made { floor, .. } if floor == "on: test"));
        assert_eq!(got.len(), FDS);
        let failed = Reply::Failed {
            error: "one line".to_owned(),
        };
        send(a.as_fd(), &failed, &[]).unwrap();
        let (reply, got) = receive(b.as_fd()).unwrap().unwrap();
        assert!(matches!(reply, Reply::Failed { error } if error == "one line"));
        assert!(got.is_empty());
        drop(a);
        assert!(receive(b.as_fd()).unwrap().is_none());
    }
}

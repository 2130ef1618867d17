//! Setting an interface down by its index, over rtnetlink: an
//! `RTM_NEWLINK` request that clears `IFF_UP` on `ifi_index`, in the
//! calling thread's namespace.
//!
//! By index, not by name: a name looked up from the index and handed to
//! a tool (`ip link set NAME down`) is resolved again by that tool, in a
//! process started later, and a rename in between sends the act
//! elsewhere or makes it fail. No tool is run either, so the end of a
//! floor does not depend on iproute2 being installed where the keeper
//! runs.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use rustix::net::{
    AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType, connect,
    netlink::SocketAddrNetlink,
    recv, send, socket_with,
    sockopt::{Timeout, set_socket_timeout},
};

/// `<linux/rtnetlink.h>`, `<linux/netlink.h>`, `<linux/if.h>`.
const RTM_NEWLINK: u16 = 16;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLMSG_ERROR: u16 = 2;
const IFF_UP: u32 = 0x1;
/// `nlmsghdr` (16 bytes) then `ifinfomsg` (16 bytes).
const REQUEST_LEN: u32 = 32;

/// How long the kernel's answer is waited for (it answers at once; this
/// only bounds a wait that should never happen).
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// Clears `IFF_UP` on the interface of index `index` (in the calling
/// thread's namespace), and waits for the kernel's acknowledgement.
///
/// # Errors
/// As [`LinkDown::open`] and [`LinkDown::set_down`].
pub(crate) fn set_down(index: u32) -> Result<(), String> {
    LinkDown::open(index)?.set_down()
}

/// An rtnetlink socket opened in one network namespace and connected to
/// its kernel, kept to set one interface there down by its index later:
/// from another thread, in another namespace, or after a jail forbids
/// opening sockets of this family (a socket acts in the namespace it was
/// opened in).
///
/// Requests are serialised on the socket, each with its own sequence
/// number, so an answer is never taken for another request's.
#[derive(Debug)]
pub struct LinkDown {
    sock: Mutex<OwnedFd>,
    ifindex: i32,
    seq: AtomicU32,
}

impl LinkDown {
    /// Opens the socket in the calling thread's namespace, for the
    /// interface of index `index` there. Nothing is sent yet.
    ///
    /// # Errors
    /// Why the socket could not be opened or connected, as one line.
    pub fn open(index: u32) -> Result<Self, String> {
        let ifindex =
            i32::try_from(index).map_err(|_| format!("interface index {index} out of range"))?;
        let sock = socket_with(
            AddressFamily::NETLINK,
            SocketType::RAW,
            SocketFlags::CLOEXEC,
            None,
        )
        .map_err(|e| format!("opening an rtnetlink socket: {e}"))?;
        set_socket_timeout(&sock, Timeout::Recv, Some(ANSWER_WITHIN))
            .map_err(|e| format!("setting the rtnetlink socket's timeout: {e}"))?;
        // Connected to the kernel (port 0): the kernel then refuses anyone
        // else's unicast to this socket, so no other process of the
        // namespace can answer in its place.
        connect(&sock, &SocketAddrNetlink::new(0, 0))
            .map_err(|e| format!("connecting the rtnetlink socket to the kernel: {e}"))?;
        Ok(Self {
            sock: Mutex::new(sock),
            ifindex,
            seq: AtomicU32::new(1),
        })
    }

    /// Clears `IFF_UP` on the interface and waits for the kernel's
    /// acknowledgement.
    ///
    /// # Errors
    /// The kernel's refusal (`ENODEV`: no interface has that index;
    /// `EPERM`: no `CAP_NET_ADMIN` there), or why the request could not be
    /// made, as one line.
    pub fn set_down(&self) -> Result<(), String> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        // A request that panicked holding the lock left nothing the next
        // one depends on: answers are matched by sequence number.
        let sock = self.sock.lock().unwrap_or_else(PoisonError::into_inner);
        send(&*sock, &request(self.ifindex, seq), SendFlags::empty())
            .map_err(|e| format!("sending RTM_NEWLINK: {e}"))?;
        let mut buf = [0u8; 4096];
        loop {
            let n = match recv(&*sock, &mut buf, RecvFlags::empty()) {
                Ok((n, _)) => n,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(format!("reading the kernel's answer to RTM_NEWLINK: {e}")),
            };
            if let Some(answer) = answer(&buf[..n.min(buf.len())], seq) {
                return answer;
            }
        }
    }
}

/// The request: `RTM_NEWLINK` on `ifindex` with sequence number `seq`,
/// `ifi_change` `IFF_UP` and
/// `ifi_flags` 0 (so `IFF_UP` cleared, every other flag as it is), with
/// an acknowledgement asked for.
fn request(ifindex: i32, seq: u32) -> Vec<u8> {
    let mut msg = Vec::with_capacity(32);
    msg.extend_from_slice(&REQUEST_LEN.to_ne_bytes());
    msg.extend_from_slice(&RTM_NEWLINK.to_ne_bytes());
    msg.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
    msg.extend_from_slice(&seq.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills it
    msg.extend_from_slice(&[0, 0]); // ifi_family AF_UNSPEC, padding
    msg.extend_from_slice(&0u16.to_ne_bytes()); // ifi_type
    msg.extend_from_slice(&ifindex.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes()); // ifi_flags
    msg.extend_from_slice(&IFF_UP.to_ne_bytes()); // ifi_change
    msg
}

/// The kernel's answer in one datagram, if it holds the acknowledgement
/// of our request `seq` (`NLMSG_ERROR` with that sequence number, echoing our
/// request's header: type `RTM_NEWLINK` and the same sequence number;
/// error 0, or the refusal's errno); `None` for anything else.
fn answer(datagram: &[u8], seq: u32) -> Option<Result<(), String>> {
    let u16_at = |at: usize| {
        datagram
            .get(at..at + 2)
            .and_then(|b| b.try_into().ok())
            .map(u16::from_ne_bytes)
    };
    let u32_at = |at: usize| {
        datagram
            .get(at..at + 4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_ne_bytes)
    };
    let mut at = 0;
    while let Some(len) = u32_at(at).and_then(|l| usize::try_from(l).ok()) {
        if len < 16 {
            return None;
        }
        // `nlmsgerr`: the error (at 16), then the request's header (at
        // 20: its type at 24, its sequence number at 28).
        if u16_at(at + 4) == Some(NLMSG_ERROR)
            && u32_at(at + 8) == Some(seq)
            && u16_at(at + 24) == Some(RTM_NEWLINK)
            && u32_at(at + 28) == Some(seq)
        {
            let code = datagram
                .get(at + 16..at + 20)
                .and_then(|b| b.try_into().ok())
                .map(i32::from_ne_bytes)?;
            return Some(match code {
                0 => Ok(()),
                neg => Err(format!(
                    "the kernel refused to set it down: {}",
                    rustix::io::Errno::from_raw_os_error(neg.saturating_neg())
                )),
            });
        }
        // Messages are 4-byte aligned.
        at = at.checked_add(len.checked_add(3)? & !3)?;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEQ: u32 = 1;

    fn ack(code: i32, seq: u32) -> Vec<u8> {
        ack_of(code, seq, &request(7, SEQ)[..16])
    }

    fn ack_of(code: i32, seq: u32, echoed: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&36u32.to_ne_bytes());
        m.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
        m.extend_from_slice(&0u16.to_ne_bytes());
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(&code.to_ne_bytes());
        m.extend_from_slice(echoed);
        m
    }

    #[test]
    fn the_acknowledgement_and_a_refusal_are_read_and_anything_else_is_not() {
        assert_eq!(answer(&ack(0, SEQ), SEQ), Some(Ok(())));
        let refused = answer(&ack(-19, SEQ), SEQ).unwrap().unwrap_err();
        assert!(refused.contains("No such device"), "{refused}");
        assert_eq!(answer(&ack(0, SEQ + 1), SEQ), None);
        assert_eq!(answer(&[], SEQ), None);
        assert_eq!(answer(&ack(0, SEQ)[..10], SEQ), None);
        assert_eq!(request(7, SEQ).len(), 32);
    }

    /// An acknowledgement is ours only if it echoes our request's header:
    /// its type and sequence number.
    #[test]
    fn an_acknowledgement_of_another_request_is_not_ours() {
        let mut other_type = request(7, SEQ)[..16].to_vec();
        other_type[4..6].copy_from_slice(&19u16.to_ne_bytes()); // RTM_GETLINK
        assert_eq!(answer(&ack_of(0, SEQ, &other_type), SEQ), None);
        let mut other_seq = request(7, SEQ)[..16].to_vec();
        other_seq[8..12].copy_from_slice(&(SEQ + 1).to_ne_bytes());
        assert_eq!(answer(&ack_of(0, SEQ, &other_seq), SEQ), None);
        assert_eq!(answer(&ack_of(0, SEQ, &[]), SEQ), None);
    }
}

//! The byte pump of an open TCP flow: one copy each way between the
//! smoltcp socket's buffers and the host stream (`recv` into `try_write`,
//! `send` from `try_read`), half-closes passed on both ways, a reset on
//! either side passed to the other; the send rings of idle flows given
//! back to the kernel.

use smoltcp::socket::tcp;

use super::{Flow, FlowState, guest_finished};
use crate::flow::FlowEnd;
use crate::session::{Datapath, would_block};

impl Datapath {
    /// Registers this task's waker with every host socket that has something
    /// to do; true when one is ready now.
    pub(crate) fn poll_hosts(&mut self, cx: &mut std::task::Context<'_>) -> bool {
        let mut ready = false;
        for id in &self.parking.active {
            let Some(flow) = self.flows.get(id) else {
                continue;
            };
            if let FlowState::Open {
                handle,
                host,
                host_eof,
                host_write_shut,
            } = &flow.state
            {
                let sock = self.sockets.get::<tcp::Socket<'_>>(*handle);
                if !*host_eof && sock.can_send() && host.poll_read_ready(cx).is_ready() {
                    ready = true;
                }
                if !*host_write_shut && sock.can_recv() && host.poll_write_ready(cx).is_ready() {
                    ready = true;
                }
            }
        }
        ready
    }

    /// Gives back the send ring of every open flow that is idle: nothing
    /// unacknowledged in it and nothing read from its host since the last
    /// sweep (called about once a second, so after one to two idle
    /// seconds). An idle ring holds no data: its pages are handed to
    /// [`Config::release_pages`](crate::config::Config) and cost no
    /// resident memory until the host sends again. The receive ring is kept:
    /// out-of-order guest data may wait in its free space, which smoltcp
    /// does not expose.
    ///
    /// An idle flow that is quiet is then parked ([`super::park`]); only
    /// active flows are swept (a parked one's ring was given back when it
    /// was parked, if it held anything).
    pub(crate) fn release_idle_buffers(&mut self) {
        let release = self.cfg.release_pages;
        let ids: Vec<u64> = self.parking.active.iter().copied().collect();
        for id in ids {
            let Some(flow) = self.flows.get_mut(&id) else {
                continue;
            };
            let FlowState::Open { handle, .. } = &flow.state else {
                continue;
            };
            let idle = flow.down == flow.down_at_sweep;
            flow.down_at_sweep = flow.down;
            if !idle {
                continue;
            }
            let sock = self.sockets.get_mut::<tcp::Socket<'_>>(*handle);
            // `send` on an empty ring offers all of it (smoltcp rewinds an
            // empty ring to its start); nothing is enqueued.
            if flow.down != flow.down_at_release
                && sock.send_queue() == 0
                && sock
                    .send(|free| {
                        release(free);
                        (0, ())
                    })
                    .is_ok()
            {
                flow.down_at_release = flow.down;
            }
            self.park_if_quiet(id);
        }
        self.compact_sockets();
    }
}

/// Moves what both sides can take now for the open flow `flow` whose guest
/// socket is `sock`. Returns how it ended (`closed`, or `reset` when either
/// side reset) once the guest socket is closed; `None` while it lives.
pub(super) fn pump(sock: &mut tcp::Socket<'_>, flow: &mut Flow) -> Option<FlowEnd> {
    let FlowState::Open {
        host,
        host_eof,
        host_write_shut,
        ..
    } = &mut flow.state
    else {
        return None;
    };
    // Guest -> host.
    while !*host_write_shut && sock.can_recv() {
        match sock.recv(|b| match host.try_write(b) {
            Ok(n) => (n, Ok(n)),
            Err(e) => (0, Err(e)),
        }) {
            Ok(Ok(0)) | Err(_) => break,
            Ok(Ok(n)) => flow.up += n as u64,
            Ok(Err(e)) if would_block(&e) => break,
            Ok(Err(_)) => {
                sock.abort();
                *host_eof = true;
                *host_write_shut = true;
            }
        }
    }
    if !*host_write_shut && guest_finished(sock) {
        *host_write_shut = true;
        host.shutdown_write();
    }
    // Host -> guest.
    while !*host_eof && sock.can_send() {
        match sock.send(|b| match host.try_read(b) {
            Ok(n) => (n, Ok(n)),
            Err(e) => (0, Err(e)),
        }) {
            Ok(Ok(0)) => {
                *host_eof = true;
                sock.close();
            }
            Ok(Ok(n)) => flow.down += n as u64,
            Ok(Err(e)) if would_block(&e) => break,
            Ok(Err(_)) => {
                *host_eof = true;
                *host_write_shut = true;
                sock.abort();
            }
            Err(_) => break,
        }
    }
    if matches!(sock.state(), tcp::State::Closed | tcp::State::TimeWait) {
        let clean = *host_eof && *host_write_shut;
        if !clean {
            // Propagate the guest's RST (or our abort) to the host side.
            host.reset_on_close();
        }
        return Some(if clean {
            FlowEnd::Closed
        } else {
            FlowEnd::Reset
        });
    }
    None
}

//! The floor keeper (module docs of [`super`], step 4): the forked child
//! that holds the floor, checks it while the gateway serves and removes or
//! keeps it when asked; and the gateway's watch on it.

use std::io::{Read as _, Write as _};
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use anyhow::{Context as _, bail};
use sluice_floor::FloorError;
use sluice_floor::ingress::{Ended, IngressFloor};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use super::{LinkCutter, bypasses};

/// The child process that holds the floor and removes it when asked
/// (module docs, step 3).
#[derive(Debug)]
pub(crate) struct FloorKeeper {
    channel: UnixStream,
    iface: String,
    /// Set by the keeper's watch when it saw the keeper gone while the
    /// gateway served ([`KeeperWatch`]).
    died: Arc<AtomicBool>,
    /// Why the watch's cut of the interface failed, if it did.
    cut_failed: Arc<OnceLock<String>>,
}

/// Watches the floor keeper while the gateway serves: the keeper writes
/// on its channel only to answer the gateway's request, and none is
/// outstanding while the gateway serves, so the channel becoming readable
/// (end of file, a hang-up) means the keeper is gone (SIGKILL, the OOM
/// killer): nothing checks the floor any more. The watch then ends the
/// session fail closed: it sets the interface down itself ([`LinkCutter`])
/// and ends the gateway as the keeper's SIGTERM does (flows closed, the
/// audit's stop record written), and the gateway exits with status 1 and
/// one line that says so ([`FloorKeeper::remove`]).
#[derive(Debug)]
pub(crate) struct KeeperWatch {
    channel: OwnedFd,
    link: LinkCutter,
    died: Arc<AtomicBool>,
    cut_failed: Arc<OnceLock<String>>,
}

impl KeeperWatch {
    /// Registers the watch with the runtime and spawns it. Must be called
    /// inside the tokio runtime.
    pub(crate) fn start(self) -> anyhow::Result<()> {
        // `with_interest` is deprecated for owners that may close or swap
        // the descriptor under the registration; an `OwnedFd` can do
        // neither while the AsyncFd owns it.
        #[allow(deprecated)]
        let channel = AsyncFd::with_interest(self.channel, Interest::READABLE)
            .context("registering the floor keeper's channel")?;
        let (link, died, cut_failed) = (self.link, self.died, self.cut_failed);
        tokio::spawn(async move {
            // Readable or hung up: gone (an error of the registration
            // itself counts the same: fail closed).
            let _ = channel.readable().await;
            // The cut's outcome first: the gateway's end reports it.
            if let Err(e) = link.cut() {
                tracing::warn!(error = %e, "could not set the guest's interface down");
                let _ = cut_failed.set(format!("{e:#}"));
            }
            died.store(true, Ordering::SeqCst);
            // The end a SIGTERM starts (the jail allows signalling this
            // process).
            if let Err(e) = rustix::process::kill_process(
                rustix::process::getpid(),
                rustix::process::Signal::TERM,
            ) {
                tracing::warn!(error = %e, "could not end the gateway after its floor keeper died");
            }
        });
        Ok(())
    }
}

/// What the gateway writes to ask for the floor's removal.
const REMOVE: &[u8] = b"remove\n";
/// The keeper's answers: the floor stays on the interface (it exists), or
/// is gone with it.
const KEPT: &str = "kept";
const REMOVED: &str = "removed";
/// Starts the keeper's answer when the floor stopped holding while the
/// gateway served; the rest is the one line the gateway exits with.
const FAILED: &str = "failed: ";

impl FloorKeeper {
    /// Forks the keeper. Must be called while the process has one thread
    /// (before the runtime starts): the child runs Rust code after fork.
    /// `token` is the descriptor the floor's gone check holds (kept open in
    /// the keeper).
    pub(super) fn spawn(floor: IngressFloor, token: libc::c_int) -> anyhow::Result<Self> {
        let (ours, theirs) = UnixStream::pair().context("creating the floor keeper's channel")?;
        let gateway = libc::pid_t::try_from(std::process::id()).context("the gateway's pid")?;
        // SAFETY: the gateway is single-threaded here (main calls this
        // before it builds the runtime; the namespace thread has been
        // joined), so the child's copy of the heap and locks is consistent
        // and it may allocate and spawn `nft`. The child never returns: it
        // ends in `_exit`.
        match unsafe { libc::fork() } {
            -1 => Err(std::io::Error::last_os_error()).context("forking the floor keeper"),
            0 => {
                drop(ours);
                // A panic must neither unwind into the copies of main's
                // frames this child holds nor run the floor's `Drop` on
                // its way (which deletes the floor: fail open): the hook
                // runs before any unwinding and aborts, so the floor stays
                // and the gateway's watch sees the keeper gone (fail
                // closed).
                let report = std::panic::take_hook();
                std::panic::set_hook(Box::new(move |info| {
                    report(info);
                    std::process::abort()
                }));
                keeper_main(std::mem::ManuallyDrop::new(floor), theirs, gateway, token)
            }
            _child => {
                drop(theirs);
                let iface = floor.iface().to_owned();
                // The keeper owns the floor now; this process must not run
                // `nft` (its jail forbids exec) when its copy drops, nor
                // hold the namespace through it.
                floor.hand_over();
                Ok(Self {
                    channel: ours,
                    iface,
                    died: Arc::new(AtomicBool::new(false)),
                    cut_failed: Arc::new(OnceLock::new()),
                })
            }
        }
    }

    /// The watch on this keeper for the runtime ([`KeeperWatch`]), which
    /// sets `link`'s interface down (through a duplicate) if it sees the
    /// keeper gone.
    pub(crate) fn watch(&self, link: &LinkCutter) -> anyhow::Result<KeeperWatch> {
        Ok(KeeperWatch {
            channel: OwnedFd::from(
                self.channel
                    .try_clone()
                    .context("duplicating the floor keeper's channel")?,
            ),
            link: link.try_clone()?,
            died: Arc::clone(&self.died),
            cut_failed: Arc::clone(&self.cut_failed),
        })
    }

    /// Asks the keeper to end the floor (set IFACE down, keep the floor
    /// while IFACE exists) and waits for its answer; one that died while
    /// the gateway served ([`KeeperWatch`]) is not asked.
    pub(crate) fn remove(mut self) -> anyhow::Result<Ended> {
        if self.died.load(Ordering::SeqCst) {
            let cut = match self.cut_failed.get() {
                None => "the interface was set down and the gateway ended (fail closed)".to_owned(),
                Some(e) => {
                    format!("setting the interface down failed ({e}), and the gateway ended")
                }
            };
            bail!(
                "`{}`: the floor keeper died while the gateway served, so nothing checked the floor any more; {cut}, and the floor stays as it was",
                self.iface
            );
        }
        self.channel
            .write_all(REMOVE)
            .context("asking the floor keeper to remove the floor")?;
        let mut answer = String::new();
        self.channel
            .read_to_string(&mut answer)
            .context("reading the floor keeper's answer")?;
        match answer.trim_end() {
            KEPT => Ok(Ended::Kept),
            REMOVED => Ok(Ended::Removed),
            "" => bail!(
                "the floor keeper ended without removing the floor on {}",
                self.iface
            ),
            other if other.starts_with(FAILED) => {
                bail!("`{}`: {}", self.iface, &other[FAILED.len()..])
            }
            other => bail!("removing the floor on {}: {other}", self.iface),
        }
    }
}

/// How often the keeper checks, while the gateway serves, that the floor
/// still holds ([`IngressFloor::check`]).
const CHECK_EVERY_MS: u16 = 3000;

/// How often once it found the floor no longer holding: each check sets
/// the interface down again, and against what no nftables rule outranks
/// (tc, XDP) the link being down is all that holds, so whatever sets it
/// up again gets a quarter of a second, not a period.
const TAMPERED_CHECK_EVERY_MS: u16 = 250;

/// The keeper's whole life: ignore the signals a terminal or a process
/// group sends (the gateway decides), check the floor every
/// [`CHECK_EVERY_MS`] until the request or the end of the channel, act,
/// exit. A floor found gone or altered (its tables deleted or made
/// dormant, a rule slipped into its chain, the interface renamed away from
/// it, a foreign chain or flowtable ahead of it, or what [`bypasses`]
/// refuses at attach added since: a `clsact` qdisc, XDP, tcx, a master)
/// is the end of the service, fail closed: the keeper
/// sets the interface down and puts the floor back on it at once
/// ([`IngressFloor::restore`]), asks the gateway to end (SIGTERM), and
/// goes on checking (and putting the floor back) until the gateway's
/// request, which puts the floor back once more and whose answer gives
/// the gateway the reason, which it exits with. A check that fails for a
/// reason that may pass (a failed `nft`, `ip` or `tc` run) is asked again
/// a few times before it counts ([`IngressFloor::check_with`]).
///
/// The floor is held in a `ManuallyDrop`: its `Drop` (which deletes a
/// floor that never served) must never run here, not even on a panic
/// (the hook [`FloorKeeper::spawn`] sets aborts first anyway).
fn keeper_main(
    floor: std::mem::ManuallyDrop<IngressFloor>,
    mut channel: UnixStream,
    gateway: libc::pid_t,
    token: libc::c_int,
) -> ! {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGPIPE] {
        // SAFETY: setting a signal's disposition to SIG_IGN has no
        // memory-safety preconditions.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
    // Keep nothing of the gateway's open but stdio, the channel, the
    // floor's descriptor of its namespace and the socket its gone check
    // asks (bound for no protocol: it receives nothing): a readiness pipe
    // or the gateway's packet socket held here would outlive the gateway.
    let mut keep = vec![channel.as_raw_fd(), token];
    keep.extend(floor.netns_fd().map(|fd| fd.as_raw_fd()));
    // SAFETY: the objects of the gateway that owned the other descriptors
    // are never used again in this process (it ends in `_exit` without
    // returning or unwinding into them).
    unsafe { crate::fds::close_all_but(&keep) };
    scrub_environment();
    // What attach refuses outside nftables (tc, XDP, tcx, a master) is
    // looked for again on the interface's current name, at every check
    // and at the end.
    let outside = |name: &str, index: u32| bypasses(name, index).map_err(|e| format!("{e:#}"));
    let mut tampered: Option<String> = None;
    loop {
        let mut pfd = libc::pollfd {
            fd: channel.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let every = if tampered.is_some() {
            TAMPERED_CHECK_EVERY_MS
        } else {
            CHECK_EVERY_MS
        };
        // SAFETY: one valid pollfd that outlives the call.
        let ready = unsafe { libc::poll(&raw mut pfd, 1, libc::c_int::from(every)) };
        if ready > 0 {
            break;
        }
        if ready < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            // The keeper cannot wait on its channel any more, so it could
            // neither check nor hear the request: it ends, leaving the
            // floor as it is, and the gateway's watch sees it gone and
            // ends the gateway (fail closed).
            std::process::abort();
        }
        match floor.check_with(outside) {
            // Gone: the gateway's socket reports it and the gateway ends.
            Ok(()) | Err(FloorError::NoInterface { .. }) => {}
            Err(e) => {
                // At once, not when the gateway's end asks (its shutdown
                // may take a while, and anything may set the interface up
                // meanwhile): the interface down and the floor back on
                // its current name. Checked again at every period until
                // the end, and put back again whenever it stops holding.
                let _ = floor.restore();
                if tampered.is_none() {
                    tampered = Some(e.to_string());
                    // SAFETY: kill has no memory effects; the parent is
                    // still the gateway (a dead gateway's keeper is
                    // reparented).
                    unsafe {
                        if libc::getppid() == gateway {
                            libc::kill(gateway, libc::SIGTERM);
                        }
                    }
                }
            }
        }
    }
    let mut request = [0u8; REMOVE.len()];
    let asked = channel.read_exact(&mut request).is_ok() && request == REMOVE;
    let floor = std::mem::ManuallyDrop::into_inner(floor);
    if asked {
        // A bypass still there (added since the last check, or one only
        // the link being down holds) is reported: never a fail closed
        // end while something still sees the guest's frames.
        let ended = floor.remove_with(outside);
        let answer = match (&tampered, ended) {
            (None, Ok(Ended::Kept)) => KEPT.to_owned(),
            (None, Ok(Ended::Removed)) => REMOVED.to_owned(),
            (None, Err(e @ FloorError::Outranked { .. })) => format!("{FAILED}{e}"),
            (None, Err(e)) => e.to_string(),
            (Some(why), Err(e @ FloorError::Outranked { .. })) => format!(
                "{FAILED}the floor stopped holding while the gateway served ({why}); the gateway ended, and {e}"
            ),
            (Some(why), ended) => {
                let after = match ended {
                    Ok(Ended::Kept) => "its floor is back on it".to_owned(),
                    Ok(Ended::Removed) => "it is gone now, and so is its floor".to_owned(),
                    Err(e) => format!("putting its floor back failed: {e}"),
                };
                format!(
                    "{FAILED}the floor stopped holding while the gateway served ({why}); the interface was set down and the gateway ended (fail closed), and {after}"
                )
            }
        };
        let _ = channel.write_all(format!("{answer}\n").as_bytes());
    } else if tampered.is_some() {
        // The gateway died (of the SIGTERM, before it could handle it)
        // without asking: the interface is down, put the floor back.
        let _ = floor.remove();
    } else {
        // The gateway died without asking: the floor stays (fail closed).
        floor.hand_over();
    }
    // SAFETY: `_exit` ends the process without running the gateway's
    // destructors or atexit handlers, which belong to the parent.
    unsafe { libc::_exit(0) }
}

unsafe extern "C" {
    /// The C library's environment (`environ(7)`).
    static mut environ: *mut *mut libc::c_char;
}

/// Overwrites every environment string of this process with zeros and
/// empties the environment: a secret the policy reads from an environment
/// variable (`env:` source) was in the gateway's environment at exec, and
/// the keeper, which is never jailed, must hold no secret (the keeper is
/// forked before the gateway reads any secret file, so the environment is
/// the only copy it could hold). The `nft` and `ip` it runs then get an
/// empty environment too (the floor crate finds them by absolute path).
fn scrub_environment() {
    // SAFETY: the keeper is single-threaded (forked from a single-threaded
    // gateway), so nothing reads the environment concurrently. `environ`
    // is the C library's NULL-terminated array of pointers to
    // NUL-terminated strings; each string is writable (on the initial
    // stack, or a heap copy made by setenv) and `strlen` bytes long before
    // its NUL. Emptying the array (its first entry NULL) leaves a valid,
    // empty environment.
    unsafe {
        let env = environ;
        if env.is_null() {
            return;
        }
        let mut p = env;
        while !(*p).is_null() {
            let s = *p;
            let len = libc::strlen(s);
            for i in 0..len {
                std::ptr::write_volatile(s.add(i), 0);
            }
            p = p.add(1);
        }
        *env = std::ptr::null_mut();
    }
}

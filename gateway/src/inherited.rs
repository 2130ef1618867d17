//! The descriptors the gateway inherits (`--fd N`, `--ready-fd N`,
//! `--metrics fd:N`), validated and owned first thing in `main`.
//!
//! Why first: a number is only a name for whatever the descriptor table
//! holds under it. Anything the gateway opens before adopting N (the
//! policy, the audit log, a probe socket, `/proc`) takes the lowest free
//! number; had the parent closed N, or passed it with `FD_CLOEXEC` so
//! that it never arrived, the gateway would then adopt its own file as
//! the guest's link, and two owners would close it. So each is checked
//! (open, of the kind its flag needs), marked close-on-exec (the `ip`,
//! `tc` and `nft` the gateway runs at start inherit none), and owned
//! before anything else runs.

use std::os::fd::{FromRawFd as _, OwnedFd};

use anyhow::{Context as _, bail};
use rustix::net::{AddressFamily, SocketType, sockopt};
use sluice_gateway::args::GatewayArgs;
use sluice_gateway::metrics::MetricsAddr;

/// The guest's link as handed over: which transport its descriptor is.
#[derive(Debug)]
pub(crate) enum GuestFd {
    /// An `AF_PACKET` socket bound to the guest's interface (`--fd N
    /// --packet`, or the one `--attach` opens).
    Packet(OwnedFd),
    /// A connected unix datagram socket (`--fd N --dgram`).
    Dgram(OwnedFd),
    /// A connected unix stream socket (`--fd N`).
    Stream(OwnedFd),
}

/// Every inherited descriptor, owned.
#[derive(Debug, Default)]
pub(crate) struct Inherited {
    /// `--ready-fd`.
    pub(crate) ready: Option<OwnedFd>,
    /// `--metrics fd:N`.
    pub(crate) metrics: Option<OwnedFd>,
    /// `--fd`.
    pub(crate) guest: Option<GuestFd>,
    /// Descriptors a path argument names (`--policy /dev/fd/N`, as a
    /// shell's `<(…)` gives, `--audit /proc/self/fd/N`): left open, and
    /// close-on-exec, for the gateway to open by that path.
    pub(crate) named: Vec<i32>,
}

/// The descriptor a path such as `/dev/fd/N`, `/proc/self/fd/N` or
/// `/proc/thread-self/fd/N` names, if it is one.
fn named_fd(path: &std::path::Path) -> Option<i32> {
    let s = path.to_str()?;
    ["/dev/fd/", "/proc/self/fd/", "/proc/thread-self/fd/"]
        .iter()
        .find_map(|prefix| s.strip_prefix(prefix))
        .and_then(|n| n.parse::<i32>().ok())
        .filter(|n| *n >= 3)
}

impl Inherited {
    /// Checks and takes every descriptor `args` names.
    ///
    /// # Errors
    /// Two flags naming one descriptor, a standard stream, a closed
    /// descriptor, or one that is not the kind of socket its flag needs.
    pub(crate) fn take(args: &GatewayArgs) -> anyhow::Result<Self> {
        if args.ready_fd.is_some() && args.ready_fd == args.fd {
            bail!("--ready-fd and --fd must be different descriptors");
        }
        let metrics_fd = match args.metrics {
            Some(MetricsAddr::Fd(m)) => Some(m),
            _ => None,
        };
        if let Some(m) = metrics_fd
            && (Some(m) == args.fd || Some(m) == args.ready_fd)
        {
            bail!("--metrics fd:{m} must differ from --fd and --ready-fd");
        }
        let mut taken = Self::default();
        let paths = [
            args.policy.as_deref(),
            args.netns.as_deref(),
            args.ca_out.as_deref(),
        ]
        .into_iter()
        .flatten()
        .chain(args.upstream_ca.iter().map(std::path::PathBuf::as_path))
        .chain(std::iter::once(std::path::Path::new(&args.audit)));
        for fd in paths.filter_map(named_fd) {
            // Only an open descriptor: a number nobody passed stays closed
            // (opening the path then fails with ENOENT, as it would have).
            // SAFETY: the descriptor is only borrowed for these calls,
            // while nothing else in the process owns or closes it.
            #[allow(unsafe_code)]
            let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
            if let Ok(flags) = rustix::io::fcntl_getfd(borrowed) {
                let _ = rustix::io::fcntl_setfd(borrowed, flags | rustix::io::FdFlags::CLOEXEC);
                taken.named.push(fd);
            }
        }
        // Taken first: whatever fails from here on closes it unwritten,
        // which the launcher reads as "stopped before ready".
        if let Some(fd) = args.ready_fd {
            taken.ready = Some(adopt_fd(fd, "--ready-fd")?);
        }
        if let Some(fd) = metrics_fd {
            taken.metrics = Some(adopt_fd(fd, "--metrics")?);
        }
        if let Some(fd) = args.fd {
            let sock = adopt_fd(fd, "--fd")?;
            taken.guest = Some(if args.packet {
                expect_socket(&sock, fd, "--packet", AddressFamily::PACKET, None)?;
                rustix::io::ioctl_fionbio(&sock, true)
                    .with_context(|| format!("--fd {fd}: setting it non-blocking"))?;
                GuestFd::Packet(sock)
            } else if matches!(args.dgram, Some(None)) {
                let dgram = Some(SocketType::DGRAM);
                expect_socket(&sock, fd, "--dgram", AddressFamily::UNIX, dgram)?;
                GuestFd::Dgram(sock)
            } else {
                let stream = Some(SocketType::STREAM);
                expect_socket(&sock, fd, "(stream)", AddressFamily::UNIX, stream)?;
                GuestFd::Stream(sock)
            });
        }
        Ok(taken)
    }

    /// Closes every descriptor above the standard streams that no flag
    /// or path argument named: whatever the parent leaked into the gateway (a descriptor
    /// without `FD_CLOEXEC`) would otherwise be held for the gateway's
    /// life, and passed on to the `ip`, `tc` and `nft` it runs at start
    /// and to the floor keeper.
    pub(crate) fn close_the_rest(&self) {
        use std::os::fd::AsRawFd;
        let guest = self.guest.as_ref().map(|g| match g {
            GuestFd::Packet(fd) | GuestFd::Dgram(fd) | GuestFd::Stream(fd) => fd.as_raw_fd(),
        });
        let keep: Vec<i32> = [
            self.ready.as_ref().map(AsRawFd::as_raw_fd),
            self.metrics.as_ref().map(AsRawFd::as_raw_fd),
            guest,
        ]
        .into_iter()
        .flatten()
        .chain(self.named.iter().copied())
        .collect();
        // SAFETY: called right after `take`, before anything else in the
        // process opens a descriptor: every descriptor the gateway owns is
        // one of `keep`.
        #[allow(unsafe_code)]
        unsafe {
            crate::fds::close_all_but(&keep);
        }
    }
}

/// Refuses `sock` (`--fd fd`, for `mode`) unless it is a socket of
/// `domain` (and of type `kind`, when given).
fn expect_socket(
    sock: &OwnedFd,
    fd: i32,
    mode: &str,
    domain: AddressFamily,
    kind: Option<SocketType>,
) -> anyhow::Result<()> {
    let want = describe(domain, kind);
    let found = sockopt::socket_domain(sock)
        .and_then(|d| Ok((d, sockopt::socket_type(sock)?)))
        .map_err(|e| anyhow::anyhow!("--fd {fd} {mode}: not a socket ({e}); want {want}"))?;
    if found.0 != domain || kind.is_some_and(|k| k != found.1) {
        bail!(
            "--fd {fd} {mode}: {}; want {want}",
            describe(found.0, Some(found.1))
        );
    }
    Ok(())
}

/// "a unix datagram socket", "a packet socket", ... for messages.
fn describe(domain: AddressFamily, kind: Option<SocketType>) -> String {
    let family = match domain {
        AddressFamily::UNIX => "unix".to_owned(),
        AddressFamily::PACKET => "packet".to_owned(),
        AddressFamily::INET => "inet".to_owned(),
        AddressFamily::INET6 => "inet6".to_owned(),
        other => format!("family-{}", other.as_raw()),
    };
    let kind = match kind {
        None => String::new(),
        Some(SocketType::STREAM) => " stream".to_owned(),
        Some(SocketType::DGRAM) => " datagram".to_owned(),
        Some(SocketType::SEQPACKET) => " seqpacket".to_owned(),
        Some(SocketType::RAW) => " raw".to_owned(),
        Some(other) => format!(" type-{}", other.as_raw()),
    };
    format!("a {family}{kind} socket")
}

/// Takes ownership of the inherited descriptor `fd`, given by `flag`, and
/// marks it close-on-exec.
#[allow(unsafe_code)]
fn adopt_fd(fd: i32, flag: &str) -> anyhow::Result<OwnedFd> {
    if fd < 3 {
        bail!("{flag} {fd}: refusing to adopt a standard stream");
    }
    // Check the fd is open before taking ownership of it.
    // SAFETY: F_GETFD on an integer only reads the descriptor table.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        bail!("{flag} {fd}: not an open file descriptor");
    }
    // SAFETY: `fd` is >= 3, open (checked above), was inherited from the
    // parent for this purpose, nothing in this process has opened anything
    // yet (main calls this first), and each flag's number is adopted once
    // (`Inherited::take` refuses two flags naming one): the OwnedFd becomes
    // its only owner.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    rustix::io::fcntl_setfd(&owned, rustix::io::FdFlags::CLOEXEC)
        .with_context(|| format!("{flag} {fd}: marking it close-on-exec"))?;
    Ok(owned)
}

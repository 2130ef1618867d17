//! `--attach IFACE --netns PATH`, the binary's part (the library forbids
//! `unsafe`; this module holds the few calls the `AF_PACKET` socket, the
//! interface and the floor keeper need, each with its `// SAFETY:`).
//!
//! In order, all before the gateway restricts itself (setns, `nft` and fork
//! are forbidden afterwards):
//! 1. On a thread of its own that enters the namespace at PATH (the
//!    gateway's other threads never move): check IFACE exists, is Ethernet
//!    (a TAP or veth: not `lo`, not a tun), has no packet socket bound to
//!    it already (`/proc/thread-self/net/packet`: another gateway, or a
//!    capture), nothing that sees its frames before the floor does (an XDP
//!    program, a `clsact` or `ingress` qdisc, a tcx program, a master such
//!    as a bridge or a bond: [`bypasses`]), and carries the MTU the
//!    gateway advertises; open a non-blocking packet socket with
//!    `PACKET_VNET_HDR` and `PACKET_IGNORE_OUTGOING` and bind it to IFACE.
//!    The socket stays bound to that namespace's interface after the
//!    thread ends; every other socket of the gateway is opened in its own.
//! 2. Install the ingress floor ([`sluice_floor::ingress::IngressFloor`]).
//! 3. Again in the namespace: turn IPv6 off on IFACE (the namespace's
//!    kernel gives it no link-local address and sends the guest no
//!    solicitations), then set IFACE up: only now, with the floor in place,
//!    can the guest's frames flow.
//! 4. Fork the floor keeper: a child that holds the floor and, when the
//!    gateway asks on exit (normal end, SIGTERM, SIGINT, or a failure
//!    after the floor was installed), sets IFACE down and keeps the floor
//!    on it while it exists (removing it only when IFACE is already gone),
//!    in the namespace it was installed in and no other
//!    ([`IngressFloor::remove`]): the guest, which may outlive the
//!    gateway, gets no network through the namespace's kernel, even if
//!    something with `CAP_NET_ADMIN` there sets IFACE up again. Before
//!    asking, the gateway sets IFACE down itself ([`LinkCutter`], a socket
//!    it opened in the namespace): that holds with no floor
//!    (`--allow-missing-isolation nftables`) or a dead keeper too.
//!    If the gateway dies without asking (SIGKILL, a crash) the keeper
//!    leaves the floor in place: the guest then has no network at all,
//!    which is the safe state. If the keeper dies while the gateway
//!    serves, nothing checks the floor any more: the gateway sees its
//!    channel close ([`KeeperWatch`]) and ends, fail closed. `main` calls [`attach`] before it reads the
//!    policy or any secret, and the keeper empties its copy of the
//!    environment first thing: the unjailed keeper holds no secret.
//!
//! Any failure in 1 to 3 leaves nothing behind: the socket closes, a
//! half-installed floor is removed by the floor crate (and the floor of
//! step 2 when step 3 fails).

use std::fs::File;
use std::os::fd::{AsFd as _, AsRawFd as _, OwnedFd};
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context as _, anyhow, bail};
use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};
use sluice_floor::LinkDown;
use sluice_floor::ingress::{Foreign, IngressFloor};

mod bypass;
mod keeper;

pub(crate) use bypass::bypasses;
pub(crate) use keeper::{FloorKeeper, KeeperWatch};

/// `<linux/if_packet.h>`: deliver a virtio-net header before each frame.
const PACKET_VNET_HDR: libc::c_int = 15;
/// `<linux/if_packet.h>`: do not deliver the frames this host sends.
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;

/// Kernel ABI constants in the types the structures hold; each value fits
/// (they are small and fixed by the ABI).
#[allow(clippy::cast_possible_truncation)]
mod abi {
    pub(super) const AF_PACKET: u16 = libc::AF_PACKET as u16;
    pub(super) const ETH_P_ALL_BE: u16 = (libc::ETH_P_ALL as u16).to_be();
    pub(super) const IFF_UP: libc::c_short = libc::IFF_UP as libc::c_short;
    pub(super) const INT_LEN: libc::socklen_t = size_of::<libc::c_int>() as libc::socklen_t;
    pub(super) const SOCKADDR_LL_LEN: libc::socklen_t =
        size_of::<libc::sockaddr_ll>() as libc::socklen_t;
}

/// The opened link and the keeper of its floor (none when the floor was
/// waived with `--allow-missing-isolation nftables` and could not be installed).
#[derive(Debug)]
pub(crate) struct Attached {
    /// The bound packet socket.
    pub(crate) socket: OwnedFd,
    /// Removes the floor on request.
    pub(crate) keeper: Option<FloorKeeper>,
    /// Sets IFACE down at the end.
    pub(crate) link: LinkCutter,
}

/// Sets the attached interface down from the gateway itself, by the index
/// it had at attach, over an rtnetlink socket opened in its namespace
/// ([`LinkDown`]: it acts there whatever namespace the calling thread is
/// in, and the jail allows using it). The request names the index alone,
/// so a rename between a lookup and the act cannot send it elsewhere.
#[derive(Debug)]
pub(crate) struct LinkCutter {
    down: Arc<LinkDown>,
    index: u32,
    /// A packet socket bound to the interface: tells it gone ([`unbound`]).
    token: OwnedFd,
}

impl LinkCutter {
    /// Another cutter of the same interface (its sockets duplicated), for
    /// the keeper's watch ([`KeeperWatch`]).
    fn try_clone(&self) -> anyhow::Result<Self> {
        Ok(Self {
            down: Arc::clone(&self.down),
            index: self.index,
            token: self
                .token
                .try_clone()
                .context("duplicating the interface's socket")?,
        })
    }

    /// Clears IFF_UP on the interface; one that is gone needs nothing (an
    /// interface that took its index since is not it, and is left alone).
    pub(crate) fn cut(&self) -> anyhow::Result<()> {
        if unbound(&self.token, self.index) {
            return Ok(());
        }
        match self.down.set_down() {
            Ok(()) => Ok(()),
            // Gone between the check and the request: nothing to cut.
            Err(_) if unbound(&self.token, self.index) => Ok(()),
            Err(e) => bail!("setting interface index {} down: {e}", self.index),
        }
    }
}

/// Opens IFACE in the namespace at `netns` and installs its floor (module docs).
pub(crate) fn attach(
    iface: &str,
    netns: &Path,
    mtu: u16,
    allow_missing_floor: bool,
) -> anyhow::Result<Attached> {
    let ns = File::open(netns).map_err(|e| anyhow!("--netns {}: {e}", netns.display()))?;
    let (socket, index) = in_namespace(&ns, netns, || open_in_namespace(iface, netns, mtu))?;
    // The interface is known by its index, which the kernel may give
    // another interface once this one is gone: a packet socket bound to
    // it for no protocol (it receives nothing) tells it gone instead.
    let token = in_namespace(&ns, netns, || {
        gone_token(index).with_context(|| format!("binding a socket to `{iface}`"))
    })?;
    // By the descriptor opened above, never by the path again: the floor
    // goes into the namespace the socket was bound in, and its keeper
    // holds that namespace (docs/attach.md).
    let foreign = if allow_missing_floor {
        Foreign::Allow
    } else {
        Foreign::Refuse
    };
    let keeper_token = token
        .try_clone()
        .context("duplicating the interface's socket")?;
    let token_fd = keeper_token.as_raw_fd();
    let floor = match IngressFloor::install_in(Some(ns.as_fd()), netns, iface, foreign) {
        Ok(floor) => Some(floor.know_gone_by(move || unbound(&keeper_token, index))),
        Err(e) if allow_missing_floor => {
            tracing::warn!(error = %e, "no nftables floor (--allow-missing-isolation nftables): the kernel may route the guest's traffic if the gateway stops");
            None
        }
        Err(e) => {
            bail!("{e} (the floor is required; --allow-missing-isolation nftables waives it)")
        }
    };
    // On error the floor drops here, which removes it.
    // The means to set the link down exist before it is up.
    let down = in_namespace(&ns, netns, || {
        let down =
            LinkDown::open(index).map_err(|e| anyhow!("{e} (to set `{iface}` down at the end)"))?;
        bring_up(&socket, iface, netns)?;
        Ok(down)
    })?;
    let link = LinkCutter {
        down: Arc::new(down),
        index,
        token,
    };
    let keeper = match floor.map(|f| FloorKeeper::spawn(f, token_fd)).transpose() {
        Ok(keeper) => keeper,
        Err(e) => {
            // The floor dropped in the failed spawn is removed: the link
            // must not stay up without it.
            let _ = link.cut();
            return Err(e);
        }
    };
    Ok(Attached {
        socket,
        keeper,
        link,
    })
}

/// Runs `f` on a thread of its own that has entered the network namespace
/// `ns` (opened from `netns`); the calling thread never moves.
fn in_namespace<T: Send>(
    ns: &File,
    netns: &Path,
    f: impl FnOnce() -> anyhow::Result<T> + Send,
) -> anyhow::Result<T> {
    std::thread::scope(|s| {
        s.spawn(|| {
            move_into_link_name_space(ns.as_fd(), Some(LinkNameSpaceType::Network)).map_err(
                |e| anyhow!("--netns {}: not a network namespace ({e})", netns.display()),
            )?;
            f()
        })
        .join()
        .unwrap_or_else(|_| Err(anyhow!("the namespace thread panicked")))
    })
}

/// A datagram socket for interface ioctls, opened in the calling thread's
/// namespace, never inherited by what the process runs.
fn probe_socket() -> anyhow::Result<OwnedFd> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType, socket_with};
    socket_with(
        AddressFamily::INET,
        SocketType::DGRAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .context("opening a probe socket")
}

/// Step 3 of the module docs, on a thread inside the namespace.
fn bring_up(sock: &OwnedFd, iface: &str, netns: &Path) -> anyhow::Result<()> {
    let where_ = || format!("`{iface}` in network namespace {}", netns.display());
    // /proc/sys/net is the opening thread's namespace's. Missing when the
    // kernel has no IPv6: then there is nothing to turn off.
    let knob = format!("/proc/sys/net/ipv6/conf/{iface}/disable_ipv6");
    if Path::new(&knob).exists() {
        std::fs::write(&knob, "1")
            .with_context(|| format!("turning IPv6 off on {} ({knob})", where_()))?;
    }
    let probe = probe_socket()?;
    set_up(&probe, iface, true).with_context(|| format!("setting {} up", where_()))?;
    // Bound while the interface was down, the socket holds a pending
    // ENETDOWN its first receive would report: reading SO_ERROR clears it.
    let _ = rustix::net::sockopt::socket_error(sock);
    Ok(())
}

/// Step 1 of the module docs, on the thread inside the namespace.
fn open_in_namespace(iface: &str, netns: &Path, mtu: u16) -> anyhow::Result<(OwnedFd, u32)> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType, socket_with};
    let where_ = || format!("`{iface}` in network namespace {}", netns.display());
    let probe = probe_socket()?;
    let index = rustix::net::netdevice::name_to_index(&probe, iface)
        .map_err(|_| anyhow!("no interface {}", where_()))?;
    if let Some(holder) = packet_socket_on(index)? {
        bail!(
            "{} is already attached: a packet socket (inode {holder}) is bound to it (another gateway, or a capture)",
            where_()
        );
    }
    if let Some(what) = bypasses(iface, index)? {
        bail!(
            "{} has {what}, which sees the guest's frames outside the floor: remove it or attach to an interface without one",
            where_()
        );
    }
    // Protocol 0 until bound: the socket receives nothing from other
    // interfaces in between.
    let sock = socket_with(
        AddressFamily::PACKET,
        SocketType::RAW,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )
    .context("opening a packet socket")?;
    set_packet_option(&sock, PACKET_VNET_HDR).context("setting PACKET_VNET_HDR")?;
    set_packet_option(&sock, PACKET_IGNORE_OUTGOING).context("setting PACKET_IGNORE_OUTGOING")?;
    let hatype = bind_packet(&sock, index, abi::ETH_P_ALL_BE)
        .with_context(|| format!("binding to {}", where_()))?;
    if hatype != libc::ARPHRD_ETHER {
        bail!(
            "{} is not a layer-2 (Ethernet) interface (hardware type {hatype}): attach to a TAP or a veth end",
            where_()
        );
    }
    let if_mtu = interface_mtu(&probe, iface).context("reading the interface's MTU")?;
    if u32::from(mtu) > if_mtu {
        bail!(
            "--mtu {mtu} exceeds the MTU {if_mtu} of {}: pass --mtu {if_mtu} (or raise the interface's MTU)",
            where_()
        );
    }
    Ok((sock, index))
}

/// The inode of a packet socket bound to interface `index` in the calling
/// thread's namespace, if any.
fn packet_socket_on(index: u32) -> anyhow::Result<Option<String>> {
    let table = std::fs::read_to_string("/proc/thread-self/net/packet")
        .context("reading /proc/thread-self/net/packet")?;
    // sk RefCnt Type Proto Iface R Rmem User Inode
    Ok(table.lines().skip(1).find_map(|line| {
        let cols: Vec<&str> = line.split_whitespace().collect();
        let bound = cols.get(4)?.parse::<u32>().ok()? == index;
        bound.then(|| cols.get(8).map_or_else(String::new, |s| (*s).to_owned()))
    }))
}

fn set_packet_option(sock: &OwnedFd, option: libc::c_int) -> std::io::Result<()> {
    let one: libc::c_int = 1;
    // SAFETY: `sock` is an open socket; the value pointer and length describe
    // `one`, a c_int that lives across the call; the kernel only reads it.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_PACKET,
            option,
            (&raw const one).cast(),
            abi::INT_LEN,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A packet socket (in the calling thread's namespace) bound to interface
/// `index` for no protocol: it receives nothing, and [`unbound`] on it
/// tells when that interface is gone.
fn gone_token(index: u32) -> anyhow::Result<OwnedFd> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType, socket_with};
    let sock = socket_with(
        AddressFamily::PACKET,
        SocketType::RAW,
        SocketFlags::CLOEXEC,
        None,
    )
    .context("opening a packet socket")?;
    bind_packet(&sock, index, 0)?;
    Ok(sock)
}

/// Whether the interface that the packet socket `sock` was bound to (as
/// index `index`) is gone: when an interface unregisters, the kernel
/// unbinds every packet socket bound to it for good (its bound index reads
/// -1), so an interface given the same index later is never taken for
/// it. A socket that cannot be asked says nothing (`false`: the index is
/// used as before).
fn unbound(sock: &OwnedFd, index: u32) -> bool {
    // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    let mut len = abi::SOCKADDR_LL_LEN;
    // SAFETY: the pointer and length describe `addr`, writable and as large
    // as the kernel's answer for an AF_PACKET socket (a sockaddr_ll).
    if unsafe { libc::getsockname(sock.as_raw_fd(), (&raw mut addr).cast(), &raw mut len) } != 0 {
        return false;
    }
    i32::try_from(index).ok() != Some(addr.sll_ifindex)
}

/// Binds the packet socket to interface `index` for `protocol` (network
/// order; 0: none) and returns the interface's hardware type (`ARPHRD_*`).
fn bind_packet(sock: &OwnedFd, index: u32, protocol: u16) -> std::io::Result<u16> {
    let ifindex =
        i32::try_from(index).map_err(|_| std::io::Error::other("ifindex out of range"))?;
    // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = abi::AF_PACKET;
    addr.sll_protocol = protocol;
    addr.sll_ifindex = ifindex;
    let len = abi::SOCKADDR_LL_LEN;
    // SAFETY: `sock` is an open AF_PACKET socket; the pointer and length
    // describe `addr`, a sockaddr_ll that lives across the call.
    if unsafe { libc::bind(sock.as_raw_fd(), (&raw const addr).cast(), len) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut bound_len = len;
    // SAFETY: the pointer and length describe `addr`, writable and as large
    // as the kernel's answer for an AF_PACKET socket (a sockaddr_ll).
    if unsafe { libc::getsockname(sock.as_raw_fd(), (&raw mut addr).cast(), &raw mut bound_len) }
        != 0
    {
        return Err(std::io::Error::last_os_error());
    }
    Ok(addr.sll_hatype)
}

fn ifreq_for(iface: &str) -> std::io::Result<libc::ifreq> {
    // SAFETY: ifreq is plain data (a name and a union of plain data); all-zero is valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    let name = iface.as_bytes();
    if name.len() >= req.ifr_name.len() {
        return Err(std::io::Error::other("interface name too long"));
    }
    for (dst, src) in req.ifr_name.iter_mut().zip(name) {
        *dst = *src as libc::c_char;
    }
    Ok(req)
}

fn interface_mtu(probe: &OwnedFd, iface: &str) -> std::io::Result<u32> {
    let mut req = ifreq_for(iface)?;
    // SAFETY: SIOCGIFMTU reads the NUL-terminated name in `req` and writes
    // the `ifru_mtu` member of its union; `req` is a valid, writable ifreq.
    if unsafe { libc::ioctl(probe.as_raw_fd(), libc::SIOCGIFMTU, &raw mut req) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFMTU succeeded, so `ifru_mtu` is the member it wrote.
    let mtu = unsafe { req.ifr_ifru.ifru_mtu };
    u32::try_from(mtu).map_err(|_| std::io::Error::other("negative MTU"))
}

/// Sets IFF_UP on `iface` (`up`) or clears it.
fn set_up(probe: &OwnedFd, iface: &str, up: bool) -> std::io::Result<()> {
    let mut req = ifreq_for(iface)?;
    // SAFETY: SIOCGIFFLAGS reads the name in `req` and writes `ifru_flags`;
    // `req` is a valid, writable ifreq.
    if unsafe { libc::ioctl(probe.as_raw_fd(), libc::SIOCGIFFLAGS, &raw mut req) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFFLAGS succeeded, so `ifru_flags` is the member it wrote.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    let want = if up {
        flags | abi::IFF_UP
    } else {
        flags & !abi::IFF_UP
    };
    if want == flags {
        return Ok(());
    }
    req.ifr_ifru.ifru_flags = want;
    // SAFETY: SIOCSIFFLAGS reads the name and `ifru_flags` from `req`, a
    // valid ifreq whose flags member was just written.
    if unsafe { libc::ioctl(probe.as_raw_fd(), libc::SIOCSIFFLAGS, &raw mut req) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

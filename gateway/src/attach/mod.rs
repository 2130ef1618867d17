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
use std::io::{Read as _, Write as _};
use std::os::fd::{AsFd as _, AsRawFd as _, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use anyhow::{Context as _, anyhow, bail};
use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};
use sluice_floor::FloorError;
use sluice_floor::ingress::{Ended, Foreign, IngressFloor};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

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
/// it had at attach (a rename does not lose it), through a socket opened in
/// its namespace (ioctls on it act there, whatever namespace the calling
/// thread is in, and the jail allows them).
#[derive(Debug)]
pub(crate) struct LinkCutter {
    probe: OwnedFd,
    index: u32,
    /// A packet socket bound to the interface: tells it gone ([`unbound`]).
    token: OwnedFd,
}

impl LinkCutter {
    /// Another cutter of the same interface (its sockets duplicated), for
    /// the keeper's watch ([`KeeperWatch`]).
    fn try_clone(&self) -> anyhow::Result<Self> {
        Ok(Self {
            probe: self
                .probe
                .try_clone()
                .context("duplicating the probe socket")?,
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
        let name = match rustix::net::netdevice::index_to_name(&self.probe, self.index) {
            Ok(name) => name,
            Err(rustix::io::Errno::NODEV) => return Ok(()),
            Err(e) => bail!("looking up interface index {}: {e}", self.index),
        };
        set_up(&self.probe, &name, false)
            .with_context(|| format!("setting `{name}` (index {}) down", self.index))
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
    let probe = in_namespace(&ns, netns, || bring_up(&socket, iface, netns))?;
    let link = LinkCutter {
        probe,
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

/// Step 3 of the module docs, on a thread inside the namespace; returns the
/// probe socket the gateway later sets the interface down with.
fn bring_up(sock: &OwnedFd, iface: &str, netns: &Path) -> anyhow::Result<OwnedFd> {
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
    Ok(probe)
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

/// Where `ip` and `tc` are looked for (absolute paths only: the gateway's
/// `PATH` is not trusted to name them).
const TOOL_DIRS: [&str; 4] = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"];

/// Runs the iproute2 tool `name` with `args` in the calling thread's
/// namespace and parses its JSON output.
fn iproute2_json(name: &str, args: &[&str]) -> anyhow::Result<serde_json::Value> {
    let tool = TOOL_DIRS
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| anyhow!("`{name}` (iproute2) not found in {}", TOOL_DIRS.join(", ")))?;
    // Killed when hung (a failed run: the keeper's check asks again).
    let out = sluice_floor::run::output_within(
        std::process::Command::new(&tool).args(args),
        b"",
        sluice_floor::run::DEADLINE,
    )
    .with_context(|| format!("running {}", tool.display()))?;
    if !out.status.success() {
        bail!(
            "{} {}: {}",
            tool.display(),
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    // `tc` prints nothing at all for a device without qdiscs on some versions.
    if out.stdout.iter().all(u8::is_ascii_whitespace) {
        return Ok(serde_json::Value::Array(Vec::new()));
    }
    serde_json::from_slice(&out.stdout)
        .with_context(|| format!("parsing the JSON of {} {}", tool.display(), args.join(" ")))
}

/// What on `iface` (index `index`, in the calling thread's namespace)
/// would see the guest's frames before the floor's netdev ingress hook, or
/// the gateway's before the guest, if anything: an XDP program (runs in the
/// driver, before everything), a `clsact` or `ingress` qdisc (tc ingress
/// runs before netfilter's netdev ingress: a `mirred` redirect, as Kata's
/// default `tcfilter` model installs, would carry the frames past the
/// floor), a tcx program (the qdisc-less tc of kernel 6.6 and later,
/// attached through a bpf link: iproute2 lists none, so the kernel is
/// asked, [`tcx_programs`]), or a master (a bridge or bond takes the frames
/// in its rx handler). The rest is read from `ip -d -j link show` and
/// `tc -j qdisc show`.
pub(crate) fn bypasses(iface: &str, index: u32) -> anyhow::Result<Option<String>> {
    let link = iproute2_json("ip", &["-d", "-j", "link", "show", "dev", iface])?;
    let qdiscs = iproute2_json("tc", &["-j", "qdisc", "show", "dev", iface])?;
    if let Some(found) = bypass_in(&link, &qdiscs) {
        return Ok(Some(found));
    }
    for (attach_type, hook) in [(BPF_TCX_INGRESS, "ingress"), (BPF_TCX_EGRESS, "egress")] {
        let n = tcx_programs(index, attach_type)
            .with_context(|| format!("asking the kernel for tcx {hook} programs"))?;
        if n > 0 {
            return Ok(Some(format!(
                "{n} tcx {hook} program(s) attached (bpf links)"
            )));
        }
    }
    Ok(None)
}

/// `<linux/bpf.h>`: the `bpf(2)` command and the tcx attach types.
const BPF_PROG_QUERY: libc::c_int = 16;
const BPF_TCX_INGRESS: u32 = 46;
const BPF_TCX_EGRESS: u32 = 47;

/// The `query` member of `union bpf_attr` (`<linux/bpf.h>`, kernel 6.6).
#[repr(C)]
#[derive(Default)]
struct BpfProgQuery {
    target_ifindex: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    prog_cnt: u32,
    _pad: u32,
    prog_attach_flags: u64,
    link_ids: u64,
    link_attach_flags: u64,
    revision: u64,
}

/// How many tcx programs of `attach_type` interface `index` (in the
/// calling thread's namespace: the kernel resolves the index in the
/// caller's) carries: `bpf(BPF_PROG_QUERY)` with no id buffer, which
/// answers the count alone. A kernel older than 6.6 has no tcx and refuses
/// the attach type (`EINVAL`), one without `bpf(2)` has no programs
/// (`ENOSYS`): none. Any other refusal (`EPERM` under a seccomp filter or
/// without `CAP_NET_ADMIN`) is an error: what cannot be checked is not
/// assumed absent.
fn tcx_programs(index: u32, attach_type: u32) -> std::io::Result<u32> {
    let mut attr = BpfProgQuery {
        target_ifindex: index,
        attach_type,
        ..BpfProgQuery::default()
    };
    let size = u32::try_from(size_of::<BpfProgQuery>()).unwrap_or(u32::MAX);
    // SAFETY: BPF_PROG_QUERY reads `size` bytes of `attr`, a repr(C)
    // mirror of the kernel's `query` member that lives across the call,
    // and writes only its `prog_cnt`, `attach_flags` and `revision` (no id
    // buffers are given: their pointers are null and the count zero).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_QUERY,
            (&raw mut attr).cast::<libc::c_void>(),
            size,
        )
    };
    if rc == 0 {
        return Ok(attr.prog_cnt);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EINVAL | libc::ENOSYS) => Ok(0),
        _ => Err(e),
    }
}

/// [`bypasses`] on the tools' parsed output.
fn bypass_in(link: &serde_json::Value, qdiscs: &serde_json::Value) -> Option<String> {
    let entry = link.as_array().and_then(|a| a.first());
    if let Some(e) = entry {
        if e.get("xdp").is_some() {
            return Some("an XDP program attached".to_owned());
        }
        if let Some(master) = e.get("master").and_then(serde_json::Value::as_str) {
            return Some(format!("a master (`{master}`: a bridge or bond)"));
        }
    }
    qdiscs.as_array()?.iter().find_map(|q| {
        let kind = q.get("kind").and_then(serde_json::Value::as_str)?;
        matches!(kind, "clsact" | "ingress").then(|| format!("a `{kind}` qdisc (tc ingress)"))
    })
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
    fn spawn(floor: IngressFloor, token: libc::c_int) -> anyhow::Result<Self> {
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

#[cfg(test)]
mod tests {
    use super::bypass_in;
    use serde_json::json;

    #[test]
    fn xdp_a_master_and_ingress_qdiscs_are_bypasses() {
        let plain = json!([{"ifname": "tap0", "flags": ["UP"]}]);
        let root_only = json!([{"kind": "noqueue", "handle": "0:", "root": true}]);
        assert_eq!(bypass_in(&plain, &root_only), None);
        assert_eq!(bypass_in(&plain, &json!([])), None);
        let xdp = json!([{"ifname": "tap0", "xdp": {"mode": 2, "prog": {"id": 7}}}]);
        assert!(bypass_in(&xdp, &root_only).is_some_and(|w| w.contains("XDP")));
        let enslaved = json!([{"ifname": "tap0", "master": "br0"}]);
        assert!(bypass_in(&enslaved, &root_only).is_some_and(|w| w.contains("br0")));
        for kind in ["clsact", "ingress"] {
            let q = json!([{"kind": "noqueue", "root": true}, {"kind": kind, "handle": "ffff:"}]);
            assert!(
                bypass_in(&plain, &q).is_some_and(|w| w.contains(kind)),
                "{kind}"
            );
        }
    }
}

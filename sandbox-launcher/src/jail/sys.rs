//! Every `unsafe` of the launcher: thin wrappers over the system calls the
//! jail needs, each returning `io::Result` with `errno` on failure.
//!
//! All of these run either in the launcher before `exec` of the helper
//! ([`keep_fds_across_exec`], only async-signal-safe calls), or in the
//! single-threaded jail helper and its forked child, where allocation is safe,
//! or (the TAP, its link settings and the packet socket of `sluice run
//! --network tap`) on a launcher thread inside the run's network namespace,
//! or (rootless) in the single-threaded TAP helper
//! (`crate::network_mode::tap_helper`).

#![allow(unsafe_code)]

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

/// Turns a `-1` return into the current `errno`.
fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// A C string from a path or argument; interior NULs are an error.
pub(crate) fn cstring(s: impl Into<Vec<u8>>) -> io::Result<CString> {
    CString::new(s).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

/// In the spawned helper, before `exec`: clear `FD_CLOEXEC` on `fds` so
/// they are inherited.
pub(crate) fn keep_fds_across_exec(cmd: &mut Command, fds: Vec<RawFd>) {
    let hook = move || -> io::Result<()> {
        for &fd in &fds {
            // SAFETY: fcntl(F_SETFD) on an fd number is async-signal-safe and
            // touches no memory; a closed fd yields EBADF, reported as an error.
            check(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) }.into())?;
        }
        Ok(())
    };
    // SAFETY: the hook only calls fcntl (async-signal-safe) and reads a Vec
    // allocated before the fork; it neither allocates nor takes locks.
    unsafe { cmd.pre_exec(hook) };
}

/// In a process spawned by `cmd`, before `exec`: close every fd above
/// stdio, so a helper's passed descriptors (a guest's socket, the audit
/// pipe) are not held open by an unrelated child.
pub(crate) fn close_fds_across_exec(cmd: &mut Command) {
    // SAFETY: the hook only makes the close_range syscall (async-signal-safe,
    // no memory touched) in the forked child right before exec.
    unsafe { cmd.pre_exec(|| close_from(3)) };
}

/// `fcntl(fd, F_DUPFD_CLOEXEC, min)`: a close-on-exec duplicate numbered at
/// least `min`.
pub(crate) fn dup_cloexec_at_least(fd: RawFd, min: RawFd) -> io::Result<RawFd> {
    // SAFETY: plain fd syscall, no memory is passed.
    let ret = check(unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, min) }.into())?;
    RawFd::try_from(ret).map_err(io::Error::other)
}

/// A close-on-exec duplicate of `fd` numbered at least `min`, owned.
pub(crate) fn dup_owned_at_least(fd: RawFd, min: RawFd) -> io::Result<OwnedFd> {
    let dup = dup_cloexec_at_least(fd, min)?;
    // SAFETY: `dup` was just returned by fcntl(F_DUPFD_CLOEXEC); nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(dup) })
}

/// `dup2(src, dst)`; the new `dst` is inherited across exec.
pub(crate) fn dup2(src: RawFd, dst: RawFd) -> io::Result<()> {
    // SAFETY: plain fd syscall; `dst` is a number this process owns by design.
    check(unsafe { libc::dup2(src, dst) }.into()).map(drop)
}

/// Sets `FD_CLOEXEC` on `fd`.
pub(crate) fn set_cloexec(fd: RawFd) -> io::Result<()> {
    // SAFETY: plain fd syscall, no memory is passed.
    check(unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) }.into()).map(drop)
}

/// Closes every fd numbered `from` or above (`close_range(2)`).
pub(crate) fn close_from(from: RawFd) -> io::Result<()> {
    let from = libc::c_uint::try_from(from).map_err(io::Error::other)?;
    // SAFETY: closes descriptors only; callers have moved every fd they still
    // need below `from`, and no Rust object refers to the closed ones after
    // exec (the child execs or exits right after).
    check(unsafe { libc::syscall(libc::SYS_close_range, from, libc::c_uint::MAX, 0) }).map(drop)
}

/// `close(fd)`.
pub(crate) fn close(fd: RawFd) {
    // SAFETY: the caller owns `fd` as a raw number with no Rust owner.
    unsafe { libc::close(fd) };
}

/// The result of [`fork`].
pub(crate) enum Forked {
    /// In the parent: the child's pid.
    Parent(libc::pid_t),
    /// In the child.
    Child,
}

/// `fork(2)`. Only called from the single-threaded helper, so the child
/// may allocate and use std freely.
pub(crate) fn fork() -> io::Result<Forked> {
    // SAFETY: the helper process is single-threaded (it never spawns
    // threads), so no lock can be held by another thread across the fork.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent(pid)),
    }
}

/// `_exit(code)` without running destructors or atexit handlers.
pub(crate) fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and is always safe to call.
    unsafe { libc::_exit(code) }
}

/// `unshare(flags)`.
pub(crate) fn unshare(flags: libc::c_int) -> io::Result<()> {
    // SAFETY: no memory is passed; in a single-threaded process unshare
    // cannot leave other threads with an inconsistent view.
    check(unsafe { libc::unshare(flags) }.into()).map(drop)
}

/// `mount(2)`; `None` arguments pass NULL.
pub(crate) fn mount(
    source: Option<&CStr>,
    target: &CStr,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> io::Result<()> {
    let ptr = |s: Option<&CStr>| s.map_or(std::ptr::null(), CStr::as_ptr);
    // SAFETY: every pointer is NULL or a NUL-terminated string alive for the call.
    check(
        unsafe {
            libc::mount(
                ptr(source),
                target.as_ptr(),
                ptr(fstype),
                flags,
                ptr(data).cast(),
            )
        }
        .into(),
    )
    .map(drop)
}

/// `umount2(target, flags)`.
pub(crate) fn umount2(target: &CStr, flags: libc::c_int) -> io::Result<()> {
    // SAFETY: NUL-terminated path alive for the call.
    check(unsafe { libc::umount2(target.as_ptr(), flags) }.into()).map(drop)
}

/// `pivot_root(new_root, put_old)`.
pub(crate) fn pivot_root(new_root: &CStr, put_old: &CStr) -> io::Result<()> {
    // SAFETY: two NUL-terminated paths alive for the call.
    check(unsafe { libc::syscall(libc::SYS_pivot_root, new_root.as_ptr(), put_old.as_ptr()) })
        .map(drop)
}

/// `sethostname(name)`.
pub(crate) fn sethostname(name: &str) -> io::Result<()> {
    // SAFETY: pointer and length describe `name`'s bytes.
    check(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) }.into()).map(drop)
}

/// `setsid()`: a new session and process group, no controlling terminal
/// (so the jailed program cannot inject input into the user's terminal).
pub(crate) fn setsid() -> io::Result<()> {
    // SAFETY: no arguments.
    check(unsafe { libc::setsid() }.into()).map(drop)
}

/// `prctl(PR_SET_PDEATHSIG, sig)`: `sig` when the parent thread dies.
pub(crate) fn set_parent_death_signal(sig: libc::c_int) -> io::Result<()> {
    let sig = libc::c_ulong::try_from(sig).map_err(io::Error::other)?;
    // SAFETY: integer arguments only.
    check(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, sig, 0, 0, 0) }.into()).map(drop)
}

/// `getppid()`.
pub(crate) fn getppid() -> libc::pid_t {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::getppid() }
}

/// `geteuid()`.
pub(crate) fn geteuid() -> u32 {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::geteuid() }
}

/// `getegid()`.
pub(crate) fn getegid() -> u32 {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::getegid() }
}

/// `capget(2)`/`capset(2)`, version 3: the header.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

/// `capget(2)`/`capset(2)`, version 3: one of the two 32-bit halves of
/// the sets.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

fn cap_header() -> CapHeader {
    CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    }
}

fn capset(data: &[CapData; 2]) -> io::Result<()> {
    let mut header = cap_header();
    // SAFETY: `header` and the two-element `data` array are the layout
    // capset(2) expects for version 3; both outlive the call.
    check(unsafe { libc::syscall(libc::SYS_capset, &raw mut header, data.as_ptr()) }).map(drop)
}

/// Empties the permitted, effective and inheritable capability sets
/// (`capset(2)`, version 3). In a user namespace its creator keeps every
/// capability *inside* it across `setresuid` to the same non-zero uid; this
/// is what takes them away before `execve`.
pub(crate) fn clear_capabilities() -> io::Result<()> {
    capset(&[CapData::default(); 2])
}

/// Adds `caps` (capability numbers, e.g. `CAP_NET_ADMIN`) to the
/// inheritable and ambient sets, so that a program this process execs
/// keeps them although its uid is not 0. Each must already be permitted.
/// Used by the rootless `--network tap` helper, whose capabilities exist
/// only inside the user namespace it made, for the `nft` it runs there.
pub(crate) fn raise_ambient(caps: &[u32]) -> io::Result<()> {
    let mut header = cap_header();
    let mut data = [CapData::default(); 2];
    // SAFETY: `header` and the two-element `data` array are the layout
    // capget(2) writes for version 3; both outlive the call.
    check(unsafe { libc::syscall(libc::SYS_capget, &raw mut header, data.as_mut_ptr()) })?;
    for &cap in caps {
        let half = usize::try_from(cap / 32).map_err(io::Error::other)?;
        let slot = data
            .get_mut(half)
            .ok_or_else(|| io::Error::other(format!("capability {cap} out of range")))?;
        slot.inheritable |= 1 << (cap % 32);
    }
    capset(&data)?;
    for &cap in caps {
        // SAFETY: integer arguments only.
        check(
            unsafe {
                libc::prctl(
                    libc::PR_CAP_AMBIENT,
                    libc::PR_CAP_AMBIENT_RAISE as libc::c_ulong,
                    libc::c_ulong::from(cap),
                    0,
                    0,
                )
            }
            .into(),
        )?;
    }
    Ok(())
}

/// The mount flags (`MS_RDONLY`, `MS_NOSUID`, `MS_NODEV`, `MS_NOEXEC` and
/// the atime flags) of the mount holding `path`, from `statvfs(3)`. In a
/// user namespace a bind remount must keep the flags the mount inherited
/// from the host (the kernel locks them), or it fails with EPERM.
pub(crate) fn mount_flags(path: &CStr) -> io::Result<libc::c_ulong> {
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: a NUL-terminated path and a valid out-pointer for the call.
    check(unsafe { libc::statvfs(path.as_ptr(), st.as_mut_ptr()) }.into())?;
    // SAFETY: statvfs returned 0, so it filled the struct.
    let st = unsafe { st.assume_init() };
    // The ST_* bits equal the MS_* bits on Linux.
    let keep = libc::MS_RDONLY
        | libc::MS_NOSUID
        | libc::MS_NODEV
        | libc::MS_NOEXEC
        | libc::MS_NOATIME
        | libc::MS_NODIRATIME
        | libc::MS_RELATIME;
    Ok(st.f_flag & keep)
}

/// Drops every capability from the bounding set (0..=`last_cap`) and clears
/// the ambient set, so nothing exec'd later can regain one.
pub(crate) fn drop_bounding_and_ambient_caps(last_cap: u32) -> io::Result<()> {
    for cap in 0..=last_cap {
        // SAFETY: integer arguments only.
        let ret = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0) };
        // EINVAL: a capability this kernel does not know; nothing to drop.
        if ret == -1 && io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
            return Err(io::Error::last_os_error());
        }
    }
    // SAFETY: integer arguments only.
    check(
        unsafe {
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
                0,
                0,
                0,
            )
        }
        .into(),
    )
    .map(drop)
}

/// Drops to `uid`/`gid` for real, effective and saved ids, and with
/// `clear_groups` to no supplementary groups (a rootless jail cannot:
/// `setgroups` is denied in its user namespace). From root to a non-zero
/// uid this also clears the permitted and effective capability sets.
pub(crate) fn drop_ids(uid: u32, gid: u32, groups: Option<&[u32]>) -> io::Result<()> {
    if let Some(groups) = groups {
        let gids: Vec<libc::gid_t> = groups.to_vec();
        // SAFETY: the pointer and length describe `gids`, alive for the call
        // (a zero length is valid with any pointer).
        check(unsafe { libc::setgroups(gids.len(), gids.as_ptr()) }.into())?;
    }
    // SAFETY: integer arguments only (glibc applies it to all threads; there is one).
    check(unsafe { libc::setresgid(gid, gid, gid) }.into())?;
    // SAFETY: as above.
    check(unsafe { libc::setresuid(uid, uid, uid) }.into()).map(drop)
}

/// `execve(path, argv, envp)`; returns only on failure.
pub(crate) fn execve(path: &CStr, argv: &[CString], envp: &[CString]) -> io::Error {
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let mut envp_ptrs: Vec<*const libc::c_char> = envp.iter().map(|a| a.as_ptr()).collect();
    envp_ptrs.push(std::ptr::null());
    // SAFETY: NULL-terminated arrays of NUL-terminated strings, all alive for
    // the call (the vectors outlive it).
    unsafe { libc::execve(path.as_ptr(), argv_ptrs.as_ptr(), envp_ptrs.as_ptr()) };
    io::Error::last_os_error()
}

/// How a waited-for process ended.
pub(crate) enum WaitStatus {
    /// Exited with this code.
    Exited(i32),
    /// Killed by this signal.
    Signaled(i32),
}

/// `waitpid(pid, 0)`, retried on EINTR, until it exits or is killed.
pub(crate) fn waitpid(pid: libc::pid_t) -> io::Result<WaitStatus> {
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: `status` is a valid out-pointer for the call.
        let ret = unsafe { libc::waitpid(pid, &raw mut status, 0) };
        if ret == -1 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if libc::WIFEXITED(status) {
            return Ok(WaitStatus::Exited(libc::WEXITSTATUS(status)));
        }
        if libc::WIFSIGNALED(status) {
            return Ok(WaitStatus::Signaled(libc::WTERMSIG(status)));
        }
    }
}

/// `kill(pid, sig)`.
pub(crate) fn kill(pid: libc::pid_t, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: integer arguments only.
    check(unsafe { libc::kill(pid, sig) }.into()).map(drop)
}

/// `pidfd_open(pid, 0)`: an fd that becomes readable when `pid` exits.
pub(crate) fn pidfd_open(pid: libc::pid_t) -> io::Result<RawFd> {
    // SAFETY: integer arguments only.
    let ret = check(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })?;
    RawFd::try_from(ret).map_err(io::Error::other)
}

/// Blocks until one of `fds` is readable or hung up; returns which.
pub(crate) fn poll_readable(fds: &[RawFd]) -> io::Result<Vec<bool>> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let n = libc::nfds_t::try_from(pfds.len()).map_err(io::Error::other)?;
    loop {
        // SAFETY: `pfds` is a valid array of `n` pollfd structs.
        let ret = unsafe { libc::poll(pfds.as_mut_ptr(), n, -1) };
        if ret == -1 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        return Ok(pfds.iter().map(|p| p.revents != 0).collect());
    }
}

/// The running kernel's Landlock ABI version (≤ 0: unavailable).
pub(crate) fn landlock_abi() -> i64 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: a NULL attribute with size 0 and the VERSION flag only queries.
    unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    }
}

// ---- `sluice run --network tap` (`crate::network_mode::tap`): called by the
// launcher on a thread of its own that has moved into the run's fresh
// network namespace (`unshare(CLONE_NEWNET)` affects only that thread).

/// An `ifreq` carrying the interface name `iface`.
fn ifreq_for(iface: &str) -> io::Result<libc::ifreq> {
    // SAFETY: ifreq is plain data (a name and a union of plain data); all-zero is valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    let name = iface.as_bytes();
    if name.is_empty() || name.len() >= req.ifr_name.len() {
        return Err(io::Error::other("interface name empty or too long"));
    }
    for (dst, src) in req.ifr_name.iter_mut().zip(name) {
        *dst = libc::c_char::from_ne_bytes([*src]);
    }
    Ok(req)
}

/// `TUNSETIFF` (`_IOW('T', 202, int)`).
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;

/// Creates the TAP `iface` in the calling thread's network namespace and
/// returns its queue (`/dev/net/tun` attached to it, no packet info
/// header, no virtio-net header): not persistent, so the device goes away
/// when the last copy of the descriptor closes.
pub(crate) fn tap_create(iface: &str) -> io::Result<OwnedFd> {
    let tun = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")?;
    let mut req = ifreq_for(iface)?;
    // IFF_TAP | IFF_NO_PI fit a c_short (0x0002 | 0x1000).
    req.ifr_ifru.ifru_flags = 0x0002 | 0x1000;
    // SAFETY: TUNSETIFF reads the name and flags from `req`, a valid ifreq
    // that lives across the call, and may write the chosen name back.
    let rc = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&tun),
            TUNSETIFF,
            &raw mut req,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(OwnedFd::from(tun))
}

/// Sets the MTU of `iface` and brings it up, through `probe` (any socket
/// of the interface's namespace).
pub(crate) fn link_set_mtu_up(probe: &OwnedFd, iface: &str, mtu: u32) -> io::Result<()> {
    use std::os::fd::AsRawFd as _;
    let mut req = ifreq_for(iface)?;
    req.ifr_ifru.ifru_mtu = libc::c_int::try_from(mtu).map_err(io::Error::other)?;
    // SAFETY: SIOCSIFMTU reads the name and `ifru_mtu` from `req`, a valid ifreq.
    if unsafe { libc::ioctl(probe.as_raw_fd(), libc::SIOCSIFMTU, &raw mut req) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut req = ifreq_for(iface)?;
    // SAFETY: SIOCGIFFLAGS reads the name and writes `ifru_flags` of `req`.
    if unsafe { libc::ioctl(probe.as_raw_fd(), libc::SIOCGIFFLAGS, &raw mut req) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFFLAGS succeeded, so `ifru_flags` is the member it wrote.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    // IFF_UP (1) fits a c_short.
    req.ifr_ifru.ifru_flags = flags | 1;
    // SAFETY: SIOCSIFFLAGS reads the name and `ifru_flags` from `req`.
    if unsafe { libc::ioctl(probe.as_raw_fd(), libc::SIOCSIFFLAGS, &raw mut req) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `<linux/if_packet.h>`: deliver a virtio-net header before each frame.
const PACKET_VNET_HDR: libc::c_int = 15;
/// `<linux/if_packet.h>`: do not deliver the frames this host sends.
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;

/// A non-blocking `AF_PACKET` socket bound to interface `index` for every
/// protocol, with `PACKET_VNET_HDR` and `PACKET_IGNORE_OUTGOING`: what the
/// gateway's `--fd N --packet` expects (the same options its own
/// `--attach` sets).
pub(crate) fn packet_socket(index: u32) -> io::Result<OwnedFd> {
    use std::os::fd::AsRawFd as _;
    // SAFETY: plain socket call; protocol 0 until bound, so nothing from
    // another interface is queued in between.
    let raw = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` was just returned by socket(); nothing else owns it.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    let one: libc::c_int = 1;
    let int_len = libc::socklen_t::try_from(size_of::<libc::c_int>()).map_err(io::Error::other)?;
    for option in [PACKET_VNET_HDR, PACKET_IGNORE_OUTGOING] {
        // SAFETY: an open socket; the pointer and length describe `one`.
        let rc = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_PACKET,
                option,
                (&raw const one).cast(),
                int_len,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = u16::try_from(libc::AF_PACKET).map_err(io::Error::other)?;
    addr.sll_protocol = u16::try_from(libc::ETH_P_ALL)
        .map_err(io::Error::other)?
        .to_be();
    addr.sll_ifindex = i32::try_from(index).map_err(io::Error::other)?;
    let len =
        libc::socklen_t::try_from(size_of::<libc::sockaddr_ll>()).map_err(io::Error::other)?;
    // SAFETY: the pointer and length describe `addr`, a sockaddr_ll alive
    // across the call.
    if unsafe { libc::bind(sock.as_raw_fd(), (&raw const addr).cast(), len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(sock)
}

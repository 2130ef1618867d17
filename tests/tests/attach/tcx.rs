//! An interface that already has a tcx program (Linux 6.6 and later) is
//! refused: the floor could not see what such a program does to frames.

use super::*;

/// Whether the running kernel has tcx (Linux 6.6 and later), read from
/// `/proc/sys/kernel/osrelease`.
fn kernel_has_tcx() -> Result<bool> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")?;
    let mut nums = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let (major, minor) = (nums.next().unwrap_or(0), nums.next().unwrap_or(0));
    Ok((major, minor) >= (6, 6))
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn an_interface_with_a_tcx_program_is_refused() -> Result<()> {
    sluice_e2e::require_root()?;
    if !kernel_has_tcx()?
        && sluice_test_skip::may_skip("tcx", "the kernel is older than 6.6: it has no tcx")
    {
        return Ok(());
    }
    let base = unique_name();
    let host = Netns::new(&format!("{base}h"))?;
    let ns = Netns::new(&format!("{base}v"))?;
    let path = format!("/run/netns/{}", ns.name());
    // tcx programs (kernel 6.6 and later: attached through bpf links, no
    // qdisc, not listed by iproute2), one on each hook.
    ns.ip(&["link", "add", "x4", "type", "veth", "peer", "name", "x5"])?;
    ns.ip(&["link", "add", "x6", "type", "veth", "peer", "name", "x7"])?;
    let tcx_in = bpf::attach(&path, "x4", bpf::INGRESS)?;
    let tcx_out = bpf::attach(&path, "x6", bpf::EGRESS)?;
    for (iface, want) in [
        ("x4", "1 tcx ingress program"),
        ("x6", "1 tcx egress program"),
    ] {
        let (code, errors) = attach_once(&host, iface, &path, 1500)?;
        ensure!(code == Some(1), "{iface}: exit {code:?}");
        ensure!(
            errors.len() == 1 && errors[0].contains(want),
            "{iface}: want one error line with `{want}`, got {errors:?}"
        );
        let t = tables(&ns)?;
        ensure!(!t.contains("sluice_floor"), "{iface}: left {t}");
    }
    // Control: with the programs detached, the same interfaces pass the
    // check and fail only at the next one (the MTU).
    drop((tcx_in, tcx_out));
    for iface in ["x4", "x6"] {
        let (code, errors) = attach_once(&host, iface, &path, 65520)?;
        ensure!(
            code == Some(1) && errors.len() == 1 && errors[0].contains("exceeds the MTU"),
            "{iface} without its tcx program: exit {code:?}, {errors:?}"
        );
    }
    Ok(())
}

/// A real tcx program on a real interface, through the `bpf(2)` syscall
/// (no bpftool or compiler needed): a two-instruction classifier
/// (`r0 = TC_ACT_OK; exit`) loaded as `BPF_PROG_TYPE_SCHED_CLS` and
/// attached with `BPF_LINK_CREATE` to the tcx hook, as Cilium and other
/// tcx users do. The link (and the program with it) goes when its
/// descriptor closes.
mod bpf {
    use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};

    use anyhow::{Context as _, Result, ensure};

    /// `<linux/bpf.h>` `enum bpf_attach_type`.
    pub(super) const INGRESS: u32 = 46;
    pub(super) const EGRESS: u32 = 47;
    const BPF_PROG_LOAD: libc::c_long = 5;
    const BPF_LINK_CREATE: libc::c_long = 28;
    const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;

    /// The start of `union bpf_attr` for `BPF_PROG_LOAD`.
    #[repr(C)]
    #[derive(Default)]
    struct ProgLoad {
        prog_type: u32,
        insn_cnt: u32,
        insns: u64,
        license: u64,
        log_level: u32,
        log_size: u32,
        log_buf: u64,
        kern_version: u32,
        prog_flags: u32,
        prog_name: [u8; 16],
        prog_ifindex: u32,
        expected_attach_type: u32,
    }

    /// `union bpf_attr` for `BPF_LINK_CREATE` with its `tcx` member.
    #[repr(C)]
    #[derive(Default)]
    struct LinkCreate {
        prog_fd: u32,
        target_ifindex: u32,
        attach_type: u32,
        flags: u32,
        relative_fd: u32,
        _pad: u32,
        expected_revision: u64,
    }

    fn bpf<T>(cmd: libc::c_long, attr: &mut T, what: &str) -> Result<OwnedFd> {
        let size = u32::try_from(size_of::<T>())?;
        // SAFETY: `attr` is a repr(C) mirror of the start of `union
        // bpf_attr` for `cmd`, `size` bytes long, alive across the call;
        // the pointers it holds (instructions, license) point at data that
        // outlives the call.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, std::ptr::from_mut(attr), size) };
        ensure!(rc >= 0, "{what}: {}", std::io::Error::last_os_error());
        let fd = i32::try_from(rc)?;
        // SAFETY: the kernel returned a new descriptor that nothing else owns.
        #[allow(unsafe_code)]
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Attaches the program to `iface` in the namespace at `netns` on the
    /// tcx hook `attach_type`; the link lives as long as the returned fd.
    pub(super) fn attach(netns: &str, iface: &str, attach_type: u32) -> Result<OwnedFd> {
        let (netns, iface) = (netns.to_owned(), iface.to_owned());
        std::thread::spawn(move || -> Result<OwnedFd> {
            let ns = std::fs::File::open(&netns).with_context(|| netns.clone())?;
            // SAFETY: setns only changes this thread's namespace; `ns` is open.
            #[allow(unsafe_code)]
            let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            ensure!(rc == 0, "setns: {}", std::io::Error::last_os_error());
            let name = std::ffi::CString::new(iface.clone())?;
            // SAFETY: `name` is a NUL-terminated string alive across the call.
            #[allow(unsafe_code)]
            let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
            ensure!(index != 0, "no interface {iface}");
            // r0 = 0 (TC_ACT_OK); exit.
            let insns: [u64; 2] = [0xb7, 0x95];
            let license = b"GPL\0";
            let mut load = ProgLoad {
                prog_type: BPF_PROG_TYPE_SCHED_CLS,
                insn_cnt: 2,
                insns: insns.as_ptr() as u64,
                license: license.as_ptr() as u64,
                ..ProgLoad::default()
            };
            let prog = bpf(BPF_PROG_LOAD, &mut load, "loading a tc classifier")?;
            let mut link = LinkCreate {
                prog_fd: u32::try_from(prog.as_raw_fd())?,
                target_ifindex: index,
                attach_type,
                ..LinkCreate::default()
            };
            bpf(BPF_LINK_CREATE, &mut link, "attaching it to a tcx hook")
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the tcx thread panicked"))?
    }
}

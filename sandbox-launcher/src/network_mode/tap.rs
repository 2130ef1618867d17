//! `sluice run --network tap`: a network namespace of the run's own
//! holding one TAP, with the ingress floor on it.
//!
//! In order, on a launcher thread that moves into a fresh namespace
//! (`unshare(CLONE_NEWNET)` changes only the calling thread; the
//! launcher's other threads never move):
//! 1. the namespace (an open `/proc/thread-self/ns/net`: nothing names it,
//!    no `/run/netns` mount);
//! 2. IPv6 off in it (the kernel there has no address of any kind, and
//!    sends the guest nothing), then the TAP [`IFACE`], not persistent,
//!    its queue kept for QEMU (`-netdev tap,fd=N`: QEMU stays in its own
//!    empty namespace, with no `/dev/net/tun` and no capability), its MTU
//!    set to the gateway's, up;
//! 3. a packet socket bound to it, for the gateway (`--fd N --packet`: the
//!    gateway needs no privilege, no `setns` and no `nft`);
//! 4. back on the caller's thread, the ingress floor
//!    ([`sluice_floor::ingress::IngressFloor`]) installed and verified in
//!    that namespace: the namespace's kernel never sees a guest frame, so
//!    when the gateway dies the guest reaches nothing.
//!
//! Cleanup needs no process: the namespace holds no address and no route,
//! and the kernel frees it, with the TAP and the floor, when its last
//! holder is gone (the launcher's descriptor, QEMU's TAP queue, the
//! gateway's packet socket). So a run ended any way, SIGKILL included,
//! leaves none of them behind, and while QEMU still runs the floor stays.
//!
//! Rootless, the namespace must be owned by a user namespace of the
//! caller's (only there does the caller hold CAP_NET_ADMIN and
//! CAP_NET_RAW), which a thread of the multi-threaded launcher cannot
//! enter: a short-lived helper process does steps 1-4 there and hands the
//! descriptors back ([`super::tap_helper`]). What the run gets is the same.

use std::fs::File;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::path::Path;

use anyhow::{Context as _, anyhow, bail};
use sluice_floor::ingress::{Foreign, IngressFloor};

use crate::jail;

/// The TAP's name inside the run's namespace (the namespace is the run's
/// own, so every run can use the same name).
pub(crate) const IFACE: &str = "tap0";

/// Why a run here cannot have a TAP, or `None` when it can.
pub(crate) fn unavailable() -> Option<String> {
    const TUN: &str = "/dev/net/tun";
    if !Path::new(TUN).exists() {
        return Some(format!("{TUN} is missing (load the tun module)"));
    }
    if jail::is_rootless() {
        if let Err(e) = jail::probe_user_namespaces() {
            return Some(format!(
                "rootless, the TAP's namespace belongs to a user namespace of the caller's: {e}"
            ));
        }
        let rw = rustix::fs::Access::READ_OK | rustix::fs::Access::WRITE_OK;
        if rustix::fs::access(TUN, rw).is_err() {
            return Some(format!(
                "{TUN} is not readable and writable by uid {} (its mode is normally 0666)",
                jail::default_ids().0
            ));
        }
    }
    None
}

/// The run's namespace, held open for as long as the run lasts.
#[derive(Debug)]
pub(crate) struct TapNamespace {
    /// `/proc/thread-self/ns/net` of the thread that made it: held, not
    /// read (while it is open the namespace lives).
    #[cfg_attr(not(test), allow(dead_code))]
    netns: OwnedFd,
    /// Its inode (what `/proc/PID/ns/net` links name), for `--json`.
    inode: u64,
    /// `on: ...` / `off: why`.
    floor: String,
}

/// What [`TapNamespace::create`] makes.
#[derive(Debug)]
pub(crate) struct MadeTap {
    /// The namespace.
    pub(crate) namespace: TapNamespace,
    /// The TAP's queue, for QEMU.
    pub(crate) queue: OwnedFd,
    /// The packet socket bound to the TAP, for the gateway.
    pub(crate) packet: OwnedFd,
}

impl TapNamespace {
    /// Makes the namespace, the TAP (MTU `mtu`), the packet socket and the
    /// floor (module docs). Without the floor the run is refused unless
    /// `allow_missing_floor` (then a warning on stderr).
    ///
    /// # Errors
    /// Any step failed; what was made is dropped, and the namespace with it.
    pub(crate) fn create(mtu: u32, allow_missing_floor: bool) -> anyhow::Result<MadeTap> {
        let (netns, queue, packet, floor) = if jail::is_rootless() {
            super::tap_helper::create(mtu, allow_missing_floor)?
        } else {
            let (netns, queue, packet) = std::thread::scope(|s| {
                s.spawn(|| {
                    jail::unshare(libc::CLONE_NEWNET)
                        .context("--network tap: a new network namespace")?;
                    make_tap(mtu)
                })
                .join()
                .unwrap_or_else(|_| Err(anyhow!("the namespace thread panicked")))
            })?;
            // The descriptor, by its /proc path: the floor crate enters the
            // namespace at a path on a thread of its own.
            let path = format!("/proc/self/fd/{}", netns.as_raw_fd());
            let floor = install_floor(Some(Path::new(&path)), allow_missing_floor)?;
            if let Some(warning) = &floor.warning {
                eprintln!("sluice: {warning}");
            }
            (netns, queue, packet, floor.state)
        };
        let inode = rustix::fs::fstat(&netns)
            .context("the TAP's namespace")?
            .st_ino;
        Ok(MadeTap {
            namespace: Self {
                netns,
                inode,
                floor,
            },
            queue,
            packet,
        })
    }

    /// The namespace's inode.
    pub(crate) fn inode(&self) -> u64 {
        self.inode
    }

    /// The floor's state.
    pub(crate) fn floor(&self) -> &str {
        &self.floor
    }
}

/// The floor as [`install_floor`] left it.
#[derive(Debug)]
pub(super) struct FloorState {
    /// `on: ...` / `off: why`.
    pub(super) state: String,
    /// What to say on stderr when the run goes on without it.
    pub(super) warning: Option<String>,
}

/// Step 4 of the module docs: installs and verifies the ingress floor on
/// [`IFACE`] in the namespace at `netns` (the caller's when `None`), and
/// leaves it to go with the namespace. Without it the run is refused
/// unless `allow_missing_floor`.
///
/// # Errors
/// The floor could not be installed or verified, and it is required.
pub(super) fn install_floor(
    netns: Option<&Path>,
    allow_missing_floor: bool,
) -> anyhow::Result<FloorState> {
    // The namespace is the run's own and fresh: nothing else is in it.
    match IngressFloor::install(netns, IFACE, Foreign::Refuse) {
        Ok(floor) => {
            let state = format!(
                "on: nftables tables netdev and inet {} drop every frame of {IFACE} \
                 before the namespace's kernel and forward nothing",
                floor.table()
            );
            // It goes with the namespace (module docs).
            floor.keep_with_namespace();
            Ok(FloorState {
                state,
                warning: None,
            })
        }
        Err(e) if allow_missing_floor => Ok(FloorState {
            state: format!("off: {e} (--allow-missing-isolation nftables)"),
            warning: Some(format!(
                "--network tap: {e}; running without the floor \
                 (--allow-missing-isolation nftables)"
            )),
        }),
        Err(e) => bail!(
            "--network tap: {e}; refusing to run without the floor on the TAP \
             (--allow-missing-isolation nftables runs without it)"
        ),
    }
}

/// Steps 2-3 of the module docs, in the calling thread's network
/// namespace (a fresh one, step 1): returns that namespace, the TAP's
/// queue and the packet socket (the descriptors keep the namespace alive).
pub(super) fn make_tap(mtu: u32) -> anyhow::Result<(OwnedFd, OwnedFd, OwnedFd)> {
    // Before the TAP exists: no IPv6 link-local address, so the
    // namespace's kernel sends the guest nothing either (no DAD, router
    // solicitation or MLD). /proc/sys/net is this thread's namespace's. A
    // kernel without IPv6 has no such files.
    for conf in ["all", "default"] {
        let knob = format!("/proc/sys/net/ipv6/conf/{conf}/disable_ipv6");
        if Path::new(&knob).exists() {
            std::fs::write(&knob, "1")
                .with_context(|| format!("--network tap: turning IPv6 off ({knob})"))?;
        }
    }
    let netns = File::open("/proc/thread-self/ns/net")
        .context("--network tap: opening the new network namespace")?;
    let queue = jail::tap_create(IFACE).context("--network tap: creating the TAP")?;
    let probe = rustix::net::socket(
        rustix::net::AddressFamily::INET,
        rustix::net::SocketType::DGRAM,
        None,
    )
    .context("--network tap: a probe socket")?;
    jail::link_set_mtu_up(&probe, IFACE, mtu)
        .with_context(|| format!("--network tap: setting {IFACE}'s MTU to {mtu} and up"))?;
    let index = rustix::net::netdevice::name_to_index(&probe, IFACE)
        .with_context(|| format!("--network tap: {IFACE}'s index"))?;
    let packet = jail::packet_socket(index)
        .with_context(|| format!("--network tap: a packet socket on {IFACE}"))?;
    Ok((OwnedFd::from(netns), queue, packet))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// `CMD...` in the namespace `netns` (a descriptor of this process).
    fn in_netns(netns: &OwnedFd, cmd: &[&str]) -> String {
        let ns = format!("/proc/{}/fd/{}", std::process::id(), netns.as_raw_fd());
        let out = Command::new("nsenter")
            .arg(format!("--net={ns}"))
            .args(cmd)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    #[test]
    fn the_namespace_holds_the_tap_its_floor_and_packet_socket_and_goes_with_them() {
        if let Some(why) = unavailable() {
            sluice_test_skip::may_skip("tap", &why);
            return;
        }
        let made = TapNamespace::create(65520, false).unwrap();
        let netns = &made.namespace.netns;
        let link = in_netns(netns, &["ip", "-o", "link", "show", IFACE]);
        assert!(link.contains("mtu 65520") && link.contains(",UP"), "{link}");
        assert!(made.namespace.floor().starts_with("on:"));
        let tables = in_netns(netns, &["nft", "list", "tables"]);
        for family in ["netdev", "inet"] {
            assert!(
                tables.contains(&format!(
                    "table {family} {}",
                    sluice_floor::ingress::table_prefix(IFACE)
                )),
                "{tables}"
            );
        }
        // Only the launcher's packet socket is bound there; the kernel has
        // no address of any kind in it.
        let packet = in_netns(netns, &["cat", "/proc/net/packet"]);
        assert_eq!(packet.lines().count(), 2, "{packet}");
        let addrs = in_netns(netns, &["ip", "-o", "addr"]);
        assert!(addrs.trim().is_empty(), "{addrs}");
        let inode = made.namespace.inode();
        let want = format!("net:[{inode}]");
        let held = || {
            std::fs::read_dir("/proc/self/fd")
                .unwrap()
                .flatten()
                .any(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy() == want))
        };
        assert!(held());
        drop(made);
        assert!(!held(), "the namespace is still held after the drop");
    }
}

//! `sluice run --network stream|dgram|tap`: how the guest's frames travel
//! between QEMU and the gateway (docs/launcher.md "Network modes").
//!
//! * `stream`: a `socketpair(AF_UNIX, SOCK_STREAM)`; QEMU `-netdev stream`
//!   on one end (`addr.type=fd`), the gateway `--fd N` on the other. Each
//!   frame behind a 4-byte length.
//! * `dgram`: a `socketpair(AF_UNIX, SOCK_DGRAM)`; QEMU `-netdev dgram`
//!   (`local.type=fd`), the gateway `--fd N --dgram`. One frame per
//!   datagram. Pre-connected: no socket path exists, in the jails or on the
//!   host.
//! * `tap`: a fresh network namespace holding one TAP, behind the ingress
//!   floor ([`tap`]); QEMU `-netdev tap,fd=N` on the TAP's queue (it stays
//!   in its own empty namespace with no capability), the gateway `--fd N
//!   --packet` on a packet socket bound to the TAP. The stand-in for a
//!   VMM that holds a TAP (Firecracker) behind `sluice-gateway --attach`.
//!   Rootless, the namespace belongs to a user namespace of the caller's,
//!   made by a short-lived helper process ([`tap_helper`]).
//!
//! In every mode the launcher holds no name anything else can find: the
//! socketpairs and the namespace vanish with the last descriptor, so a run
//! killed by SIGKILL leaves nothing to remove.

pub(crate) mod tap;
pub mod tap_helper;

pub use tap_helper::helper_main_if_requested as tap_helper_main_if_requested;

use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixDatagram, UnixStream};

use anyhow::Context as _;
use sluice_gateway::args::GatewayArgs;

use crate::jail::Layer;

/// How the guest's link reaches the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NetworkMode {
    /// A unix stream socketpair (QEMU `-netdev stream`).
    Stream,
    /// A unix datagram socketpair, one frame per datagram (QEMU `-netdev dgram`).
    Dgram,
    /// A TAP in a network namespace of the run's own, behind an nftables floor
    /// (QEMU `-netdev tap`; the gateway reads it with a packet socket).
    /// Rootless, that namespace belongs to a user namespace of the caller's.
    Tap,
}

impl NetworkMode {
    /// The mode's name, as `--network` takes it and `--json` reports it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Stream => "stream",
            Self::Dgram => "dgram",
            Self::Tap => "tap",
        }
    }

    /// Whether this host can give a run this mode, and if not, why (one line).
    pub(crate) fn unavailable(self) -> Option<String> {
        match self {
            Self::Stream | Self::Dgram => None,
            Self::Tap => tap::unavailable(),
        }
    }
}

/// The modes in order of preference when `--network` is not given,
/// measured: docs/benchmarks.md "Network modes, under QEMU"
/// (`benches/network-modes.sh`: whole `sluice run`s, 200 MB each way,
/// three alternating rounds) puts the three within about 1% of each other
/// (the guest's CPU, not the link, bounds them under TCG), so the tie goes
/// to stream, which needs no root, no namespace and no nftables; then tap
/// and dgram as the harness figures of "Transports (issue 13)" order them
/// at the gateway's MTU (65520: datagram behind on downloads, 1.90 against
/// 4.32 and 4.00 Gbit/s with 4 streams).
pub(crate) const PREFERENCE: [NetworkMode; 3] =
    [NetworkMode::Stream, NetworkMode::Tap, NetworkMode::Dgram];

/// The mode of a run: `requested` if given (refused in one line where the
/// host cannot give it), else the first of [`PREFERENCE`] this host can
/// give, with a line on stderr for each preferred mode skipped.
///
/// # Errors
/// The requested mode is unavailable here.
pub(crate) fn choose(requested: Option<NetworkMode>) -> anyhow::Result<NetworkMode> {
    if let Some(mode) = requested {
        return match mode.unavailable() {
            None => Ok(mode),
            Some(why) => anyhow::bail!("--network {}: {why}", mode.name()),
        };
    }
    for mode in PREFERENCE {
        match mode.unavailable() {
            None => return Ok(mode),
            Some(why) => eprintln!(
                "sluice: network mode {} unavailable here ({why}); trying the next",
                mode.name()
            ),
        }
    }
    // Stream never fails the check above; this is only reached if that changes.
    Ok(NetworkMode::Stream)
}

/// The mode a run without `--network` gets here, without a word on
/// stderr (for `sluice doctor`).
pub(crate) fn choose_quietly() -> Option<NetworkMode> {
    PREFERENCE.into_iter().find(|m| m.unavailable().is_none())
}

/// The guest's link for one run: QEMU's end, the gateway's end, and (tap)
/// the namespace that holds the TAP for as long as the run lasts.
#[derive(Debug)]
pub(crate) struct GuestNetwork {
    /// QEMU's end: a socketpair end, or the TAP's queue. Drop the
    /// launcher's copy once QEMU has it (a stream gateway sees the guest's
    /// end close only when no copy is left).
    pub(crate) qemu: OwnedFd,
    /// The gateway's end: the other socketpair end, or the packet socket.
    pub(crate) gateway: OwnedFd,
    /// What the run keeps until it ends.
    pub(crate) held: HeldNetwork,
}

/// What a run keeps of its link until it ends: the mode and (tap) the
/// namespace. Dropping it closes the launcher's hold on the namespace.
#[derive(Debug)]
pub(crate) struct HeldNetwork {
    mode: NetworkMode,
    tap: Option<tap::TapNamespace>,
}

impl GuestNetwork {
    /// Makes the link for `mode`. `mtu` is the gateway's (the TAP gets it);
    /// `allow_missing` may name `nftables` (a tap run then goes on, with a
    /// warning, when the floor cannot be installed).
    ///
    /// # Errors
    /// A socketpair, the namespace, the TAP, the packet socket or the floor
    /// could not be made; nothing is left behind.
    pub(crate) fn open(
        mode: NetworkMode,
        mtu: u16,
        allow_missing: &std::collections::BTreeSet<Layer>,
    ) -> anyhow::Result<Self> {
        let (qemu, gateway, tap) = match mode {
            NetworkMode::Stream => {
                let (g, q) = UnixStream::pair().context("socketpair")?;
                (OwnedFd::from(q), OwnedFd::from(g), None)
            }
            NetworkMode::Dgram => {
                let (g, q) = UnixDatagram::pair().context("socketpair")?;
                (OwnedFd::from(q), OwnedFd::from(g), None)
            }
            NetworkMode::Tap => {
                let allow = allow_missing.contains(&Layer::Nftables);
                let made = tap::TapNamespace::create(u32::from(mtu), allow)?;
                (made.queue, made.packet, Some(made.namespace))
            }
        };
        Ok(Self {
            qemu,
            gateway,
            held: HeldNetwork { mode, tap },
        })
    }
}

impl HeldNetwork {
    /// The mode.
    pub(crate) fn mode(&self) -> NetworkMode {
        self.mode
    }

    /// Sets the gateway's transport flags for its end at `fd`.
    pub(crate) fn gateway_args(&self, args: &mut GatewayArgs, fd: i32) {
        args.fd = Some(fd);
        args.socket = None;
        args.dgram = (self.mode == NetworkMode::Dgram).then_some(None);
        args.packet = self.mode == NetworkMode::Tap;
    }

    /// What `--json` says of the link: the mode, and for tap the
    /// namespace's inode, the TAP's name and the floor.
    pub(crate) fn summary(&self) -> serde_json::Value {
        let mut v = serde_json::json!({ "mode": self.mode.name() });
        if let Some(t) = &self.tap {
            v["netns_inode"] = t.inode().into();
            v["iface"] = tap::IFACE.into();
            v["floor"] = t.floor().into();
        }
        v
    }
}

/// QEMU's `-netdev` value for `mode`, with its end of the link at `fd`.
pub(crate) fn qemu_netdev(mode: NetworkMode, fd: i32) -> String {
    match mode {
        NetworkMode::Stream => format!("stream,id=net0,server=off,addr.type=fd,addr.str={fd}"),
        NetworkMode::Dgram => format!("dgram,id=net0,local.type=fd,local.str={fd}"),
        // The queue was opened by the launcher: QEMU needs neither
        // /dev/net/tun nor the namespace nor a capability.
        NetworkMode::Tap => format!("tap,id=net0,fd={fd}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_mode_gives_qemu_and_the_gateway_matching_transports() {
        assert_eq!(
            qemu_netdev(NetworkMode::Dgram, 3),
            "dgram,id=net0,local.type=fd,local.str=3"
        );
        assert_eq!(qemu_netdev(NetworkMode::Tap, 3), "tap,id=net0,fd=3");
        assert!(qemu_netdev(NetworkMode::Stream, 3).starts_with("stream,"));
        for mode in [NetworkMode::Stream, NetworkMode::Dgram] {
            let net = GuestNetwork::open(mode, 65520, &Default::default()).unwrap();
            let mut args = GatewayArgs::with_fd(9);
            net.held.gateway_args(&mut args, 3);
            assert_eq!(args.fd, Some(3));
            assert_eq!(args.dgram, (mode == NetworkMode::Dgram).then_some(None));
            assert!(!args.packet);
            // The gateway's end and QEMU's are one socketpair of that type.
            let ty = rustix::net::sockopt::socket_type(&net.gateway).unwrap();
            let want = if mode == NetworkMode::Stream {
                rustix::net::SocketType::STREAM
            } else {
                rustix::net::SocketType::DGRAM
            };
            assert_eq!(ty, want);
            assert_eq!(net.held.summary()["mode"], mode.name());
            assert_eq!(net.held.mode(), mode);
        }
    }

    #[test]
    fn stream_and_dgram_are_always_available_and_the_default_is_the_first_available() {
        assert_eq!(NetworkMode::Stream.unavailable(), None);
        assert_eq!(NetworkMode::Dgram.unavailable(), None);
        let first = PREFERENCE
            .iter()
            .copied()
            .find(|m| m.unavailable().is_none())
            .unwrap();
        assert_eq!(choose(None).unwrap(), first);
        assert_eq!(
            choose(Some(NetworkMode::Dgram)).unwrap(),
            NetworkMode::Dgram
        );
    }
}

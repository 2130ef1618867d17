//! The smoltcp side of a session: the device that hands smoltcp one guest
//! frame at a time and collects its output in the session's [`TxBatch`],
//! the interface (the gateway's address, `any_ip`, a default route), and
//! the calls that feed it a frame or let it emit.

use std::net::Ipv4Addr;
use std::time::Instant;

use smoltcp::iface::{Config as IfaceConfig, Interface};
use smoltcp::phy::{Device, DeviceCapabilities, Medium, RxToken, TxToken};
use smoltcp::time::Instant as SmolInstant;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpAddress, IpCidr};

use crate::config::Config;
use crate::frames::TxBatch;
use crate::session::Datapath;

/// Output queued for the guest beyond which the stack stops emitting and guest input pauses.
pub(crate) const TX_HIGH_WATER: usize = 1024 * 1024;

/// The smoltcp device for one step: at most one received frame, and the output batch.
struct GuestDevice<'a> {
    rx: Option<&'a [u8]>,
    tx: &'a mut TxBatch,
    mtu: usize,
}

struct GuestRx<'a>(&'a [u8]);
struct GuestTx<'a>(&'a mut TxBatch);

impl RxToken for GuestRx<'_> {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(self.0)
    }
}

impl TxToken for GuestTx<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        self.0.push_with(len, f)
    }
}

impl Device for GuestDevice<'_> {
    type RxToken<'b>
        = GuestRx<'b>
    where
        Self: 'b;
    type TxToken<'b>
        = GuestTx<'b>
    where
        Self: 'b;

    fn receive(&mut self, _t: SmolInstant) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        let frame = self.rx.take()?;
        Some((GuestRx(frame), GuestTx(&mut *self.tx)))
    }

    fn transmit(&mut self, _t: SmolInstant) -> Option<Self::TxToken<'_>> {
        (self.tx.queued() < TX_HIGH_WATER).then_some(GuestTx(&mut *self.tx))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = self.mtu + 14;
        caps.max_burst_size = None;
        caps
    }
}

pub(crate) fn ip4(a: Ipv4Addr) -> IpAddress {
    IpAddress::Ipv4(a)
}

/// A fresh interface for one guest session: the gateway's MAC and address,
/// a default route via itself, and `any_ip` (it answers for every
/// destination a socket listens on).
pub(crate) fn interface(cfg: &Config, tx: &mut TxBatch, epoch: Instant) -> Interface {
    let mut dev = GuestDevice {
        rx: None,
        tx,
        mtu: usize::from(cfg.mtu),
    };
    let mut icfg = IfaceConfig::new(HardwareAddress::Ethernet(EthernetAddress(cfg.gateway_mac)));
    icfg.random_seed = u64::from(std::process::id()) ^ u64::from(epoch.elapsed().subsec_nanos());
    let mut iface = Interface::new(icfg, &mut dev, SmolInstant::from_micros(0));
    iface.update_ip_addrs(|addrs| {
        let _ = addrs.push(IpCidr::new(ip4(cfg.gateway_ip), cfg.subnet.prefix_len()));
    });
    let _ = iface.routes_mut().add_default_ipv4_route(cfg.gateway_ip);
    iface.set_any_ip(true);
    iface
}

impl Datapath {
    pub(crate) fn now(&self) -> SmolInstant {
        SmolInstant::from_micros(
            i64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(i64::MAX),
        )
    }

    pub(crate) fn ingress(&mut self, frame: &[u8]) {
        self.unpark_for_frame(frame);
        let now = self.now();
        let mut dev = GuestDevice {
            rx: Some(frame),
            tx: &mut self.tx,
            mtu: usize::from(self.cfg.mtu),
        };
        let _ = self
            .iface
            .poll_ingress_single(now, &mut dev, &mut self.sockets);
    }

    pub(crate) fn egress(&mut self) {
        let now = self.now();
        let mut dev = GuestDevice {
            rx: None,
            tx: &mut self.tx,
            mtu: usize::from(self.cfg.mtu),
        };
        self.iface.poll_maintenance(now);
        for _ in 0..256 {
            if matches!(
                self.iface.poll_egress(now, &mut dev, &mut self.sockets),
                smoltcp::iface::PollResult::None
            ) {
                break;
            }
        }
    }
}

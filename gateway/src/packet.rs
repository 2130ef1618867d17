//! Classification of guest frames before smoltcp sees them, and the few
//! frames the gateway crafts itself (UDP replies, RSTs for refused SYNs).
//!
//! [`classify`] reads a frame through smoltcp's checked `Packet` views (after
//! `new_checked` no accessor panics) and decides where it goes: to the stack
//! (ARP and ICMP for the gateway, TCP), to a local service (DHCP, DNS), to the
//! SYN decision, to the UDP decision, or dropped with a [`DropReason`]. No
//! input makes it panic.

use std::net::{Ipv4Addr, SocketAddrV4};

use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{
    ArpOperation, ArpPacket, EthernetAddress, EthernetFrame, EthernetProtocol, Icmpv4Message,
    Icmpv4Packet, IpAddress, IpProtocol, Ipv4Packet, Ipv4Repr, TcpControl, TcpPacket, TcpRepr,
    TcpSeqNumber, UdpPacket, UdpRepr,
};

use crate::frames::TxBatch;

const ETH_HEADER: usize = 14;
const IPV4_HEADER: usize = 20;
const UDP_HEADER: usize = 8;
const TCP_HEADER: usize = 20;

/// Why a guest frame was dropped (counted per reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
pub enum DropReason {
    /// Truncated or inconsistent headers, bad IPv4 checksum.
    Malformed,
    /// IPv6 is off (no parity; see docs/gateway.md).
    Ipv6,
    /// An EtherType the gateway does not speak.
    EtherType,
    /// ARP not asking for the gateway address, or not from the guest.
    Arp,
    /// ICMP not addressed to the gateway.
    Icmp,
    /// Source MAC or IP is not the guest's.
    Spoofed,
    /// IPv4 fragments are not reassembled.
    Fragment,
    /// IP protocols other than TCP, UDP and ICMP.
    Protocol,
}

impl DropReason {
    /// Index into [`DropReason::ALL`] for counters.
    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// Every reason, in index order.
    pub(crate) const ALL: [DropReason; 8] = [
        Self::Malformed,
        Self::Ipv6,
        Self::EtherType,
        Self::Arp,
        Self::Icmp,
        Self::Spoofed,
        Self::Fragment,
        Self::Protocol,
    ];

    /// The audit reason a drop is recorded under, for the drops the schema
    /// names (`spoofed_source`, `ipv6_blocked`, `icmp_blocked`); `None` for
    /// the others (malformed frames, other EtherTypes, foreign ARP,
    /// fragments, other IP protocols), which only count.
    pub(crate) fn audit_reason(self) -> Option<sluice_policy::Reason> {
        use sluice_policy::Reason;
        match self {
            Self::Spoofed => Some(Reason::SpoofedSource),
            Self::Ipv6 => Some(Reason::Ipv6Blocked),
            Self::Icmp => Some(Reason::IcmpBlocked),
            Self::Malformed | Self::EtherType | Self::Arp | Self::Fragment | Self::Protocol => None,
        }
    }

    /// Counter name.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::Ipv6 => "ipv6",
            Self::EtherType => "ethertype",
            Self::Arp => "arp",
            Self::Icmp => "icmp",
            Self::Spoofed => "spoofed",
            Self::Fragment => "fragment",
            Self::Protocol => "protocol",
        }
    }
}

/// Where a guest frame goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
pub enum Class {
    /// Hand to smoltcp (ARP/ICMP for the gateway, TCP segments that are not new SYNs).
    Stack,
    /// A TCP SYN without ACK: a new connection to decide.
    TcpSyn {
        /// Guest endpoint.
        src: SocketAddrV4,
        /// Destination.
        dst: SocketAddrV4,
        /// The SYN's sequence number (for a RST).
        seq: u32,
    },
    /// A DHCP request (UDP to port 67); payload is `frame[range]`.
    Dhcp {
        /// Payload start.
        start: usize,
        /// Payload end.
        end: usize,
    },
    /// An ICMP echo request to the gateway (answered without smoltcp).
    IcmpEcho,
    /// Any other UDP datagram; payload is `frame[start..end]`.
    Udp {
        /// Guest endpoint.
        src: SocketAddrV4,
        /// Destination.
        dst: SocketAddrV4,
        /// Payload start.
        start: usize,
        /// Payload end.
        end: usize,
    },
    /// Dropped.
    Drop(DropReason),
}

/// What [`classify`] needs to know about the virtual network.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
pub struct Addresses {
    /// The gateway's address.
    pub gateway_ip: Ipv4Addr,
    /// The guest's address.
    pub guest_ip: Ipv4Addr,
    /// The guest's MAC once known; then frames from other MACs are dropped.
    pub guest_mac: Option<[u8; 6]>,
}

/// Classifies one Ethernet frame from the guest.
#[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
pub fn classify(frame: &[u8], a: &Addresses) -> Class {
    let Ok(eth) = EthernetFrame::new_checked(frame) else {
        return Class::Drop(DropReason::Malformed);
    };
    if a.guest_mac.is_some_and(|m| eth.src_addr().0 != m) {
        return Class::Drop(DropReason::Spoofed);
    }
    match eth.ethertype() {
        EthernetProtocol::Arp => classify_arp(eth.payload(), a),
        EthernetProtocol::Ipv4 => classify_ipv4(eth.payload(), a),
        EthernetProtocol::Ipv6 => Class::Drop(DropReason::Ipv6),
        _ => Class::Drop(DropReason::EtherType),
    }
}

fn classify_arp(payload: &[u8], a: &Addresses) -> Class {
    let Ok(arp) = ArpPacket::new_checked(payload) else {
        return Class::Drop(DropReason::Malformed);
    };
    if arp.protocol_len() != 4 || arp.hardware_len() != 6 {
        return Class::Drop(DropReason::Malformed);
    }
    let sender = Ipv4Addr::from(<[u8; 4]>::try_from(arp.source_protocol_addr()).unwrap_or([0; 4]));
    let target = Ipv4Addr::from(<[u8; 4]>::try_from(arp.target_protocol_addr()).unwrap_or([0; 4]));
    if sender != a.guest_ip && !sender.is_unspecified() {
        return Class::Drop(DropReason::Spoofed);
    }
    match arp.operation() {
        // Only the gateway's own address is answered (any_ip would answer all).
        ArpOperation::Request if target == a.gateway_ip => Class::Stack,
        // Replies to the stack's own requests for the guest.
        ArpOperation::Reply if sender == a.guest_ip => Class::Stack,
        _ => Class::Drop(DropReason::Arp),
    }
}

fn classify_ipv4(payload: &[u8], a: &Addresses) -> Class {
    let Ok(ip) = Ipv4Packet::new_checked(payload) else {
        return Class::Drop(DropReason::Malformed);
    };
    if !ip.verify_checksum() {
        return Class::Drop(DropReason::Malformed);
    }
    if ip.more_frags() || ip.frag_offset() != 0 {
        return Class::Drop(DropReason::Fragment);
    }
    let src = ip.src_addr();
    let dst = ip.dst_addr();
    let ip_off = ETH_HEADER + usize::from(ip.header_len());
    match ip.next_header() {
        IpProtocol::Udp => {
            let Ok(udp) = UdpPacket::new_checked(ip.payload()) else {
                return Class::Drop(DropReason::Malformed);
            };
            let start = ip_off + UDP_HEADER;
            let end = ip_off + usize::from(udp.len());
            if udp.dst_port() == crate::dhcp::SERVER_PORT
                && udp.src_port() == crate::dhcp::CLIENT_PORT
            {
                if src == a.guest_ip || src.is_unspecified() {
                    return Class::Dhcp { start, end };
                }
                return Class::Drop(DropReason::Spoofed);
            }
            if src != a.guest_ip {
                return Class::Drop(DropReason::Spoofed);
            }
            Class::Udp {
                src: SocketAddrV4::new(src, udp.src_port()),
                dst: SocketAddrV4::new(dst, udp.dst_port()),
                start,
                end,
            }
        }
        _ if src != a.guest_ip => Class::Drop(DropReason::Spoofed),
        IpProtocol::Tcp => {
            let Ok(tcp) = TcpPacket::new_checked(ip.payload()) else {
                return Class::Drop(DropReason::Malformed);
            };
            if tcp.syn() && !tcp.ack() && !tcp.rst() {
                return Class::TcpSyn {
                    src: SocketAddrV4::new(src, tcp.src_port()),
                    dst: SocketAddrV4::new(dst, tcp.dst_port()),
                    seq: tcp.seq_number().0 as u32,
                };
            }
            Class::Stack
        }
        IpProtocol::Icmp if dst == a.gateway_ip => match Icmpv4Packet::new_checked(ip.payload()) {
            Ok(icmp) if icmp.msg_type() == Icmpv4Message::EchoRequest && icmp.verify_checksum() => {
                Class::IcmpEcho
            }
            Ok(_) => Class::Drop(DropReason::Icmp),
            Err(_) => Class::Drop(DropReason::Malformed),
        },
        IpProtocol::Icmp => Class::Drop(DropReason::Icmp),
        _ => Class::Drop(DropReason::Protocol),
    }
}

/// Appends an Ethernet/IPv4/UDP frame to `out`.
#[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
pub fn write_udp(
    out: &mut TxBatch,
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: SocketAddrV4,
    dst: SocketAddrV4,
    payload: &[u8],
) {
    let ip_repr = Ipv4Repr {
        src_addr: (*src.ip()),
        dst_addr: (*dst.ip()),
        next_header: IpProtocol::Udp,
        payload_len: UDP_HEADER + payload.len(),
        hop_limit: 64,
    };
    let len = ETH_HEADER + IPV4_HEADER + UDP_HEADER + payload.len();
    out.push_with(len, |buf| {
        let caps = ChecksumCapabilities::default();
        let mut eth = EthernetFrame::new_unchecked(&mut *buf);
        eth.set_src_addr(EthernetAddress(src_mac));
        eth.set_dst_addr(EthernetAddress(dst_mac));
        eth.set_ethertype(EthernetProtocol::Ipv4);
        let mut ip = Ipv4Packet::new_unchecked(eth.payload_mut());
        ip_repr.emit(&mut ip, &caps);
        let mut udp = UdpPacket::new_unchecked(ip.payload_mut());
        UdpRepr {
            src_port: src.port(),
            dst_port: dst.port(),
        }
        .emit(
            &mut udp,
            &IpAddress::Ipv4(ip_repr.src_addr),
            &IpAddress::Ipv4(ip_repr.dst_addr),
            payload.len(),
            |b| b.copy_from_slice(payload),
            &caps,
        );
    });
}

/// Appends the echo reply to an echo request `frame` already classified as
/// [`Class::IcmpEcho`]; nothing when the frame does not hold one.
#[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
pub fn write_echo_reply(out: &mut TxBatch, gateway_mac: [u8; 6], request: &[u8]) {
    let Ok(eth) = EthernetFrame::new_checked(request) else {
        return;
    };
    let Ok(ip) = Ipv4Packet::new_checked(eth.payload()) else {
        return;
    };
    let Ok(icmp) = Icmpv4Packet::new_checked(ip.payload()) else {
        return;
    };
    let (src_mac, src_ip, dst_ip) = (eth.src_addr(), ip.src_addr(), ip.dst_addr());
    let ip_repr = Ipv4Repr {
        src_addr: dst_ip,
        dst_addr: src_ip,
        next_header: IpProtocol::Icmp,
        payload_len: 8 + icmp.data().len(),
        hop_limit: 64,
    };
    let (ident, seq_no, data) = (icmp.echo_ident(), icmp.echo_seq_no(), icmp.data());
    out.push_with(ETH_HEADER + IPV4_HEADER + 8 + data.len(), |buf| {
        let caps = ChecksumCapabilities::default();
        let mut e = EthernetFrame::new_unchecked(&mut *buf);
        e.set_src_addr(EthernetAddress(gateway_mac));
        e.set_dst_addr(src_mac);
        e.set_ethertype(EthernetProtocol::Ipv4);
        let mut ipp = Ipv4Packet::new_unchecked(e.payload_mut());
        ip_repr.emit(&mut ipp, &caps);
        let mut reply = Icmpv4Packet::new_unchecked(ipp.payload_mut());
        reply.set_msg_type(Icmpv4Message::EchoReply);
        reply.set_msg_code(0);
        reply.set_echo_ident(ident);
        reply.set_echo_seq_no(seq_no);
        reply.data_mut().copy_from_slice(data);
        reply.fill_checksum();
    });
}

/// Appends a RST|ACK answering a SYN from `guest` to `dst` with sequence `seq`.
#[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
pub fn write_rst_for_syn(
    out: &mut TxBatch,
    gateway_mac: [u8; 6],
    guest_mac: [u8; 6],
    guest: SocketAddrV4,
    dst: SocketAddrV4,
    seq: u32,
) {
    let tcp = TcpRepr {
        src_port: dst.port(),
        dst_port: guest.port(),
        control: TcpControl::Rst,
        seq_number: TcpSeqNumber(0),
        ack_number: Some(TcpSeqNumber(seq.wrapping_add(1) as i32)),
        window_len: 0,
        window_scale: None,
        max_seg_size: None,
        sack_permitted: false,
        sack_ranges: [None; 3],
        timestamp: None,
        payload: &[],
    };
    let ip_repr = Ipv4Repr {
        src_addr: (*dst.ip()),
        dst_addr: (*guest.ip()),
        next_header: IpProtocol::Tcp,
        payload_len: TCP_HEADER,
        hop_limit: 64,
    };
    out.push_with(ETH_HEADER + IPV4_HEADER + TCP_HEADER, |buf| {
        let caps = ChecksumCapabilities::default();
        let mut eth = EthernetFrame::new_unchecked(&mut *buf);
        eth.set_src_addr(EthernetAddress(gateway_mac));
        eth.set_dst_addr(EthernetAddress(guest_mac));
        eth.set_ethertype(EthernetProtocol::Ipv4);
        let mut ip = Ipv4Packet::new_unchecked(eth.payload_mut());
        ip_repr.emit(&mut ip, &caps);
        let mut pkt = TcpPacket::new_unchecked(ip.payload_mut());
        tcp.emit(
            &mut pkt,
            &IpAddress::Ipv4(ip_repr.src_addr),
            &IpAddress::Ipv4(ip_repr.dst_addr),
            &caps,
        );
    });
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) const GUEST_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 1];
    pub(crate) const GW_MAC: [u8; 6] = [0x52, 0x55, 0x0a, 0, 2, 2];

    pub(crate) fn addrs() -> Addresses {
        Addresses {
            gateway_ip: Ipv4Addr::new(10, 0, 2, 2),
            guest_ip: Ipv4Addr::new(10, 0, 2, 15),
            guest_mac: None,
        }
    }

    /// A guest TCP frame with the given flags.
    pub(crate) fn tcp_frame(
        src: SocketAddrV4,
        dst: SocketAddrV4,
        control: TcpControl,
        seq: u32,
        ack: Option<u32>,
    ) -> Vec<u8> {
        tcp_segment(src, dst, control, seq, ack, &[])
    }

    /// A guest TCP segment carrying `payload`.
    pub(crate) fn tcp_segment(
        src: SocketAddrV4,
        dst: SocketAddrV4,
        control: TcpControl,
        seq: u32,
        ack: Option<u32>,
        payload: &[u8],
    ) -> Vec<u8> {
        let tcp = TcpRepr {
            src_port: src.port(),
            dst_port: dst.port(),
            control,
            seq_number: TcpSeqNumber(seq as i32),
            ack_number: ack.map(|a| TcpSeqNumber(a as i32)),
            window_len: 64240,
            window_scale: if control == TcpControl::Syn {
                Some(7)
            } else {
                None
            },
            max_seg_size: if control == TcpControl::Syn {
                Some(1460)
            } else {
                None
            },
            sack_permitted: false,
            sack_ranges: [None; 3],
            timestamp: None,
            payload,
        };
        let ip_repr = Ipv4Repr {
            src_addr: (*src.ip()),
            dst_addr: (*dst.ip()),
            next_header: IpProtocol::Tcp,
            payload_len: tcp.buffer_len(),
            hop_limit: 64,
        };
        let mut buf = vec![0u8; ETH_HEADER + IPV4_HEADER + tcp.buffer_len()];
        let caps = ChecksumCapabilities::default();
        let mut eth = EthernetFrame::new_unchecked(&mut buf[..]);
        eth.set_src_addr(EthernetAddress(GUEST_MAC));
        eth.set_dst_addr(EthernetAddress(GW_MAC));
        eth.set_ethertype(EthernetProtocol::Ipv4);
        let mut ip = Ipv4Packet::new_unchecked(eth.payload_mut());
        ip_repr.emit(&mut ip, &caps);
        let mut pkt = TcpPacket::new_unchecked(ip.payload_mut());
        tcp.emit(
            &mut pkt,
            &IpAddress::Ipv4(ip_repr.src_addr),
            &IpAddress::Ipv4(ip_repr.dst_addr),
            &caps,
        );
        buf
    }

    pub(crate) fn udp_frame(src: SocketAddrV4, dst: SocketAddrV4, payload: &[u8]) -> Vec<u8> {
        let mut b = TxBatch::default();
        write_udp(&mut b, GUEST_MAC, GW_MAC, src, dst, payload);
        b.unwritten()[4..].to_vec()
    }

    pub(crate) fn arp_request(sender: Ipv4Addr, target: Ipv4Addr) -> Vec<u8> {
        use smoltcp::wire::{ArpHardware, ArpRepr};
        let repr = ArpRepr::EthernetIpv4 {
            operation: ArpOperation::Request,
            source_hardware_addr: EthernetAddress(GUEST_MAC),
            source_protocol_addr: sender,
            target_hardware_addr: EthernetAddress([0; 6]),
            target_protocol_addr: target,
        };
        let _ = ArpHardware::Ethernet;
        let mut buf = vec![0u8; ETH_HEADER + repr.buffer_len()];
        let mut eth = EthernetFrame::new_unchecked(&mut buf[..]);
        eth.set_src_addr(EthernetAddress(GUEST_MAC));
        eth.set_dst_addr(EthernetAddress::BROADCAST);
        eth.set_ethertype(EthernetProtocol::Arp);
        repr.emit(&mut ArpPacket::new_unchecked(eth.payload_mut()));
        buf
    }

    #[test]
    fn syn_and_segments_are_told_apart() {
        let a = addrs();
        let g = SocketAddrV4::new(a.guest_ip, 40000);
        let d = SocketAddrV4::new(Ipv4Addr::new(198, 51, 100, 1), 443);
        assert_eq!(
            classify(&tcp_frame(g, d, TcpControl::Syn, 5, None), &a),
            Class::TcpSyn {
                src: g,
                dst: d,
                seq: 5
            }
        );
        assert_eq!(
            classify(&tcp_frame(g, d, TcpControl::None, 6, Some(1)), &a),
            Class::Stack
        );
        let spoof = SocketAddrV4::new(Ipv4Addr::new(10, 0, 2, 99), 1);
        assert_eq!(
            classify(&tcp_frame(spoof, d, TcpControl::Syn, 5, None), &a),
            Class::Drop(DropReason::Spoofed)
        );
    }

    #[test]
    fn arp_only_for_the_gateway_address() {
        let a = addrs();
        assert_eq!(
            classify(&arp_request(a.guest_ip, a.gateway_ip), &a),
            Class::Stack
        );
        assert_eq!(
            classify(&arp_request(a.guest_ip, Ipv4Addr::new(10, 0, 2, 3)), &a),
            Class::Drop(DropReason::Arp)
        );
        assert_eq!(
            classify(&arp_request(a.guest_ip, Ipv4Addr::new(8, 8, 8, 8)), &a),
            Class::Drop(DropReason::Arp)
        );
        assert_eq!(
            classify(&arp_request(Ipv4Addr::new(10, 0, 2, 7), a.gateway_ip), &a),
            Class::Drop(DropReason::Spoofed)
        );
    }

    #[test]
    fn udp_dhcp_and_mac_lock() {
        let mut a = addrs();
        let dhcp = udp_frame(
            SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 68),
            SocketAddrV4::new(Ipv4Addr::BROADCAST, 67),
            b"x",
        );
        assert!(matches!(classify(&dhcp, &a), Class::Dhcp { .. }));
        let g = SocketAddrV4::new(a.guest_ip, 5000);
        let dns = udp_frame(g, SocketAddrV4::new(a.gateway_ip, 53), b"query");
        match classify(&dns, &a) {
            Class::Udp { start, end, .. } => assert_eq!(&dns[start..end], b"query"),
            other => panic!("{other:?}"),
        }
        a.guest_mac = Some([9; 6]);
        assert_eq!(classify(&dns, &a), Class::Drop(DropReason::Spoofed));
    }

    #[test]
    fn garbage_and_ipv6_are_dropped() {
        let a = addrs();
        assert_eq!(classify(&[0u8; 5], &a), Class::Drop(DropReason::Malformed));
        let mut v6 = vec![0u8; 60];
        v6[12] = 0x86;
        v6[13] = 0xdd;
        assert_eq!(classify(&v6, &a), Class::Drop(DropReason::Ipv6));
        let mut bad_ip = vec![0u8; 40];
        bad_ip[12] = 0x08;
        bad_ip[14] = 0x45;
        assert_eq!(classify(&bad_ip, &a), Class::Drop(DropReason::Malformed));
        // Every truncation of a valid frame classifies without panicking.
        let f = tcp_frame(
            SocketAddrV4::new(a.guest_ip, 1),
            SocketAddrV4::new(a.gateway_ip, 2),
            TcpControl::Syn,
            1,
            None,
        );
        for n in 0..f.len() {
            let _ = classify(&f[..n], &a);
        }
    }
}

//! Fuzz the classification of guest frames before smoltcp
//! (`sluice_gateway::packet::classify`), and the frames the gateway crafts
//! from a classified frame (echo reply, RST for a refused SYN).
//!
//! Input: one Ethernet frame. Invariants beyond "no panic": classification is
//! the same with and without a known guest MAC unless the frame is then
//! dropped as spoofed; payload ranges lie inside the frame; UDP/DHCP are only
//! reported for IPv4 UDP, SYNs only for TCP from the guest's address; an echo
//! reply and a RST built from the frame are well-formed IPv4 with valid
//! checksums, addressed back to the sender.

use std::net::Ipv4Addr;

use sluice_gateway::frames::TxBatch;
use sluice_gateway::packet::{self, Addresses, Class, DropReason};
use smoltcp::wire::{
    EthernetFrame, EthernetProtocol, Icmpv4Packet, IpProtocol, Ipv4Packet, TcpPacket,
};

const GATEWAY_MAC: [u8; 6] = [0x52, 0x55, 0x0a, 0x00, 0x02, 0x02];
const GUEST_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 15);

/// The frames in `tx`, without their length prefixes.
fn frames(tx: &TxBatch) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut rest = tx.unwritten();
    while let Some(p) = rest.get(..4) {
        let len = u32::from_be_bytes([p[0], p[1], p[2], p[3]]) as usize;
        out.push(rest[4..4 + len].to_vec());
        rest = &rest[4 + len..];
    }
    out
}

/// The IPv4 packet of a crafted frame, checked.
fn ipv4(frame: &[u8]) -> Ipv4Packet<&[u8]> {
    let eth = EthernetFrame::new_checked(frame).expect("crafted Ethernet");
    assert_eq!(eth.ethertype(), EthernetProtocol::Ipv4);
    let ip = Ipv4Packet::new_checked(&frame[14..]).expect("crafted IPv4");
    assert!(ip.verify_checksum(), "crafted IPv4 checksum");
    ip
}

/// One fuzz input (the libFuzzer target and the corpus replay call this).
pub fn run(data: &[u8]) {
    let mut a = Addresses {
        gateway_ip: Ipv4Addr::new(10, 0, 2, 2),
        guest_ip: GUEST_IP,
        guest_mac: None,
    };
    let open = packet::classify(data, &a);
    if let Some(mac) = data.get(6..12) {
        a.guest_mac = Some(<[u8; 6]>::try_from(mac).unwrap_or([0; 6]));
        // The frame's own MAC is the guest's: same answer.
        assert_eq!(packet::classify(data, &a), open);
        a.guest_mac = Some([2, 0, 0, 0, 0, 1]);
        let other = packet::classify(data, &a);
        if data.get(6..12) != Some(&[2, 0, 0, 0, 0, 1][..]) {
            assert!(
                matches!(
                    other,
                    Class::Drop(DropReason::Spoofed | DropReason::Malformed)
                ),
                "{other:?}"
            );
        }
    }
    match open {
        Class::Dhcp { start, end } | Class::Udp { start, end, .. } => {
            assert!(start <= end && data.get(start..end).is_some(), "{open:?}");
            let ip = Ipv4Packet::new_checked(&data[14..]).expect("classified as IPv4");
            assert_eq!(ip.next_header(), IpProtocol::Udp);
        }
        Class::TcpSyn { src, dst, seq } => {
            assert_eq!(*src.ip(), GUEST_IP);
            let mut tx = TxBatch::default();
            let mac = <[u8; 6]>::try_from(&data[6..12]).unwrap_or([0; 6]);
            packet::write_rst_for_syn(&mut tx, GATEWAY_MAC, mac, src, dst, seq);
            for f in frames(&tx) {
                let ip = ipv4(&f);
                assert_eq!((ip.src_addr(), ip.dst_addr()), (*dst.ip(), *src.ip()));
                let tcp = TcpPacket::new_checked(ip.payload()).expect("crafted TCP");
                assert!(tcp.rst());
                assert_eq!(tcp.ack_number().0 as u32, seq.wrapping_add(1));
            }
        }
        Class::IcmpEcho => {
            let mut tx = TxBatch::default();
            packet::write_echo_reply(&mut tx, GATEWAY_MAC, data);
            let out = frames(&tx);
            assert_eq!(out.len(), 1, "no echo reply");
            let ip = ipv4(&out[0]);
            assert_eq!(ip.dst_addr(), GUEST_IP);
            let icmp = Icmpv4Packet::new_checked(ip.payload()).expect("crafted ICMP");
            assert!(icmp.verify_checksum(), "echo reply checksum");
        }
        Class::Stack | Class::Drop(_) => {}
    }
}

//! Fuzz the gateway's DHCP server (`sluice_gateway::dhcp::DhcpServer`) with
//! a sequence of guest payloads on one server (its state: the first MAC
//! served, the lease).
//!
//! Input: payloads back to back, each with a 2-byte big-endian length (a
//! short last one takes the rest). Invariants beyond "no panic": a payload
//! that does not decode as a DHCP message gets no reply; every reply decodes
//! as a BOOTREPLY with the request's xid and the client's MAC, is an OFFER,
//! ACK or NAK, carries the gateway as server id, offers only the guest's
//! address (or 0.0.0.0), and goes to the guest's address, broadcast or
//! (INFORM) the client's own address; the client MAC never changes once
//! set; `leased()` holds from the first ACK on.

use std::net::Ipv4Addr;

use dhcproto::v4::{DhcpOption, Message, MessageType, Opcode, OptionCode};
use dhcproto::{Decodable, Decoder};
use sluice_gateway::config::{Config, DEFAULT_SUBNET};
use sluice_gateway::dhcp::{self, DhcpServer};

/// One fuzz input (the libFuzzer target and the corpus replay call this).
pub fn run(data: &[u8]) {
    let Ok(cfg) = Config::new(DEFAULT_SUBNET, 1500) else {
        panic!("the default config is valid");
    };
    let mut server = DhcpServer::new(&cfg);
    let mut rest = data;
    let mut mac_seen: Option<[u8; 6]> = None;
    let mut acked = false;
    while !rest.is_empty() {
        let len = match rest {
            [a, b, ..] => usize::from(u16::from_be_bytes([*a, *b])),
            _ => rest.len(),
        };
        let body = rest.get(2..).unwrap_or_default();
        let payload = &body[..len.min(body.len())];
        rest = &body[payload.len()..];

        let req = dhcp::decode_request(payload);
        let reply = match server.handle(payload) {
            Ok(reply) => reply,
            Err(_) => {
                assert!(req.is_none(), "a decodable payload called malformed");
                None
            }
        };
        let Some(reply) = reply else {
            assert_eq!(server.client_mac(), mac_seen, "a MAC set without a reply");
            assert_eq!(server.leased(), acked);
            continue;
        };
        let Some(req) = req else {
            panic!("a reply to a payload that does not decode: {payload:?}");
        };
        assert_eq!(req.opcode(), Opcode::BootRequest);
        if let Some(m) = mac_seen {
            assert_eq!(reply.client_mac, m, "a reply to another client");
        }
        mac_seen = Some(reply.client_mac);
        assert_eq!(server.client_mac(), mac_seen);
        assert_eq!(&req.chaddr()[..6], &reply.client_mac);

        let Ok(resp) = Message::decode(&mut Decoder::new(&reply.payload)) else {
            panic!("the reply does not decode: {:?}", reply.payload);
        };
        assert_eq!(resp.opcode(), Opcode::BootReply);
        assert_eq!(resp.xid(), req.xid());
        assert_eq!(&resp.chaddr()[..6], &reply.client_mac);
        let kind = resp.opts().msg_type();
        assert!(
            matches!(
                kind,
                Some(MessageType::Offer | MessageType::Ack | MessageType::Nak)
            ),
            "{kind:?}"
        );
        assert_eq!(
            resp.opts().get(OptionCode::ServerIdentifier),
            Some(&DhcpOption::ServerIdentifier(cfg.gateway_ip))
        );
        assert!(
            resp.yiaddr() == cfg.guest_ip || resp.yiaddr().is_unspecified(),
            "offered {}",
            resp.yiaddr()
        );
        assert!(
            reply.dst_ip == cfg.guest_ip
                || reply.dst_ip == Ipv4Addr::BROADCAST
                || reply.dst_ip == req.ciaddr(),
            "sent to {}",
            reply.dst_ip
        );
        if kind == Some(MessageType::Ack) {
            acked = true;
        }
        assert_eq!(server.leased(), acked);
    }
}

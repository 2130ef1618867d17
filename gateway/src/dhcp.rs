//! The DHCP server for the one guest: DISCOVER -> OFFER, REQUEST -> ACK (or NAK
//! for another address), INFORM -> ACK. Options: subnet mask, router and DNS
//! (the gateway), MTU (option 26), lease, renewal and rebinding times, server id.
//!
//! The first client hardware address served becomes the guest's MAC; requests
//! from other MACs are ignored (one guest per gateway).

use std::net::Ipv4Addr;

use dhcproto::v4::{DhcpOption, Message, MessageType, Opcode, OptionCode};
use dhcproto::{Decodable, Decoder, Encodable, Encoder};

use crate::config::Config;

/// DHCP server port.
pub(crate) const SERVER_PORT: u16 = 67;
/// DHCP client port.
pub(crate) const CLIENT_PORT: u16 = 68;

/// A reply to send to the guest.
#[derive(Debug, PartialEq, Eq)]
#[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
pub struct DhcpReply {
    /// UDP payload.
    pub payload: Vec<u8>,
    /// The client's MAC (Ethernet destination).
    pub client_mac: [u8; 6],
    /// IP destination: the offered address, or broadcast when the client asked for it.
    pub dst_ip: Ipv4Addr,
}

/// The DHCP server state.
#[derive(Debug)]
#[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
pub struct DhcpServer {
    guest_ip: Ipv4Addr,
    gateway_ip: Ipv4Addr,
    mask: Ipv4Addr,
    mtu: u16,
    lease_secs: u32,
    client: Option<[u8; 6]>,
    leased: bool,
}

impl DhcpServer {
    /// A server handing out `cfg.guest_ip`.
    #[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
    pub fn new(cfg: &Config) -> Self {
        Self {
            guest_ip: cfg.guest_ip,
            gateway_ip: cfg.gateway_ip,
            mask: cfg.subnet.netmask(),
            mtu: cfg.mtu,
            lease_secs: u32::try_from(cfg.lease.as_secs()).unwrap_or(u32::MAX),
            client: None,
            leased: false,
        }
    }

    /// The guest's MAC once a client has been served.
    #[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
    pub fn client_mac(&self) -> Option<[u8; 6]> {
        self.client
    }

    /// Whether the guest has been ACKed a lease.
    #[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
    pub fn leased(&self) -> bool {
        self.leased
    }

    /// Handles one DHCP payload; `None` for anything that gets no answer
    /// (malformed, not a request, another client, unknown type).
    #[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
    pub fn handle(&mut self, payload: &[u8]) -> Option<DhcpReply> {
        let req = Message::decode(&mut Decoder::new(payload)).ok()?;
        if req.opcode() != Opcode::BootRequest || req.hlen() != 6 {
            return None;
        }
        let mac: [u8; 6] = req.chaddr().get(..6)?.try_into().ok()?;
        if self.client.is_some_and(|c| c != mac) {
            return None;
        }
        let reply_type = match req.opts().msg_type()? {
            MessageType::Discover => MessageType::Offer,
            MessageType::Request => {
                let requested = match req.opts().get(OptionCode::RequestedIpAddress) {
                    Some(DhcpOption::RequestedIpAddress(ip)) => *ip,
                    _ => req.ciaddr(),
                };
                if requested == self.guest_ip {
                    MessageType::Ack
                } else {
                    MessageType::Nak
                }
            }
            MessageType::Inform => MessageType::Ack,
            _ => return None,
        };
        self.client = Some(mac);
        if reply_type == MessageType::Ack {
            self.leased = true;
        }
        let is_inform = req.opts().msg_type() == Some(MessageType::Inform);
        let yiaddr = if reply_type == MessageType::Nak || is_inform {
            Ipv4Addr::UNSPECIFIED
        } else {
            self.guest_ip
        };
        let mut resp = Message::new_with_id(
            req.xid(),
            req.ciaddr(),
            yiaddr,
            self.gateway_ip,
            req.giaddr(),
            &mac,
        );
        resp.set_opcode(Opcode::BootReply).set_flags(req.flags());
        let opts = resp.opts_mut();
        opts.insert(DhcpOption::MessageType(reply_type));
        opts.insert(DhcpOption::ServerIdentifier(self.gateway_ip));
        if reply_type != MessageType::Nak {
            opts.insert(DhcpOption::SubnetMask(self.mask));
            opts.insert(DhcpOption::Router(vec![self.gateway_ip]));
            opts.insert(DhcpOption::DomainNameServer(vec![self.gateway_ip]));
            opts.insert(DhcpOption::InterfaceMtu(self.mtu));
            if !is_inform {
                opts.insert(DhcpOption::AddressLeaseTime(self.lease_secs));
                opts.insert(DhcpOption::Renewal(self.lease_secs / 2));
                opts.insert(DhcpOption::Rebinding(self.lease_secs / 8 * 7));
            }
        }
        let mut payload = Vec::with_capacity(320);
        resp.encode(&mut Encoder::new(&mut payload)).ok()?;
        let dst_ip =
            if req.flags().broadcast() || reply_type == MessageType::Nak || yiaddr.is_unspecified()
            {
                if is_inform && !req.ciaddr().is_unspecified() {
                    req.ciaddr()
                } else {
                    Ipv4Addr::BROADCAST
                }
            } else {
                yiaddr
            };
        Some(DhcpReply {
            payload,
            client_mac: mac,
            dst_ip,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DEFAULT_SUBNET;

    const MAC: [u8; 6] = [0x52, 0x54, 0, 0x12, 0x34, 0x56];

    fn request(kind: MessageType, mac: [u8; 6], requested: Option<Ipv4Addr>) -> Vec<u8> {
        let mut m = Message::new_with_id(
            7,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            &mac,
        );
        m.opts_mut().insert(DhcpOption::MessageType(kind));
        if let Some(ip) = requested {
            m.opts_mut().insert(DhcpOption::RequestedIpAddress(ip));
        }
        let mut out = Vec::new();
        m.encode(&mut Encoder::new(&mut out)).unwrap();
        out
    }

    fn decode(r: &DhcpReply) -> Message {
        Message::decode(&mut Decoder::new(&r.payload)).unwrap()
    }

    #[test]
    fn discover_request_ack_with_all_options() {
        let cfg = Config::new(DEFAULT_SUBNET, 1500).unwrap();
        let mut s = DhcpServer::new(&cfg);
        let offer = s
            .handle(&request(MessageType::Discover, MAC, None))
            .unwrap();
        let m = decode(&offer);
        assert_eq!(m.opts().msg_type(), Some(MessageType::Offer));
        assert_eq!(m.yiaddr(), Ipv4Addr::new(10, 0, 2, 15));
        assert_eq!(m.xid(), 7);
        assert!(!s.leased());
        let ack = s
            .handle(&request(
                MessageType::Request,
                MAC,
                Some(Ipv4Addr::new(10, 0, 2, 15)),
            ))
            .unwrap();
        let m = decode(&ack);
        assert_eq!(m.opts().msg_type(), Some(MessageType::Ack));
        assert_eq!(
            m.opts().get(OptionCode::InterfaceMtu),
            Some(&DhcpOption::InterfaceMtu(1500))
        );
        assert_eq!(
            m.opts().get(OptionCode::Router),
            Some(&DhcpOption::Router(vec![Ipv4Addr::new(10, 0, 2, 2)]))
        );
        assert_eq!(
            m.opts().get(OptionCode::DomainNameServer),
            Some(&DhcpOption::DomainNameServer(vec![Ipv4Addr::new(
                10, 0, 2, 2
            )]))
        );
        assert_eq!(
            m.opts().get(OptionCode::SubnetMask),
            Some(&DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 255, 0)))
        );
        assert_eq!(
            m.opts().get(OptionCode::AddressLeaseTime),
            Some(&DhcpOption::AddressLeaseTime(3600))
        );
        assert_eq!(ack.client_mac, MAC);
        assert!(s.leased());
        assert_eq!(s.client_mac(), Some(MAC));
    }

    #[test]
    fn wrong_address_is_naked_and_other_clients_ignored() {
        let cfg = Config::new(DEFAULT_SUBNET, 65520).unwrap();
        let mut s = DhcpServer::new(&cfg);
        let nak = s
            .handle(&request(
                MessageType::Request,
                MAC,
                Some(Ipv4Addr::new(10, 0, 2, 99)),
            ))
            .unwrap();
        assert_eq!(decode(&nak).opts().msg_type(), Some(MessageType::Nak));
        assert_eq!(nak.dst_ip, Ipv4Addr::BROADCAST);
        let other = [2, 0, 0, 0, 0, 1];
        assert!(
            s.handle(&request(MessageType::Discover, other, None))
                .is_none()
        );
        assert!(s.handle(b"garbage").is_none());
        assert!(s.handle(&[]).is_none());
    }
}

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

/// A DHCP payload that does not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
pub struct Malformed;

/// Where the options begin: the fixed BOOTP header (236 bytes) and the
/// magic cookie (RFC 2131 section 3).
const OPTIONS_AT: usize = 240;
/// The option codes that carry no length.
const PAD: u8 = 0;
const END: u8 = 255;

/// Decodes a guest's DHCP payload, refusing first any option whose length
/// `dhcproto` only `debug_assert!`s (a debug build would panic on the guest's
/// bytes; a release build would read past the option's stated length).
#[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
pub fn decode_request(payload: &[u8]) -> Option<Message> {
    if !asserted_lengths_hold(payload.get(OPTIONS_AT..).unwrap_or_default()) {
        return None;
    }
    Message::decode(&mut Decoder::new(payload)).ok()
}

/// Walks the options as `dhcproto` does (a run of consecutive options with
/// one code is one option, RFC 3396; pad and end take no length) and checks
/// the lengths it asserts. A truncated option is left to the decoder, which
/// refuses it.
fn asserted_lengths_hold(mut opts: &[u8]) -> bool {
    let mut run: Option<(u8, usize)> = None;
    let run_ok = |run: Option<(u8, usize)>| run.is_none_or(|(code, len)| length_ok(code, len));
    while let Some(&code) = opts.first() {
        match code {
            PAD => {
                if !run_ok(run.take()) {
                    return false;
                }
                opts = opts.get(1..).unwrap_or_default();
                continue;
            }
            END => break,
            _ => {}
        }
        let Some(&len) = opts.get(1) else { break };
        run = match run {
            Some((prev, total)) if prev == code => Some((code, total + usize::from(len))),
            other if !run_ok(other) => return false,
            _ => Some((code, usize::from(len))),
        };
        opts = opts.get(2 + usize::from(len)..).unwrap_or_default();
    }
    run_ok(run)
}

/// Whether an option of this code may have this (concatenated) length, for
/// the codes whose length `dhcproto` asserts; every other code passes.
fn length_ok(code: u8, len: usize) -> bool {
    match OptionCode::from(code) {
        OptionCode::RapidCommit => len == 0,
        OptionCode::ClientNetworkInterface => len == 3,
        OptionCode::BulkLeaseQueryBaseTime
        | OptionCode::BulkLeasQueryStartTimeOfState
        | OptionCode::BulkLeaseQueryQueryStartTime
        | OptionCode::BulkLeaseQueryQueryEndTime => len == 4,
        OptionCode::ClientFQDN => len >= 3,
        OptionCode::BulkLeaseQueryStatusCode => len >= 1,
        _ => true,
    }
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

    /// Handles one DHCP payload: `Err` for one that does not decode (the
    /// caller drops and counts it), `Ok(None)` for one that gets no answer
    /// (not a request, another client, an unknown type).
    #[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
    pub fn handle(&mut self, payload: &[u8]) -> Result<Option<DhcpReply>, Malformed> {
        let req = decode_request(payload).ok_or(Malformed)?;
        Ok(self.answer(&req))
    }

    fn answer(&mut self, req: &Message) -> Option<DhcpReply> {
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

    /// A DISCOVER with `raw` (options as bytes) first among its options.
    fn discover_with(raw: &[u8]) -> Vec<u8> {
        let mut m = request(MessageType::Discover, MAC, None);
        m.splice(OPTIONS_AT..OPTIONS_AT, raw.iter().copied());
        m
    }

    #[test]
    fn options_of_a_length_dhcproto_asserts_are_refused_not_decoded() {
        let cfg = Config::new(DEFAULT_SUBNET, 1500).unwrap();
        let base_time = u8::from(OptionCode::BulkLeaseQueryBaseTime);
        let rapid = u8::from(OptionCode::RapidCommit);
        let fqdn = u8::from(OptionCode::ClientFQDN);
        let status = u8::from(OptionCode::BulkLeaseQueryStatusCode);
        for raw in [
            vec![base_time, 2, 0, 0],
            vec![base_time, 0],
            vec![rapid, 1, 0],
            vec![fqdn, 2, 0, 0],
            vec![status, 0],
            // Two halves of one option (RFC 3396) sum to 6, not 4.
            vec![base_time, 2, 0, 0, base_time, 4, 0, 0, 0, 0],
            // A pad ends a run: the second option stands alone.
            vec![base_time, 4, 0, 0, 0, 0, PAD, base_time, 3, 0, 0, 0],
        ] {
            let mut s = DhcpServer::new(&cfg);
            assert_eq!(s.handle(&discover_with(&raw)), Err(Malformed), "{raw:?}");
            assert_eq!(s.client_mac(), None);
        }
        for raw in [
            vec![base_time, 4, 0, 0, 0, 1],
            vec![base_time, 2, 0, 0, base_time, 2, 0, 1],
            vec![rapid, 0],
            vec![fqdn, 6, 0, 0, 0, 1, b'a', 0],
        ] {
            let mut s = DhcpServer::new(&cfg);
            let offer = s.handle(&discover_with(&raw)).unwrap().unwrap();
            assert_eq!(decode(&offer).opts().msg_type(), Some(MessageType::Offer));
        }
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
            .unwrap()
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
            .unwrap()
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
            .unwrap()
            .unwrap();
        assert_eq!(decode(&nak).opts().msg_type(), Some(MessageType::Nak));
        assert_eq!(nak.dst_ip, Ipv4Addr::BROADCAST);
        let other = [2, 0, 0, 0, 0, 1];
        assert!(s.handle(&request(MessageType::Discover, other, None)) == Ok(None));
        assert_eq!(s.handle(b"garbage"), Err(Malformed));
        assert_eq!(s.handle(&[]), Err(Malformed));
    }
}

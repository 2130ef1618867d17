//! Published ports (`--publish`): host connections to a published TCP port
//! become smoltcp sockets connecting into the guest; datagrams to a
//! published UDP port reach the guest from a gateway-side port per host
//! peer, and the guest's replies to that port go back to the peer.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, SocketAddrV4};
use std::sync::Arc;

use smoltcp::socket::tcp;
use smoltcp::wire::{IpEndpoint, IpListenEndpoint};
use tokio::net::TcpStream;

use crate::decide::{FlowKey, Transport};
use crate::packet;
use crate::session::Datapath;
use crate::stack::ip4;
use crate::tcp::FlowState;

/// First local port for published-port connections into the guest.
const PUBLISH_PORT_BASE: u16 = 49152;
/// Host peers of published UDP ports remembered at once (for replies).
const MAX_UDP_PUBLISH_PEERS: usize = 1024;

/// The session's published-port state: the next gateway-side port and the
/// UDP peers' mappings.
#[derive(Debug)]
pub(crate) struct Published {
    next_port: u16,
    /// Published UDP: gateway-side port -> (host socket, host peer).
    udp: HashMap<u16, (Arc<tokio::net::UdpSocket>, SocketAddr)>,
    /// Published UDP: (host socket address, host peer) -> gateway-side port.
    udp_by_peer: HashMap<(SocketAddr, SocketAddr), u16>,
}

impl Default for Published {
    fn default() -> Self {
        Self {
            next_port: PUBLISH_PORT_BASE,
            udp: HashMap::new(),
            udp_by_peer: HashMap::new(),
        }
    }
}

impl Published {
    /// Where a guest datagram to gateway port `port` goes: the host socket
    /// and peer that port stands for, if it is a published UDP peer's.
    pub(crate) fn udp_peer(&self, port: u16) -> Option<&(Arc<tokio::net::UdpSocket>, SocketAddr)> {
        self.udp.get(&port)
    }
}

impl Datapath {
    pub(crate) fn on_publish_udp(
        &mut self,
        socket: Arc<tokio::net::UdpSocket>,
        peer: SocketAddr,
        guest_port: u16,
        data: &[u8],
    ) {
        let Ok(local) = socket.local_addr() else {
            return;
        };
        let port = match self.published.udp_by_peer.get(&(local, peer)) {
            Some(p) => *p,
            None => {
                if self.published.udp.len() >= MAX_UDP_PUBLISH_PEERS {
                    self.published.udp.clear();
                    self.published.udp_by_peer.clear();
                }
                let mut p = self.published.next_port;
                while self.published.udp.contains_key(&p) {
                    p = p.checked_add(1).unwrap_or(PUBLISH_PORT_BASE);
                }
                self.published.next_port = p.checked_add(1).unwrap_or(PUBLISH_PORT_BASE);
                self.published.udp.insert(p, (socket, peer));
                self.published.udp_by_peer.insert((local, peer), p);
                p
            }
        };
        let mac = self.guest_mac.unwrap_or([0xff; 6]);
        packet::write_udp(
            &mut self.tx,
            self.cfg.gateway_mac,
            mac,
            SocketAddrV4::new(self.cfg.gateway_ip, port),
            SocketAddrV4::new(self.cfg.guest_ip, guest_port),
            data,
        );
    }

    pub(crate) fn on_publish(&mut self, stream: TcpStream, guest_port: u16) {
        if self.flows.len() >= self.cfg.max_flows {
            return;
        }
        let local_port = self.published.next_port;
        self.published.next_port = self
            .published
            .next_port
            .checked_add(1)
            .unwrap_or(PUBLISH_PORT_BASE);
        let mut sock = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0u8; self.cfg.flow_buffer]),
            tcp::SocketBuffer::new(vec![0u8; self.cfg.flow_send_buffer]),
        );
        sock.set_nagle_enabled(false);
        sock.set_ack_delay(None);
        let remote = IpEndpoint::new(ip4(self.cfg.guest_ip), guest_port);
        let local = IpListenEndpoint {
            addr: Some(ip4(self.cfg.gateway_ip)),
            port: local_port,
        };
        if let Err(e) = sock.connect(self.iface.context(), remote, local) {
            tracing::warn!(error = %e, "publish: cannot connect into the guest");
            return;
        }
        let handle = self.sockets.add(sock);
        let _ = stream.set_nodelay(true);
        let key = FlowKey {
            transport: Transport::Tcp,
            src: SocketAddr::new(IpAddr::V4(self.cfg.gateway_ip), local_port),
            dst: SocketAddr::new(IpAddr::V4(self.cfg.guest_ip), guest_port),
        };
        let id = self.insert_flow(key, FlowState::Connecting { syn: Vec::new() });
        self.open_flow(id, handle, stream);
    }
}

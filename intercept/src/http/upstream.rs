//! The one upstream TCP connect of both proxies: to the destination
//! enforcement validated, bounded in time, and refused when the kernel
//! routes it locally.
//!
//! Why the local-route check: the deciders refuse the host's own addresses
//! (and loopback by class) before a flow is admitted, but a host address the
//! gateway's refresher has not seen yet (an interface just configured) would
//! be reached through the kernel's local route. A connected socket whose
//! local address equals its peer's was routed locally: it is reset (linger
//! 0) before a byte is written to it. The datapath's splice path applies the
//! same rule to its own connects.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use sluice_policy::Reason;
use tokio::net::TcpStream;

/// Why the upstream could not be connected: the audit reason
/// (`connect_failed`, or `platform_denied` for a local route) and a detail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConnectError {
    pub(crate) reason: Reason,
    pub(crate) detail: String,
}

/// Connects to `dst` within `timeout`, with `TCP_NODELAY`; refuses a
/// connection the kernel routed locally ([`routes_locally`]).
pub(crate) async fn connect(dst: SocketAddr, timeout: Duration) -> Result<TcpStream, ConnectError> {
    let failed = |detail: String| ConnectError {
        reason: Reason::ConnectFailed,
        detail,
    };
    let tcp = match tokio::time::timeout(timeout, TcpStream::connect(dst)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(failed(format!("connect {dst}: {e}"))),
        Err(_) => return Err(failed(format!("connect {dst}: timed out"))),
    };
    if routes_locally(tcp.local_addr(), tcp.peer_addr()) {
        let _ = socket2::SockRef::from(&tcp).set_linger(Some(Duration::ZERO));
        return Err(ConnectError {
            reason: Reason::PlatformDenied,
            detail: format!("connect {dst}: routed locally (a host address)"),
        });
    }
    let _ = tcp.set_nodelay(true);
    Ok(tcp)
}

/// Whether a connected socket's route was local: the kernel chose the
/// destination itself as the source, so the destination is one of this
/// host's addresses. Loopback destinations are left to the deciders (the
/// platform deny set refuses them by class before any connect). Either
/// address unknown: fail closed (local).
pub(crate) fn routes_locally(local: io::Result<SocketAddr>, peer: io::Result<SocketAddr>) -> bool {
    match (local, peer) {
        (Ok(local), Ok(peer)) => local.ip() == peer.ip() && !peer.ip().is_loopback(),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    #[test]
    fn a_socket_whose_source_is_its_destination_routes_locally() {
        let sa = |s: &str| Ok(s.parse::<SocketAddr>().unwrap());
        assert!(routes_locally(sa("192.0.2.2:40000"), sa("192.0.2.2:443")));
        assert!(!routes_locally(
            sa("192.0.2.2:40000"),
            sa("198.51.100.10:443")
        ));
        assert!(!routes_locally(sa("127.0.0.1:40000"), sa("127.0.0.1:443")));
        assert!(routes_locally(
            Err(io::Error::other("x")),
            sa("198.51.100.10:443")
        ));
    }

    /// A non-loopback address of this host: the source address the kernel
    /// would pick towards a TEST-NET-3 address (a UDP connect sends
    /// nothing). Fails when the host has no route at all.
    fn own_address() -> std::net::IpAddr {
        let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        s.connect("203.0.113.1:9")
            .expect("this test needs an IPv4 route (any interface but lo)");
        let ip = s.local_addr().unwrap().ip();
        assert!(!ip.is_loopback() && !ip.is_unspecified(), "{ip}");
        ip
    }

    #[tokio::test]
    async fn a_connect_to_an_own_address_is_refused_before_any_byte() {
        let listener = TcpListener::bind("0.0.0.0:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let dst = SocketAddr::new(own_address(), port);
        let err = connect(dst, Duration::from_secs(10)).await.unwrap_err();
        assert_eq!(err.reason, Reason::PlatformDenied, "{err:?}");
        assert!(err.detail.contains("routed locally"), "{err:?}");
        // The listener saw a connection that was reset without data.
        let (mut accepted, _) = listener.accept().await.unwrap();
        let mut buf = [0u8; 1];
        let n = tokio::io::AsyncReadExt::read(&mut accepted, &mut buf).await;
        assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");

        // Loopback is the deciders' business: connected.
        let lo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ok = connect(lo.local_addr().unwrap(), Duration::from_secs(10)).await;
        assert!(ok.is_ok(), "{ok:?}");
    }

    #[tokio::test]
    async fn a_refused_connect_is_connect_failed() {
        let dst = {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            l.local_addr().unwrap()
        };
        let err = connect(dst, Duration::from_secs(10)).await.unwrap_err();
        assert_eq!(err.reason, Reason::ConnectFailed, "{err:?}");
    }
}

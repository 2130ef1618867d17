//! Upgrades on proxied connections: which are allowed, and the one splice of
//! two upgraded streams.
//!
//! Only WebSocket is understood: HTTP/1.1 `Connection: upgrade` with
//! `Upgrade: websocket` (and nothing else offered), or an HTTP/2 extended
//! CONNECT (RFC 8441) whose `:protocol` is `websocket`. Anything else asked
//! for (`h2c`, a raw TCP tunnel protocol, ...) would carry bytes nobody
//! checks; the proxies refuse it (`upgrade_refused`). What is spliced is not
//! substituted or scrubbed: see docs/interception.md for where WebSocket is
//! allowed at all.

use http::HeaderMap;
use http::header;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

use super::hop;

/// What a request asks to switch to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ask {
    /// No upgrade (or an `Upgrade` that `Connection` does not name: a
    /// hop-by-hop leftover that is simply dropped).
    None,
    /// WebSocket, and only that.
    WebSocket,
    /// Anything else; the protocol(s) as sent, at most 64 characters.
    Other(String),
}

/// What an HTTP/1.1 request head asks for.
pub(crate) fn h1_request(headers: &HeaderMap) -> Ask {
    if !headers.contains_key(header::UPGRADE) || !hop::connection_has(headers, "upgrade") {
        return Ask::None;
    }
    let mut offered = headers
        .get_all(header::UPGRADE)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|p| !p.is_empty())
        .peekable();
    if offered.peek().is_some() && offered.all(|p| p.eq_ignore_ascii_case(b"websocket")) {
        return Ask::WebSocket;
    }
    let sent: Vec<String> = headers
        .get_all(header::UPGRADE)
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .collect();
    Ask::Other(sent.join(", ").chars().take(64).collect())
}

/// What an HTTP/2 extended CONNECT's `:protocol` asks for.
pub(crate) fn h2_protocol(protocol: &str) -> Ask {
    if protocol.eq_ignore_ascii_case("websocket") {
        Ask::WebSocket
    } else {
        Ask::Other(protocol.chars().take(64).collect())
    }
}

/// What a splice carried: bytes guest -> upstream and upstream -> guest,
/// and why it could not start, if it did not.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Spliced {
    pub(crate) up: u64,
    pub(crate) down: u64,
    pub(crate) error: Option<String>,
}

/// Waits for both sides' upgraded streams and copies bytes both ways until
/// both directions ended. Byte counts are those of a splice that ended
/// cleanly (0 when it broke: the copy reports no partial counts).
pub(crate) async fn splice(guest: OnUpgrade, upstream: OnUpgrade) -> Spliced {
    match tokio::try_join!(guest, upstream) {
        Ok((g, u)) => {
            let (mut g, mut u) = (TokioIo::new(g), TokioIo::new(u));
            match tokio::io::copy_bidirectional(&mut g, &mut u).await {
                Ok((up, down)) => Spliced {
                    up,
                    down,
                    error: None,
                },
                Err(_) => Spliced::default(),
            }
        }
        Err(e) => Spliced {
            error: Some(format!("upgrade: {e}")),
            ..Spliced::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn h(conn: &'static str, up: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static(conn));
        h.insert(header::UPGRADE, HeaderValue::from_static(up));
        h
    }

    #[test]
    fn only_websocket_is_an_allowed_upgrade() {
        assert_eq!(h1_request(&h("Upgrade", "websocket")), Ask::WebSocket);
        assert_eq!(
            h1_request(&h("keep-alive, upgrade", "WebSocket")),
            Ask::WebSocket
        );
        assert_eq!(
            h1_request(&h("Upgrade, HTTP2-Settings", "h2c")),
            Ask::Other("h2c".into())
        );
        assert_eq!(
            h1_request(&h("upgrade", "websocket, h2c")),
            Ask::Other("websocket, h2c".into())
        );
        let mut two = h("upgrade", "websocket");
        two.append(header::UPGRADE, HeaderValue::from_static("tcp"));
        assert_eq!(h1_request(&two), Ask::Other("websocket, tcp".into()));
        assert_eq!(h1_request(&h("upgrade", " , ")), Ask::Other(" , ".into()));
        // Not named by Connection: not an upgrade (dropped as hop-by-hop).
        assert_eq!(h1_request(&h("keep-alive", "websocket")), Ask::None);
        assert_eq!(h1_request(&HeaderMap::new()), Ask::None);

        assert_eq!(h2_protocol("websocket"), Ask::WebSocket);
        assert_eq!(h2_protocol("connect-udp"), Ask::Other("connect-udp".into()));
        assert_eq!(h2_protocol(&"x".repeat(100)), Ask::Other("x".repeat(64)));
    }
}

//! Header helpers shared by the TLS proxy ([`crate::proxy`]) and the
//! plain-HTTP proxy ([`crate::plain`]).

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// The host of an authority (`Host` value or `:authority`) in the one
/// normaliser's canonical form ([`sluice_name::normalize_name`]), after the
/// a `:port` (decimal digits) equal to `port` is removed. `None` when the
/// value is not a valid host name (white space included: hyper has already
/// removed the field's surrounding white space) or names another port: the
/// caller treats that as a mismatch.
pub(crate) fn authority_host(value: &str, port: u16) -> Option<String> {
    if value.starts_with('[') {
        // An IPv6 literal is never a server name.
        return None;
    }
    let (host, p) = match value.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (value, None),
    };
    if let Some(p) = p
        && !(p.bytes().all(|b| b.is_ascii_digit()) && p.parse::<u16>().ok() == Some(port))
    {
        return None;
    }
    sluice_name::normalize_name(host).ok().map(String::from)
}

/// Removes hop-by-hop headers (and those `Connection` names). With
/// `upgrade`, `Connection: upgrade` and `Upgrade` are kept.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap, upgrade: bool) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        if !(upgrade && n == header::UPGRADE) {
            headers.remove(n);
        }
    }
    for n in [
        header::CONNECTION,
        header::TE,
        header::TRANSFER_ENCODING,
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
        header::UPGRADE,
    ] {
        if !(upgrade && n == header::UPGRADE) {
            headers.remove(n);
        }
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
    headers.remove("http2-settings");
    if upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
}

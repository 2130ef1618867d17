//! Hop-by-hop headers (RFC 9110 7.6.1): the one list both proxies drop in
//! both directions, and the parsing of comma-separated header tokens
//! (`Connection`, `TE`, `Upgrade`, `Content-Encoding`).

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// The comma-separated tokens of every `name` field in `headers` (all
/// instances), trimmed, empty ones skipped, parameters (`;q=1`) kept. A
/// field value that is not visible ASCII yields no token.
pub(crate) fn tokens<'a>(
    headers: &'a HeaderMap,
    name: &HeaderName,
) -> impl Iterator<Item = &'a str> + 'a {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// Whether some `Connection` field names `token` (case-insensitive).
pub(crate) fn connection_has(headers: &HeaderMap, token: &str) -> bool {
    tokens(headers, &header::CONNECTION).any(|t| t.eq_ignore_ascii_case(token))
}

/// `TE` names `trailers` (the client accepts trailer fields).
pub(crate) fn wants_trailers(headers: &HeaderMap) -> bool {
    tokens(headers, &header::TE).any(|t| {
        t.split(';')
            .next()
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("trailers"))
    })
}

/// Removes hop-by-hop headers (and those `Connection` names). With
/// `upgrade`, `Connection: upgrade` and `Upgrade` are kept (the caller
/// decided the upgrade is allowed).
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap, upgrade: bool) {
    let named: Vec<HeaderName> = tokens(headers, &header::CONNECTION)
        .filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
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

/// Whether a body with these headers is content-encoded: some coding in
/// some `Content-Encoding` field (every instance, every comma-separated
/// coding) other than `identity`. A field that is not readable text counts
/// as encoded (fail closed).
pub(crate) fn content_encoded(headers: &HeaderMap) -> bool {
    headers.get_all(header::CONTENT_ENCODING).iter().any(|v| {
        v.to_str().map_or(true, |v| {
            v.split(',')
                .map(str::trim)
                .any(|c| !c.is_empty() && !c.eq_ignore_ascii_case("identity"))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_are_removed() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-foo"),
        );
        h.append(header::CONNECTION, HeaderValue::from_static("x-bar"));
        h.insert("x-foo", HeaderValue::from_static("1"));
        h.insert("x-bar", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer x"));
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h.len(), 1, "{h:?}");

        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert!(connection_has(&h, "upgrade"));
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h.get(header::UPGRADE).unwrap(), "websocket");
        assert_eq!(h.get(header::CONNECTION).unwrap(), "upgrade");

        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("Upgrade, HTTP2-Settings"),
        );
        h.insert(header::UPGRADE, HeaderValue::from_static("h2c"));
        h.insert(
            "http2-settings",
            HeaderValue::from_static("AAMAAABkAAQAAP__"),
        );
        strip_hop_by_hop(&mut h, false);
        assert!(h.is_empty(), "{h:?}");
    }

    #[test]
    fn te_trailers_is_recognised() {
        let mut h = HeaderMap::new();
        h.insert(header::TE, HeaderValue::from_static("gzip, Trailers;q=1"));
        assert!(wants_trailers(&h));
        h.insert(header::TE, HeaderValue::from_static("gzip"));
        assert!(!wants_trailers(&h));
        h.append(header::TE, HeaderValue::from_static("trailers"));
        assert!(wants_trailers(&h));
        assert!(!wants_trailers(&HeaderMap::new()));
    }

    #[test]
    fn every_content_encoding_field_and_coding_is_checked() {
        let h = |values: &[&'static str]| {
            let mut h = HeaderMap::new();
            for v in values {
                h.append(header::CONTENT_ENCODING, HeaderValue::from_static(v));
            }
            h
        };
        assert!(!content_encoded(&h(&[])));
        assert!(!content_encoded(&h(&["identity"])));
        assert!(!content_encoded(&h(&["Identity, identity", ""])));
        assert!(content_encoded(&h(&["gzip"])));
        // The first field or coding alone says nothing.
        assert!(content_encoded(&h(&["identity", "gzip"])));
        assert!(content_encoded(&h(&["identity, br"])));
        let mut bin = HeaderMap::new();
        bin.insert(
            header::CONTENT_ENCODING,
            HeaderValue::from_bytes(b"gz\xffip").unwrap(),
        );
        assert!(content_encoded(&bin));
    }
}

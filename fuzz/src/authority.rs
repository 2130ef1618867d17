//! Fuzz the one Host / `:authority` reader both proxies use
//! (`sluice_intercept::http::authority::parse`).
//!
//! Input: bytes 0..2 are the connection's destination port (big-endian), the
//! rest the header value as hyper would hand it over (lossy UTF-8). Beyond
//! "no panic", the invariants every Host check rests on:
//! - an accepted host is in the one normaliser's canonical form (normalising
//!   it again gives it back), so it compares equal to a policy name exactly
//!   when the names are the same;
//! - reading is stable: the accepted host read again, alone or with the
//!   destination port, gives the same host;
//! - a plain name (no port, no white space, no brackets) is accepted exactly
//!   when the normaliser accepts it, with the same result;
//! - a value naming another port is never accepted.

use sluice_intercept::http::authority::parse;

/// One fuzz input (the libFuzzer target and the corpus replay call this).
pub fn run(data: &[u8]) {
    let Some((port, value)) = data.split_first_chunk::<2>() else {
        return;
    };
    let port = u16::from_be_bytes(*port);
    let value = String::from_utf8_lossy(value);
    let got = parse(&value, port);
    if let Ok(host) = &got {
        let again = sluice_name::normalize_name(host).expect("an accepted host normalises");
        assert_eq!(again.as_str(), host, "not canonical: {value:?}");
        assert_eq!(parse(host, port).as_ref(), Ok(host), "unstable: {value:?}");
        assert_eq!(
            parse(&format!("{host}:{port}"), port).as_ref(),
            Ok(host),
            "with the port: {value:?}"
        );
        let other = port.wrapping_add(1);
        if other != 0 {
            assert!(
                parse(&format!("{host}:{other}"), port).is_err(),
                "another port accepted: {value:?}"
            );
        }
    }
    let plain = !value.is_empty()
        && !value.contains(':')
        && !value.starts_with('[')
        && !value.chars().any(char::is_whitespace);
    if plain {
        let want = sluice_name::normalize_name(&value).map(String::from).ok();
        assert_eq!(got.ok(), want, "plain name {value:?}");
    }
}

//! The shared name corpus (sluice-name's `tests/corpus.txt`) through the
//! interceptors' name checks: the authority/`Host` comparison both proxies
//! make ([`crate::http::authority::parse`]), the plain proxy's admitted host
//! ([`crate::http::authority::normalise_host`] then the comparison `check_host` makes)
//! and the TLS proxy's SNI re-check (`sluice_name::wire_equals` against the
//! verified SNI). Each must accept exactly what the corpus's wire column
//! accepts, in the same canonical form.

use sluice_name::corpus::cases;

use crate::http::authority::normalise_host;

/// The authority reader as the proxies call it: `None` for a refusal.
fn authority_host(value: &str, port: u16) -> Option<String> {
    crate::http::authority::parse(value, port).ok()
}

/// What a lenient normaliser (lower case, every trailing dot and the
/// surrounding white space gone) would have made of `input`: the verified
/// name a loose check would have let `input` pass as.
fn loose(input: &str) -> String {
    input.trim().trim_end_matches('.').to_ascii_lowercase()
}

#[test]
fn corpus_through_the_interceptors() {
    let cases = cases().unwrap();
    assert!(!cases.is_empty());
    let mut checked = 0;
    for case in &cases {
        let want = case.wire.name();
        let line = case.line;
        let Ok(input) = std::str::from_utf8(&case.input) else {
            // hyper's `to_str` refuses such a header value, and rustls such
            // an SNI: both proxies then refuse the request as a mismatch.
            assert_eq!(want, None, "line {line}");
            continue;
        };
        checked += 1;
        // Authority without and with a port (the one the flow is for, and
        // another).
        assert_eq!(authority_host(input, 443).as_deref(), want, "line {line}");
        let with_port = format!("{input}:443");
        assert_eq!(
            authority_host(&with_port, 443).as_deref(),
            want,
            "line {line}: {with_port:?}"
        );
        assert_eq!(authority_host(&format!("{input}:8443"), 443), None);
        assert_eq!(authority_host(&format!("{input}:+443"), 443), None);
        // Plain proxy: the admitted host and the request's Host.
        let admitted = normalise_host(input);
        assert_eq!(admitted, want.unwrap_or_default(), "line {line}: admitted");
        let host_ok = authority_host(input, 80).is_some_and(|h| h == admitted);
        assert_eq!(host_ok, want.is_some(), "line {line}: plain Host");
        // A request whose Host is `input`, on a flow admitted for what a
        // lenient normaliser makes of it.
        let lenient = normalise_host(&loose(input));
        let host_ok = authority_host(input, 80).is_some_and(|h| h == lenient);
        assert_eq!(host_ok, want.is_some_and(|w| w == lenient), "line {line}");
        // TLS proxy: the guest's SNI against the verified one.
        let verified = loose(input);
        assert_eq!(
            sluice_name::wire_equals(input.as_bytes(), &verified),
            want == Some(verified.as_str()),
            "line {line}: SNI"
        );
    }
    assert!(checked > 0);
}

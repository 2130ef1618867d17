//! Host / `:authority` parsing: the one place both proxies turn what a
//! request names into a host name comparable with the host its connection
//! was admitted for (the verified SNI, or the Host enforcement validated).
//!
//! Pure and allocation-light; [`parse`] is the entry a fuzz target calls.

use thiserror::Error;

/// Why a Host / `:authority` value names no host on the expected port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum AuthorityError {
    /// Nothing but white space (or dots) where the host should be.
    #[error("empty host")]
    Empty,
    /// An IP literal in brackets (IPv6): never a server name.
    #[error("an IPv6 literal is not a host name")]
    Ipv6Literal,
    /// White space in the value (around or inside the host, before the port).
    #[error("white space inside the authority")]
    WhiteSpace,
    /// The `:port` is not a decimal port number.
    #[error("unreadable port")]
    BadPort,
    /// The `:port` names another port than the connection's.
    #[error("port {0} is not the destination port")]
    OtherPort(u16),
    /// The host is not a name the one normaliser accepts.
    #[error("not a host name: {0}")]
    Name(sluice_name::NameError),
}

/// The host an authority value (a `Host` header, an absolute target's or
/// HTTP/2 `:authority`) names, in the one normaliser's canonical form
/// ([`sluice_name::normalize_name`]: lower case, no trailing dot, DNS
/// limits). The value may carry `:port` only when it is `port` (the
/// destination port). White space anywhere is refused (hyper has already
/// removed a header field's surrounding white space, so none is left by a
/// well-formed request). An IPv6 literal (`[...]`) is refused: it is never a
/// server name.
///
/// A host the normaliser refuses is an error: the caller treats it as a
/// mismatch.
pub fn parse(value: &str, port: u16) -> Result<String, AuthorityError> {
    if value.starts_with('[') {
        return Err(AuthorityError::Ipv6Literal);
    }
    let host = match value.rsplit_once(':') {
        Some((host, p)) => {
            if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(AuthorityError::BadPort);
            }
            let p: u16 = p.parse().map_err(|_| AuthorityError::BadPort)?;
            if p != port {
                return Err(AuthorityError::OtherPort(p));
            }
            host
        }
        None => value,
    };
    if host.bytes().any(|b| b.is_ascii_whitespace()) {
        return Err(AuthorityError::WhiteSpace);
    }
    match sluice_name::normalize_name(host) {
        Ok(name) => Ok(String::from(name)),
        Err(sluice_name::NameError::Empty) => Err(AuthorityError::Empty),
        Err(e) => Err(AuthorityError::Name(e)),
    }
}

/// The admitted host (the plain proxy's, from enforcement) in the one
/// normaliser's canonical form ([`sluice_name::normalize_name`]); empty when it does not normalise, which no request's
/// host equals (every request is then refused as a mismatch).
#[must_use]
pub fn normalise_host(host: &str) -> String {
    sluice_name::normalize_name(host)
        .map(String::from)
        .unwrap_or_default()
}

/// Whether `sent` (a name the guest sent, e.g. its ClientHello SNI) names
/// `admitted` (a name already normalised by enforcement): the wire bytes
/// normalised by the one normaliser and compared exactly.
#[must_use]
pub fn names_host(sent: &str, admitted: &str) -> bool {
    sluice_name::wire_equals(sent.as_bytes(), admitted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_normalised_and_ports_checked() {
        let ok = |v: &str, p: u16| parse(v, p).ok();
        assert_eq!(
            ok("API.Example.com.", 443).as_deref(),
            Some("api.example.com")
        );
        assert_eq!(
            parse(" api.example.com", 443),
            Err(AuthorityError::WhiteSpace)
        );
        assert_eq!(
            ok("api.example.com:443", 443).as_deref(),
            Some("api.example.com")
        );
        assert_eq!(
            ok("api.example.com:8443", 8443).as_deref(),
            Some("api.example.com")
        );
        assert_eq!(
            parse("api.example.com:8443", 443),
            Err(AuthorityError::OtherPort(8443))
        );
        assert_eq!(parse("origin.test:", 80), Err(AuthorityError::BadPort));
        assert_eq!(parse("origin.test:+80", 80), Err(AuthorityError::BadPort));
        assert_eq!(parse("origin.test:080", 80).as_deref(), Ok("origin.test"));
        assert_eq!(parse("origin.test:99999", 80), Err(AuthorityError::BadPort));
        assert_eq!(parse("[2001:db8::1]", 80), Err(AuthorityError::Ipv6Literal));
        assert_eq!(
            parse("[2001:db8::1]:80", 80),
            Err(AuthorityError::Ipv6Literal)
        );
        assert_eq!(parse(":80", 80), Err(AuthorityError::Empty));
        assert_eq!(parse("", 80), Err(AuthorityError::Empty));
        assert!(matches!(parse("...", 80), Err(AuthorityError::Name(_))));
        assert_eq!(
            parse("origin.test :80", 80),
            Err(AuthorityError::WhiteSpace)
        );
        assert_eq!(parse("ori gin.test", 80), Err(AuthorityError::WhiteSpace));
        // A bare IPv6 address splits at its last colon: never a match for a
        // name, whatever it yields.
        assert_ne!(parse("2001:db8::80", 80).as_deref(), Ok("origin.test"));
    }

    #[test]
    fn sni_comparison_uses_the_same_normalisation() {
        assert!(names_host("API.example.com.", "api.example.com"));
        assert!(!names_host("api.example.com.evil", "api.example.com"));
        assert_eq!(normalise_host("Origin.Test."), "origin.test");
        // Not a name: equals no request's host.
        assert_eq!(normalise_host(" Origin.Test "), "");
    }
}

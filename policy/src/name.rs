//! Domain names: the runtime normaliser (allocation-free, for names seen on
//! the wire) and the policy-time pattern parser (IDN, wildcards, public
//! suffixes).
//!
//! The two agree: a name written in the policy and the same name seen in a
//! DNS query, SNI or Host header normalise to the same bytes.
//!
//! Runtime names ([`normalize_name`]) must already be ASCII, as they are on
//! the wire (DNS labels, SNI host_name per RFC 6066, Host per RFC 9110 use
//! A-labels). They are lower-cased, one trailing dot is removed, and each
//! label must be 1..=63 bytes of `a-z 0-9 - _` with the whole name at most
//! 253 bytes. Anything else is rejected, never guessed at.

use std::fmt;
use std::net::IpAddr;

/// The longest name accepted, in bytes, without the trailing dot (RFC 1035).
pub const MAX_NAME_LEN: usize = 253;
/// The longest label accepted, in bytes (RFC 1035).
pub const MAX_LABEL_LEN: usize = 63;

/// A normalised name held inline (no heap): lower-case ASCII, no trailing
/// dot, valid labels. Obtain one with [`normalize_name`].
#[derive(Clone, Copy)]
pub struct NormalName {
    buf: [u8; MAX_NAME_LEN],
    len: u8,
}

impl NormalName {
    /// The normalised name.
    #[must_use]
    pub fn as_str(&self) -> &str {
        let bytes = self.buf.get(..usize::from(self.len)).unwrap_or_default();
        // Only ASCII bytes are ever written into `buf`.
        std::str::from_utf8(bytes).unwrap_or_default()
    }
}

impl fmt::Debug for NormalName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for NormalName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a name seen at runtime could not be normalised.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// The name is empty (or only a dot).
    #[error("empty name")]
    Empty,
    /// The name is longer than 253 bytes.
    #[error("name longer than 253 bytes")]
    TooLong,
    /// A label is empty (two dots in a row, or a leading dot).
    #[error("empty label")]
    EmptyLabel,
    /// A label is longer than 63 bytes.
    #[error("label longer than 63 bytes")]
    LabelTooLong,
    /// A byte other than `A-Z a-z 0-9 - _ .` (including any non-ASCII byte).
    #[error("invalid character: only A-Z a-z 0-9 - _ and . are allowed")]
    InvalidChar,
}

/// Normalise a name seen on the wire: ASCII-lowercase, strip one trailing
/// dot, check label syntax. Never allocates.
///
/// # Errors
/// A [`NameError`] saying which rule the name breaks.
pub fn normalize_name(name: &str) -> Result<NormalName, NameError> {
    let bytes = name.as_bytes();
    let bytes = bytes.strip_suffix(b".").unwrap_or(bytes);
    if bytes.is_empty() {
        return Err(NameError::Empty);
    }
    if bytes.len() > MAX_NAME_LEN {
        return Err(NameError::TooLong);
    }
    let mut out = NormalName {
        buf: [0; MAX_NAME_LEN],
        len: 0,
    };
    let mut label_len = 0usize;
    for (slot, &b) in out.buf.iter_mut().zip(bytes) {
        let c = match b {
            b'.' => {
                if label_len == 0 {
                    return Err(NameError::EmptyLabel);
                }
                label_len = 0;
                b'.'
            }
            b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' => b,
            b'A'..=b'Z' => b.to_ascii_lowercase(),
            _ => return Err(NameError::InvalidChar),
        };
        if c != b'.' {
            label_len += 1;
            if label_len > MAX_LABEL_LEN {
                return Err(NameError::LabelTooLong);
            }
        }
        *slot = c;
    }
    if label_len == 0 {
        return Err(NameError::EmptyLabel);
    }
    out.len = u8::try_from(bytes.len()).map_err(|_| NameError::TooLong)?;
    Ok(out)
}

/// What a domain pattern matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PatternKind {
    /// `example.com`: exactly that name.
    Exact,
    /// `*.example.com`: strict subdomains at any depth, not the apex.
    Subdomains,
    /// `**.example.com`: the apex and all its subdomains.
    ApexAndSubdomains,
}

/// A parsed, normalised domain pattern.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DomainPattern {
    /// What the pattern matches.
    pub kind: PatternKind,
    /// The normalised base name (A-labels, lower case, no trailing dot,
    /// without the `*.` / `**.` prefix).
    pub base: String,
}

impl DomainPattern {
    /// Whether the pattern matches a normalised name.
    #[must_use]
    pub fn matches(&self, name: &str) -> bool {
        let is_sub = name.len() > self.base.len()
            && name.ends_with(self.base.as_str())
            && name.as_bytes().get(name.len() - self.base.len() - 1) == Some(&b'.');
        match self.kind {
            PatternKind::Exact => name == self.base,
            PatternKind::Subdomains => is_sub,
            PatternKind::ApexAndSubdomains => is_sub || name == self.base,
        }
    }
}

impl fmt::Display for DomainPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            PatternKind::Exact => f.write_str(&self.base),
            PatternKind::Subdomains => write!(f, "*.{}", self.base),
            PatternKind::ApexAndSubdomains => write!(f, "**.{}", self.base),
        }
    }
}

/// Where a pattern is used: allow-side wildcards may not sit directly over a
/// public suffix; deny-side ones may (denying all of `*.tk` is fine).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PatternUse {
    Allow,
    Deny,
    /// Secret hosts: exact names only.
    ExactOnly,
}

/// Parse and normalise a domain pattern written in a policy. The error is a
/// complete message (what is wrong, what would be right).
pub(crate) fn parse_pattern(src: &str, usage: PatternUse) -> Result<DomainPattern, String> {
    if src.is_empty() {
        return Err("empty domain; write a name such as `example.com`".into());
    }
    if src.trim() != src {
        return Err(format!(
            "domain `{src}` has leading or trailing whitespace; remove it"
        ));
    }
    if src == "*" || src == "**" || src == "*." || src == "**." {
        return Err(format!(
            "bare wildcard `{src}` is not allowed; name a domain, e.g. `*.example.com` (subdomains) or `**.example.com` (apex and subdomains)"
        ));
    }
    let (kind, rest) = if let Some(rest) = src.strip_prefix("**.") {
        (PatternKind::ApexAndSubdomains, rest)
    } else if let Some(rest) = src.strip_prefix("*.") {
        (PatternKind::Subdomains, rest)
    } else {
        (PatternKind::Exact, src)
    };
    if rest.contains('*') {
        return Err(format!(
            "wildcard in `{src}` is not allowed there; a wildcard may only be the whole first label: `*.example.com` or `**.example.com`"
        ));
    }
    if kind != PatternKind::Exact && usage == PatternUse::ExactOnly {
        return Err(format!(
            "`{src}`: secret hosts must be exact names (no wildcards), e.g. `api.example.com`"
        ));
    }
    if looks_like_ip(rest) {
        return Err(format!(
            "`{src}` is an IP address, not a domain; use a `cidr:` rule (e.g. `cidr: {}`) for addresses",
            ip_hint(rest)
        ));
    }
    let ascii = idna::domain_to_ascii(rest).map_err(|_| {
        format!("`{src}` is not a valid domain name (IDNA conversion failed); {DOMAIN_SHAPE}")
    })?;
    let ascii = ascii.strip_suffix('.').unwrap_or(&ascii).to_owned();
    if looks_like_ip(&ascii) {
        return Err(format!(
            "`{src}` is an IP address, not a domain; use a `cidr:` rule for addresses"
        ));
    }
    let normal = normalize_name(&ascii)
        .map_err(|e| format!("`{src}` is not a valid domain ({e}); {DOMAIN_SHAPE}"))?;
    let base = normal.as_str().to_owned();
    if base
        .rsplit('.')
        .next()
        .is_some_and(|tld| tld.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(format!(
            "`{src}` ends in an all-numeric label; that is an address, not a domain"
        ));
    }
    if kind != PatternKind::Exact && usage == PatternUse::Allow && is_public_suffix(&base) {
        return Err(format!(
            "`{src}` puts a wildcard directly over the public suffix `{base}` (anyone can register names under it); allow a registrable domain instead, e.g. `{}.example.{base}`",
            if kind == PatternKind::Subdomains {
                "*"
            } else {
                "**"
            }
        ));
    }
    Ok(DomainPattern { kind, base })
}

const DOMAIN_SHAPE: &str =
    "a domain is dot-separated labels of 1-63 letters, digits, `-` or `_`, at most 253 characters";

/// Whether `name` (normalised) is a public suffix: a single label (any TLD,
/// listed or not), or a suffix listed in the Public Suffix List (ICANN or
/// private section, e.g. `co.uk`, `github.io`).
pub(crate) fn is_public_suffix(name: &str) -> bool {
    if !name.contains('.') {
        return true;
    }
    psl::suffix(name.as_bytes()).is_some_and(|s| s.is_known() && s.as_bytes() == name.as_bytes())
}

fn looks_like_ip(s: &str) -> bool {
    let t = s
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or(s);
    t.parse::<IpAddr>().is_ok()
}

fn ip_hint(s: &str) -> String {
    let t = s
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or(s);
    match t.parse::<IpAddr>() {
        Ok(IpAddr::V4(v4)) => format!("{v4}/32"),
        Ok(IpAddr::V6(v6)) => format!("{v6}/128"),
        Err(_) => t.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_normalisation_table() {
        let ok: &[(&str, &str)] = &[
            ("Example.COM", "example.com"),
            ("example.com.", "example.com"),
            ("a-b_c.example.com", "a-b_c.example.com"),
            ("xn--bcher-kva.example", "xn--bcher-kva.example"),
            ("localhost", "localhost"),
        ];
        for (input, want) in ok {
            assert_eq!(normalize_name(input).unwrap().as_str(), *want, "{input}");
        }
        let long_label = "a".repeat(64);
        let long_name = ["a"; 127].join(".") + ".bb";
        let bad: &[(&str, NameError)] = &[
            ("", NameError::Empty),
            (".", NameError::Empty),
            ("a..b", NameError::EmptyLabel),
            (".a", NameError::EmptyLabel),
            ("a.b..", NameError::EmptyLabel),
            ("bücher.example", NameError::InvalidChar),
            ("a b.example", NameError::InvalidChar),
            ("*.example.com", NameError::InvalidChar),
            (&long_label, NameError::LabelTooLong),
            (&long_name, NameError::TooLong),
        ];
        for (input, want) in bad {
            assert_eq!(normalize_name(input).unwrap_err(), *want, "{input}");
        }
    }

    #[test]
    fn pattern_parsing_table() {
        let ok: &[(&str, PatternKind, &str)] = &[
            ("api.openai.com", PatternKind::Exact, "api.openai.com"),
            ("API.OpenAI.com.", PatternKind::Exact, "api.openai.com"),
            (
                "*.pythonhosted.org",
                PatternKind::Subdomains,
                "pythonhosted.org",
            ),
            (
                "**.github.com",
                PatternKind::ApexAndSubdomains,
                "github.com",
            ),
            (
                "bücher.example",
                PatternKind::Exact,
                "xn--bcher-kva.example",
            ),
            (
                "*.BÜCHER.example",
                PatternKind::Subdomains,
                "xn--bcher-kva.example",
            ),
            ("*.example.co.uk", PatternKind::Subdomains, "example.co.uk"),
            ("github.io", PatternKind::Exact, "github.io"),
        ];
        for (src, kind, base) in ok {
            let p = parse_pattern(src, PatternUse::Allow).unwrap();
            assert_eq!((p.kind, p.base.as_str()), (*kind, *base), "{src}");
        }
        let bad = [
            "*",
            "**",
            "*.",
            "foo*.example.com",
            "f*o.example.com",
            "a.*.example.com",
            "*.*.example.com",
            "***.example.com",
            "*.com",
            "**.com",
            "*.co.uk",
            "**.github.io",
            "*.corp",
            "127.0.0.1",
            "[::1]",
            "::1",
            "１２７.0.0.1",
            "10.1",
            " example.com",
            "",
            "a..b",
            "exa mple.com",
        ];
        for src in bad {
            assert!(
                parse_pattern(src, PatternUse::Allow).is_err(),
                "{src:?} accepted"
            );
        }
        // Deny rules may be broad.
        assert!(parse_pattern("*.tk", PatternUse::Deny).is_ok());
        assert!(parse_pattern("*", PatternUse::Deny).is_err());
        assert!(parse_pattern("*.example.com", PatternUse::ExactOnly).is_err());
    }

    #[test]
    fn pattern_matching_table() {
        let table: &[(&str, &str, bool)] = &[
            ("example.com", "example.com", true),
            ("example.com", "www.example.com", false),
            ("*.example.com", "example.com", false),
            ("*.example.com", "www.example.com", true),
            ("*.example.com", "a.b.example.com", true),
            ("*.example.com", "badexample.com", false),
            ("**.example.com", "example.com", true),
            ("**.example.com", "a.b.example.com", true),
            ("**.example.com", "example.com.evil", false),
            ("**.example.com", "xexample.com", false),
        ];
        for (pat, name, want) in table {
            let p = parse_pattern(pat, PatternUse::Allow).unwrap();
            assert_eq!(p.matches(name), *want, "{pat} vs {name}");
        }
    }
}

//! Domain patterns as the policy writes them (IDN, wildcards, public
//! suffixes), on top of the one name normaliser, [`sluice_name`].
//!
//! A pattern's base name is converted to A-labels with IDNA (UTS 46) and then
//! normalised by [`sluice_name::normalize_name`], the function every wire
//! path (DNS question, SNI, Host) calls: so a name written in the policy and
//! the same name seen on the wire normalise to the same bytes. A pattern is
//! matched against names already normalised ([`DomainPattern::matches`]).

use std::fmt;
use std::net::IpAddr;

pub use sluice_name::{MAX_LABEL_LEN, MAX_NAME_LEN, NameError, NormalName, normalize_name};

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
    // The IP check ignores the root dot; the normaliser below removes
    // exactly one, as it does for wire names (so `a.com..` is refused).
    if looks_like_ip(ascii.strip_suffix('.').unwrap_or(&ascii)) {
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

    /// The shared corpus through the policy's two name paths: compiling a
    /// rule name (`parse_pattern`, IDNA then the one normaliser) gives the
    /// corpus's policy column, and matching a wire name
    /// (`CompiledPolicy::check_name`) accepts exactly the names the wire
    /// column accepts.
    #[test]
    fn corpus_through_compile_and_matching() {
        use crate::{CompileOptions, Reason, from_yaml_str};
        use sluice_name::corpus::{Expect, cases};

        let cases = cases().unwrap();
        assert!(!cases.is_empty());
        let policy = from_yaml_str(
            "version: 1\nid: corpus\nallow: []\ndeny:\n  - \"**.com\"\n  - \"**.de\"\n  - localhost\n",
            "corpus.yaml",
            &CompileOptions::default(),
        )
        .unwrap();
        let covered = |n: &str| n == "localhost" || n.ends_with(".com") || n.ends_with(".de");
        for case in &cases {
            let Ok(text) = std::str::from_utf8(&case.input) else {
                // Not writable in a policy file: must be refused everywhere.
                assert_eq!(case.policy.name(), None, "line {}", case.line);
                continue;
            };
            let compiled = parse_pattern(text, PatternUse::Allow)
                .ok()
                .map(|p| p.to_string());
            assert_eq!(
                compiled.as_deref(),
                case.policy.name(),
                "line {}: compile {text:?}",
                case.line
            );
            let want = case.wire.name().is_some_and(covered);
            let got = policy.check_name(text).reason == Reason::Denylisted;
            assert_eq!(got, want, "line {}: match {text:?}", case.line);
            if let Expect::Name(n) = &case.wire {
                assert_eq!(
                    normalize_name(text).map(String::from).as_deref(),
                    Ok(n.as_str())
                );
            }
        }
    }
}

//! Which entries `sluice audit` shows: `--kind`, `--decision`, `--reason`,
//! `--name GLOB`, `--sandbox`, `--since`. Every given filter must match
//! (and); a repeated `--kind` or `--reason` matches any of its values (or).

use super::entry::Entry;

/// The filters of one `sluice audit` run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Schema-1 kinds to keep (empty: all).
    pub kinds: Vec<String>,
    /// `Some(true)`: denials only; `Some(false)`: allows only.
    pub deny: Option<bool>,
    /// Reasons to keep (empty: all).
    pub reasons: Vec<String>,
    /// A glob (`*` any run of characters, `?` one) one of the entry's names
    /// must match, ASCII case-insensitively. An entry without a name never
    /// matches.
    pub name: Option<String>,
    /// The sandbox id to keep.
    pub sandbox: Option<String>,
    /// Keep decisions at or after this time (Unix milliseconds).
    pub since_ms: Option<i64>,
}

impl Filter {
    /// Whether `e` passes every filter given.
    pub fn matches(&self, e: &Entry) -> bool {
        (self.kinds.is_empty() || self.kinds.contains(&e.kind))
            && self.deny.is_none_or(|d| d == e.deny)
            && (self.reasons.is_empty() || self.reasons.contains(&e.reason))
            && self
                .name
                .as_deref()
                .is_none_or(|g| e.names.iter().any(|n| glob(g, n)))
            && self.sandbox.as_deref().is_none_or(|s| s == e.sandbox)
            && self.since_ms.is_none_or(|t| e.time_ms >= t)
    }
}

/// `*` and `?` glob match of `text` against `pattern`, ASCII
/// case-insensitive; linear in the input (the classic two-pointer walk that
/// backtracks only to the last `*`).
pub fn glob(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().map(|c| c.to_ascii_lowercase()).collect();
    let t: Vec<char> = text.chars().map(|c| c.to_ascii_lowercase()).collect();
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ti));
                pi += 1;
            }
            Some(&c) if c == '?' || c == t[ti] => {
                pi += 1;
                ti += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    pi = sp + 1;
                    ti = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// Parses `--since`: RFC 3339 UTC (`2026-11-21T19:20:30Z`, fractions
/// allowed) or an age before `now_ms` (`90s`, `15m`, `2h`, `1d`).
pub fn parse_since(s: &str, now_ms: i64) -> Result<i64, String> {
    let age = |n: &str, unit: i64| {
        n.parse::<i64>()
            .ok()
            .and_then(|n| n.checked_mul(unit))
            .map(|ms| now_ms.saturating_sub(ms))
    };
    let relative = match s.char_indices().last() {
        Some((i, 's')) => age(&s[..i], 1000),
        Some((i, 'm')) => age(&s[..i], 60_000),
        Some((i, 'h')) => age(&s[..i], 3_600_000),
        Some((i, 'd')) => age(&s[..i], 86_400_000),
        _ => None,
    };
    if let Some(ms) = relative {
        return Ok(ms);
    }
    // The audit's own timestamp reader wants a fraction: add one if absent.
    let text = match s.strip_suffix('Z') {
        Some(body) if !body.contains('.') => format!("{body}.000Z"),
        _ => s.to_owned(),
    };
    serde_json::from_value::<sluice_policy::audit::Timestamp>(serde_json::Value::String(text))
        .map(|t| t.unix_millis())
        .map_err(|e| {
            format!("--since {s}: not RFC 3339 UTC (…Z) nor an age (90s, 15m, 2h, 1d): {e}")
        })
}

#[cfg(test)]
mod tests {
    use super::super::entry::Format;
    use super::*;

    fn entry(kind: &str, deny: bool, reason: &str, names: &[&str], t: i64) -> Entry {
        Entry {
            format: Format::Schema1,
            time_ms: t,
            sandbox: "vm-1".into(),
            kind: kind.into(),
            deny,
            reason: reason.into(),
            names: names.iter().map(|n| (*n).to_owned()).collect(),
            subject: String::new(),
            suppressed: Vec::new(),
        }
    }

    #[test]
    fn globs_match_whole_names_case_insensitively() {
        assert!(glob("*.github.com", "api.GitHub.com"));
        assert!(!glob("*.github.com", "github.com"));
        assert!(glob("*github.com", "github.com"));
        assert!(glob("py?i.org", "pypi.org"));
        assert!(!glob("pypi", "pypi.org"));
        assert!(glob("*", ""));
        assert!(glob("a*b*c", "axxbyyc"));
        assert!(!glob("a*b*c", "axxbyy"));
    }

    #[test]
    fn every_given_filter_must_match() {
        let e = entry("dns", true, "not_allowlisted", &["evil.example"], 1000);
        assert!(Filter::default().matches(&e));
        let f = |f: Filter| f.matches(&e);
        assert!(f(Filter {
            kinds: vec!["http".into(), "dns".into()],
            ..Filter::default()
        }));
        assert!(!f(Filter {
            kinds: vec!["http".into()],
            ..Filter::default()
        }));
        assert!(f(Filter {
            deny: Some(true),
            ..Filter::default()
        }));
        assert!(!f(Filter {
            deny: Some(false),
            ..Filter::default()
        }));
        assert!(f(Filter {
            reasons: vec!["not_allowlisted".into()],
            ..Filter::default()
        }));
        assert!(!f(Filter {
            reasons: vec!["denylisted".into()],
            ..Filter::default()
        }));
        assert!(f(Filter {
            name: Some("*.example".into()),
            ..Filter::default()
        }));
        assert!(!f(Filter {
            name: Some("*.test".into()),
            ..Filter::default()
        }));
        assert!(f(Filter {
            sandbox: Some("vm-1".into()),
            ..Filter::default()
        }));
        assert!(!f(Filter {
            sandbox: Some("vm-2".into()),
            ..Filter::default()
        }));
        assert!(f(Filter {
            since_ms: Some(1000),
            ..Filter::default()
        }));
        assert!(!f(Filter {
            since_ms: Some(1001),
            ..Filter::default()
        }));
        let nameless = entry("gateway", false, "started", &[], 1000);
        assert!(
            !Filter {
                name: Some("*".into()),
                ..Filter::default()
            }
            .matches(&nameless)
        );
    }

    #[test]
    fn since_takes_a_time_or_an_age() {
        assert_eq!(parse_since("90s", 100_000), Ok(10_000));
        assert_eq!(parse_since("2m", 200_000), Ok(80_000));
        assert_eq!(parse_since("1h", 3_600_000), Ok(0));
        assert_eq!(parse_since("1d", 86_400_001), Ok(1));
        assert_eq!(
            parse_since("2026-11-21T19:20:29Z", 0),
            Ok(1_795_288_829_000)
        );
        assert_eq!(
            parse_since("2026-11-21T19:20:29.990Z", 0),
            Ok(1_795_288_829_990)
        );
        assert!(parse_since("yesterday", 0).is_err());
        assert!(parse_since("2026-11-21T19:20:29+01:00", 0).is_err());
    }
}

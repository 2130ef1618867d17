//! The `dns:` section: where the gateway forwards allowed queries (the
//! host's resolvers or the policy's) and the bounds on an answer's life in
//! the name-to-IP table.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use serde::Serialize;
use serde_saphyr::{Location, Spanned};

use super::Compiler;
use crate::model::{RawDns, RawUpstream};

/// Default lower bound on a DNS answer's TTL in the name-to-IP table.
pub const DEFAULT_TTL_MIN: Duration = Duration::from_secs(5);
/// Default upper bound on a DNS answer's TTL in the name-to-IP table.
pub const DEFAULT_TTL_MAX: Duration = Duration::from_secs(300);

/// Where the gateway forwards allowed DNS queries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Upstream {
    /// The host's `/etc/resolv.conf` (read by the gateway, not by this crate).
    System,
    /// These resolvers, in order (port 53 unless written).
    Servers(Vec<SocketAddr>),
}

/// Bounds applied to DNS answer TTLs in the gateway's name-to-IP table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct TtlBounds {
    /// Answers live at least this long (so a connect that follows an answer
    /// with TTL 0 still finds it).
    pub min: Duration,
    /// Answers live at most this long.
    pub max: Duration,
}

impl TtlBounds {
    /// Clamp a TTL into the bounds.
    #[must_use]
    pub fn clamp(&self, ttl: Duration) -> Duration {
        ttl.clamp(self.min, self.max)
    }
}

impl Compiler<'_> {
    /// The resolvers and TTL bounds of the `dns:` section (absent: the
    /// host's resolvers and the default bounds). `fallback` places an
    /// inverted-bounds error when neither bound is written.
    pub(super) fn dns(
        &mut self,
        raw: Option<&RawDns>,
        fallback: Location,
    ) -> (Upstream, TtlBounds) {
        let upstream = match raw.and_then(|d| d.upstream.as_ref()) {
            None => Upstream::System,
            Some(u) => self.upstream(u),
        };
        let mut ttl = TtlBounds {
            min: DEFAULT_TTL_MIN,
            max: DEFAULT_TTL_MAX,
        };
        if let Some(dns) = raw {
            if let Some(m) = &dns.ttl_min {
                match u64::try_from(m.value) {
                    Ok(v) if v <= 86_400 => ttl.min = Duration::from_secs(v),
                    _ => self.err(
                        m.referenced,
                        format!("ttl_min {} is out of range; use 0..86400 seconds", m.value),
                    ),
                }
            }
            if let Some(m) = &dns.ttl_max {
                match u64::try_from(m.value) {
                    Ok(v) if (1..=604_800).contains(&v) => ttl.max = Duration::from_secs(v),
                    _ => self.err(
                        m.referenced,
                        format!("ttl_max {} is out of range; use 1..604800 seconds", m.value),
                    ),
                }
            }
            if ttl.min > ttl.max {
                let at = dns
                    .ttl_min
                    .as_ref()
                    .or(dns.ttl_max.as_ref())
                    .map_or(fallback, |s| s.referenced);
                self.err(
                    at,
                    format!(
                        "ttl_min ({}) is larger than ttl_max ({}); ttl_min must be <= ttl_max",
                        ttl.min.as_secs(),
                        ttl.max.as_secs()
                    ),
                );
            }
        }
        (upstream, ttl)
    }

    /// The `upstream:` key: `system`, or a list of resolvers (port 53
    /// unless written); the host's loopback and unspecified addresses are
    /// refused.
    fn upstream(&mut self, u: &Spanned<RawUpstream>) -> Upstream {
        match &u.value {
            RawUpstream::Keyword(k) if k == "system" => Upstream::System,
            RawUpstream::Keyword(k) => {
                self.err(
                    u.referenced,
                    format!("`upstream: {k}` is not understood; write `system` or a list of resolver addresses such as [192.0.2.53, \"[2001:db8::53]:53\"]"),
                );
                Upstream::System
            }
            RawUpstream::List(list) => {
                if list.is_empty() {
                    self.err(u.referenced, "`upstream` is an empty list; omit it (or write `system`) to use the host's /etc/resolv.conf");
                }
                let mut out = Vec::new();
                for s in list {
                    let s = s.trim();
                    let parsed = s
                        .parse::<SocketAddr>()
                        .ok()
                        .or_else(|| s.parse::<IpAddr>().ok().map(|ip| SocketAddr::new(ip, 53)));
                    if let Some(sa) = parsed {
                        if sa.ip().is_loopback() || sa.ip().is_unspecified() {
                            // The guest's queries would reach the host's own
                            // resolver (threat model: never the host's services).
                            self.err(
                                u.referenced,
                                format!("resolver `{s}` is a loopback or unspecified address: the guest must never reach the host's own resolver; name a resolver on the network"),
                            );
                        } else {
                            out.push(sa);
                        }
                    } else {
                        self.err(
                            u.referenced,
                            format!("resolver `{s}` is not an address; write `192.0.2.53`, `192.0.2.53:5353` or `[2001:db8::53]:53`"),
                        );
                    }
                }
                Upstream::Servers(out)
            }
        }
    }
}

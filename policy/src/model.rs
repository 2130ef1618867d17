//! The policy file as written (version 1): serde types that mirror the YAML
//! exactly. Strict: unknown keys are rejected (`deny_unknown_fields`),
//! duplicate keys are rejected by the parser, and every value a semantic
//! check may complain about is [`Spanned`] so the error can name its line and
//! column.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use serde_saphyr::Spanned;

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPolicy {
    pub(crate) version: Spanned<RawVersion>,
    pub(crate) id: Spanned<String>,
    #[serde(default)]
    pub(crate) label: Option<String>,
    #[serde(default)]
    #[allow(dead_code, reason = "free-form, kept only so it parses")]
    pub(crate) comment: Option<String>,
    #[serde(default)]
    pub(crate) allow: Vec<Spanned<RawAllow>>,
    #[serde(default)]
    pub(crate) deny: Vec<Spanned<String>>,
    #[serde(default)]
    pub(crate) internal: Vec<Spanned<String>>,
    #[serde(default)]
    pub(crate) ports: Option<RawPorts>,
    #[serde(default)]
    pub(crate) inspect: Vec<Spanned<String>>,
    #[serde(default)]
    pub(crate) dns: Option<RawDns>,
    #[serde(default)]
    pub(crate) secrets: Vec<Spanned<RawSecret>>,
    #[serde(default)]
    pub(crate) unlisted: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) approval: Option<Spanned<RawApproval>>,
}

/// `version:`, which must be a YAML integer. A quoted `"1"` is a string and
/// is rejected as a wrong type (the parser would otherwise read any scalar
/// that looks like a number as one, quoted or not).
#[derive(Debug)]
pub(crate) struct RawVersion(pub(crate) i64);

impl<'de> Deserialize<'de> for RawVersion {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(VersionVisitor)
    }
}

struct VersionVisitor;

impl<'de> Visitor<'de> for VersionVisitor {
    type Value = RawVersion;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the number 1 (`version: 1`)")
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawVersion, E> {
        Ok(RawVersion(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawVersion, E> {
        i64::try_from(v).map(RawVersion).map_err(|_| {
            E::custom(format!(
                "unsupported policy version {v}; this sluice reads `version: 1`"
            ))
        })
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<RawVersion, E> {
        Err(E::custom(format!(
            "`version` is the string {v:?}, not a number; write `version: 1` without quotes"
        )))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<RawVersion, E> {
        Err(E::custom(format!(
            "`version` is {v:?}, not a whole number; write `version: 1`"
        )))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<RawVersion, E> {
        Err(E::custom(format!(
            "`version` is `{v}`, not a number; write `version: 1`"
        )))
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, _: A) -> Result<RawVersion, A::Error> {
        Err(de::Error::custom(
            "`version` is a list, not a number; write `version: 1`",
        ))
    }

    fn visit_map<A: de::MapAccess<'de>>(self, _: A) -> Result<RawVersion, A::Error> {
        Err(de::Error::custom(
            "`version` is a mapping, not a number; write `version: 1`",
        ))
    }
}

/// One allow rule: exactly one of `domain`, `domains`, `cidr`, `cidrs`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAllow {
    #[serde(default)]
    pub(crate) id: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) domain: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) domains: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    pub(crate) cidr: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) cidrs: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    pub(crate) ports: Option<Vec<Spanned<i64>>>,
    #[serde(default)]
    pub(crate) udp_ports: Option<Vec<Spanned<i64>>>,
    #[serde(default)]
    #[allow(dead_code, reason = "free-form, kept only so it parses")]
    pub(crate) comment: Option<String>,
}

/// Extra port classes beyond the built-in 443 (TLS) and 80 (HTTP).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPorts {
    #[serde(default)]
    pub(crate) tls: Vec<Spanned<i64>>,
    #[serde(default)]
    pub(crate) http: Vec<Spanned<i64>>,
}

/// Upstream resolvers and TTL bounds.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDns {
    #[serde(default)]
    pub(crate) upstream: Option<Spanned<RawUpstream>>,
    #[serde(default)]
    pub(crate) ttl_min: Option<Spanned<i64>>,
    #[serde(default)]
    pub(crate) ttl_max: Option<Spanned<i64>>,
}

/// `upstream: system` or a list of resolver addresses.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum RawUpstream {
    Keyword(String),
    List(Vec<String>),
}

/// One secret.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSecret {
    pub(crate) name: Spanned<String>,
    pub(crate) placeholder: Spanned<String>,
    #[serde(default)]
    pub(crate) env: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) file: Option<Spanned<String>>,
    /// Never accepted: present only to give a precise error.
    #[serde(default)]
    pub(crate) value: Option<Spanned<de::IgnoredAny>>,
    pub(crate) hosts: Vec<Spanned<String>>,
    #[serde(default)]
    pub(crate) locations: Option<Vec<Spanned<String>>>,
    /// `websocket: true` opts the secret in to WebSocket upgrades on its
    /// hosts (default false).
    #[serde(default)]
    pub(crate) websocket: bool,
    #[serde(default)]
    #[allow(dead_code, reason = "free-form, kept only so it parses")]
    pub(crate) comment: Option<String>,
}

/// `approval:` (runtime approval of unlisted names).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawApproval {
    pub(crate) backend: Spanned<RawApprovalBackend>,
    #[serde(default)]
    pub(crate) timeout: Option<Spanned<i64>>,
    #[serde(default)]
    pub(crate) always: Option<bool>,
    #[serde(default)]
    pub(crate) ports: Option<Vec<Spanned<i64>>>,
    #[serde(default)]
    pub(crate) udp_ports: Option<Vec<Spanned<i64>>>,
    #[serde(default)]
    pub(crate) max_pending: Option<Spanned<i64>>,
    #[serde(default)]
    pub(crate) per_minute: Option<Spanned<i64>>,
}

/// `backend:`: `terminal`, `unix: PATH` or `webhook: {url: ...}`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum RawApprovalBackend {
    Terminal,
    Unix(String),
    Webhook(RawWebhook),
}

/// `webhook:`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawWebhook {
    pub(crate) url: String,
    #[serde(default)]
    pub(crate) bearer_token_file: Option<String>,
    #[serde(default)]
    pub(crate) client_cert: Option<String>,
    #[serde(default)]
    pub(crate) client_key: Option<String>,
    #[serde(default)]
    pub(crate) ca: Option<String>,
}

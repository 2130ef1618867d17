//! The policy file as written (version 1): serde types that mirror the YAML
//! exactly. Strict: unknown keys are rejected (`deny_unknown_fields`),
//! duplicate keys are rejected by the parser, and every value a semantic
//! check may complain about is [`Spanned`] so the error can name its line and
//! column.

use serde::Deserialize;
use serde_saphyr::Spanned;

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPolicy {
    pub(crate) version: Spanned<i64>,
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
    pub(crate) value: Option<Spanned<serde::de::IgnoredAny>>,
    pub(crate) hosts: Vec<Spanned<String>>,
    #[serde(default)]
    pub(crate) locations: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    #[allow(dead_code, reason = "free-form, kept only so it parses")]
    pub(crate) comment: Option<String>,
}

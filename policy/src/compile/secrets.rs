//! Secrets as the policy declares them (never their values): where each
//! value comes from, the placeholder the sandbox sends, the exact hosts it
//! may go to and where in a request; and the checks that make those
//! bindings unambiguous and reachable.

use std::collections::HashMap;
use std::path::PathBuf;

use serde::Serialize;
use serde_saphyr::{Location, Spanned};

use super::compiler::valid_ident;
use super::{CompiledPolicy, Compiler, Transport};
use crate::model::RawSecret;
use crate::name::{DomainPattern, PatternKind, PatternUse, parse_pattern};
use crate::reason::Reason;

/// Where a secret's real value comes from. The policy names the source; the
/// gateway reads it. Values are never written in the policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SecretSource {
    /// An environment variable of the gateway process.
    Env(String),
    /// A file (absolute path); its content, without one trailing newline.
    File(PathBuf),
}

/// Where in a request a placeholder may be substituted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct SecretLocations {
    /// Request header values (including Basic auth credentials). Default.
    pub headers: bool,
    /// The query string.
    pub query: bool,
    /// The request body.
    pub body: bool,
}

/// A secret as declared by the policy (never its value).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct SecretSpec {
    /// The secret's name (appears in audit lines).
    pub name: String,
    /// The string the sandbox sees and sends.
    pub placeholder: String,
    /// Where the real value comes from.
    pub source: SecretSource,
    /// The exact (normalised) hosts it may be sent to.
    pub hosts: Vec<String>,
    /// Where it may be substituted.
    pub locations: SecretLocations,
    /// The policy opts this secret in to WebSocket (`websocket: true`): an
    /// upgrade to a host it is bound to is allowed when every secret bound
    /// to that host opted in. After the upgrade nothing is substituted or
    /// scrubbed, so opting in accepts that an origin echoing the upgrade
    /// request into the stream hands the value to the guest
    /// (docs/secrets.md "Upgrades"). Not serialised when false, so the
    /// version hash of a policy without the key is unchanged.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub websocket: bool,
}

impl Compiler<'_> {
    /// Checks the `secrets:` list and adds each secret with a source to
    /// `policy` (its hosts join the inspected patterns). A host must be
    /// reachable on a TLS port under the rules already compiled.
    pub(super) fn secrets(&mut self, raw: &[Spanned<RawSecret>], policy: &mut CompiledPolicy) {
        let mut names: HashMap<String, Location> = HashMap::new();
        let mut placeholders: Vec<(String, Location)> = Vec::new();
        for entry in raw {
            let s = &entry.value;
            let name = s.name.value.clone();
            if !valid_ident(&name, 64) {
                self.err(
                    s.name.referenced,
                    format!("secret name `{name}` is invalid; use 1-64 characters from A-Z a-z 0-9 . _ -"),
                );
            } else if let Some(prev) = names.get(&name) {
                let (l, c) = (prev.line(), prev.column());
                self.err(
                    s.name.referenced,
                    format!("secret `{name}` is already declared at line {l}, column {c}; secret names must be unique"),
                );
            } else {
                names.insert(name.clone(), s.name.referenced);
            }
            if let Some(v) = &s.value {
                self.err(
                    v.referenced,
                    "secret values are never written in the policy; use `env: VARIABLE` or `file: /absolute/path`",
                );
            }
            let ph = &s.placeholder;
            if ph.value.len() < 8 || !ph.value.bytes().all(|b| b.is_ascii_graphic()) {
                self.err(
                    ph.referenced,
                    format!(
                        "placeholder `{}` is invalid; use at least 8 printable ASCII characters without spaces, e.g. `sk-sluice-placeholder-{name}`",
                        ph.value
                    ),
                );
            } else {
                for (other, at) in &placeholders {
                    let (l, c) = (at.line(), at.column());
                    if *other == ph.value {
                        self.err(
                            ph.referenced,
                            format!("placeholder `{}` is already used by the secret at line {l}, column {c}; each secret needs its own placeholder", ph.value),
                        );
                    } else if other.contains(ph.value.as_str()) || ph.value.contains(other.as_str())
                    {
                        self.err(
                            ph.referenced,
                            format!("placeholder `{}` and `{other}` (line {l}, column {c}) contain one another; substitution would be ambiguous, make neither a substring of the other", ph.value),
                        );
                    }
                }
                placeholders.push((ph.value.clone(), ph.referenced));
            }
            let source = match (&s.env, &s.file) {
                (Some(e), None) => {
                    if e.value.is_empty()
                        || e.value.bytes().next().is_some_and(|b| b.is_ascii_digit())
                        || !e
                            .value
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'_')
                    {
                        self.err(
                            e.referenced,
                            format!("`{}` is not an environment variable name; use A-Z a-z 0-9 _ (not starting with a digit)", e.value),
                        );
                    }
                    Some(SecretSource::Env(e.value.clone()))
                }
                (None, Some(f)) => {
                    if !f.value.starts_with('/') {
                        self.err(
                            f.referenced,
                            format!("secret file `{}` must be an absolute path", f.value),
                        );
                    }
                    Some(SecretSource::File(PathBuf::from(&f.value)))
                }
                (Some(_), Some(f)) => {
                    self.err(
                        f.referenced,
                        format!("secret `{name}` has both `env` and `file`; give exactly one"),
                    );
                    None
                }
                (None, None) => {
                    if s.value.is_none() {
                        self.err(
                            entry.referenced,
                            format!("secret `{name}` has no source; add `env: VARIABLE` or `file: /absolute/path`"),
                        );
                    }
                    None
                }
            };
            let mut locations = SecretLocations {
                headers: false,
                query: false,
                body: false,
            };
            match &s.locations {
                None => locations.headers = true,
                Some(list) => {
                    if list.is_empty() {
                        self.err(entry.referenced, format!("secret `{name}` has an empty `locations` list; omit it for [headers] or list headers, query, body"));
                    }
                    for l in list {
                        match l.value.as_str() {
                            "headers" => locations.headers = true,
                            "query" => locations.query = true,
                            "body" => locations.body = true,
                            other => self.err(
                                l.referenced,
                                format!("unknown secret location `{other}`; use `headers`, `query` or `body`"),
                            ),
                        }
                    }
                }
            }
            if s.hosts.is_empty() {
                self.err(
                    entry.referenced,
                    format!("secret `{name}` has no hosts; list the exact hosts it may be sent to"),
                );
            }
            let mut hosts = Vec::new();
            for h in &s.hosts {
                let pat = match parse_pattern(&h.value, PatternUse::ExactOnly) {
                    Ok(p) => p,
                    Err(m) => {
                        self.err(h.referenced, m);
                        continue;
                    }
                };
                let host = pat.base;
                let reachable = policy.tls_ports.iter().any(|&p| {
                    policy
                        .check_name_port(&host, Transport::Tcp, p)
                        .is_allowed()
                });
                if !reachable {
                    let why = match policy.check_name(&host).reason {
                        Reason::Denylisted => "it is denied by a deny rule",
                        Reason::Allowlisted => "its allow rules name no TLS port",
                        _ => "no allow rule matches it",
                    };
                    self.err(
                        h.referenced,
                        format!("secret `{name}` is bound to `{host}`, which no allow rule reaches on a TLS port ({why}); add an allow rule for `{host}` on 443 or bind the secret to an allowed host"),
                    );
                }
                hosts.push(host);
            }
            if let Some(source) = source {
                let Ok(sid) = u32::try_from(policy.secrets.len()) else {
                    continue;
                };
                for h in &hosts {
                    let list = policy
                        .secrets_by_host
                        .entry(h.clone().into_boxed_str())
                        .or_default();
                    if !list.contains(&sid) {
                        list.push(sid);
                    }
                    let p = DomainPattern {
                        kind: PatternKind::Exact,
                        base: h.clone(),
                    };
                    if !policy.inspect.contains(&p) {
                        policy.inspect.push(p);
                    }
                }
                policy.secrets.push(SecretSpec {
                    name,
                    placeholder: ph.value.clone(),
                    source,
                    hosts,
                    locations,
                    websocket: s.websocket,
                });
            }
        }
    }
}

//! The compiler: one pass over a parsed policy that collects every error
//! (each at its `line:col`) and, when there are none, builds the snapshot
//! and its version hash. The allow, deny, `internal:` and `inspect:`
//! sections are compiled here; ports, `dns:`, secrets and approval have
//! modules of their own.

use std::collections::HashMap;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::Serialize;
use serde_saphyr::{Location, Spanned};

use super::load::clamp_u32;
use super::{CompiledPolicy, SecretSpec, TLS_PORT, Upstream};
use crate::approval::{ApprovalSpec, Unlisted};
use crate::error::{PolicyError, PolicyErrors};
use crate::fx::FxMap;
use crate::model::{RawAllow, RawPolicy};
use crate::name::{DomainPattern, PatternKind, PatternUse, parse_pattern};
use crate::name_table::{NameTableBuilder, RuleRef};
use crate::platform;
use crate::rule_table::RuleTable;

/// Inputs to compilation that do not come from the file.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct CompileOptions {
    /// The host's own addresses (every address of every interface). They
    /// join the non-overridable platform deny set. The gateway fills them
    /// in; `sluice policy check` leaves them empty.
    pub host_addresses: Vec<IpAddr>,
}

/// Serialised to compute the version hash.
#[derive(Serialize)]
struct Canonical<'a> {
    version: u32,
    id: &'a str,
    label: Option<&'a str>,
    rules: Vec<(&'a str, &'a str, &'a [u16], &'a [u16])>,
    deny: &'a [String],
    internal: Vec<String>,
    tls_ports: &'a [u16],
    http_ports: &'a [u16],
    inspect: Vec<String>,
    secrets: &'a [SecretSpec],
    upstream: &'a Upstream,
    ttl: (u64, u64),
    // Absent when at their defaults, so a policy that does not use runtime
    // approval keeps the hash it had before these keys existed.
    #[serde(skip_serializing_if = "Unlisted::is_deny")]
    unlisted: Unlisted,
    #[serde(skip_serializing_if = "Option::is_none")]
    approval: Option<&'a ApprovalSpec>,
}

/// One compilation: the origin that names errors, and the errors found so
/// far (compilation goes on after an error, to report them all).
pub(crate) struct Compiler<'o> {
    origin: &'o str,
    errors: Vec<PolicyError>,
}

impl<'o> Compiler<'o> {
    /// A compiler whose errors name `origin`.
    pub(crate) fn new(origin: &'o str) -> Self {
        Self {
            origin,
            errors: Vec::new(),
        }
    }

    /// Records an error at `at`.
    pub(crate) fn err(&mut self, at: Location, message: impl Into<String>) {
        self.errors.push(PolicyError {
            origin: self.origin.to_owned(),
            line: clamp_u32(at.line()),
            column: clamp_u32(at.column()),
            message: message.into(),
        });
    }

    /// A network (an address alone is a host network), or an error when it
    /// does not parse or lies entirely in the platform deny set.
    fn cidr(&mut self, s: &Spanned<String>, what: &str) -> Option<IpNet> {
        let text = s.value.trim();
        let net = match text.parse::<IpNet>() {
            Ok(n) => n.trunc(),
            Err(_) => match text.parse::<IpAddr>() {
                Ok(ip) => IpNet::from(ip),
                Err(_) => {
                    self.err(
                        s.referenced,
                        format!(
                            "`{}` is not a CIDR network; write an address with a prefix length, e.g. `203.0.113.0/24` or `2001:db8::/32`",
                            s.value
                        ),
                    );
                    return None;
                }
            },
        };
        let first = platform::classify(net.network());
        let last = platform::classify(net.broadcast());
        if first.is_always_denied() && first == last {
            self.err(
                s.referenced,
                format!(
                    "{what} `{net}` lies entirely in the platform deny set ({first}), which no rule can open; remove it"
                ),
            );
            return None;
        }
        Some(net)
    }

    /// Compiles `raw`: the snapshot, or every error found.
    pub(crate) fn compile(
        mut self,
        raw: RawPolicy,
        options: &CompileOptions,
    ) -> Result<CompiledPolicy, PolicyErrors> {
        if raw.version.value.0 != 1 {
            self.err(
                raw.version.referenced,
                format!(
                    "unsupported policy version {}; this sluice reads `version: 1`",
                    raw.version.value.0
                ),
            );
        }
        let id = raw.id.value.clone();
        if !valid_ident(&id, 64) {
            self.err(
                raw.id.referenced,
                format!("policy id `{id}` is invalid; use 1-64 characters from A-Z a-z 0-9 . _ -"),
            );
        }

        let mut rules = RuleTable::default();
        let mut pattern_text = String::new();
        let mut names = NameTableBuilder::default();
        let mut cidr_rules: Vec<(IpNet, u32)> = Vec::new();
        let mut rule_ids: HashMap<String, Location> = HashMap::new();
        let mut domain_rule_count = 0usize;

        for (idx, entry) in raw.allow.iter().enumerate() {
            let at = entry.referenced;
            let a: &RawAllow = &entry.value;
            let rule_id = match &a.id {
                Some(s) => {
                    if !valid_ident(&s.value, 128) {
                        self.err(
                            s.referenced,
                            format!("rule id `{}` is invalid; use 1-128 characters from A-Z a-z 0-9 . _ -", s.value),
                        );
                    } else if let Some(prev) = rule_ids.get(&s.value) {
                        let (l, c) = (prev.line(), prev.column());
                        self.err(
                            s.referenced,
                            format!("rule id `{}` is already used at line {l}, column {c}; ids must be unique", s.value),
                        );
                    } else {
                        rule_ids.insert(s.value.clone(), s.referenced);
                    }
                    s.value.clone()
                }
                None => format!("allow[{idx}]"),
            };
            let given = usize::from(a.domain.is_some())
                + usize::from(a.domains.is_some())
                + usize::from(a.cidr.is_some())
                + usize::from(a.cidrs.is_some());
            if given != 1 {
                self.err(
                    at,
                    if given == 0 {
                        "allow rule names no destination; give exactly one of `domain`, `domains`, `cidr`, `cidrs`"
                    } else {
                        "allow rule mixes destinations; give exactly one of `domain`, `domains`, `cidr`, `cidrs` (split it into several rules)"
                    },
                );
                continue;
            }
            let tcp_ports = match &a.ports {
                Some(list) => self.ports(list),
                None => vec![TLS_PORT],
            };
            let udp_ports = match &a.udp_ports {
                Some(list) => self.ports(list),
                None => Vec::new(),
            };
            if tcp_ports.is_empty() && udp_ports.is_empty() {
                if a.ports.as_ref().is_some_and(|l| l.is_empty()) {
                    self.err(
                        at,
                        "allow rule has an empty `ports` list and no `udp_ports`; omit `ports` for the default [443] or list ports",
                    );
                }
                continue;
            }
            let Some(port_set) = rules.port_set(&tcp_ports, &udp_ports) else {
                continue;
            };
            let mut domain_list: Vec<&Spanned<String>> = Vec::new();
            if let Some(d) = &a.domain {
                domain_list.push(d);
            }
            if let Some(ds) = &a.domains {
                if ds.is_empty() {
                    self.err(at, "`domains` is empty; list at least one domain");
                }
                domain_list.extend(ds.iter());
            }
            for d in domain_list {
                let pat = match parse_pattern(&d.value, PatternUse::Allow) {
                    Ok(p) => p,
                    Err(m) => {
                        self.err(d.referenced, m);
                        continue;
                    }
                };
                pattern_text.clear();
                pattern_text.push_str(match pat.kind {
                    PatternKind::Exact => "",
                    PatternKind::Subdomains => "*.",
                    PatternKind::ApexAndSubdomains => "**.",
                });
                pattern_text.push_str(&pat.base);
                let Some(rid) = rules.push(&rule_id, &pattern_text, port_set) else {
                    self.err(d.referenced, "too many rules");
                    continue;
                };
                let r = RuleRef {
                    id: rid,
                    ports: port_set,
                };
                let node = names.node(pat.base);
                match pat.kind {
                    PatternKind::Exact => node.exact.push(r),
                    PatternKind::Subdomains => node.sub.push(r),
                    PatternKind::ApexAndSubdomains => {
                        node.exact.push(r);
                        node.sub.push(r);
                    }
                }
                domain_rule_count += 1;
            }
            let mut cidr_list: Vec<&Spanned<String>> = Vec::new();
            if let Some(c) = &a.cidr {
                cidr_list.push(c);
            }
            if let Some(cs) = &a.cidrs {
                if cs.is_empty() {
                    self.err(at, "`cidrs` is empty; list at least one network");
                }
                cidr_list.extend(cs.iter());
            }
            for c in cidr_list {
                let Some(net) = self.cidr(c, "allow network") else {
                    continue;
                };
                let Some(rid) = rules.push(&rule_id, &net.to_string(), port_set) else {
                    continue;
                };
                cidr_rules.push((net, rid));
            }
        }

        let allow_rule_count = rules.len();
        let no_ports = rules.port_set(&[], &[]).unwrap_or(0);
        let mut canon_deny: Vec<String> = Vec::new();
        for (idx, d) in raw.deny.iter().enumerate() {
            let pat = match parse_pattern(&d.value, PatternUse::Deny) {
                Ok(p) => p,
                Err(m) => {
                    self.err(d.referenced, m);
                    continue;
                }
            };
            let pattern = pat.to_string();
            let Some(rid) = rules.push(&format!("deny[{idx}]"), &pattern, no_ports) else {
                continue;
            };
            canon_deny.push(pattern);
            let node = names.node(pat.base);
            match pat.kind {
                PatternKind::Exact => {
                    node.deny_exact.get_or_insert(rid);
                }
                PatternKind::Subdomains => {
                    node.deny_sub.get_or_insert(rid);
                }
                PatternKind::ApexAndSubdomains => {
                    node.deny_exact.get_or_insert(rid);
                    node.deny_sub.get_or_insert(rid);
                }
            }
            domain_rule_count += 1;
        }

        let mut internal = Vec::new();
        for (idx, s) in raw.internal.iter().enumerate() {
            if let Some(net) = self.cidr(s, "internal network") {
                let Some(rid) = rules.push(&format!("internal[{idx}]"), &net.to_string(), no_ports)
                else {
                    continue;
                };
                internal.push((net, rid));
            }
        }

        let (tls_ports, http_ports) = self.protocol_ports(raw.ports.as_ref());

        let (upstream, ttl) = self.dns(raw.dns.as_ref(), raw.id.referenced);

        let mut inspect = Vec::new();
        let mut inspect_names: FxMap<Box<str>, (bool, bool)> = FxMap::default();
        for s in &raw.inspect {
            match parse_pattern(&s.value, PatternUse::Allow) {
                Ok(p) => {
                    add_inspect(&mut inspect_names, &p);
                    inspect.push(p);
                }
                Err(m) => self.err(s.referenced, m),
            }
        }

        rules.freeze();
        let Some(names) = names.build() else {
            self.err(raw.id.referenced, "too many domain rules");
            return Err(PolicyErrors::new(self.errors));
        };
        let (unlisted, approval) = self.approval(raw.unlisted.as_ref(), raw.approval.as_ref());
        let mut policy = CompiledPolicy {
            origin: self.origin.to_owned(),
            id,
            label: raw.label.clone(),
            version_hash: String::new(),
            rules,
            names,
            cidr_rules,
            internal,
            host_addresses: options.host_addresses.clone(),
            tls_ports,
            http_ports,
            inspect,
            inspect_names,
            secrets: Vec::new(),
            secrets_by_host: FxMap::default(),
            upstream,
            ttl,
            domain_rule_count,
            unlisted,
            approval,
        };

        self.secrets(&raw.secrets, &mut policy);

        if !self.errors.is_empty() {
            return Err(PolicyErrors::new(self.errors));
        }

        let canonical = Canonical {
            version: 1,
            id: &policy.id,
            label: policy.label.as_deref(),
            rules: (0..allow_rule_count)
                .filter_map(|i| policy.rules.describe(u32::try_from(i).ok()?))
                .collect(),
            deny: &canon_deny,
            internal: policy.internal.iter().map(|(n, _)| n.to_string()).collect(),
            tls_ports: &policy.tls_ports,
            http_ports: &policy.http_ports,
            inspect: policy.inspect.iter().map(ToString::to_string).collect(),
            secrets: &policy.secrets,
            upstream: &policy.upstream,
            ttl: (policy.ttl.min.as_secs(), policy.ttl.max.as_secs()),
            unlisted: policy.unlisted,
            approval: policy.approval.as_ref(),
        };
        let bytes = serde_json::to_vec(&canonical).unwrap_or_default();
        let digest = ring::digest::digest(&ring::digest::SHA256, &bytes);
        let mut hex = String::from("sha256:");
        for b in digest.as_ref().iter().take(8) {
            hex.push_str(&format!("{b:02x}"));
        }
        policy.version_hash = hex;
        Ok(policy)
    }
}

/// Marks `p`'s base in the `inspect:` table: the name itself, its
/// subdomains, or both.
fn add_inspect(map: &mut FxMap<Box<str>, (bool, bool)>, p: &DomainPattern) {
    let e = map
        .entry(p.base.clone().into_boxed_str())
        .or_insert((false, false));
    match p.kind {
        PatternKind::Exact => e.0 = true,
        PatternKind::Subdomains => e.1 = true,
        PatternKind::ApexAndSubdomains => {
            e.0 = true;
            e.1 = true;
        }
    }
}

/// Whether `s` is 1 to `max` characters from A-Z a-z 0-9 . _ - (policy,
/// rule and secret names).
pub(super) fn valid_ident(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

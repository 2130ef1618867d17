//! The compiled snapshot ([`CompiledPolicy`]) and the questions the gateway
//! asks it: may this name be resolved, may this flow open, may this answer
//! reach the guest, which hosts are inspected and which secrets they carry.
//!
//! Matching structure: the name table (`name_table.rs`) maps each normalised
//! domain a rule names to the allow and deny rules written for that exact
//! name and for its subdomains. A check reads the name once and probes the
//! label-boundary suffixes (`a.b.example.com`, `b.example.com`,
//! `example.com`, `com`) with one hash each, so its cost grows with the
//! number of labels, not the number of rules.

use std::net::IpAddr;

use ipnet::IpNet;

use super::{PortProtocol, SecretSpec, Transport, TtlBounds, Upstream};
use crate::approval::{ApprovalSpec, Unlisted};
use crate::fx::FxMap;
use crate::name::{DomainPattern, normalize_name};
use crate::name_table::{NameMatch, NameTable, RuleRef};
use crate::platform::{self, AddressClass};
use crate::reason::Reason;
use crate::rule_table::RuleTable;
use crate::verdict::{MatchedRule, Verdict};

/// An immutable compiled policy snapshot.
///
/// Shared as `Arc<CompiledPolicy>` and swapped whole on reload; a snapshot
/// never changes, so verdicts borrowed from it stay valid while it lives.
/// Every check is allocation-free.
#[derive(Debug)]
pub struct CompiledPolicy {
    pub(super) origin: String,
    pub(super) id: String,
    pub(super) label: Option<String>,
    pub(super) version_hash: String,
    pub(super) rules: RuleTable,
    pub(super) names: NameTable,
    pub(super) cidr_rules: Vec<(IpNet, u32)>,
    pub(super) internal: Vec<(IpNet, u32)>,
    pub(super) host_addresses: Vec<IpAddr>,
    pub(super) tls_ports: Vec<u16>,
    pub(super) http_ports: Vec<u16>,
    pub(super) inspect: Vec<DomainPattern>,
    pub(super) inspect_names: FxMap<Box<str>, (bool, bool)>,
    pub(super) secrets: Vec<SecretSpec>,
    pub(super) secrets_by_host: FxMap<Box<str>, Vec<u32>>,
    pub(super) upstream: Upstream,
    pub(super) ttl: TtlBounds,
    pub(super) domain_rule_count: usize,
    pub(super) unlisted: Unlisted,
    pub(super) approval: Option<ApprovalSpec>,
}

impl CompiledPolicy {
    /// The policy's `id:` (goes into every audit line).
    #[must_use]
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The policy's free-text `label:`, if any.
    #[must_use]
    pub fn label(&self) -> Option<&str> {
        self.label.as_deref()
    }

    /// Where the policy came from (the file path or origin name given).
    #[must_use]
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// `sha256:` and the first 16 hex digits of the SHA-256 of the
    /// normalised policy. Stable across whitespace, comments, key order, case
    /// and IDN spelling; changes whenever any rule, port, secret binding,
    /// resolver or TTL changes.
    #[must_use]
    pub fn version_hash(&self) -> &str {
        &self.version_hash
    }

    /// The number of domain patterns (allow and deny) compiled.
    #[must_use]
    pub fn domain_rule_count(&self) -> usize {
        self.domain_rule_count
    }

    /// The upstream DNS resolvers.
    #[must_use]
    pub fn upstream_resolvers(&self) -> &Upstream {
        &self.upstream
    }

    /// TTL bounds for the name-to-IP table.
    #[must_use]
    pub fn ttl_bounds(&self) -> TtlBounds {
        self.ttl
    }

    /// What happens to a name no rule lists (`unlisted:`).
    #[must_use]
    pub fn unlisted(&self) -> Unlisted {
        self.unlisted
    }

    /// The `approval:` section, when the policy has one.
    #[must_use]
    pub fn approval(&self) -> Option<&ApprovalSpec> {
        self.approval.as_ref()
    }

    /// How the gateway must treat TCP `port`: TLS (443 and `ports.tls`),
    /// plain HTTP (80 and `ports.http`), or raw TCP.
    #[must_use]
    pub fn port_protocol(&self, port: u16) -> PortProtocol {
        if self.tls_ports.binary_search(&port).is_ok() {
            PortProtocol::Tls
        } else if self.http_ports.binary_search(&port).is_ok() {
            PortProtocol::Http
        } else {
            PortProtocol::Tcp
        }
    }

    /// Whether TCP `port` carries TLS that must be SNI-inspected.
    #[must_use]
    pub fn is_tls_port(&self, port: u16) -> bool {
        self.port_protocol(port) == PortProtocol::Tls
    }

    /// Walk `name` (as seen on the wire: any case, optional trailing dot)
    /// through the name table. `accept` filters allow rules (e.g. by port);
    /// deny rules always win. A name that is not valid DNS syntax matches
    /// nothing.
    #[inline]
    fn match_name(&self, name: &str, accept: impl FnMut(RuleRef) -> bool) -> NameMatch {
        self.names.match_name(name, accept)
    }

    /// Whether a rule allows `port` over `transport`.
    fn port_filter(&self, transport: Transport, port: u16) -> impl Fn(RuleRef) -> bool + '_ {
        move |r| self.rules.allows(r.ports, transport, port)
    }

    fn rule_ref<'a>(&'a self, id: u32, name: Option<&'a str>) -> Option<MatchedRule<'a>> {
        self.rules
            .texts(id)
            .map(|(id, pattern)| MatchedRule { id, pattern, name })
    }

    fn verdict_for<'a>(&'a self, reason: Reason, id: u32, name: Option<&'a str>) -> Verdict<'a> {
        match self.rule_ref(id, name) {
            Some(rule) => Verdict::with_rule(reason, rule),
            None => Verdict::of(reason),
        }
    }

    /// DNS stage: may this name be resolved at all (on any port)?
    ///
    /// The name is normalised here (ASCII case-folding, one trailing dot);
    /// a name that is not valid ASCII DNS syntax is denied `not_allowlisted`
    /// (the gateway normalises first with [`crate::normalize_name`] to answer
    /// FORMERR instead). Deny rules win over allow rules.
    #[must_use]
    pub fn check_name<'a>(&'a self, name: &'a str) -> Verdict<'a> {
        match self.match_name(name, |_| true) {
            NameMatch::Denied(d) => self.verdict_for(Reason::Denylisted, d, Some(name)),
            NameMatch::Allowed(a) | NameMatch::FilteredOut(a) => {
                self.verdict_for(Reason::Allowlisted, a, Some(name))
            }
            NameMatch::None => Verdict::of(Reason::NotAllowlisted),
        }
    }

    /// Whether the name is allowed on `port` over `transport` (no address
    /// check). Used for SNI / Host checks after the destination check.
    #[must_use]
    pub fn check_name_port<'a>(
        &'a self,
        name: &'a str,
        transport: Transport,
        port: u16,
    ) -> Verdict<'a> {
        match self.match_name(name, self.port_filter(transport, port)) {
            NameMatch::Denied(d) => self.verdict_for(Reason::Denylisted, d, Some(name)),
            NameMatch::Allowed(a) => self.verdict_for(Reason::Allowlisted, a, Some(name)),
            NameMatch::FilteredOut(f) => {
                self.verdict_for(port_reason(transport, port), f, Some(name))
            }
            NameMatch::None => Verdict::of(Reason::NotAllowlisted),
        }
    }

    /// The platform and non-public checks for a destination address.
    fn address_gate<'a>(&'a self, ip: IpAddr) -> Result<(), Verdict<'a>> {
        let class = platform::classify(ip);
        if class.is_always_denied() || self.is_host_address(ip) {
            return Err(Verdict::of(Reason::PlatformDenied));
        }
        if class.is_non_public() && !self.internal_allows(ip) {
            return Err(Verdict::of(Reason::PrivateDestination));
        }
        Ok(())
    }

    fn is_host_address(&self, ip: IpAddr) -> bool {
        let canon = canonical_ip(ip);
        self.host_addresses
            .iter()
            .any(|h| canonical_ip(*h) == canon)
    }

    /// TCP stage: may the guest open a TCP connection to `ip:port`, given the
    /// names the sandbox's DNS table says resolved to `ip` (only names whose
    /// entry is still valid)?
    ///
    /// Order: platform deny set (always first), non-public ranges (unless a
    /// CIDR allow rule or `internal:` names them), CIDR allow rules for the
    /// port, then the names: allowed if any name is allowed on this port.
    /// With no name and no CIDR match the verdict is
    /// `ip_not_resolved_for_name`. For a name that is allowed but not on
    /// this port: `port_not_allowed`; for a denied name: `denylisted`.
    #[must_use]
    pub fn check_destination<'a>(
        &'a self,
        ip: IpAddr,
        port: u16,
        names: &[&'a str],
    ) -> Verdict<'a> {
        self.check_flow(Transport::Tcp, ip, port, names)
    }

    /// UDP stage: like [`CompiledPolicy::check_destination`] but against the
    /// rules' `udp_ports`. Denials that no rule explains are `quic_blocked`
    /// for port 443 and `udp_blocked` otherwise. (DNS to the gateway itself
    /// never reaches this check.)
    #[must_use]
    pub fn check_udp<'a>(&'a self, ip: IpAddr, port: u16, names: &[&'a str]) -> Verdict<'a> {
        self.check_flow(Transport::Udp, ip, port, names)
    }

    fn check_flow<'a>(
        &'a self,
        transport: Transport,
        ip: IpAddr,
        port: u16,
        names: &[&'a str],
    ) -> Verdict<'a> {
        if let Err(v) = self.address_gate(ip) {
            return v;
        }
        for &(net, id) in &self.cidr_rules {
            if net.contains(&ip)
                && self
                    .rules
                    .ports_of(id)
                    .is_some_and(|set| self.rules.allows(set, transport, port))
            {
                return self.verdict_for(Reason::CidrAllowed, id, None);
            }
        }
        let mut port_miss: Option<Verdict<'a>> = None;
        let mut denied: Option<Verdict<'a>> = None;
        for &name in names {
            match self.match_name(name, self.port_filter(transport, port)) {
                NameMatch::Allowed(a) => {
                    return self.verdict_for(Reason::Allowlisted, a, Some(name));
                }
                NameMatch::FilteredOut(f) => {
                    if port_miss.is_none() {
                        port_miss =
                            Some(self.verdict_for(port_reason(transport, port), f, Some(name)));
                    }
                }
                NameMatch::Denied(d) => {
                    if denied.is_none() {
                        denied = Some(self.verdict_for(Reason::Denylisted, d, Some(name)));
                    }
                }
                NameMatch::None => {}
            }
        }
        if let Some(v) = port_miss.or(denied) {
            return v;
        }
        match transport {
            Transport::Udp => Verdict::of(port_reason(transport, port)),
            Transport::Tcp if names.is_empty() => Verdict::of(Reason::IpNotResolvedForName),
            Transport::Tcp => Verdict::of(Reason::NotAllowlisted),
        }
    }

    /// DNS answer filter: may an answer record pointing at `ip` reach the
    /// guest? Platform-denied addresses (and the host's own) are
    /// `platform_denied`; other non-public addresses are `private_answer`
    /// unless [`CompiledPolicy::internal_allows`] them; the rest are
    /// `dns_answered`.
    #[must_use]
    pub fn check_dns_answer(&self, ip: IpAddr) -> Verdict<'_> {
        let class = platform::classify(ip);
        if class.is_always_denied() || self.is_host_address(ip) {
            return Verdict::of(Reason::PlatformDenied);
        }
        if class.is_non_public() && !self.internal_allows(ip) {
            return Verdict::of(Reason::PrivateAnswer);
        }
        Verdict::of(Reason::DnsAnswered)
    }

    /// The networks the policy names for non-public destinations: its
    /// `internal:` networks and the networks of its CIDR allow rules (the
    /// kernel floor under the gateway lets exactly these through).
    pub fn named_networks(&self) -> impl Iterator<Item = IpNet> + '_ {
        self.internal
            .iter()
            .chain(self.cidr_rules.iter())
            .map(|(n, _)| *n)
    }

    /// Whether a non-public `ip` is opened by the policy: it lies in an
    /// `internal:` network or in a CIDR allow rule (any port). Compared
    /// literally: `::ffff:10.0.0.1` is not inside `10.0.0.0/8`. Says nothing
    /// about the platform deny set, which nothing opens.
    #[must_use]
    pub fn internal_allows(&self, ip: IpAddr) -> bool {
        self.internal.iter().any(|(n, _)| n.contains(&ip))
            || self.cidr_rules.iter().any(|(n, _)| n.contains(&ip))
    }

    /// The address class of `ip`, with the host's own addresses reported as
    /// [`AddressClass::Loopback`]-like platform space via
    /// [`CompiledPolicy::is_platform_denied`].
    #[must_use]
    pub fn classify(&self, ip: IpAddr) -> AddressClass {
        platform::classify(ip)
    }

    /// Whether `ip` is in the non-overridable platform deny set, including
    /// the host's own addresses from [`CompileOptions`](super::CompileOptions).
    #[must_use]
    pub fn is_platform_denied(&self, ip: IpAddr) -> bool {
        platform::classify(ip).is_always_denied() || self.is_host_address(ip)
    }

    /// Whether a WebSocket upgrade to `host` is allowed as far as secrets
    /// go: no secret is bound to it, or every secret bound to it opted in
    /// (`websocket: true`).
    #[must_use]
    pub fn websocket_allowed(&self, host: &str) -> bool {
        self.secrets_for_host(host).all(|s| s.websocket)
    }

    /// The secrets bound to `host` (normalised here; exact match only).
    pub fn secrets_for_host(&self, host: &str) -> impl Iterator<Item = &SecretSpec> + '_ {
        let ids: &[u32] = match normalize_name(host) {
            Ok(n) => self
                .secrets_by_host
                .get(n.as_str())
                .map_or(&[], Vec::as_slice),
            Err(_) => &[],
        };
        ids.iter().filter_map(|&i| self.secrets.get(i as usize))
    }

    /// Every secret in the policy.
    #[must_use]
    pub fn secrets(&self) -> &[SecretSpec] {
        &self.secrets
    }

    /// Whether TLS to `host` must be intercepted: a secret is bound to it or
    /// an `inspect:` pattern matches it.
    #[must_use]
    pub fn inspect_host(&self, host: &str) -> bool {
        let Ok(norm) = normalize_name(host) else {
            return false;
        };
        let name = norm.as_str();
        if self.secrets_by_host.contains_key(name) {
            return true;
        }
        if self
            .inspect_names
            .get(name)
            .is_some_and(|&(exact, _)| exact)
        {
            return true;
        }
        let mut rest = name;
        while let Some(dot) = rest.find('.') {
            rest = rest.get(dot + 1..).unwrap_or_default();
            if self.inspect_names.get(rest).is_some_and(|&(_, sub)| sub) {
                return true;
            }
        }
        false
    }

    /// Every pattern whose hosts are inspected: the `inspect:` list plus each
    /// secret host (exact). The CA's name constraints are built from it.
    #[must_use]
    pub fn inspected_patterns(&self) -> &[DomainPattern] {
        &self.inspect
    }
}

fn port_reason(transport: Transport, port: u16) -> Reason {
    match (transport, port) {
        (Transport::Tcp, _) => Reason::PortNotAllowed,
        (Transport::Udp, 443) => Reason::QuicBlocked,
        (Transport::Udp, _) => Reason::UdpBlocked,
    }
}

/// IPv4-mapped IPv6 compared as IPv4.
fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

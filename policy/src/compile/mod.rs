//! Compiling a policy file into an immutable, allocation-free-to-query
//! snapshot ([`CompiledPolicy`]), and the queries the gateway asks it.
//!
//! Matching structure: the name table (`name_table.rs`) maps each normalised
//! domain a rule names to the allow and deny rules written for that exact
//! name and for its subdomains. A check reads the name once and probes the
//! label-boundary suffixes (`a.b.example.com`, `b.example.com`,
//! `example.com`, `com`) with one hash each, so its cost grows with the
//! number of labels, not the number of rules.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;
use serde::Serialize;
use serde_saphyr::{Location, Spanned};

use crate::approval::{ApprovalSpec, Unlisted};
use crate::error::{PolicyError, PolicyErrors};
use crate::fx::FxMap;
use crate::model::{RawAllow, RawPolicy, RawSecret, RawUpstream};
use crate::name::{DomainPattern, PatternKind, PatternUse, normalize_name, parse_pattern};
use crate::name_table::{NameMatch, NameTable, NameTableBuilder, RuleRef};
use crate::platform::{self, AddressClass};
use crate::reason::Reason;
use crate::rule_table::RuleTable;
use crate::verdict::{MatchedRule, Verdict};

/// The largest policy file read (16 MiB); larger files are rejected before
/// parsing.
pub const MAX_POLICY_BYTES: u64 = 16 * 1024 * 1024;

/// The port every TLS check applies to, whatever the policy says.
pub const TLS_PORT: u16 = 443;
/// The port every plain-HTTP check applies to, whatever the policy says.
pub const HTTP_PORT: u16 = 80;

/// Default lower bound on a DNS answer's TTL in the name-to-IP table.
pub const DEFAULT_TTL_MIN: Duration = Duration::from_secs(5);
/// Default upper bound on a DNS answer's TTL in the name-to-IP table.
pub const DEFAULT_TTL_MAX: Duration = Duration::from_secs(300);

/// Inputs to compilation that do not come from the file.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct CompileOptions {
    /// The host's own addresses (every address of every interface). They
    /// join the non-overridable platform deny set. The gateway fills them
    /// in; `sluice policy check` leaves them empty.
    pub host_addresses: Vec<IpAddr>,
}

/// How the gateway must treat a TCP port before deciding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PortProtocol {
    /// TLS: read the ClientHello and check the SNI (443 and `ports.tls`).
    Tls,
    /// Plain HTTP: read the request head and check the Host (80 and
    /// `ports.http`).
    Http,
    /// Raw TCP: decided on the destination address alone.
    Tcp,
}

/// A transport protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

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

/// An immutable compiled policy snapshot.
///
/// Shared as `Arc<CompiledPolicy>` and swapped whole on reload; a snapshot
/// never changes, so verdicts borrowed from it stay valid while it lives.
/// Every check is allocation-free.
#[derive(Debug)]
pub struct CompiledPolicy {
    origin: String,
    id: String,
    label: Option<String>,
    version_hash: String,
    rules: RuleTable,
    names: NameTable,
    cidr_rules: Vec<(IpNet, u32)>,
    internal: Vec<(IpNet, u32)>,
    host_addresses: Vec<IpAddr>,
    tls_ports: Vec<u16>,
    http_ports: Vec<u16>,
    inspect: Vec<DomainPattern>,
    inspect_names: FxMap<Box<str>, (bool, bool)>,
    secrets: Vec<SecretSpec>,
    secrets_by_host: FxMap<Box<str>, Vec<u32>>,
    upstream: Upstream,
    ttl: TtlBounds,
    domain_rule_count: usize,
    unlisted: Unlisted,
    approval: Option<ApprovalSpec>,
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
    /// the host's own addresses from [`CompileOptions`].
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

// ---------------------------------------------------------------------------
// Loading and compiling.

/// Read and compile a policy file, with its approval overlay
/// ([`crate::overlay`], `NAME.approved.yaml` beside it) when there is one.
/// The error list names the file at fault as its origin.
///
/// # Errors
/// Every problem found, each `file:line:col: message`.
pub fn load_file(path: &Path, options: &CompileOptions) -> Result<CompiledPolicy, PolicyErrors> {
    let origin = path.display().to_string();
    let fail = |message: String| {
        PolicyErrors::new(vec![PolicyError {
            origin: origin.clone(),
            line: 0,
            column: 0,
            message,
        }])
    };
    let meta =
        std::fs::metadata(path).map_err(|e| fail(format!("cannot read policy file: {e}")))?;
    if meta.len() > MAX_POLICY_BYTES {
        return Err(fail(format!(
            "policy file is {} bytes; the limit is {MAX_POLICY_BYTES}",
            meta.len()
        )));
    }
    let src =
        std::fs::read_to_string(path).map_err(|e| fail(format!("cannot read policy file: {e}")))?;
    let Some((overlay, overlay_origin)) = crate::overlay::read(path)? else {
        return from_yaml_str(&src, &origin, options);
    };
    // The overlay is checked on its own first, so its errors name it.
    let alone = parse_raw(&overlay, &overlay_origin)?;
    crate::overlay::check(&alone, &overlay_origin)?;
    Compiler::new(&overlay_origin).compile(alone, options)?;
    let mut raw = parse_raw(&src, &origin)?;
    raw.allow
        .extend(parse_raw(&overlay, &overlay_origin)?.allow);
    Compiler::new(&origin).compile(raw, options)
}

/// Compile a policy from YAML text. `origin` names it in errors (a path, or
/// e.g. `<embedded default>`).
///
/// # Errors
/// Every problem found, each `origin:line:col: message`.
pub fn from_yaml_str(
    src: &str,
    origin: &str,
    options: &CompileOptions,
) -> Result<CompiledPolicy, PolicyErrors> {
    if src.len() as u64 > MAX_POLICY_BYTES {
        return Err(PolicyErrors::new(vec![PolicyError {
            origin: origin.to_owned(),
            line: 0,
            column: 0,
            message: format!(
                "policy is {} bytes; the limit is {MAX_POLICY_BYTES}",
                src.len()
            ),
        }]));
    }
    let raw = parse_raw(src, origin)?;
    Compiler::new(origin).compile(raw, options)
}

/// The YAML text of a policy allowing exactly `domains` on port 443 (what
/// `sluice run --allow-domain NAME` hands the gateway). Each entry is a
/// pattern as in an allow rule (`example.com`, `*.example.com`,
/// `**.example.com`); the text is valid YAML whatever the entries contain,
/// and [`from_domains`] reports entries that are not valid patterns.
#[must_use]
pub fn allow_domains_yaml(domains: &[&str]) -> String {
    let mut src = String::from(
        "# Generated from --allow-domain.\nversion: 1\nid: allow-domain\nlabel: \"--allow-domain\"\nallow:",
    );
    if domains.is_empty() {
        src.push_str(" []\n");
    } else {
        src.push('\n');
    }
    for d in domains {
        // A JSON string is a valid YAML double-quoted scalar.
        let quoted = serde_json::to_string(d).unwrap_or_default();
        src.push_str("  - domain: ");
        src.push_str(&quoted);
        src.push('\n');
    }
    src
}

/// Compile [`allow_domains_yaml`]`(domains)`.
///
/// # Errors
/// The problems with the given names (positions refer to the generated
/// text and are omitted; the origin is `--allow-domain`).
pub fn from_domains(
    domains: &[&str],
    options: &CompileOptions,
) -> Result<CompiledPolicy, PolicyErrors> {
    from_yaml_str(&allow_domains_yaml(domains), "--allow-domain", options).map_err(|errs| {
        PolicyErrors::new(
            errs.into_iter()
                .map(|e| PolicyError {
                    line: 0,
                    column: 0,
                    ..e
                })
                .collect(),
        )
    })
}

pub(crate) fn parse_raw(src: &str, origin: &str) -> Result<RawPolicy, PolicyErrors> {
    let mut opts = serde_saphyr::Options::default();
    // Large allowlists (100k+ rules) exceed the parser's default node and
    // event budgets; the input size cap bounds them instead (every node
    // takes at least one byte). Alias and anchor limits stay at their
    // defaults (billion-laughs protection).
    let mut budget = serde_saphyr::Budget::default();
    budget.max_nodes = usize::try_from(MAX_POLICY_BYTES).unwrap_or(usize::MAX);
    budget.max_events = budget.max_nodes.saturating_mul(2);
    opts.budget = Some(budget);
    opts.with_snippet = false;
    opts.duplicate_keys = serde_saphyr::DuplicateKeyPolicy::Error;
    serde_saphyr::from_str_with_options::<RawPolicy>(src, opts).map_err(|e| {
        let (line, column) = e
            .location()
            .map_or((0, 0), |l| (clamp_u32(l.line()), clamp_u32(l.column())));
        PolicyErrors::new(vec![PolicyError {
            origin: origin.to_owned(),
            line,
            column,
            message: yaml_message(&e),
        }])
    })
}

fn clamp_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// The parser's message without its own position suffix (we print ours in
/// front).
fn yaml_message(e: &serde_saphyr::Error) -> String {
    let at_start = e
        .location()
        .is_none_or(|l| l.line() <= 1 && l.column() <= 1);
    let text = e.to_string();
    let first = text.lines().next().unwrap_or_default().trim().to_owned();
    let cut = first
        .rfind(" at line ")
        .map_or(first.as_str(), |i| first.get(..i).unwrap_or_default());
    let msg = cut.trim_end_matches(':').trim();
    if let Some(key) = msg.strip_prefix("duplicate mapping key: ") {
        let key = key.split(", set DuplicateKeyPolicy").next().unwrap_or(key);
        return format!("duplicate key `{key}`; each key may appear only once in a mapping");
    }
    if let Some(field) = msg.strip_prefix("missing field ") {
        return format!("missing required key {field}");
    }
    // The parser's terse messages, said in the policy's terms.
    let rewritten = match msg {
        "expected sequence start" => "expected a list here: `[a, b]` or one `- item` per line",
        "expected mapping start" if at_start => {
            "expected a mapping (`key: value` lines); a policy starts with `version: 1` and `id: NAME`"
        }
        "expected mapping start" => "expected a mapping here (`key: value` lines)",
        m if m.contains("found a tab") => {
            "found a tab character; YAML indentation and separation must use spaces"
        }
        "expected string scalar" => "expected a single string here",
        "invalid i64" => "expected a whole number here",
        "invalid boolean" => "expected `true` or `false` here",
        "unexpected end of input" => {
            "unexpected end of input; a policy needs at least `version: 1` and `id: NAME`"
        }
        m if m.starts_with("data did not match any variant of untagged enum RawUpstream") => {
            "`upstream` must be `system` or a list of resolver addresses, e.g. [192.0.2.53, \"[2001:db8::53]:53\"]"
        }
        m if m.starts_with("multiple YAML documents detected") => {
            "a policy file holds one YAML document; remove the `---` and what follows it"
        }
        "" => return text,
        m => m,
    };
    rewritten.to_owned()
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

pub(crate) struct Compiler<'o> {
    origin: &'o str,
    errors: Vec<PolicyError>,
}

impl<'o> Compiler<'o> {
    pub(crate) fn new(origin: &'o str) -> Self {
        Self {
            origin,
            errors: Vec::new(),
        }
    }

    pub(crate) fn err(&mut self, at: Location, message: impl Into<String>) {
        self.errors.push(PolicyError {
            origin: self.origin.to_owned(),
            line: clamp_u32(at.line()),
            column: clamp_u32(at.column()),
            message: message.into(),
        });
    }

    fn port(&mut self, p: &Spanned<i64>) -> Option<u16> {
        match u16::try_from(p.value) {
            Ok(v) if v >= 1 => Some(v),
            _ => {
                self.err(
                    p.referenced,
                    format!("port {} is out of range; ports are 1..65535", p.value),
                );
                None
            }
        }
    }

    pub(crate) fn ports(&mut self, list: &[Spanned<i64>]) -> Vec<u16> {
        let mut out: Vec<u16> = list.iter().filter_map(|p| self.port(p)).collect();
        out.sort_unstable();
        out.dedup();
        out
    }

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

        let mut tls_ports = vec![TLS_PORT];
        let mut http_ports = vec![HTTP_PORT];
        if let Some(p) = &raw.ports {
            for sp in &p.tls {
                if let Some(v) = self.port(sp) {
                    if v == HTTP_PORT {
                        self.err(
                            sp.referenced,
                            "port 80 is always plain HTTP; it cannot be a TLS port",
                        );
                    } else {
                        tls_ports.push(v);
                    }
                }
            }
            for sp in &p.http {
                if let Some(v) = self.port(sp) {
                    if tls_ports.contains(&v) {
                        self.err(
                            sp.referenced,
                            format!("port {v} is already a TLS port; a port is either `tls` or `http`, not both"),
                        );
                    } else {
                        http_ports.push(v);
                    }
                }
            }
        }
        tls_ports.sort_unstable();
        tls_ports.dedup();
        http_ports.sort_unstable();
        http_ports.dedup();

        let upstream = match raw.dns.as_ref().and_then(|d| d.upstream.as_ref()) {
            None => Upstream::System,
            Some(u) => self.upstream(u),
        };
        let mut ttl = TtlBounds {
            min: DEFAULT_TTL_MIN,
            max: DEFAULT_TTL_MAX,
        };
        if let Some(dns) = &raw.dns {
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
                    .map_or(raw.id.referenced, |s| s.referenced);
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

    fn secrets(&mut self, raw: &[Spanned<RawSecret>], policy: &mut CompiledPolicy) {
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

fn valid_ident(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

//! Policy enforcement: the [`Decider`] that puts every guest flow to the
//! compiled policy, and the DNS filter the forwarder consults.
//!
//! [`PolicyDecider`] holds the policy in an [`ArcSwap`], so a reload
//! ([`PolicyDecider::swap`]) replaces it atomically while the datapath keeps
//! deciding; a decision uses one snapshot from start to end.
//!
//! # TCP, in order
//! 1. The platform deny set ([`PlatformDenySet`], then the policy's own
//!    platform classes and the host's addresses): `platform_denied`, whatever
//!    the policy says.
//! 2. DNS to any resolver but the gateway (TCP 53, DoT 853):
//!    `dns_resolver_denied`, whatever the policy says.
//! 3. [`CompiledPolicy::check_destination`] with the names the [`DnsTable`]
//!    holds for the destination IP (unexpired only): non-public addresses
//!    nothing opens are `private_destination`; a CIDR allow rule for the port
//!    allows at once (no name needed, even on TLS ports); otherwise some name
//!    resolved to this IP must be allowed on this port, or the flow is denied
//!    (`ip_not_resolved_for_name` when no name resolved to it: IP literals,
//!    hard-coded and foreign addresses; `port_not_allowed`, `denylisted`,
//!    `not_allowlisted` otherwise).
//! 4. Raw TCP ports stop there (allowed). TLS ports (443 and `ports.tls`) and
//!    plain-HTTP ports (80 and `ports.http`) get [`Decision::Inspect`] with
//!    [`INSPECT_MAX_BYTES`] and [`INSPECT_DEADLINE`]; [`Decider::inspect`]
//!    then requires the name on the wire to be allowed on the port and the
//!    destination IP to be in the table *for that name*:
//!    - TLS: exactly one host_name SNI, no ECH (`sni_absent`, `sni_multiple`,
//!      `sni_unreadable`, `not_tls`, `ech_present`; GREASE ECH cannot be told
//!      from real ECH on the wire, so both are denied: docs/threat-model.md
//!      says why and what clients must set), allowed on the port
//!      (`not_allowlisted`, `denylisted`, `port_not_allowed`), and resolved
//!      to the destination (`sni_dns_mismatch`).
//!    - HTTP: one Host (`http_host_absent`), no CONNECT
//!      (`http_connect_denied`), a well-formed head within the bound
//!      (`http_unreadable`), a Host that is a name allowed on the port (an IP
//!      literal Host is `not_allowlisted`) and resolved to the destination
//!      (`http_host_mismatch`, also used when an absolute-form target
//!      disagrees with Host).
//!
//! # UDP
//! Platform deny set first; UDP/TCP 53 and 853 to anything but the gateway
//! (whose DNS the datapath serves before asking) are `dns_resolver_denied`;
//! otherwise [`CompiledPolicy::check_udp`] with the table's names: allowed only
//! when a rule's `udp_ports` names the port, else `quic_blocked` (port 443) or
//! `udp_blocked`.
//!
//! # DNS
//! [`dns_filter`] (or [`PolicyDecider::dns_action`]) decides a guest query on
//! its name before anything is forwarded: names the policy does not allow are
//! answered REFUSED locally. [`keep_addr`] (or [`PolicyDecider::keep_answer`])
//! is the address predicate for `sluice_inspect::dns::sanitize_response`, and
//! [`ttl_range`] its TTL clamp. The datapath reaches them through the
//! [`Decider`] DNS hooks this type implements (`dns_query`,
//! `keep_dns_answer`, `dns_ttl_bounds`) and `dns::server` filters answers
//! with `dns::server::sanitize` (sluice-inspect's `sanitize_response_clamped`)
//! and `dns::server::record` (the table update), which apply the same
//! address predicate and clamp. Only A questions are forwarded; other types (AAAA while IPv6 is
//! off, HTTPS/SVCB which could carry ECH configurations, TXT, ...) get an
//! empty answer locally (`dns_type_withheld`).
//!
//! # Reload
//! [`PolicyDecider::swap`] installs a new snapshot; [`PolicyDecider::recheck_tcp`]
//! says which open flows the new policy revokes, given the names that admitted
//! them ([`wire_name`] recovers the SNI / Host from the inspected bytes).
//!
//! # Limits
//! - [`Decider::inspect`] is called with the whole accumulated buffer each
//!   time new bytes have arrived (the datapath remembers how many it last
//!   put; a loop turn without new bytes calls nothing) and re-parses it from
//!   the start (the trait gives no per-flow state): quadratic in the number
//!   of segments but bounded by [`INSPECT_MAX_BYTES`] (16 KiB).
//! - Only the first request head of a plain-HTTP connection is read here.
//!   Later requests on a kept-alive or pipelined connection are checked by
//!   the plain-HTTP proxy the datapath hands such flows to
//!   ([`Decider::proxies_plain_http`], `sluice_intercept::PlainProxy`):
//!   each must name the Host the first was admitted with, else `421`
//!   (`host_mismatch`). On TLS ports a later request's Host is checked only
//!   on intercepted flows (against the SNI); spliced TLS is opaque.
//! - TTL: a flow is decided once, at its SYN / first bytes, against entries
//!   valid at that moment; an open flow is not cut when its entry expires
//!   (the grace for open flows is their lifetime). Reload revocation is the
//!   caller's job ([`PolicyDecider::swap`] returns the old snapshot).

use std::net::IpAddr;
use std::ops::RangeInclusive;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use hickory_proto::op::ResponseCode;
use sluice_inspect::{http, tls};
use sluice_policy::{CompiledPolicy, PortProtocol, Reason, Transport};

use super::{
    Approvals, AskAbout, DecideContext, Decider, Decision, DenyReason, DnsDecision, FlowKey,
    InspectVerdict, PlatformDenySet, Verdict,
};
use crate::dns::DnsTable;
pub use crate::flow::WireName;

/// Bound on the first bytes buffered for TLS / HTTP inspection (16 KiB:
/// post-quantum ClientHellos of several KB fit).
pub const INSPECT_MAX_BYTES: usize = sluice_inspect::DEFAULT_MAX_BYTES;
/// How long the datapath waits for a complete ClientHello / request head.
pub const INSPECT_DEADLINE: Duration = Duration::from_secs(5);
/// The most table names considered for one destination IP (a CDN address
/// shared by many allowed names); further names are ignored.
pub const MAX_NAMES_PER_IP: usize = 32;

/// DNS ports that only the gateway may serve: plain DNS and DNS over TLS.
const DNS_PORTS: [u16; 2] = [53, 853];

/// The decider that enforces a [`CompiledPolicy`] (see the module docs for
/// the order of checks and the reasons).
#[derive(Debug)]
pub struct PolicyDecider {
    policy: ArcSwap<CompiledPolicy>,
    platform: PlatformDenySet,
}

impl PolicyDecider {
    /// A decider enforcing `policy` on top of the non-overridable `platform`
    /// deny set.
    pub fn new(policy: Arc<CompiledPolicy>, platform: PlatformDenySet) -> Self {
        Self {
            policy: ArcSwap::new(policy),
            platform,
        }
    }

    /// The policy in force now (a cheap snapshot; later swaps do not change it).
    pub fn policy(&self) -> Arc<CompiledPolicy> {
        self.policy.load_full()
    }

    /// Atomically replaces the policy (reload) and returns the previous one.
    /// Decisions already taken are not revisited here: the caller resets the
    /// flows the new policy denies (`reload_revoked`).
    pub fn swap(&self, policy: Arc<CompiledPolicy>) -> Arc<CompiledPolicy> {
        self.policy.swap(policy)
    }

    /// The non-overridable deny set this decider applies first.
    pub fn platform(&self) -> &PlatformDenySet {
        &self.platform
    }

    /// Re-decides an open TCP flow under the policy in force now (after a
    /// [`PolicyDecider::swap`]): `Err` with the verdict when the flow must be
    /// reset (`reload_revoked` in the audit, with this reason as detail).
    ///
    /// `names` are the names that admitted the flow, remembered by the caller:
    /// the SNI or Host for an inspected flow ([`wire_name`]), the table's
    /// names for the destination at SYN time for a raw-TCP flow. The DNS
    /// table is deliberately not consulted: an open flow keeps its admission
    /// after its entry's TTL ends; only the policy is re-checked (platform,
    /// DNS ports, non-public ranges, CIDR rules, names on the port).
    pub fn recheck_tcp(&self, flow: &FlowKey, names: &[&str]) -> Result<(), Verdict> {
        let policy = self.policy.load();
        let ip = flow.dst.ip();
        let port = flow.dst.port();
        if self.platform_denied(&policy, ip) {
            return Err(DenyReason::PlatformDenied.into());
        }
        if DNS_PORTS.contains(&port) {
            return Err(Verdict::of(Reason::DnsResolverDenied));
        }
        destination_verdict(&policy.check_destination(ip, port, names)).map(drop)
    }

    /// [`PolicyDecider::recheck_tcp`] for a flow whose SNI / Host was never
    /// read (admitted by a CIDR rule, or on a port that was raw TCP under the
    /// old policy): on a port the new policy inspects (TLS or HTTP), only a
    /// CIDR rule can keep it; the table's names for its address cannot, since
    /// nothing ties the connection to any of them. The deny reason is the one
    /// a name-less flow to that address gets (`ip_not_resolved_for_name`
    /// unless the address gate says otherwise).
    pub fn recheck_tcp_uninspected(&self, flow: &FlowKey, names: &[&str]) -> Result<(), Verdict> {
        self.recheck_tcp(flow, names)?;
        let policy = self.policy.load();
        let port = flow.dst.port();
        if policy.port_protocol(port) == PortProtocol::Tcp {
            return Ok(());
        }
        destination_verdict(&policy.check_destination(flow.dst.ip(), port, &[])).map(drop)
    }

    /// [`PolicyDecider::recheck_tcp`] for an open UDP flow: platform, DNS
    /// ports, then [`CompiledPolicy::check_udp`] with the names that admitted
    /// it (the table's names for its destination at open).
    pub fn recheck_udp(&self, flow: &FlowKey, names: &[&str]) -> Result<(), Verdict> {
        let policy = self.policy.load();
        let ip = flow.dst.ip();
        if self.platform_denied(&policy, ip) {
            return Err(DenyReason::PlatformDenied.into());
        }
        if DNS_PORTS.contains(&flow.dst.port()) {
            return Err(Verdict::of(Reason::DnsResolverDenied));
        }
        destination_verdict(&policy.check_udp(ip, flow.dst.port(), names)).map(drop)
    }

    /// Whether an open flow that [`PolicyDecider::recheck_tcp`] (or
    /// `recheck_udp`) would revoke with `reason` is kept by a standing
    /// runtime approval of one of `names` on its port: the address gate is
    /// never overridden, and each name must still be a plain allowlist miss
    /// under the policy in force now.
    pub fn kept_by_approval(
        &self,
        flow: &FlowKey,
        names: &[&str],
        reason: Reason,
        approvals: &Approvals,
        now: Instant,
    ) -> bool {
        let policy = self.policy.load();
        let ip = flow.dst.ip();
        if self.platform_denied(&policy, ip)
            || DNS_PORTS.contains(&flow.dst.port())
            || !policy.check_dns_answer(ip).is_allowed()
            || !approval_may_open(reason)
        {
            return false;
        }
        names.iter().any(|n| {
            approvals.opens(n, flow.transport, flow.dst.port(), now) && policy.would_ask(n)
        })
    }

    /// [`dns_filter`] under the policy in force now.
    pub fn dns_action(&self, qname: &str) -> DnsAction {
        dns_filter(&self.policy.load(), qname)
    }

    /// [`keep_addr`] under the policy in force now, for one answer address.
    pub fn keep_answer(&self, ip: IpAddr) -> bool {
        keep_addr(&self.policy.load(), &self.platform)("", ip)
    }

    /// The platform gate shared by TCP and UDP.
    fn platform_denied(&self, policy: &CompiledPolicy, ip: IpAddr) -> bool {
        self.platform.denies(ip) || policy.is_platform_denied(ip)
    }
}

/// Whether a denial with `reason` may be overridden by a runtime approval
/// of one of the destination's names: never when the address gate refused
/// the destination (platform, metadata, private), which nothing opens.
fn approval_may_open(reason: Reason) -> bool {
    !matches!(
        reason,
        Reason::PlatformDenied | Reason::PrivateDestination | Reason::DnsResolverDenied
    )
}

/// Whether a standing approval opens one of `names` on `port`, each name
/// still a plain allowlist miss under `policy` (a `deny:` rule or a
/// reload to `unlisted: deny` closes what was approved).
fn approved_any(
    policy: &CompiledPolicy,
    ctx: &DecideContext<'_>,
    names: &[&str],
    transport: Transport,
    port: u16,
) -> bool {
    ctx.approved.is_some_and(|a| {
        names
            .iter()
            .any(|n| a.opens(n, transport, port, ctx.now) && policy.would_ask(n))
    })
}

/// The verdict of a flow a runtime approval admitted (no rule decided).
const APPROVED: Verdict = Verdict::of(Reason::ApprovalAllowed);

/// The unexpired names the table holds for `ip` (at most [`MAX_NAMES_PER_IP`]).
fn table_names(table: &DnsTable, ip: IpAddr, now: Instant) -> Vec<&str> {
    table.names_for(ip, now).take(MAX_NAMES_PER_IP).collect()
}

/// A destination check's verdict: `Ok` with the allowing rule, or `Err`
/// with the reason alone (a destination denial names no rule: schema-1
/// `connection` deny lines never have).
fn destination_verdict(v: &sluice_policy::Verdict<'_>) -> Result<Verdict, Verdict> {
    if v.is_allowed() {
        Ok(Verdict::of_policy(v))
    } else {
        Err(Verdict::of(v.reason))
    }
}

impl PolicyDecider {
    /// Steps 1-3 of the TCP order: `Ok` with the allowing verdict (reason
    /// `cidr_allowed` when the flow is allowed without inspection, a name
    /// allowed on this port otherwise).
    fn tcp_destination(
        &self,
        policy: &CompiledPolicy,
        flow: &FlowKey,
        ctx: &DecideContext<'_>,
    ) -> Result<Verdict, Verdict> {
        let ip = flow.dst.ip();
        let port = flow.dst.port();
        if self.platform_denied(policy, ip) {
            return Err(DenyReason::PlatformDenied.into());
        }
        if DNS_PORTS.contains(&port) {
            return Err(Verdict::of(Reason::DnsResolverDenied));
        }
        let names = table_names(ctx.dns, ip, ctx.now);
        let v = policy.check_destination(ip, port, &names);
        if !v.is_allowed()
            && approval_may_open(v.reason)
            && approved_any(policy, ctx, &names, Transport::Tcp, port)
        {
            return Ok(APPROVED);
        }
        destination_verdict(&v)
    }

    /// The name seen on the wire (SNI or Host) must be allowed on the port
    /// and resolved to the destination; `mismatch` is the reason otherwise.
    /// The verdict names the rule that decided on the name (a deny rule, or
    /// an allow rule without the port), but none on a mismatch.
    fn check_wire_name(
        policy: &CompiledPolicy,
        flow: &FlowKey,
        name: &str,
        ctx: &DecideContext<'_>,
        mismatch: Reason,
    ) -> InspectVerdict {
        let v = policy.check_name_port(name, Transport::Tcp, flow.dst.port());
        let verdict = if v.is_allowed() {
            Verdict::of_policy(&v)
        } else if approved_any(policy, ctx, &[name], Transport::Tcp, flow.dst.port()) {
            APPROVED
        } else {
            return InspectVerdict::Deny(Verdict::of_policy(&v));
        };
        if ctx.dns.resolved_for(flow.dst.ip(), name, ctx.now) {
            InspectVerdict::Allow(verdict)
        } else {
            InspectVerdict::Deny(Verdict::of(mismatch))
        }
    }
}

/// The policy reason for a ClientHello rejection.
fn tls_reason(r: tls::Reject) -> Reason {
    match r {
        tls::Reject::NotTls => Reason::NotTls,
        tls::Reject::SniAbsent => Reason::SniAbsent,
        tls::Reject::SniMultiple => Reason::SniMultiple,
        tls::Reject::EchPresent => Reason::EchPresent,
        // Unreadable, too large, and any future variant: fail closed.
        _ => Reason::SniUnreadable,
    }
}

/// The policy reason for a request-head rejection.
fn http_reason(r: http::Reject) -> Reason {
    match r {
        http::Reject::HostAbsent => Reason::HttpHostAbsent,
        http::Reject::Connect => Reason::HttpConnectDenied,
        http::Reject::HostMismatch => Reason::HttpHostMismatch,
        // Several Hosts, malformed, too large, and any future variant.
        _ => Reason::HttpUnreadable,
    }
}

/// The longest request method accepted before its space.
const MAX_METHOD_LEN: usize = 16;

/// Whether `bytes` can still start an HTTP/1 request: a method of
/// [`MAX_METHOD_LEN`] token characters or fewer, then a space. Lets binary
/// first bytes (a ClientHello, SSH) on a plain-HTTP port be denied at once
/// instead of waiting for the bound or the deadline for a head that never
/// ends.
fn method_plausible(bytes: &[u8]) -> bool {
    let is_tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    let head = bytes.get(..=MAX_METHOD_LEN).unwrap_or(bytes);
    match head.iter().position(|&b| b == b' ') {
        Some(0) => false,
        Some(n) => head.iter().take(n).all(|&b| is_tchar(b)),
        None => head.len() <= MAX_METHOD_LEN && head.iter().all(|&b| is_tchar(b)),
    }
}

impl Decider for PolicyDecider {
    fn policy_dns_upstreams(&self) -> Option<Vec<std::net::SocketAddr>> {
        match self.policy.load().upstream_resolvers() {
            sluice_policy::Upstream::Servers(servers) => Some(servers.clone()),
            sluice_policy::Upstream::System => None,
        }
    }

    /// A flow on a TLS port whose SNI has a secret bound to it or matches an
    /// `inspect:` pattern, under the policy in force now.
    fn intercepts(&self, flow: &FlowKey, sni: &str) -> bool {
        let policy = self.policy.load();
        policy.port_protocol(flow.dst.port()) == PortProtocol::Tls && policy.inspect_host(sni)
    }

    /// A flow on a plain-HTTP port (80 and `ports.http`) under the policy in
    /// force now: every request on it must name the Host its first request
    /// was admitted with (`sluice_intercept::PlainProxy`).
    fn proxies_plain_http(&self, flow: &FlowKey) -> bool {
        self.policy.load().port_protocol(flow.dst.port()) == PortProtocol::Http
    }

    fn dns_query(&self, qname: &str) -> DnsDecision {
        dns_decision(&self.policy.load(), qname)
    }

    fn keep_dns_answer(&self, ip: IpAddr) -> bool {
        self.keep_answer(ip)
    }

    /// A chain through a name a deny rule matches is refused (`denylisted`):
    /// otherwise an allowed alias (`alias.example.org CNAME
    /// bad.example.org`) would hand the guest the denied host's addresses
    /// under the alias's name. Targets no rule mentions pass (CDN names are
    /// rarely in an allow list; the question's name was allowed). The
    /// verdict names no rule: the rule that matched the question's name did
    /// not decide, and the line is about the question.
    fn dns_cname_target(&self, target: &str) -> Option<Verdict> {
        let denied = self.policy.load().check_name(target).reason == Reason::Denylisted;
        denied.then_some(Verdict::of(Reason::Denylisted))
    }

    fn dns_ttl_bounds(&self) -> Option<(Duration, Duration)> {
        let b = self.policy.load().ttl_bounds();
        Some((b.min, b.max))
    }

    fn decide_tcp(&self, flow: &FlowKey, ctx: &DecideContext<'_>) -> Decision {
        let policy = self.policy.load();
        match self.tcp_destination(&policy, flow, ctx) {
            Err(verdict) => Decision::Deny(verdict),
            Ok(verdict) if verdict.reason == Reason::CidrAllowed => Decision::Allow(verdict),
            Ok(verdict) => match policy.port_protocol(flow.dst.port()) {
                PortProtocol::Tcp => Decision::Allow(verdict),
                PortProtocol::Tls | PortProtocol::Http => Decision::Inspect {
                    max_bytes: INSPECT_MAX_BYTES,
                    deadline: INSPECT_DEADLINE,
                },
            },
        }
    }

    fn decide_udp(&self, flow: &FlowKey, ctx: &DecideContext<'_>) -> Decision {
        let policy = self.policy.load();
        let ip = flow.dst.ip();
        let port = flow.dst.port();
        if self.platform_denied(&policy, ip) {
            return Decision::Deny(DenyReason::PlatformDenied.into());
        }
        if DNS_PORTS.contains(&port) {
            return Decision::Deny(Verdict::of(Reason::DnsResolverDenied));
        }
        let names = table_names(ctx.dns, ip, ctx.now);
        let v = policy.check_udp(ip, port, &names);
        if !v.is_allowed()
            && approval_may_open(v.reason)
            && approved_any(&policy, ctx, &names, Transport::Udp, port)
        {
            return Decision::Allow(APPROVED);
        }
        match destination_verdict(&v) {
            Ok(verdict) => Decision::Allow(verdict),
            Err(verdict) => Decision::Deny(verdict),
        }
    }

    /// Re-checks the destination under the policy in force now (it may have
    /// been swapped since the SYN), then reads `first_bytes` from the start
    /// with a fresh reader. A raw-TCP port (never sent to inspection) or a
    /// CIDR-allowed destination gets the same answer as `decide_tcp`.
    fn inspect(
        &self,
        flow: &FlowKey,
        first_bytes: &[u8],
        ctx: &DecideContext<'_>,
    ) -> InspectVerdict {
        let policy = self.policy.load();
        let destination = match self.tcp_destination(&policy, flow, ctx) {
            Err(verdict) => return InspectVerdict::Deny(verdict),
            Ok(verdict) if verdict.reason == Reason::CidrAllowed => {
                return InspectVerdict::Allow(verdict);
            }
            Ok(verdict) => verdict,
        };
        match policy.port_protocol(flow.dst.port()) {
            PortProtocol::Tcp => InspectVerdict::Allow(destination),
            PortProtocol::Tls => {
                match tls::ClientHelloReader::new(INSPECT_MAX_BYTES).push(first_bytes) {
                    tls::Progress::NeedMore => InspectVerdict::NeedMore,
                    tls::Progress::Reject(r) => InspectVerdict::Deny(Verdict::of(tls_reason(r))),
                    tls::Progress::Done(hello) => Self::check_wire_name(
                        &policy,
                        flow,
                        &hello.server_name,
                        ctx,
                        Reason::SniDnsMismatch,
                    ),
                }
            }
            PortProtocol::Http => {
                if !method_plausible(first_bytes) {
                    return InspectVerdict::Deny(Verdict::of(Reason::HttpUnreadable));
                }
                match http::RequestHeadReader::new(INSPECT_MAX_BYTES).push(first_bytes) {
                    http::Progress::NeedMore => InspectVerdict::NeedMore,
                    http::Progress::Reject(r) => InspectVerdict::Deny(Verdict::of(http_reason(r))),
                    http::Progress::Done(head) => match &head.host {
                        http::Host::Name(name) => Self::check_wire_name(
                            &policy,
                            flow,
                            name,
                            ctx,
                            Reason::HttpHostMismatch,
                        ),
                        http::Host::V4(_) | http::Host::V6(_) => {
                            InspectVerdict::Deny(Verdict::of(Reason::NotAllowlisted))
                        }
                    },
                }
            }
        }
    }
}

/// Reads the SNI or Host from `first_bytes` the way [`Decider::inspect`]
/// does, for `protocol` (`None` for raw TCP, or when the bytes are
/// incomplete or were rejected: then there is no single name to report).
pub fn wire_name(protocol: PortProtocol, first_bytes: &[u8]) -> Option<WireName> {
    match protocol {
        PortProtocol::Tcp => None,
        PortProtocol::Tls => match tls::ClientHelloReader::new(INSPECT_MAX_BYTES).push(first_bytes)
        {
            tls::Progress::Done(hello) => Some(WireName::Sni(hello.server_name)),
            _ => None,
        },
        PortProtocol::Http => {
            match http::RequestHeadReader::new(INSPECT_MAX_BYTES).push(first_bytes) {
                http::Progress::Done(head) => Some(WireName::Host(head.host.to_string())),
                _ => None,
            }
        }
    }
}

/// The SNI or Host an inspected flow's first bytes present, whatever the
/// port: a TLS handshake record (first byte 0x16) is read as a ClientHello,
/// anything else as an HTTP/1 request head. Sound because the two cannot be
/// confused (an HTTP method starts with a token character, never 0x16).
/// For the audit line and for [`PolicyDecider::recheck_tcp`] after a reload.
pub fn sniff_wire_name(first_bytes: &[u8]) -> Option<WireName> {
    match first_bytes.first() {
        Some(0x16) => wire_name(PortProtocol::Tls, first_bytes),
        Some(_) => wire_name(PortProtocol::Http, first_bytes),
        None => None,
    }
}

/// The policy's TTL bounds in whole seconds, for
/// `sluice_inspect::dns::sanitize_response_clamped` (the guest re-resolves no
/// later than the gateway's table entry expires). The table itself takes the
/// same bounds through [`DnsTable::set_ttl_bounds`].
pub fn ttl_range(policy: &CompiledPolicy) -> RangeInclusive<u32> {
    let secs = |d: Duration| u32::try_from(d.as_secs()).unwrap_or(u32::MAX);
    let b = policy.ttl_bounds();
    secs(b.min)..=secs(b.max).max(secs(b.min))
}

/// What to do with a guest DNS query, decided on its (normalised) name alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DnsAction {
    /// Forward upstream; filter the answer with [`keep_addr`].
    Forward,
    /// Answer locally with `rcode` and audit `reason`; never forward.
    Answer {
        /// The response code for the guest.
        rcode: ResponseCode,
        /// The audit reason (`not_allowlisted` or `denylisted`).
        reason: Reason,
    },
}

/// Decides a guest query for `qname` (as normalised by
/// `sluice_inspect::dns::parse_query`; queries that do not parse are answered
/// FORMERR by the caller before this).
///
/// A name the policy does not allow on any port (`not_allowlisted`) or that a
/// deny rule matches (`denylisted`) is answered **REFUSED** locally and never
/// forwarded, so a denied name never leaves the machine (DNS exfiltration).
/// REFUSED rather than NXDOMAIN because it is the truth: the name may well
/// exist, the gateway declines to resolve it. NXDOMAIN would assert
/// non-existence, be negatively cached by stub resolvers, and make a denial
/// look like a typo when an operator debugs an agent; REFUSED is also what
/// the audit schema's examples use. Either fails promptly (one nameserver).
///
/// The query type is not decided here: `sanitize_response` answers only
/// what a client needs to connect.
pub fn dns_filter(policy: &CompiledPolicy, qname: &str) -> DnsAction {
    let v = policy.check_name(qname);
    if v.is_allowed() {
        DnsAction::Forward
    } else {
        DnsAction::Answer {
            rcode: ResponseCode::Refused,
            reason: v.reason,
        }
    }
}

/// [`dns_filter`] with the verdict the query's `dns` line carries: a
/// forwarded name's allow rule (`dns_answered`), a refused name's deny rule
/// (`denylisted`) or none (`not_allowlisted`); or, for a plain allowlist
/// miss under `unlisted: ask` ([`CompiledPolicy::would_ask`]), the
/// approval section to ask under.
pub fn dns_decision(policy: &CompiledPolicy, qname: &str) -> DnsDecision {
    let v = policy.check_name(qname);
    if v.is_allowed() {
        DnsDecision::Forward(Verdict {
            reason: Reason::DnsAnswered,
            ..Verdict::of_policy(&v)
        })
    } else if v.reason == Reason::NotAllowlisted
        && let Some(spec) = policy.approval()
        && policy.would_ask(qname)
    {
        DnsDecision::Ask(AskAbout {
            spec: spec.clone(),
            policy_id: policy.id().into(),
        })
    } else {
        DnsDecision::Answer {
            rcode: ResponseCode::Refused,
            verdict: Verdict::of_policy(&v),
        }
    }
}

/// The `keep_addr` predicate for `sluice_inspect::dns::sanitize_response`:
/// whether an answer address may reach the guest (and the table).
///
/// Dropped: the platform deny set (`platform`, and the policy's platform
/// classes and host addresses: loopback, link-local, the gateway's own
/// addresses, IPv4-mapped forms, ...) always, and other non-public addresses
/// (private, CGNAT, ULA, documentation, reserved) unless
/// [`CompiledPolicy::internal_allows`] them (rebinding defense). When every
/// address is dropped the caller answers an error and audits
/// `private_answer`.
pub fn keep_addr<'a>(
    policy: &'a CompiledPolicy,
    platform: &'a PlatformDenySet,
) -> impl Fn(&str, IpAddr) -> bool + 'a {
    move |_qname, ip| !platform.denies(ip) && policy.check_dns_answer(ip).is_allowed()
}

#[cfg(test)]
mod tests;

//! The decision points: every new guest flow is put to a [`Decider`] before
//! anything leaves the host, and the decider's [`Verdict`] (a typed
//! [`Reason`] and the rule that decided) travels with the flow to its audit
//! lines.
//!
//! [`PlatformDecider`] ([`platform`]) is the default: it denies only the
//! non-overridable set (loopback, unspecified, link-local, multicast,
//! broadcast, the host's own interface addresses, the gateway's virtual
//! addresses) and allows other TCP; it denies all UDP except DNS to the
//! gateway, which the datapath serves itself. [`PolicyDecider`]
//! ([`policy`]) implements [`Decider`] with the compiled policy.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use hickory_proto::op::ResponseCode;
use sluice_policy::{ApprovalSpec, Reason};

use crate::dns::DnsTable;

pub mod platform;
pub mod policy;

/// The sandbox's runtime approvals, which [`DecideContext::approved`]
/// lends the decider (they live with the DNS server that asks).
pub use crate::dns::approval::Approvals;
pub use crate::flow::{FlowKey, Transport};
pub use crate::verdict::{Rule, Verdict};
pub use platform::{HostAddresses, PlatformDecider, PlatformDenySet, host_addresses};
pub use policy::PolicyDecider;

/// The gateway's own refusals of a flow (no policy involved), each with
/// its audit [`Verdict`] ([`DenyReason::verdict`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DenyReason {
    /// Destination in the platform deny set (loopback, link-local, host addresses, ...).
    PlatformDenied,
    /// The gateway's own address on a port it does not serve.
    GatewayAddress,
    /// UDP other than DNS to the gateway, with no rule allowing it.
    UdpNotAllowed,
    /// The flow table is full.
    TooManyFlows,
    /// The host could not connect to the destination.
    ConnectFailed,
    /// The inspected first bytes did not arrive before the deadline or bound.
    InspectTimeout,
    /// The policy inspects the SNI, but it is outside the running sandbox
    /// CA's name constraints.
    OutsideSandboxCa,
    /// The policy inspects the SNI, but there is no sandbox CA (the policy
    /// at start inspected nothing).
    NoSandboxCa,
}

impl DenyReason {
    /// The audit verdict: the schema reason, and the cause in `detail`
    /// when the reason does not say it alone.
    pub const fn verdict(self) -> Verdict {
        match self {
            Self::PlatformDenied => Verdict::of(Reason::PlatformDenied),
            Self::GatewayAddress => Verdict::explained(Reason::PlatformDenied, "gateway address"),
            Self::UdpNotAllowed => Verdict::of(Reason::UdpBlocked),
            Self::TooManyFlows => Verdict::of(Reason::FlowLimit),
            Self::ConnectFailed => Verdict::of(Reason::ConnectFailed),
            Self::InspectTimeout => Verdict::of(Reason::InspectTimeout),
            Self::OutsideSandboxCa => Verdict::explained(
                Reason::InspectFailed,
                "host outside the sandbox CA's name constraints; restart to inspect",
            ),
            Self::NoSandboxCa => Verdict::explained(
                Reason::InspectFailed,
                "no sandbox CA (the policy at start inspected no host); restart to inspect",
            ),
        }
    }
}

impl From<DenyReason> for Verdict {
    fn from(r: DenyReason) -> Self {
        r.verdict()
    }
}

/// The answer to a new flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Connect from the host, then complete the guest handshake; the
    /// verdict goes on the flow's `connection` line.
    Allow(Verdict),
    /// Answer RST (TCP) or drop (UDP), and audit the verdict.
    Deny(Verdict),
    /// Complete the guest handshake first, read up to `max_bytes` (until
    /// `deadline`), and ask [`Decider::inspect`] before connecting.
    Inspect {
        /// Bound on the bytes buffered for inspection.
        max_bytes: usize,
        /// How long to wait for them.
        deadline: Duration,
    },
}

/// The answer after reading a flow's first bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InspectVerdict {
    /// Not enough bytes yet (the datapath denies when the bound or deadline is reached).
    NeedMore,
    /// Connect and replay the bytes upstream; the verdict goes on the
    /// flow's `connection` line.
    Allow(Verdict),
    /// Reset the guest connection.
    Deny(Verdict),
}

/// The answer to a guest DNS query, decided on its normalised name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DnsDecision {
    /// Forward it upstream; the verdict (`dns_answered` and the rule that
    /// allowed the name) goes on the answer's line.
    Forward(Verdict),
    /// Answer `rcode` locally and audit the verdict; never forward.
    Answer {
        /// The response code for the guest.
        rcode: ResponseCode,
        /// Why.
        verdict: Verdict,
    },
    /// A plain allowlist miss under `unlisted: ask` (docs/approval.md):
    /// hold the query and ask the approval backend, then forward it
    /// (`dns_answered`) or refuse it (`approval_denied`,
    /// `approval_limited`) as the decision says.
    Ask(AskAbout),
}

/// What a [`DnsDecision::Ask`] asks under: the policy's `approval:` section
/// and its id, both from the policy in force when the query came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AskAbout {
    /// The `approval:` section (backend, timeout, ports, bounds).
    pub spec: ApprovalSpec,
    /// The policy's id, sent with the question.
    pub policy_id: Box<str>,
}

/// What a decider may consult besides the flow itself.
#[derive(Debug)]
pub struct DecideContext<'a> {
    /// The sandbox's name-to-address table, filled by the DNS forwarder.
    pub dns: &'a DnsTable,
    /// The sandbox's runtime approvals (`unlisted: ask`): a name the
    /// policy does not list but a standing decision approved opens the
    /// ports the `approval:` section names. `None` where nothing is asked.
    pub approved: Option<&'a Approvals>,
    /// The current time (for TTL checks).
    pub now: Instant,
}

/// A decision point for new flows. Called on the datapath task: must not block.
pub trait Decider: Send + Sync {
    /// Decides a new guest TCP connection (on its SYN).
    fn decide_tcp(&self, flow: &FlowKey, ctx: &DecideContext<'_>) -> Decision;

    /// Decides a new guest UDP flow (its first datagram).
    fn decide_udp(&self, flow: &FlowKey, ctx: &DecideContext<'_>) -> Decision;

    /// Decides an inspected flow from its first bytes (called as bytes arrive).
    fn inspect(
        &self,
        flow: &FlowKey,
        first_bytes: &[u8],
        ctx: &DecideContext<'_>,
    ) -> InspectVerdict {
        let _ = (flow, first_bytes, ctx);
        InspectVerdict::Allow(Verdict::of(Reason::Allowlisted))
    }

    /// Whether an allowed TLS flow whose ClientHello named `sni` is to be
    /// intercepted (TLS terminated by the proxy) rather than spliced. Asked
    /// only after [`Decider::inspect`] allowed the flow. The default (no
    /// policy) intercepts nothing.
    fn intercepts(&self, flow: &FlowKey, sni: &str) -> bool {
        let _ = (flow, sni);
        false
    }

    /// Whether an allowed plain-HTTP flow (its first request's Host checked
    /// by [`Decider::inspect`]) is to be served by the plain-HTTP proxy,
    /// which checks every later request's Host too, rather than spliced.
    /// Asked only after [`Decider::inspect`] allowed the flow. The default
    /// (no policy) splices.
    fn proxies_plain_http(&self, flow: &FlowKey) -> bool {
        let _ = flow;
        false
    }

    /// The DNS resolvers the policy in force names (`dns.upstream: [..]`);
    /// `None` without a policy or for `upstream: system` (the host's). Asked
    /// for every forwarded query, so a reload applies to the next one.
    fn policy_dns_upstreams(&self) -> Option<Vec<SocketAddr>> {
        None
    }

    /// Decides a guest DNS query on its normalised name before anything is
    /// forwarded. The default (no policy) forwards every name, naming no
    /// rule.
    fn dns_query(&self, qname: &str) -> DnsDecision {
        let _ = qname;
        DnsDecision::Forward(Verdict::of(Reason::DnsAnswered))
    }

    /// Whether an upstream answer address may reach the guest and the DNS
    /// table. The default keeps every address.
    fn keep_dns_answer(&self, ip: IpAddr) -> bool {
        let _ = ip;
        true
    }

    /// The `(min, max)` TTL bounds for the DNS table and for the TTLs the
    /// guest is told; `None` keeps the table's defaults and upstream TTLs.
    fn dns_ttl_bounds(&self) -> Option<(Duration, Duration)> {
        None
    }

    /// Whether an upstream answer must be refused because its CNAME chain
    /// passes through `target` (a normalised name): `Some(verdict)` refuses
    /// it (REFUSED to the guest, nothing recorded, the verdict audited),
    /// `None` lets it through. The default refuses nothing.
    fn dns_cname_target(&self, target: &str) -> Option<Verdict> {
        let _ = target;
        None
    }
}

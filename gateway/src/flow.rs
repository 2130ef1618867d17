//! What a guest flow is, in every module's terms: its [`FlowKey`], its one
//! [`Transport`] type, what admitted it ([`Admission`]: the verdict, the
//! name on the wire, the names rechecked on reload) and why it ended
//! ([`FlowEnd`]).

use std::net::SocketAddr;

use sluice_policy::Reason;

use crate::verdict::Verdict;

/// Transport of a flow: the policy crate's type, used from the first
/// packet to the audit line.
pub use sluice_policy::Transport;

/// A guest flow as seen in its first packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlowKey {
    /// TCP or UDP.
    pub transport: Transport,
    /// The guest's endpoint.
    pub src: SocketAddr,
    /// The destination the guest asked for.
    pub dst: SocketAddr,
}

/// The name a flow's first bytes present, for the audit line and for
/// `PolicyDecider::recheck_tcp`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireName {
    /// The single SNI of a ClientHello (lowercase, no trailing dot).
    Sni(String),
    /// The Host of an HTTP/1 request head (a name, or an IP literal as
    /// written, IPv6 in brackets), without its port.
    Host(String),
}

impl WireName {
    /// The name itself.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Sni(n) | Self::Host(n) => n,
        }
    }
}

/// What admitted a flow, made once when it was allowed and kept with it
/// while it lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    /// The decider's verdict: its `connection` line's reason and rule.
    pub verdict: Verdict,
    /// The SNI or Host that admitted an inspected flow.
    pub wire: Option<WireName>,
    /// The names that admitted the flow, rechecked on a reload: the wire
    /// name, or the DNS table's names for the destination at open (set
    /// when the flow opens).
    pub names: Vec<Box<str>>,
}

impl Admission {
    /// An admission by `verdict`, on the name `wire` if inspected; its
    /// names are set when the flow opens.
    pub fn new(verdict: Verdict, wire: Option<WireName>) -> Self {
        Self {
            verdict,
            wire,
            names: Vec::new(),
        }
    }

    /// The admitting names, borrowed.
    pub fn names(&self) -> Vec<&str> {
        self.names.iter().map(|n| &**n).collect()
    }
}

/// Why an open flow ended: its `flow_close` line's reason, and for the
/// ends without a reason of their own, the cause written to `detail`
/// (reason `closed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowEnd {
    /// FIN both ways, or the guest reset it.
    Closed,
    /// Either side reset it while it was open (`closed`, detail `reset`).
    Reset,
    /// No traffic for the idle period (UDP).
    IdleTimeout,
    /// The gateway shut down.
    Shutdown,
    /// The host could not connect to the destination.
    ConnectFailed,
    /// The host socket failed (UDP).
    UpstreamError,
    /// The flow could not be handed to its proxy (`closed`, detail
    /// `inspect_failed`).
    InspectFailed,
    /// The guest disconnected from the gateway (`closed`, detail
    /// `guest_closed`).
    GuestClosed,
    /// The guest broke the frame stream protocol (`closed`, detail
    /// `protocol_error`).
    ProtocolError,
    /// Reading from or writing to the guest failed (`closed`, detail
    /// `guest_error`).
    GuestError,
}

impl FlowEnd {
    /// The `flow_close` reason.
    pub fn reason(self) -> Reason {
        match self {
            Self::IdleTimeout => Reason::IdleTimeout,
            Self::Shutdown => Reason::Shutdown,
            Self::ConnectFailed => Reason::ConnectFailed,
            Self::UpstreamError => Reason::UpstreamError,
            Self::Closed
            | Self::Reset
            | Self::InspectFailed
            | Self::GuestClosed
            | Self::ProtocolError
            | Self::GuestError => Reason::Closed,
        }
    }

    /// The `flow_close` detail, for the ends that share the reason `closed`.
    pub fn detail(self) -> Option<&'static str> {
        match self {
            Self::Reset => Some("reset"),
            Self::InspectFailed => Some("inspect_failed"),
            Self::GuestClosed => Some("guest_closed"),
            Self::ProtocolError => Some("protocol_error"),
            Self::GuestError => Some("guest_error"),
            Self::Closed
            | Self::IdleTimeout
            | Self::Shutdown
            | Self::ConnectFailed
            | Self::UpstreamError => None,
        }
    }
}

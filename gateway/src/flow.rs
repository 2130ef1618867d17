//! What a guest flow is, in every module's terms: its [`FlowKey`], its one
//! [`Transport`] type, and why it ended ([`FlowEnd`]).

use std::net::SocketAddr;

use sluice_policy::Reason;

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

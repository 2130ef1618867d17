//! The closed set of decisions and reasons that every verdict and audit line
//! carries.
//!
//! A [`Reason`] says *why* a decision was taken. Its snake_case name (see
//! [`Reason::as_str`]) is what appears in the audit log's `reason` field and is
//! part of the audit schema: renaming a variant is a schema change.

use serde::{Deserialize, Serialize};

/// The outcome of a check: let the traffic through or stop it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// The traffic may pass.
    Allow,
    /// The traffic is stopped (RST, DNS error, dropped datagram, HTTP error).
    Deny,
}

impl Decision {
    /// The audit spelling: `allow` or `deny`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Deny => "deny",
        }
    }
}

macro_rules! reasons {
    (
        allow { $( $(#[$am:meta])* $aname:ident = $astr:literal, )* }
        deny { $( $(#[$dm:meta])* $dname:ident = $dstr:literal, )* }
    ) => {
        /// Why a decision was taken. A closed set: every audit line's `reason`
        /// is one of these, spelled in snake_case.
        ///
        /// Variants in the first group accompany [`Decision::Allow`] (or
        /// describe a normal event such as a flow closing); the rest accompany
        /// [`Decision::Deny`] (see [`Reason::is_allow`]).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        #[non_exhaustive]
        pub enum Reason {
            $( $(#[$am])* $aname, )*
            $( $(#[$dm])* $dname, )*
        }

        impl Reason {
            /// Every reason, allow-side first, in declaration order.
            pub const ALL: &'static [Reason] = &[ $( Reason::$aname, )* $( Reason::$dname, )* ];

            /// The snake_case name used in the audit log.
            #[must_use]
            pub const fn as_str(self) -> &'static str {
                match self {
                    $( Self::$aname => $astr, )*
                    $( Self::$dname => $dstr, )*
                }
            }

            /// Whether this reason accompanies an allow (or a normal event)
            /// rather than a deny.
            #[must_use]
            pub const fn is_allow(self) -> bool {
                match self {
                    $( Self::$aname => true, )*
                    $( Self::$dname => false, )*
                }
            }

            /// The decision this reason belongs to.
            #[must_use]
            pub const fn decision(self) -> Decision {
                if self.is_allow() { Decision::Allow } else { Decision::Deny }
            }

            /// Parse an audit spelling back into a reason (`None` if unknown).
            #[must_use]
            pub fn from_name(name: &str) -> Option<Self> {
                match name {
                    $( $astr => Some(Self::$aname), )*
                    $( $dstr => Some(Self::$dname), )*
                    _ => None,
                }
            }
        }
    };
}

reasons! {
    allow {
        /// A domain allow rule matched the name (and the port, where one was
        /// checked).
        Allowlisted = "allowlisted",
        /// A CIDR allow rule matched the destination address and port.
        CidrAllowed = "cidr_allowed",
        /// A DNS answer was returned to the guest (after filtering).
        DnsAnswered = "dns_answered",
        /// Traffic to the gateway's own services (DHCP, DNS) on its virtual
        /// address.
        GatewayService = "gateway_service",
        /// An inbound connection or datagram through a `--publish` mapping.
        Published = "published",
        /// A flow ended normally (FIN both ways, or the guest reset it).
        Closed = "closed",
        /// A flow was closed after its idle timeout.
        IdleTimeout = "idle_timeout",
        /// A flow was closed because the gateway is shutting down.
        Shutdown = "shutdown",
        /// A new policy was loaded and swapped in.
        ReloadApplied = "reload_applied",
        /// The gateway started serving (a `gateway` record).
        Started = "started",
        /// A summary of audit lines suppressed by rate limiting (see the
        /// record's `suppressed` counts).
        RateLimitSummary = "rate_limit_summary",
        /// A runtime approval (`unlisted: ask`) opened a name the policy
        /// does not list: the `approval` record of an allow decision, and
        /// the connections it admits.
        ApprovalAllowed = "approval_allowed",
    }
    deny {
        /// No allow rule matches the name (or the address, with no name).
        NotAllowlisted = "not_allowlisted",
        /// A deny rule matches the name; deny rules win over allow rules.
        Denylisted = "denylisted",
        /// The address is in the non-overridable platform deny set (loopback,
        /// unspecified, link-local, cloud host services such as
        /// `168.63.129.16`, multicast, broadcast, the host's own addresses).
        PlatformDenied = "platform_denied",
        /// The destination is in a non-public range (RFC 1918, CGNAT, ULA,
        /// benchmarking, documentation, reserved) that no CIDR allow rule or
        /// `internal:` entry names.
        PrivateDestination = "private_destination",
        /// A DNS answer pointed into non-public space that `internal:` does not
        /// allow (rebinding defense); the record was dropped.
        PrivateAnswer = "private_answer",
        /// The destination IP is not in the sandbox's name-to-IP table for an
        /// allowed name (IP literals, hard-coded or foreign addresses).
        IpNotResolvedForName = "ip_not_resolved_for_name",
        /// The TLS ClientHello carries no server_name.
        SniAbsent = "sni_absent",
        /// The TLS ClientHello carries more than one host_name.
        SniMultiple = "sni_multiple",
        /// The TLS ClientHello could not be read (malformed, truncated, too
        /// large).
        SniUnreadable = "sni_unreadable",
        /// The SNI is allowed but the destination IP was not resolved for it.
        SniDnsMismatch = "sni_dns_mismatch",
        /// The ClientHello offers Encrypted Client Hello.
        EchPresent = "ech_present",
        /// The first bytes on a TLS port are not a TLS handshake record.
        NotTls = "not_tls",
        /// A plain-HTTP request head has no Host header.
        HttpHostAbsent = "http_host_absent",
        /// The Host is allowed but the destination IP was not resolved for it.
        HttpHostMismatch = "http_host_mismatch",
        /// The request head could not be parsed (malformed or too large).
        HttpUnreadable = "http_unreadable",
        /// An HTTP CONNECT request on a plain-HTTP port.
        HttpConnectDenied = "http_connect_denied",
        /// A proxied request asked to switch protocols to something the
        /// proxies do not understand (anything but WebSocket: HTTP/1.1
        /// `Upgrade`, HTTP/2 extended CONNECT `:protocol`), or to WebSocket
        /// on a TLS host with bound secrets (an upgraded stream is neither
        /// substituted nor scrubbed): answered 501 or 403, never forwarded.
        UpgradeRefused = "upgrade_refused",
        /// An inspected request's Host / `:authority` differs from the SNI.
        HostSniMismatch = "host_sni_mismatch",
        /// A request on a plain-HTTP connection names another host (Host
        /// header or absolute-form authority, or another port) than the one
        /// enforcement validated for the connection from its first request:
        /// answered 421, never forwarded.
        HostMismatch = "host_mismatch",
        /// The name is allowed, but not on this port.
        PortNotAllowed = "port_not_allowed",
        /// A UDP datagram to a destination no UDP rule allows.
        UdpBlocked = "udp_blocked",
        /// UDP to port 443 (QUIC / HTTP/3); clients fall back to TCP.
        QuicBlocked = "quic_blocked",
        /// IPv6 traffic while IPv6 is off.
        Ipv6Blocked = "ipv6_blocked",
        /// ICMP to anything but the gateway address.
        IcmpBlocked = "icmp_blocked",
        /// DNS (UDP/TCP 53, DoT 853) to a resolver other than the gateway.
        DnsResolverDenied = "dns_resolver_denied",
        /// A DNS query that could not be parsed or normalised (answered
        /// FORMERR).
        DnsFormerr = "dns_formerr",
        /// A query type the guest does not need to connect (answered empty).
        DnsTypeWithheld = "dns_type_withheld",
        /// A concurrency or rate limit was hit (flows, queries).
        FlowLimit = "flow_limit",
        /// A frame from an address other than the leased guest's.
        SpoofedSource = "spoofed_source",
        /// Connecting upstream failed (refused, unreachable, timed out).
        ConnectFailed = "connect_failed",
        /// The upstream (origin or resolver) failed after connecting.
        UpstreamError = "upstream_error",
        /// The upstream's TLS certificate failed verification.
        UpstreamTlsFailed = "upstream_tls_failed",
        /// A secret's placeholder was sent to a host the secret is not bound
        /// to (passed through unchanged, never substituted).
        SecretHostMismatch = "secret_host_mismatch",
        /// A policy reload was rejected; the old policy stays in force.
        ReloadRejected = "reload_rejected",
        /// A flow was reset because a reloaded policy no longer allows it.
        ReloadRevoked = "reload_revoked",
        /// The first bytes of a flow did not arrive before the deadline.
        InspectTimeout = "inspect_timeout",
        /// TLS interception failed (certificate minting, handshake with the
        /// guest).
        InspectFailed = "inspect_failed",
        /// A malformed frame from the guest (bad length, unparsable packet).
        FrameError = "frame_error",
        /// A runtime approval question was answered deny, timed out, or its
        /// backend failed (never an allow): the query is REFUSED.
        ApprovalDenied = "approval_denied",
        /// A name was refused without asking: too many questions pending,
        /// too many asked this minute, or too many decisions held.
        ApprovalLimited = "approval_limited",
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Display for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serde_spelling_matches_as_str_for_every_reason() {
        for &r in Reason::ALL {
            let json = serde_json::to_string(&r).unwrap();
            assert_eq!(json, format!("\"{}\"", r.as_str()));
            let back: Reason = serde_json::from_str(&json).unwrap();
            assert_eq!(back, r);
            assert_eq!(Reason::from_name(r.as_str()), Some(r));
        }
    }

    #[test]
    fn names_are_unique_and_snake_case() {
        let mut seen = std::collections::HashSet::new();
        for &r in Reason::ALL {
            assert!(seen.insert(r.as_str()), "duplicate {}", r.as_str());
            assert!(
                r.as_str()
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            );
        }
    }

    /// docs/audit.md's closed set lists exactly these reasons, each on the
    /// side its decision says.
    #[test]
    fn the_audit_page_lists_exactly_the_closed_set() {
        let page = include_str!("../../docs/audit.md");
        let section = page
            .split("## Reasons (closed set)")
            .nth(1)
            .and_then(|s| s.split("Each is documented").next())
            .expect("docs/audit.md has its reasons section");
        let (allow, deny) = section
            .split_once("Deny side")
            .expect("the section has an allow and a deny side");
        let names = |text: &str| -> Vec<String> {
            text.split('`')
                .skip(1)
                .step_by(2)
                .filter(|t| !t.contains(' ') && !t.contains(':'))
                .map(str::to_owned)
                .collect()
        };
        let (allow, deny) = (names(allow), names(deny));
        let mut listed: Vec<&str> = allow.iter().chain(&deny).map(String::as_str).collect();
        for name in &allow {
            let r = Reason::from_name(name).unwrap_or_else(|| panic!("{name}: no such reason"));
            assert_eq!(r.decision(), Decision::Allow, "{name}");
        }
        for name in &deny {
            let r = Reason::from_name(name).unwrap_or_else(|| panic!("{name}: no such reason"));
            assert_eq!(r.decision(), Decision::Deny, "{name}");
        }
        let mut all: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        listed.sort_unstable();
        all.sort_unstable();
        assert_eq!(listed, all);
    }

    #[test]
    fn decision_follows_reason_group() {
        assert_eq!(Reason::Allowlisted.decision(), Decision::Allow);
        assert_eq!(Reason::CidrAllowed.decision(), Decision::Allow);
        assert_eq!(Reason::NotAllowlisted.decision(), Decision::Deny);
        assert_eq!(Reason::ReloadRejected.decision(), Decision::Deny);
        assert_eq!(Reason::from_name("no_such_reason"), None);
    }
}

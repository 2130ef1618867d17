//! Prometheus metrics (`--metrics`): one [`Metrics`] registry per process,
//! served as Prometheus text exposition (format 0.0.4) by [`http`] at
//! `/metrics`. The metric list is docs/metrics.md.
//!
//! Where the numbers come from:
//! - every decision already becomes an audit record, so the audit sink
//!   hands each record to [`Metrics::observe`] before its rate limiter
//!   (a suppressed line is still counted here): flows opened and closed,
//!   bytes, DNS queries, inspections, HTTP requests, secrets substituted,
//!   reloads. Labels are the record's own typed fields (`reason` is
//!   [`sluice_policy::Reason::as_str`]), never guest-controlled text, so
//!   the label sets stay bounded; the one exception is the secret's name,
//!   which the operator's policy bounds (never its value);
//! - the audit sink itself: lines written, records suppressed, write errors,
//!   and the policy in force ([`Metrics::set_policy`]);
//! - the session: frames dropped before any flow, hand-overs to the
//!   proxies, and the open flow tables' sizes (set each loop turn);
//! - `/proc/self` at scrape time: resident memory and open descriptors
//!   ([`process`]).
//!
//! Counters live for the process (a guest reconnecting to `--socket` does
//! not reset them). Bytes are counted when a flow closes (its `flow_close`
//! record), so a long flow's bytes show up at its end.

use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use sluice_policy::audit::{AuditRecord, Kind, PolicyRef};
use sluice_policy::{Reason, Transport};

pub mod http;
mod process;

pub use http::{MetricsAddr, MetricsListener};

/// Label set of static label values.
type Static<const N: usize> = [(&'static str, &'static str); N];

/// The gateway's metrics (see the module docs). Cheap to share: every
/// handle is an `Arc` inside; updates are atomic adds.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    flows_opened: Family<Static<3>, Counter>,
    flows_closed: Family<Static<2>, Counter>,
    flow_bytes: Family<Static<2>, Counter>,
    active_flows: Family<Static<1>, Gauge>,
    dns_queries: Family<Static<2>, Counter>,
    inspections: Family<Static<3>, Counter>,
    interceptions: Family<Static<1>, Counter>,
    http_requests: Family<Static<2>, Counter>,
    secrets_substituted: Family<[(&'static str, String); 1], Counter>,
    reloads: Family<Static<1>, Counter>,
    approvals: Family<[(&'static str, String); 2], Counter>,
    policy_info: Family<[(&'static str, String); 3], Gauge>,
    audit_lines: Counter,
    audit_suppressed: Family<Static<2>, Counter>,
    audit_write_errors: Counter,
    frames_dropped: Family<Static<1>, Counter>,
}

/// Which proxy a flow was handed to ([`Metrics::intercepted`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Proxy {
    /// The TLS interception proxy (an inspected SNI).
    Tls,
    /// The plain-HTTP proxy (every request's Host checked).
    PlainHttp,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// An empty registry with every metric registered under the `sluice_`
    /// prefix, and the `/proc/self` collector (opened now: the gateway's
    /// jail forbids opening it later).
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("sluice");
        let m = Self {
            flows_opened: Family::default(),
            flows_closed: Family::default(),
            flow_bytes: Family::default(),
            active_flows: Family::default(),
            dns_queries: Family::default(),
            inspections: Family::default(),
            interceptions: Family::default(),
            http_requests: Family::default(),
            secrets_substituted: Family::default(),
            reloads: Family::default(),
            approvals: Family::default(),
            policy_info: Family::default(),
            audit_lines: Counter::default(),
            audit_suppressed: Family::default(),
            audit_write_errors: Counter::default(),
            frames_dropped: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "flows_opened",
            "Flow decisions (a TCP SYN, the first datagram of a UDP flow, a published-port connection), by transport, decision and reason",
            m.flows_opened.clone(),
        );
        registry.register(
            "flows_closed",
            "Flows ended, by transport and reason (closed, idle_timeout, reload_revoked, ...)",
            m.flows_closed.clone(),
        );
        registry.register(
            "flow_bytes",
            "Bytes of closed flows, by transport and direction (up: guest to destination; down: destination to guest)",
            m.flow_bytes.clone(),
        );
        registry.register(
            "active_flows",
            "Flows open now, by transport (TCP: connecting, inspecting or established)",
            m.active_flows.clone(),
        );
        registry.register(
            "dns_queries",
            "DNS queries from the guest, by decision and reason (dns_answered, not_allowlisted, dns_type_withheld, ...)",
            m.dns_queries.clone(),
        );
        registry.register(
            "inspections",
            "Flows decided on their first bytes (TLS SNI or HTTP Host), by field, decision and reason",
            m.inspections.clone(),
        );
        registry.register(
            "interceptions",
            "Flows handed to a proxy, by proxy (tls: interception; http: plain-HTTP Host checks)",
            m.interceptions.clone(),
        );
        registry.register(
            "http_requests",
            "HTTP requests seen by the proxies, by decision and reason",
            m.http_requests.clone(),
        );
        registry.register(
            "secrets_substituted",
            "Secret substitutions into requests, by secret name (never the value)",
            m.secrets_substituted.clone(),
        );
        registry.register(
            "reloads",
            "Policy reloads, by result (applied, rejected)",
            m.reloads.clone(),
        );
        registry.register(
            "approvals",
            "Runtime approval decisions (unlisted: ask), by decision (allow_once, ..., deny_sandbox) and reason (approval_allowed, approval_denied)",
            m.approvals.clone(),
        );
        registry.register(
            "policy_info",
            "The policy in force (id, version hash, label); always 1",
            m.policy_info.clone(),
        );
        registry.register(
            "audit_lines_written",
            "Audit lines written (summaries included)",
            m.audit_lines.clone(),
        );
        registry.register(
            "audit_records_suppressed",
            "Audit records the rate limiter suppressed (counted in summary lines), by kind and reason",
            m.audit_suppressed.clone(),
        );
        registry.register(
            "audit_write_errors",
            "Audit lines that could not be written",
            m.audit_write_errors.clone(),
        );
        registry.register(
            "frames_dropped",
            "Guest frames dropped before any flow, by reason",
            m.frames_dropped.clone(),
        );
        registry.register_collector(Box::new(process::ProcessCollector::open()));
        Self { registry, ..m }
    }

    /// The registry in Prometheus text exposition format 0.0.4.
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(8 * 1024);
        // Writing into a String cannot fail; a collector error leaves the
        // families encoded so far, which is still valid exposition.
        if let Err(e) = prometheus_text::encode(&mut out, &self.registry) {
            tracing::warn!(error = %e, "encoding metrics");
        }
        out
    }

    /// Counts what one audit record says (module docs). Called for every
    /// record, written or suppressed.
    pub(crate) fn observe(&self, rec: &AuditRecord<'_>) {
        let decision = rec.decision.as_str();
        let reason = rec.reason.as_str();
        match rec.kind {
            Kind::Connection => {
                // Frame drops have no transport: counted by frames_dropped.
                let Some(transport) = rec.transport else {
                    return;
                };
                let transport = transport_str(transport);
                self.flows_opened
                    .get_or_create(&[
                        ("transport", transport),
                        ("decision", decision),
                        ("reason", reason),
                    ])
                    .inc();
                let field = match (&rec.sni, &rec.host) {
                    (Some(_), _) => Some("sni"),
                    (None, Some(_)) => Some("host"),
                    (None, None) => None,
                };
                if let Some(field) = field {
                    self.inspections
                        .get_or_create(&[
                            ("field", field),
                            ("decision", decision),
                            ("reason", reason),
                        ])
                        .inc();
                }
            }
            Kind::FlowClose => {
                let transport = transport_str(rec.transport.unwrap_or(Transport::Tcp));
                self.flows_closed
                    .get_or_create(&[("transport", transport), ("reason", reason)])
                    .inc();
                for (direction, bytes) in [("up", rec.bytes_up), ("down", rec.bytes_down)] {
                    self.flow_bytes
                        .get_or_create(&[("transport", transport), ("direction", direction)])
                        .inc_by(bytes.unwrap_or(0));
                }
            }
            Kind::Dns => {
                self.dns_queries
                    .get_or_create(&[("decision", decision), ("reason", reason)])
                    .inc();
            }
            Kind::Http => {
                self.http_requests
                    .get_or_create(&[("decision", decision), ("reason", reason)])
                    .inc();
                for s in &rec.secrets {
                    self.secrets_substituted
                        .get_or_create(&[("secret", s.name.to_string())])
                        .inc();
                }
            }
            Kind::PolicyReload => {
                let result = match rec.reason {
                    Reason::ReloadApplied => "applied",
                    _ => "rejected",
                };
                self.reloads.get_or_create(&[("result", result)]).inc();
            }
            Kind::Approval => {
                // The decision is one of five fixed spellings (the
                // gateway's own record, never guest text).
                let choice = rec
                    .approval
                    .as_ref()
                    .map_or_else(String::new, |a| a.decision.to_string());
                self.approvals
                    .get_or_create(&[("decision", choice), ("reason", reason.to_owned())])
                    .inc();
            }
            // Summaries (their records were counted one by one), lifecycle
            // records, and any kind added later.
            _ => {}
        }
    }

    /// One audit line written (`true`) or failed to write.
    pub(crate) fn audit_line_written(&self, written: bool) {
        if written {
            self.audit_lines.inc();
        } else {
            self.audit_write_errors.inc();
        }
    }

    /// One record the rate limiter suppressed.
    pub(crate) fn audit_suppressed(&self, rec: &AuditRecord<'_>) {
        self.audit_suppressed
            .get_or_create(&[
                ("kind", kind_str(rec.kind)),
                ("reason", rec.reason.as_str()),
            ])
            .inc();
    }

    /// The policy in force from now on, as the audit names it (without a
    /// policy: id and version `none`).
    pub(crate) fn set_policy(&self, policy: &PolicyRef<'_>) {
        self.policy_info.clear();
        self.policy_info
            .get_or_create(&[
                ("id", policy.id.to_string()),
                ("version", policy.version.to_string()),
                ("label", policy.label.as_deref().unwrap_or("").to_owned()),
            ])
            .set(1);
    }

    /// One guest frame dropped before any flow (`reason`: the session's
    /// drop counter name).
    pub(crate) fn frame_dropped(&self, reason: &'static str) {
        self.frames_dropped
            .get_or_create(&[("reason", reason)])
            .inc();
    }

    /// One flow handed to `proxy`.
    pub(crate) fn intercepted(&self, proxy: Proxy) {
        let name = match proxy {
            Proxy::Tls => "tls",
            Proxy::PlainHttp => "http",
        };
        self.interceptions.get_or_create(&[("proxy", name)]).inc();
    }

    /// The open flows now.
    pub(crate) fn set_active_flows(&self, tcp: usize, udp: usize) {
        for (transport, n) in [("tcp", tcp), ("udp", udp)] {
            self.active_flows
                .get_or_create(&[("transport", transport)])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }
}

fn transport_str(t: Transport) -> &'static str {
    match t {
        Transport::Tcp => "tcp",
        Transport::Udp => "udp",
    }
}

/// The audit spelling of a record kind.
fn kind_str(kind: Kind) -> &'static str {
    match kind {
        Kind::Dns => "dns",
        Kind::Connection => "connection",
        Kind::Http => "http",
        Kind::FlowClose => "flow_close",
        Kind::PolicyReload => "policy_reload",
        Kind::Summary => "summary",
        Kind::Gateway => "gateway",
        Kind::Approval => "approval",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::audit::{AuditEvent, AuditSink, FlowTotals};
    use crate::flow::{FlowEnd, Transport};
    use crate::verdict::Verdict;
    use hickory_proto::op::ResponseCode;
    use sluice_policy::Reason;

    /// The exposition's value of the series `line_start` (name and labels
    /// as encoded), if present.
    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
    }

    #[test]
    fn audit_events_are_counted_by_their_labels() {
        let metrics = Arc::new(Metrics::new());
        let mut sink = AuditSink::new(Box::new(std::io::sink()), "sb");
        sink.set_metrics(Arc::clone(&metrics));
        let src = "10.0.2.15:40000".parse().expect("addr");
        let dst = "198.51.100.10:443".parse().expect("addr");
        let allowed = Verdict::of(Reason::Allowlisted);
        sink.record(&AuditEvent::FlowOpen {
            flow: 1,
            transport: Transport::Tcp,
            src,
            dst,
            verdict: &allowed,
        });
        let udp = Verdict::of(Reason::UdpBlocked);
        sink.record(&AuditEvent::FlowDeny {
            transport: Transport::Udp,
            src,
            dst,
            verdict: &udp,
        });
        sink.record(&AuditEvent::FlowClose {
            totals: FlowTotals {
                flow: 1,
                transport: Transport::Tcp,
                src,
                dst,
                bytes_up: 10,
                bytes_down: 20,
                duration_ms: 1,
            },
            end: FlowEnd::Closed,
        });
        let refused = Verdict::of(Reason::NotAllowlisted);
        sink.record(&AuditEvent::Dns {
            qname: "example.com",
            qtype: "A",
            rcode: ResponseCode::Refused,
            answers: &[],
            verdict: &refused,
        });
        sink.record(&AuditEvent::Reload {
            applied: false,
            trigger: "sighup",
            detail: "x",
        });
        sink.record(&AuditEvent::Approval {
            name: "files.example.org",
            choice: sluice_approval::Choice::AllowSandbox,
            by: "unix: alice",
            lasts: crate::audit::ApprovalLasts::Sandbox,
            tcp_ports: &[443],
            udp_ports: &[],
            detail: None,
        });
        metrics.frame_dropped("icmp");
        metrics.intercepted(Proxy::Tls);
        metrics.set_active_flows(3, 1);
        let text = metrics.encode();
        let want = [
            (
                r#"sluice_flows_opened_total{transport="tcp",decision="allow",reason="allowlisted"}"#,
                1.0,
            ),
            (
                r#"sluice_flows_opened_total{transport="udp",decision="deny",reason="udp_blocked"}"#,
                1.0,
            ),
            (
                r#"sluice_flows_closed_total{transport="tcp",reason="closed"}"#,
                1.0,
            ),
            (
                r#"sluice_flow_bytes_total{transport="tcp",direction="up"}"#,
                10.0,
            ),
            (
                r#"sluice_flow_bytes_total{transport="tcp",direction="down"}"#,
                20.0,
            ),
            (
                r#"sluice_dns_queries_total{decision="deny",reason="not_allowlisted"}"#,
                1.0,
            ),
            (r#"sluice_reloads_total{result="rejected"}"#, 1.0),
            (
                r#"sluice_approvals_total{decision="allow_sandbox",reason="approval_allowed"}"#,
                1.0,
            ),
            (r#"sluice_frames_dropped_total{reason="icmp"}"#, 1.0),
            (r#"sluice_interceptions_total{proxy="tls"}"#, 1.0),
            (r#"sluice_active_flows{transport="tcp"}"#, 3.0),
            (r#"sluice_active_flows{transport="udp"}"#, 1.0),
            (
                r#"sluice_policy_info{id="none",version="none",label=""}"#,
                1.0,
            ),
            ("sluice_audit_lines_written_total", 6.0),
        ];
        for (series, v) in want {
            assert_eq!(value(&text, series), Some(v), "{series} in\n{text}");
        }
        assert!(
            value(&text, "sluice_process_resident_memory_bytes").is_some_and(|b| b > 0.0),
            "{text}"
        );
        assert!(
            text.contains("# TYPE sluice_flows_opened_total counter"),
            "{text}"
        );
    }
}

//! One audit line, schema 1 or OCSF, read into one shape ([`Entry`]) that
//! the filters, the human line and the summary use.
//!
//! A schema-1 line is read with `sluice_policy::audit::AuditRecord`, so it
//! is held to the schema (an unknown reason or kind is malformed). An OCSF
//! line is recognised by its `class_uid` and read by the attributes
//! `sluice-gateway --audit-format ocsf` writes (docs/audit.md, "OCSF"):
//! `time`, `action_id`, `status_detail`, `device.uid` and
//! `unmapped.schema1_kind` must be there.

use std::borrow::Cow;

use serde_json::Value;
use sluice_policy::Decision;
use sluice_policy::audit::{AuditRecord, Kind, Timestamp};

/// Why a line is not an audit record.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EntryError {
    /// The line is not JSON (or not one JSON object).
    #[error("not JSON: {0}")]
    NotJson(String),
    /// A schema-1 record that does not follow the schema.
    #[error("not a schema-1 record: {0}")]
    Schema1(String),
    /// An OCSF event without an attribute sluice always writes.
    #[error("OCSF event without `{0}`")]
    OcsfMissing(&'static str),
    /// JSON that is neither a schema-1 record nor an OCSF event.
    #[error("neither a schema-1 record (`schema`) nor an OCSF event (`class_uid`)")]
    Unknown,
}

/// Which format a line was written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// sluice's schema 1.
    Schema1,
    /// OCSF (`--audit-format ocsf`).
    Ocsf,
}

/// A decision, as the viewer needs it, whichever format it came in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The format of the line.
    pub format: Format,
    /// Decision time, Unix milliseconds.
    pub time_ms: i64,
    /// The sandbox (VM) id.
    pub sandbox: String,
    /// The schema-1 kind (`dns`, `connection`, `http`, `flow_close`,
    /// `policy_reload`, `summary`, `gateway`).
    pub kind: String,
    /// `true` for a denial.
    pub deny: bool,
    /// The schema-1 reason (`not_allowlisted`, ...).
    pub reason: String,
    /// The names the record is about (`qname`, `sni`, `host`), for
    /// `--name` and the summary.
    pub names: Vec<String>,
    /// What the decision was about, one line: query and answer, endpoints,
    /// request and status, totals, or the first line of `detail`.
    pub subject: String,
    /// Counts a `summary` record carries: (kind, reason, count).
    pub suppressed: Vec<(String, String, u64)>,
}

impl Entry {
    /// Reads one line (without its newline).
    pub fn parse(line: &str) -> Result<Self, EntryError> {
        let v: Value =
            serde_json::from_str(line).map_err(|e| EntryError::NotJson(e.to_string()))?;
        if v.get("schema").is_some() {
            let rec =
                AuditRecord::from_json(line).map_err(|e| EntryError::Schema1(e.to_string()))?;
            Ok(Self::from_schema1(&rec))
        } else if v.get("class_uid").is_some() {
            Self::from_ocsf(&v)
        } else {
            Err(EntryError::Unknown)
        }
    }

    /// The decision time as RFC 3339 UTC with milliseconds.
    pub fn timestamp(&self) -> String {
        Timestamp::from_unix_millis(self.time_ms)
            .and_then(|t| serde_json::to_value(t).ok())
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_else(|| self.time_ms.to_string())
    }

    fn from_schema1(r: &AuditRecord<'_>) -> Self {
        let approved = r.approval.as_ref().map(|a| Cow::Borrowed(a.name.as_ref()));
        let names: Vec<String> = [&r.qname, &r.sni, &r.host, &approved]
            .into_iter()
            .flatten()
            .map(|n| n.to_string())
            .collect();
        let detail = r.detail.as_deref().and_then(|d| d.lines().next());
        let ep = |e: &Option<sluice_policy::audit::Endpoint>| {
            e.map(|e| std::net::SocketAddr::new(e.ip, e.port).to_string())
        };
        let subject = match r.kind {
            Kind::Dns => dns_subject(
                r.qname.as_deref(),
                r.qtype.as_deref(),
                r.rcode.as_deref(),
                &r.answers
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>(),
            ),
            Kind::Connection | Kind::FlowClose => flow_subject(
                r.transport.map(|t| match t {
                    sluice_policy::Transport::Tcp => "tcp",
                    sluice_policy::Transport::Udp => "udp",
                }),
                ep(&r.src).as_deref(),
                ep(&r.dst).as_deref(),
                r.sni.as_deref().or(r.host.as_deref()),
                r.bytes_up.zip(r.bytes_down),
                detail,
            ),
            Kind::Http => http_subject(
                r.method.as_deref(),
                r.host.as_deref().or(r.sni.as_deref()),
                r.path.as_deref(),
                r.status,
                detail,
            ),
            Kind::Approval => match &r.approval {
                Some(a) => approval_subject(
                    &a.name,
                    &a.decision,
                    &a.by,
                    &a.lasts,
                    &a.tcp_ports,
                    &a.udp_ports,
                ),
                None => detail.unwrap_or_default().to_owned(),
            },
            _ => detail.unwrap_or_default().to_owned(),
        };
        Self {
            format: Format::Schema1,
            time_ms: r.ts.unix_millis(),
            sandbox: r.sandbox.to_string(),
            kind: name_of(&r.kind),
            deny: r.decision == Decision::Deny,
            reason: r.reason.as_str().to_owned(),
            names,
            subject,
            suppressed: r
                .suppressed
                .iter()
                .map(|s| {
                    (
                        s.kind.map_or_else(|| "-".to_owned(), |k| name_of(&k)),
                        s.reason.as_str().to_owned(),
                        s.count,
                    )
                })
                .collect(),
        }
    }

    fn from_ocsf(v: &Value) -> Result<Self, EntryError> {
        let s = |p: &str| v.pointer(p).and_then(Value::as_str);
        let time_ms = v
            .get("time")
            .and_then(Value::as_i64)
            .ok_or(EntryError::OcsfMissing("time"))?;
        let deny = match v.get("action_id").and_then(Value::as_u64) {
            Some(1) => false,
            Some(2) => true,
            _ => return Err(EntryError::OcsfMissing("action_id")),
        };
        let reason = s("/status_detail").ok_or(EntryError::OcsfMissing("status_detail"))?;
        let sandbox = s("/device/uid").ok_or(EntryError::OcsfMissing("device.uid"))?;
        let kind =
            s("/unmapped/schema1_kind").ok_or(EntryError::OcsfMissing("unmapped.schema1_kind"))?;
        let names: Vec<String> = [
            "/query/hostname",
            "/tls/sni",
            "/http_request/url/hostname",
            "/dst_endpoint/hostname",
            "/unmapped/approval/name",
        ]
        .into_iter()
        .filter_map(&s)
        .fold(Vec::new(), |mut acc, n| {
            if !acc.iter().any(|a: &String| a == n) {
                acc.push(n.to_owned());
            }
            acc
        });
        let ep = |p: &str| {
            let e = v.get(p)?;
            let ip = e.get("ip")?.as_str()?;
            let port = e.get("port")?.as_u64()?;
            Some(if ip.contains(':') {
                format!("[{ip}]:{port}")
            } else {
                format!("{ip}:{port}")
            })
        };
        let detail = s("/message").and_then(|d| d.lines().next());
        let subject = match kind {
            "dns" => {
                let answers: Vec<String> = v
                    .get("answers")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|x| x.get("rdata")?.as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default();
                let rcode = v
                    .get("rcode_id")
                    .and_then(Value::as_u64)
                    .map(|id| match id {
                        0 => "NOERROR",
                        1 => "FORMERR",
                        2 => "SERVFAIL",
                        3 => "NXDOMAIN",
                        4 => "NOTIMP",
                        5 => "REFUSED",
                        _ => "OTHER",
                    });
                dns_subject(s("/query/hostname"), s("/query/type"), rcode, &answers)
            }
            "connection" | "flow_close" => {
                let up = v.pointer("/traffic/bytes_out").and_then(Value::as_u64);
                let down = v.pointer("/traffic/bytes_in").and_then(Value::as_u64);
                flow_subject(
                    s("/connection_info/protocol_name"),
                    ep("src_endpoint").as_deref(),
                    ep("dst_endpoint").as_deref(),
                    s("/tls/sni").or(s("/dst_endpoint/hostname")),
                    up.zip(down),
                    detail,
                )
            }
            "http" => http_subject(
                s("/http_request/http_method"),
                s("/http_request/url/hostname"),
                s("/http_request/url/path"),
                v.pointer("/http_response/code")
                    .and_then(Value::as_u64)
                    .and_then(|c| u16::try_from(c).ok()),
                detail,
            ),
            "approval" => match v.pointer("/unmapped/approval") {
                Some(a) => {
                    let text = |k: &str| a.get(k).and_then(Value::as_str).unwrap_or("-");
                    let ports = |k: &str| -> Vec<u16> {
                        a.get(k)
                            .and_then(Value::as_array)
                            .map(|l| {
                                l.iter()
                                    .filter_map(|p| p.as_u64().and_then(|p| u16::try_from(p).ok()))
                                    .collect()
                            })
                            .unwrap_or_default()
                    };
                    approval_subject(
                        text("name"),
                        text("decision"),
                        text("by"),
                        text("lasts"),
                        &ports("tcp_ports"),
                        &ports("udp_ports"),
                    )
                }
                None => detail.unwrap_or_default().to_owned(),
            },
            _ => detail.unwrap_or_default().to_owned(),
        };
        let suppressed = v
            .pointer("/unmapped/suppressed")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|x| {
                        (
                            x.get("kind")
                                .and_then(Value::as_str)
                                .unwrap_or("-")
                                .to_owned(),
                            x.get("reason")
                                .and_then(Value::as_str)
                                .unwrap_or("-")
                                .to_owned(),
                            x.get("count").and_then(Value::as_u64).unwrap_or(0),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(Self {
            format: Format::Ocsf,
            time_ms,
            sandbox: sandbox.to_owned(),
            kind: kind.to_owned(),
            deny,
            reason: reason.to_owned(),
            names,
            subject,
            suppressed,
        })
    }
}

/// A schema-1-shaped view (`kind`, `decision`, `reason`, `suppressed`) of
/// one audit value of either format, for code that counts schema-1 fields
/// (`sluice run --json`). A schema-1 value is returned unchanged; a value
/// that is neither format is returned unchanged too.
pub fn schema1_view(v: Value) -> Value {
    if v.get("class_uid").is_none() {
        return v;
    }
    let Ok(e) = Entry::from_ocsf(&v) else {
        return v;
    };
    let suppressed: Vec<Value> = e
        .suppressed
        .iter()
        .map(|(k, r, c)| serde_json::json!({"kind": k, "reason": r, "count": c}))
        .collect();
    let mut out = serde_json::json!({
        "kind": e.kind,
        "decision": if e.deny { "deny" } else { "allow" },
        "reason": e.reason,
        "sandbox": e.sandbox,
    });
    if !suppressed.is_empty() {
        out["suppressed"] = Value::Array(suppressed);
    }
    out
}

fn name_of(kind: &Kind) -> String {
    serde_json::to_value(kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| "-".to_owned())
}

/// `NAME allow_once by unix: alice (dns_ttl) tcp 443`.
fn approval_subject(
    name: &str,
    decision: &str,
    by: &str,
    lasts: &str,
    tcp: &[u16],
    udp: &[u16],
) -> String {
    let mut s = format!("{name} {decision} by {by} ({lasts})");
    for (proto, ports) in [("tcp", tcp), ("udp", udp)] {
        if !ports.is_empty() {
            let list: Vec<String> = ports.iter().map(ToString::to_string).collect();
            s.push_str(&format!(" {proto} {}", list.join(",")));
        }
    }
    s
}

fn dns_subject(
    qname: Option<&str>,
    qtype: Option<&str>,
    rcode: Option<&str>,
    answers: &[String],
) -> String {
    let mut s = format!("{} {}", qname.unwrap_or("-"), qtype.unwrap_or("-"));
    if let Some(r) = rcode {
        s.push_str(&format!(" -> {r}"));
    }
    if !answers.is_empty() {
        s.push_str(&format!(" {}", answers.join(",")));
    }
    s
}

fn flow_subject(
    transport: Option<&str>,
    src: Option<&str>,
    dst: Option<&str>,
    name: Option<&str>,
    totals: Option<(u64, u64)>,
    detail: Option<&str>,
) -> String {
    let mut s = format!(
        "{} {} -> {}",
        transport.unwrap_or("-"),
        src.unwrap_or("-"),
        dst.unwrap_or("-")
    );
    if let Some(n) = name {
        s.push_str(&format!(" ({n})"));
    }
    if let Some((up, down)) = totals {
        s.push_str(&format!(" up {up} down {down}"));
    }
    if let Some(d) = detail {
        s.push_str(&format!(": {d}"));
    }
    s
}

fn http_subject(
    method: Option<&str>,
    host: Option<&str>,
    path: Option<&str>,
    status: Option<u16>,
    detail: Option<&str>,
) -> String {
    let mut s = format!(
        "{} {}{}",
        method.unwrap_or("-"),
        host.unwrap_or("-"),
        path.unwrap_or("")
    );
    if let Some(c) = status {
        s.push_str(&format!(" -> {c}"));
    }
    if let Some(d) = detail {
        s.push_str(&format!(": {d}"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const DNS1: &str = r#"{"schema":1,"ts":"2026-11-21T19:20:29.990Z","sandbox":"vm-1","kind":"dns","decision":"deny","reason":"not_allowlisted","policy":{"id":"p","version":"v"},"qname":"evil.example","qtype":"A","rcode":"REFUSED"}"#;
    const CONN1: &str = r#"{"schema":1,"ts":"2026-11-21T19:20:30.123Z","sandbox":"vm-1","kind":"connection","decision":"allow","reason":"allowlisted","policy":{"id":"p","version":"v"},"flow":7,"transport":"tcp","src":{"ip":"10.0.2.15","port":40000},"dst":{"ip":"93.184.215.14","port":443},"sni":"www.example.com"}"#;
    const DNS_OCSF: &str = r#"{"class_uid":4003,"activity_id":1,"type_uid":400301,"time":1795288829990,"action_id":2,"status_detail":"not_allowlisted","device":{"uid":"vm-1","type_id":6},"query":{"hostname":"evil.example","type":"A"},"rcode_id":5,"unmapped":{"schema1_kind":"dns"}}"#;
    const SUMMARY_OCSF: &str = r#"{"class_uid":4001,"activity_id":99,"type_uid":400199,"time":1795288830000,"action_id":1,"status_detail":"rate_limit_summary","device":{"uid":"vm-1","type_id":6},"count":3,"unmapped":{"schema1_kind":"summary","suppressed":[{"kind":"dns","reason":"not_allowlisted","count":3}]}}"#;

    #[test]
    fn both_formats_read_to_the_same_entry() {
        let a = Entry::parse(DNS1).unwrap();
        let b = Entry::parse(DNS_OCSF).unwrap();
        assert_eq!((a.format, b.format), (Format::Schema1, Format::Ocsf));
        assert_eq!(a.time_ms, b.time_ms);
        assert_eq!(a.timestamp(), "2026-11-21T19:20:29.990Z");
        for e in [&a, &b] {
            assert_eq!(e.kind, "dns");
            assert!(e.deny);
            assert_eq!(e.reason, "not_allowlisted");
            assert_eq!(e.sandbox, "vm-1");
            assert_eq!(e.names, ["evil.example"]);
            assert_eq!(e.subject, "evil.example A -> REFUSED");
        }
    }

    #[test]
    fn connections_name_their_endpoints_and_sni() {
        let e = Entry::parse(CONN1).unwrap();
        assert!(!e.deny);
        assert_eq!(e.names, ["www.example.com"]);
        assert_eq!(
            e.subject,
            "tcp 10.0.2.15:40000 -> 93.184.215.14:443 (www.example.com)"
        );
    }

    #[test]
    fn summaries_carry_their_counts_in_both_formats() {
        let e = Entry::parse(SUMMARY_OCSF).unwrap();
        assert_eq!(e.suppressed, [("dns".into(), "not_allowlisted".into(), 3)]);
        let v = schema1_view(serde_json::from_str(SUMMARY_OCSF).unwrap());
        assert_eq!(v["kind"], "summary");
        assert_eq!(v["suppressed"][0]["count"], 3);
        let same: Value = serde_json::from_str(CONN1).unwrap();
        assert_eq!(schema1_view(same.clone()), same);
    }

    #[test]
    fn malformed_lines_say_why() {
        assert!(matches!(
            Entry::parse("{\"schema\":1,"),
            Err(EntryError::NotJson(_))
        ));
        assert_eq!(Entry::parse("{\"a\":1}"), Err(EntryError::Unknown));
        assert!(matches!(
            Entry::parse(&DNS1.replace("not_allowlisted", "because")),
            Err(EntryError::Schema1(_))
        ));
        assert_eq!(
            Entry::parse(&DNS_OCSF.replace("\"action_id\":2,", "")),
            Err(EntryError::OcsfMissing("action_id"))
        );
    }

    #[test]
    fn approval_records_read_alike_in_both_formats() {
        let schema1 = r#"{"schema":1,"ts":"2026-11-21T19:20:29.990Z","sandbox":"vm-1","kind":"approval","decision":"allow","reason":"approval_allowed","policy":{"id":"p","version":"v"},"approval":{"name":"files.example.org","decision":"allow_once","by":"unix: alice","lasts":"dns_ttl","tcp_ports":[443]}}"#;
        let ocsf = r#"{"class_uid":4001,"activity_id":99,"type_uid":400199,"time":1795288829990,"action_id":1,"status_detail":"approval_allowed","device":{"uid":"vm-1","type_id":6},"unmapped":{"schema1_kind":"approval","approval":{"name":"files.example.org","decision":"allow_once","by":"unix: alice","lasts":"dns_ttl","tcp_ports":[443]}}}"#;
        for line in [schema1, ocsf] {
            let e = Entry::parse(line).unwrap();
            assert_eq!(e.kind, "approval");
            assert!(!e.deny);
            assert_eq!(e.names, vec!["files.example.org".to_owned()]);
            assert_eq!(
                e.subject,
                "files.example.org allow_once by unix: alice (dns_ttl) tcp 443"
            );
        }
    }
}

//! The audit record as an OCSF event (`--audit-format ocsf`).
//!
//! Converts an already-built schema-1 [`AuditRecord`] into one OCSF
//! [`OCSF_VERSION`] event: the mapping is the table in `docs/audit.md`
//! ("OCSF mapping"), and `docs/ocsf/` holds the subset of the OCSF schema
//! every event written here is validated against (end to end, by
//! `tests/tests/ocsf.rs`). Nothing is decided here: decision, reason and
//! rule are the record's, written in OCSF's words.
//!
//! Classes: `connection` and `flow_close` are Network Activity (4001),
//! `http` HTTP Activity (4002), `dns` DNS Activity (4003). Records with no
//! network event of their own (`summary`, `policy_reload`, `gateway`) are
//! Network Activity with activity 99 Other, `message` = their `detail` and
//! the schema-1 kind and counts under `unmapped`; so is `approval` (a
//! runtime approval decision), its facts under `unmapped.approval`: one category, so a
//! pipeline that takes sluice's network events takes all of them. Every
//! event carries the security_control profile (`action_id`,
//! `disposition_id`, `firewall_rule`, `policy`).

use std::io;
use std::net::IpAddr;

use serde_json::{Map, Value, json};
use sluice_policy::audit::{AuditRecord, Endpoint, Kind};
use sluice_policy::{Decision, Reason, Transport};

/// The OCSF schema version the events follow (`metadata.version`).
pub const OCSF_VERSION: &str = "1.1.0";

/// OCSF category 4, Network Activity.
const NETWORK_CATEGORY: u32 = 4;
const NETWORK_ACTIVITY: u32 = 4001;
const HTTP_ACTIVITY: u32 = 4002;
const DNS_ACTIVITY: u32 = 4003;
/// `activity_id` 99: Other, in every class.
const OTHER: u32 = 99;

/// Writes `rec` as one OCSF event and a newline into `out`.
pub fn write_line(rec: &AuditRecord<'_>, out: &mut Vec<u8>) -> io::Result<()> {
    serde_json::to_writer(&mut *out, &event(rec))?;
    out.push(b'\n');
    Ok(())
}

/// The OCSF event for `rec` (module docs).
#[must_use]
pub fn event(rec: &AuditRecord<'_>) -> Value {
    let (class_uid, class_name, activity_id) = class_and_activity(rec);
    let allowed = rec.decision == Decision::Allow;
    let mut e = Map::new();
    e.insert("class_uid".into(), json!(class_uid));
    e.insert("class_name".into(), json!(class_name));
    e.insert("category_uid".into(), json!(NETWORK_CATEGORY));
    e.insert("category_name".into(), json!("Network Activity"));
    e.insert("activity_id".into(), json!(activity_id));
    e.insert(
        "type_uid".into(),
        json!(u64::from(class_uid) * 100 + u64::from(activity_id)),
    );
    e.insert("time".into(), json!(rec.ts.unix_millis()));
    // Informational for what passed, Low for what was stopped: a denial is
    // the policy working, not an incident by itself.
    e.insert("severity_id".into(), json!(if allowed { 1 } else { 2 }));
    e.insert(
        "metadata".into(),
        json!({
            "version": OCSF_VERSION,
            "product": {
                "name": "sluice-gateway",
                "vendor_name": "sluice",
                "version": env!("CARGO_PKG_VERSION"),
            },
            "profiles": ["security_control"],
        }),
    );
    // security_control: the decision.
    e.insert("action_id".into(), json!(if allowed { 1 } else { 2 }));
    e.insert(
        "action".into(),
        json!(if allowed { "Allowed" } else { "Denied" }),
    );
    e.insert("disposition_id".into(), json!(if allowed { 1 } else { 2 }));
    e.insert(
        "disposition".into(),
        json!(if allowed { "Allowed" } else { "Blocked" }),
    );
    e.insert("status_id".into(), json!(if allowed { 1 } else { 2 }));
    e.insert(
        "status".into(),
        json!(if allowed { "Success" } else { "Failure" }),
    );
    e.insert("status_detail".into(), json!(rec.reason.as_str()));
    let mut policy = json!({"uid": rec.policy.id, "version": rec.policy.version});
    if let Some(label) = &rec.policy.label {
        policy["name"] = json!(label);
    }
    e.insert("policy".into(), policy);
    if let Some(r) = &rec.rule {
        let mut fr = json!({"uid": r.id, "condition": r.pattern});
        if let Some(n) = &r.name {
            fr["desc"] = json!(n);
        }
        e.insert("firewall_rule".into(), fr);
    }
    // The sandbox (VM) is the device the event is about; type 6 Virtual.
    e.insert(
        "device".into(),
        json!({"uid": rec.sandbox, "type_id": 6, "type": "Virtual"}),
    );
    // The initiator is always the sandbox: where the record has no guest
    // endpoint (DNS to the gateway, lifecycle), it is named by its id, which
    // also meets the network classes' "src or dst endpoint" constraint.
    let mut src = rec
        .src
        .map_or_else(|| json!({"uid": rec.sandbox}), |s| endpoint(&s, None));
    if rec.src.is_some() {
        src["uid"] = json!(rec.sandbox);
    }
    e.insert("src_endpoint".into(), src);
    if let Some(d) = &rec.dst {
        e.insert("dst_endpoint".into(), endpoint(d, rec.host.as_deref()));
    }
    if rec.transport.is_some() || rec.flow.is_some() {
        e.insert("connection_info".into(), connection_info(rec));
    }
    if let Some(sni) = &rec.sni {
        e.insert("tls".into(), json!({"sni": sni}));
    }
    if let (Some(up), Some(down)) = (rec.bytes_up, rec.bytes_down) {
        e.insert(
            "traffic".into(),
            json!({"bytes_out": up, "bytes_in": down, "bytes": up.saturating_add(down)}),
        );
    }
    if let Some(ms) = rec.duration_ms {
        e.insert("duration".into(), json!(ms));
    }
    if let Some(d) = &rec.detail {
        e.insert("message".into(), json!(d));
    }
    match rec.kind {
        Kind::Http => http(rec, &mut e),
        Kind::Dns => dns(rec, &mut e),
        _ => {}
    }
    let mut unmapped = Map::new();
    unmapped.insert("schema1_kind".into(), json!(kind_name(rec.kind)));
    if !rec.secrets.is_empty() {
        unmapped.insert("secrets".into(), json!(rec.secrets));
    }
    // An approval decision has no OCSF class of its own: Network Activity,
    // activity Other, the decision's facts kept whole.
    if let Some(a) = &rec.approval {
        unmapped.insert("approval".into(), json!(a));
    }
    if !rec.suppressed.is_empty() {
        let total = rec
            .suppressed
            .iter()
            .fold(0u64, |n, s| n.saturating_add(s.count));
        e.insert("count".into(), json!(total));
        unmapped.insert("suppressed".into(), json!(rec.suppressed));
    }
    e.insert("unmapped".into(), Value::Object(unmapped));
    Value::Object(e)
}

/// The schema-1 spelling of `kind` (kept under `unmapped.schema1_kind`, so
/// a reader can tell a lifecycle record from a summary).
fn kind_name(kind: Kind) -> String {
    serde_json::to_value(kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The class, its name and the activity (docs/audit.md, "Per kind").
fn class_and_activity(rec: &AuditRecord<'_>) -> (u32, &'static str, u32) {
    let allowed = rec.decision == Decision::Allow;
    match rec.kind {
        // 1 Open, 5 Refuse.
        Kind::Connection => (
            NETWORK_ACTIVITY,
            "Network Activity",
            if allowed { 1 } else { 5 },
        ),
        // 2 Close, 3 Reset, 4 Fail.
        Kind::FlowClose => {
            let activity = match rec.reason {
                Reason::ConnectFailed | Reason::UpstreamError => 4,
                _ if rec.detail.as_deref() == Some("reset") => 3,
                _ => 2,
            };
            (NETWORK_ACTIVITY, "Network Activity", activity)
        }
        Kind::Http => (HTTP_ACTIVITY, "HTTP Activity", http_activity(rec)),
        // 6 Traffic: a query and the answer sent back; 1 Query: a query
        // refused or withheld.
        Kind::Dns => (DNS_ACTIVITY, "DNS Activity", if allowed { 6 } else { 1 }),
        _ => (NETWORK_ACTIVITY, "Network Activity", OTHER),
    }
}

/// HTTP Activity's activity for the request method.
fn http_activity(rec: &AuditRecord<'_>) -> u32 {
    match rec
        .method
        .as_deref()
        .map(str::to_ascii_uppercase)
        .as_deref()
    {
        Some("CONNECT") => 1,
        Some("DELETE") => 2,
        Some("GET") => 3,
        Some("HEAD") => 4,
        Some("OPTIONS") => 5,
        Some("POST") => 6,
        Some("PUT") => 7,
        Some("TRACE") => 8,
        _ => OTHER,
    }
}

fn endpoint(ep: &Endpoint, hostname: Option<&str>) -> Value {
    let mut v = json!({"ip": ep.ip.to_string(), "port": ep.port});
    if let Some(h) = hostname {
        v["hostname"] = json!(h);
    }
    v
}

fn connection_info(rec: &AuditRecord<'_>) -> Value {
    // HTTP records carry no transport: requests ride on TCP.
    let (name, num) = match rec.transport {
        Some(Transport::Udp) => ("udp", 17),
        _ => ("tcp", 6),
    };
    // 1 Inbound for a published port's flow, 2 Outbound for the guest's.
    let inbound = rec.reason == Reason::Published;
    let mut v = json!({
        "protocol_name": name,
        "protocol_num": num,
        "direction_id": if inbound { 1 } else { 2 },
        "direction": if inbound { "Inbound" } else { "Outbound" },
    });
    if let Some(f) = rec.flow {
        v["uid"] = json!(f.to_string());
    }
    v
}

fn http(rec: &AuditRecord<'_>, e: &mut Map<String, Value>) {
    let mut url = Map::new();
    let host = rec.host.as_deref().or(rec.sni.as_deref());
    if let Some(h) = host {
        url.insert("hostname".into(), json!(h));
    }
    if let Some(p) = &rec.path {
        url.insert("path".into(), json!(p));
    }
    if let (Some(h), Some(p)) = (host, &rec.path) {
        let scheme = if rec.sni.is_some() { "https" } else { "http" };
        url.insert("url_string".into(), json!(format!("{scheme}://{h}{p}")));
    }
    let mut req = json!({"url": url});
    if let Some(m) = &rec.method {
        req["http_method"] = json!(m);
    }
    e.insert("http_request".into(), req);
    if let Some(code) = rec.status {
        e.insert("http_response".into(), json!({"code": code}));
    }
}

fn dns(rec: &AuditRecord<'_>, e: &mut Map<String, Value>) {
    if let Some(q) = &rec.qname {
        let mut query = json!({"hostname": q});
        if let Some(t) = &rec.qtype {
            query["type"] = json!(t);
        }
        e.insert("query".into(), query);
    }
    if let Some(rcode) = &rec.rcode {
        let (id, caption) = match rcode.as_ref() {
            "NOERROR" => (0, "NoError"),
            "FORMERR" => (1, "FormError"),
            "SERVFAIL" => (2, "ServError"),
            "NXDOMAIN" => (3, "NXDomain"),
            "NOTIMP" => (4, "NotImp"),
            "REFUSED" => (5, "Refused"),
            _ => (99, "Other"),
        };
        e.insert("rcode_id".into(), json!(id));
        e.insert("rcode".into(), json!(caption));
    }
    if !rec.answers.is_empty() {
        let answers: Vec<Value> = rec
            .answers
            .iter()
            .map(|ip| {
                let t = match ip {
                    IpAddr::V4(_) => "A",
                    IpAddr::V6(_) => "AAAA",
                };
                json!({"rdata": ip.to_string(), "type": t})
            })
            .collect();
        e.insert("answers".into(), json!(answers));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_policy::audit::{
        PolicyRef, RuleRef, SecretLocation, SecretUse, Suppressed, Timestamp,
    };
    use std::borrow::Cow;

    fn base(kind: Kind, reason: Reason) -> AuditRecord<'static> {
        AuditRecord::new(
            Timestamp::from_unix_millis(1_764_000_000_123).unwrap(),
            "vm-1",
            kind,
            reason,
            PolicyRef {
                id: Cow::Borrowed("p"),
                version: Cow::Borrowed("sha256:00"),
                label: Some(Cow::Borrowed("label")),
            },
        )
    }

    #[test]
    fn a_connection_maps_to_network_activity_with_the_security_control_profile() {
        let mut r = base(Kind::Connection, Reason::Allowlisted)
            .flow(7)
            .endpoints(
                Transport::Tcp,
                "10.0.2.15:40000".parse().unwrap(),
                "93.184.215.14:443".parse().unwrap(),
            );
        r.sni = Some(Cow::Borrowed("www.example.com"));
        r.rule = Some(RuleRef {
            id: Cow::Borrowed("allow[0]"),
            pattern: Cow::Borrowed("**.example.com"),
            name: Some(Cow::Borrowed("www.example.com")),
        });
        let e = event(&r);
        assert_eq!(e["class_uid"], 4001);
        assert_eq!(e["activity_id"], 1);
        assert_eq!(e["type_uid"], 400_101);
        assert_eq!(e["time"], 1_764_000_000_123_i64);
        assert_eq!(e["action_id"], 1);
        assert_eq!(e["disposition_id"], 1);
        assert_eq!(e["status_detail"], "allowlisted");
        assert_eq!(e["policy"]["uid"], "p");
        assert_eq!(e["policy"]["name"], "label");
        assert_eq!(e["firewall_rule"]["uid"], "allow[0]");
        assert_eq!(e["firewall_rule"]["condition"], "**.example.com");
        assert_eq!(e["tls"]["sni"], "www.example.com");
        assert_eq!(e["dst_endpoint"]["port"], 443);
        assert_eq!(e["src_endpoint"]["ip"], "10.0.2.15");
        assert_eq!(e["connection_info"]["protocol_num"], 6);
        assert_eq!(e["connection_info"]["uid"], "7");
        assert_eq!(e["metadata"]["version"], OCSF_VERSION);
        assert_eq!(e["metadata"]["product"]["name"], "sluice-gateway");
        assert_eq!(e["device"]["uid"], "vm-1");
    }

    #[test]
    fn denials_refuse_and_block() {
        let e = event(&base(Kind::Connection, Reason::IpNotResolvedForName));
        assert_eq!(
            (&e["activity_id"], &e["action_id"], &e["disposition_id"]),
            (&json!(5), &json!(2), &json!(2))
        );
        assert_eq!(e["type_uid"], 400_105);
        assert_eq!(e["status_detail"], "ip_not_resolved_for_name");
    }

    #[test]
    fn flow_closes_are_close_reset_or_fail() {
        let mut r = base(Kind::FlowClose, Reason::Closed).totals(10, 20, 30);
        assert_eq!(event(&r)["activity_id"], 2);
        assert_eq!(event(&r)["traffic"]["bytes_out"], 10);
        assert_eq!(event(&r)["traffic"]["bytes_in"], 20);
        assert_eq!(event(&r)["duration"], 30);
        r.detail = Some(Cow::Borrowed("reset"));
        assert_eq!(event(&r)["activity_id"], 3);
        assert_eq!(
            event(&base(Kind::FlowClose, Reason::ConnectFailed))["activity_id"],
            4
        );
    }

    #[test]
    fn http_records_carry_the_request_and_response_and_name_secrets_only() {
        let mut r = base(Kind::Http, Reason::Allowlisted);
        r.method = Some(Cow::Borrowed("POST"));
        r.host = Some(Cow::Borrowed("api.example.com"));
        r.sni = Some(Cow::Borrowed("api.example.com"));
        r.path = Some(Cow::Borrowed("/v1/x"));
        r.status = Some(200);
        r.secrets = vec![SecretUse {
            name: Cow::Borrowed("key"),
            location: SecretLocation::Header,
        }];
        let e = event(&r);
        assert_eq!(e["class_uid"], 4002);
        assert_eq!(e["activity_id"], 6);
        assert_eq!(e["type_uid"], 400_206);
        assert_eq!(e["http_request"]["http_method"], "POST");
        assert_eq!(e["http_request"]["url"]["hostname"], "api.example.com");
        assert_eq!(e["http_request"]["url"]["path"], "/v1/x");
        assert_eq!(
            e["http_request"]["url"]["url_string"],
            "https://api.example.com/v1/x"
        );
        assert_eq!(e["http_response"]["code"], 200);
        assert_eq!(e["unmapped"]["secrets"][0]["name"], "key");
        r.method = Some(Cow::Borrowed("PATCH"));
        assert_eq!(event(&r)["activity_id"], 99);
    }

    #[test]
    fn dns_records_carry_the_query_rcode_and_answers() {
        let mut r = base(Kind::Dns, Reason::DnsAnswered).query("a.example", "A");
        r.rcode = Some(Cow::Borrowed("NOERROR"));
        r.answers = vec!["93.184.215.14".parse().unwrap()];
        let e = event(&r);
        assert_eq!(e["class_uid"], 4003);
        assert_eq!(e["activity_id"], 6);
        assert_eq!(e["query"]["hostname"], "a.example");
        assert_eq!(e["query"]["type"], "A");
        assert_eq!(e["rcode_id"], 0);
        assert_eq!(e["answers"][0]["rdata"], "93.184.215.14");
        assert_eq!(e["src_endpoint"]["uid"], "vm-1");
        let mut d = base(Kind::Dns, Reason::NotAllowlisted).query("b.example", "A");
        d.rcode = Some(Cow::Borrowed("REFUSED"));
        let e = event(&d);
        assert_eq!((&e["activity_id"], &e["rcode_id"]), (&json!(1), &json!(5)));
    }

    #[test]
    fn summaries_and_lifecycle_are_other_with_their_kind_and_counts() {
        let mut r = base(Kind::Summary, Reason::RateLimitSummary);
        r.suppressed = vec![
            Suppressed {
                kind: Some(Kind::Dns),
                reason: Reason::DnsAnswered,
                count: 3,
            },
            Suppressed {
                kind: Some(Kind::Connection),
                reason: Reason::NotAllowlisted,
                count: 4,
            },
        ];
        let e = event(&r);
        assert_eq!(
            (&e["class_uid"], &e["activity_id"]),
            (&json!(4001), &json!(99))
        );
        assert_eq!(e["count"], 7);
        assert_eq!(e["unmapped"]["schema1_kind"], "summary");
        assert_eq!(e["unmapped"]["suppressed"][1]["count"], 4);
        let mut g = base(Kind::PolicyReload, Reason::ReloadRejected);
        g.detail = Some(Cow::Borrowed("trigger: sighup"));
        let e = event(&g);
        assert_eq!(e["type_uid"], 400_199);
        assert_eq!(e["message"], "trigger: sighup");
        assert_eq!(e["unmapped"]["schema1_kind"], "policy_reload");
        assert_eq!(e["action_id"], 2);
    }

    #[test]
    fn lines_are_one_json_object_each() {
        let mut out = Vec::new();
        write_line(&base(Kind::Gateway, Reason::Started), &mut out).unwrap();
        assert_eq!(out.iter().filter(|b| **b == b'\n').count(), 1);
        assert!(out.ends_with(b"\n"));
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["unmapped"]["schema1_kind"], "gateway");
    }

    #[test]
    fn an_approval_is_network_activity_other_with_its_facts_unmapped() {
        use sluice_policy::audit::ApprovalInfo;
        let mut r = base(Kind::Approval, Reason::ApprovalAllowed);
        r.approval = Some(ApprovalInfo {
            name: Cow::Borrowed("files.example.org"),
            decision: Cow::Borrowed("allow_once"),
            by: Cow::Borrowed("unix: alice"),
            lasts: Cow::Borrowed("dns_ttl"),
            tcp_ports: vec![443],
            udp_ports: vec![],
        });
        let v = event(&r);
        assert_eq!(
            (v["class_uid"].clone(), v["activity_id"].clone()),
            (json!(4001), json!(99))
        );
        assert_eq!(v["action"], "Allowed");
        assert_eq!(v["status_detail"], "approval_allowed");
        assert_eq!(v["unmapped"]["schema1_kind"], "approval");
        assert_eq!(v["unmapped"]["approval"]["name"], "files.example.org");
        assert_eq!(v["unmapped"]["approval"]["by"], "unix: alice");
        assert_eq!(v["unmapped"]["approval"]["tcp_ports"], json!([443]));
    }
}

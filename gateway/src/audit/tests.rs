use super::*;
use std::sync::Mutex;

use std::collections::BTreeMap;

use sluice_policy::audit::Suppressed;
use sluice_policy::{CompileOptions, Decision, from_yaml_str};

use crate::decide::policy::dns_decision;
use crate::decide::{DenyReason, DnsDecision};

/// A writer tests can read back.
#[derive(Clone, Default)]
pub(crate) struct Shared(pub(crate) Arc<Mutex<Vec<u8>>>);
impl Write for Shared {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Shared {
    pub(crate) fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

/// Every line parses as a schema-1 record; returned as JSON values.
pub(crate) fn parse_all(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .map(|l| {
            let rec = AuditRecord::from_json(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            assert_eq!(rec.schema, 1);
            assert_eq!(rec.decision, rec.reason.decision(), "{l}");
            serde_json::from_str(l).unwrap()
        })
        .collect()
}

fn policy() -> Arc<CompiledPolicy> {
    Arc::new(
            from_yaml_str(
                "version: 1\nid: audit-gw\nlabel: tests\nallow:\n  - domain: \"**.example.com\"\n  - cidr: \"203.0.113.0/24\"\n    ports: [22]\ndeny:\n  - \"bad.example.com\"\n",
                "a.yaml",
                &CompileOptions::default(),
            )
            .unwrap(),
        )
}

#[test]
fn an_approval_decision_is_an_approval_record_saying_who_and_how_long() {
    let buf = Shared::default();
    let mut sink = AuditSink::new(Box::new(buf.clone()), "sb1");
    sink.set_policy(Some(policy()));
    for (choice, by, lasts) in [
        (Choice::AllowOnce, "unix: alice", ApprovalLasts::DnsTtl),
        (Choice::DenyOnce, "timeout", ApprovalLasts::RetryWindow),
    ] {
        sink.record(&AuditEvent::Approval {
            name: "files.example.org",
            choice,
            by,
            lasts,
            tcp_ports: &[443],
            udp_ports: &[],
            detail: None,
        });
    }
    sink.flush();
    let lines = parse_all(&buf.text());
    assert_eq!(lines.len(), 2);
    let (a, d) = (&lines[0], &lines[1]);
    assert_eq!(
        (a["kind"].as_str(), a["reason"].as_str()),
        (Some("approval"), Some("approval_allowed"))
    );
    assert_eq!(a["approval"]["name"], "files.example.org");
    assert_eq!(a["approval"]["by"], "unix: alice");
    assert_eq!(a["approval"]["lasts"], "dns_ttl");
    assert_eq!(a["approval"]["tcp_ports"], serde_json::json!([443]));
    assert!(a["approval"].get("udp_ports").is_none());
    assert_eq!(
        (d["decision"].as_str(), d["reason"].as_str()),
        (Some("deny"), Some("approval_denied"))
    );
    // A deny opens nothing: no ports.
    assert!(d["approval"].get("tcp_ports").is_none());
}

#[test]
fn every_event_maps_to_a_schema_1_record_that_round_trips() {
    let buf = Shared::default();
    let mut sink = AuditSink::new(Box::new(buf.clone()), "sb1");
    sink.set_policy(Some(policy()));
    let src: SocketAddr = "10.0.2.15:1000".parse().unwrap();
    let dst: SocketAddr = "93.184.216.34:443".parse().unwrap();
    let sni = WireName::Sni("www.example.com".into());
    let host = WireName::Host("bad.example.com".into());
    let answers = ["93.184.216.34".parse().unwrap()];
    // The verdicts as the policy decider makes them.
    let p = policy();
    let cidr = Verdict::of_policy(&p.check_destination("203.0.113.9".parse().unwrap(), 22, &[]));
    let by_sni = Verdict::of_policy(&p.check_name_port("www.example.com", Transport::Tcp, 443));
    let unresolved = Verdict::of(Reason::IpNotResolvedForName);
    let udp = DenyReason::UdpNotAllowed.verdict();
    let by_host = Verdict::of_policy(&p.check_name_port("bad.example.com", Transport::Tcp, 80));
    let DnsDecision::Forward(answered) = dns_decision(&p, "www.example.com") else {
        panic!("www.example.com is allowed");
    };
    let DnsDecision::Answer {
        verdict: refused, ..
    } = dns_decision(&p, "bad.example.com")
    else {
        panic!("bad.example.com is denied");
    };
    let events = [
        AuditEvent::FlowOpen {
            flow: 1,
            transport: Transport::Tcp,
            src,
            dst: "203.0.113.9:22".parse().unwrap(),
            verdict: &cidr,
        },
        AuditEvent::InspectedOpen {
            flow: 2,
            src,
            dst,
            wire: &sni,
            verdict: &by_sni,
        },
        AuditEvent::PublishedOpen {
            flow: 3,
            transport: Transport::Tcp,
            src: "10.0.2.2:49152".parse().unwrap(),
            dst: "10.0.2.15:8080".parse().unwrap(),
        },
        AuditEvent::FlowDeny {
            transport: Transport::Tcp,
            src,
            dst,
            verdict: &unresolved,
        },
        AuditEvent::FlowDeny {
            transport: Transport::Udp,
            src,
            dst,
            verdict: &udp,
        },
        AuditEvent::InspectedDeny {
            flow: 4,
            src,
            dst: "93.184.216.34:80".parse().unwrap(),
            verdict: &by_host,
            wire: Some(&host),
        },
        AuditEvent::FlowClose {
            totals: FlowTotals {
                flow: 2,
                transport: Transport::Tcp,
                src,
                dst,
                bytes_up: 10,
                bytes_down: 20,
                duration_ms: 30,
            },
            end: FlowEnd::Reset,
        },
        AuditEvent::Revoked {
            totals: FlowTotals {
                flow: 1,
                transport: Transport::Tcp,
                src,
                dst,
                bytes_up: 1,
                bytes_down: 2,
                duration_ms: 3,
            },
            why: Reason::NotAllowlisted,
            wire: Some(&sni),
        },
        AuditEvent::Dns {
            qname: "www.example.com",
            qtype: "A",
            rcode: ResponseCode::NoError,
            answers: &answers,
            verdict: &answered,
        },
        AuditEvent::Dns {
            qname: "bad.example.com",
            qtype: "A",
            rcode: ResponseCode::Refused,
            answers: &[],
            verdict: &refused,
        },
        AuditEvent::Reload {
            applied: false,
            trigger: "sighup",
            detail: "p.yaml:3:1: unknown field `x`",
        },
        AuditEvent::Gateway {
            reason: Reason::Started,
            detail: "sluice-gateway",
        },
    ];
    for e in &events {
        sink.record(e);
    }
    sink.flush();
    let lines = parse_all(&buf.text());
    assert_eq!(lines.len(), events.len());
    for l in &lines {
        assert_eq!(l["sandbox"], "sb1");
        assert_eq!(l["policy"]["id"], "audit-gw");
        assert_eq!(l["policy"]["label"], "tests");
        assert!(
            l["policy"]["version"]
                .as_str()
                .unwrap()
                .starts_with("sha256:")
        );
    }
    let want = [
        ("connection", "cidr_allowed"),
        ("connection", "allowlisted"),
        ("connection", "published"),
        ("connection", "ip_not_resolved_for_name"),
        ("connection", "udp_blocked"),
        ("connection", "denylisted"),
        ("flow_close", "closed"),
        ("flow_close", "reload_revoked"),
        ("dns", "dns_answered"),
        ("dns", "denylisted"),
        ("policy_reload", "reload_rejected"),
        ("gateway", "started"),
    ];
    for (l, (kind, reason)) in lines.iter().zip(want) {
        assert_eq!(
            (l["kind"].as_str(), l["reason"].as_str()),
            (Some(kind), Some(reason)),
            "{l}"
        );
    }
    assert_eq!(lines[0]["rule"]["pattern"], "203.0.113.0/24");
    assert_eq!(lines[0]["flow"], 1);
    assert_eq!(lines[1]["sni"], "www.example.com");
    assert_eq!(lines[1]["rule"]["pattern"], "**.example.com");
    assert_eq!(lines[3]["dst"]["ip"], "93.184.216.34");
    assert_eq!(lines[3]["transport"], "tcp");
    assert_eq!(lines[4]["transport"], "udp");
    assert_eq!(lines[5]["host"], "bad.example.com");
    assert_eq!(lines[5]["rule"]["pattern"], "bad.example.com");
    assert_eq!(lines[6]["bytes_down"], 20);
    assert_eq!(lines[6]["detail"], "reset");
    assert_eq!(lines[7]["detail"], "not_allowlisted");
    assert_eq!(lines[7]["decision"], "deny");
    assert_eq!(lines[8]["answers"][0], "93.184.216.34");
    assert_eq!(lines[8]["rule"]["pattern"], "**.example.com");
    assert!(lines[10]["detail"].as_str().unwrap().contains("p.yaml:3:1"));
}

/// The `flow_close` lines byte for byte (but the timestamp), as schema 1
/// has written them since session 2: refactoring the events must not
/// change them.
#[test]
fn flow_close_lines_are_unchanged() {
    let buf = Shared::default();
    let mut sink = AuditSink::new(Box::new(buf.clone()), "sb1");
    sink.set_policy(Some(policy()));
    let totals = |flow, bytes_up, bytes_down, duration_ms| FlowTotals {
        flow,
        transport: Transport::Tcp,
        src: "10.0.2.15:1000".parse().unwrap(),
        dst: "93.184.216.34:443".parse().unwrap(),
        bytes_up,
        bytes_down,
        duration_ms,
    };
    let sni = WireName::Sni("www.example.com".into());
    sink.record(&AuditEvent::FlowClose {
        totals: totals(2, 10, 20, 30),
        end: FlowEnd::Reset,
    });
    sink.record(&AuditEvent::Revoked {
        totals: totals(1, 1, 2, 3),
        why: Reason::NotAllowlisted,
        wire: Some(&sni),
    });
    let mut udp = totals(3, 4, 5, 6);
    udp.transport = Transport::Udp;
    sink.record(&AuditEvent::FlowClose {
        totals: udp,
        end: FlowEnd::IdleTimeout,
    });
    let text = buf.text();
    let lines: Vec<String> = text
        .lines()
        .map(|l| {
            let at = l.find(",\"sandbox\"").unwrap();
            format!("{{\"schema\":1{}", &l[at..])
        })
        .collect();
    let policy =
        r#""policy":{"id":"audit-gw","version":"sha256:7216e8f26070237c","label":"tests"}"#;
    let ends = r#""src":{"ip":"10.0.2.15","port":1000},"dst":{"ip":"93.184.216.34","port":443}"#;
    assert_eq!(
        lines,
        [
            format!(
                r#"{{"schema":1,"sandbox":"sb1","kind":"flow_close","decision":"allow","reason":"closed",{policy},"flow":2,"transport":"tcp",{ends},"bytes_up":10,"bytes_down":20,"duration_ms":30,"detail":"reset"}}"#
            ),
            format!(
                r#"{{"schema":1,"sandbox":"sb1","kind":"flow_close","decision":"deny","reason":"reload_revoked",{policy},"flow":1,"transport":"tcp",{ends},"sni":"www.example.com","bytes_up":1,"bytes_down":2,"duration_ms":3,"detail":"not_allowlisted"}}"#
            ),
            format!(
                r#"{{"schema":1,"sandbox":"sb1","kind":"flow_close","decision":"allow","reason":"idle_timeout",{policy},"flow":3,"transport":"udp",{ends},"bytes_up":4,"bytes_down":5,"duration_ms":6}}"#
            ),
        ]
    );
}

/// A writer that records each `write` call as one chunk.
#[derive(Clone, Default)]
struct Chunks(Arc<Mutex<Vec<Vec<u8>>>>);
impl Write for Chunks {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().push(b.to_vec());
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn each_line_reaches_the_output_in_one_write() {
    let out = Chunks::default();
    let mut sink = AuditSink::new(Box::new(out.clone()), "sb1");
    sink.set_policy(Some(policy()));
    let answers = ["93.184.216.34".parse().unwrap()];
    let big = "x".repeat(3 * LINE_BUFFER_KEEP);
    for detail in ["", big.as_str(), ""] {
        sink.record(&AuditEvent::Dns {
            qname: "www.example.com",
            qtype: "A",
            rcode: ResponseCode::NoError,
            answers: &answers,
            verdict: &ANSWERED,
        });
        sink.record(&AuditEvent::Reload {
            applied: false,
            trigger: "sighup",
            detail,
        });
    }
    let chunks = out.0.lock().unwrap().clone();
    assert_eq!(chunks.len(), 6, "one write per line");
    for c in &chunks {
        assert_eq!(c.iter().filter(|&&b| b == b'\n').count(), 1);
        assert!(c.ends_with(b"\n"));
        AuditRecord::from_json(std::str::from_utf8(&c[..c.len() - 1]).unwrap()).unwrap();
    }
    // The huge detail was cut to keep the line within its bound.
    assert!(chunks[3].len() <= MAX_LINE_BYTES, "{}", chunks[3].len());
    assert!(String::from_utf8_lossy(&chunks[3]).contains("xxx...\""));
    // The buffer a huge line grew is given back.
    assert!(sink.writer.line.capacity() <= LINE_BUFFER_KEEP);
    assert_eq!(sink.lines_written(), 6);
}

#[test]
fn without_a_policy_lines_name_the_none_policy() {
    let buf = Shared::default();
    let mut sink = AuditSink::new(Box::new(buf.clone()), "sb");
    sink.record(&AuditEvent::FlowDeny {
        transport: Transport::Tcp,
        src: "10.0.2.15:1".parse().unwrap(),
        dst: "10.0.2.2:22".parse().unwrap(),
        verdict: &DenyReason::GatewayAddress.verdict(),
    });
    let lines = parse_all(&buf.text());
    assert_eq!(lines[0]["policy"]["id"], NO_POLICY_ID);
    assert_eq!(lines[0]["reason"], "platform_denied");
    assert_eq!(lines[0]["detail"], "gateway address");
}

#[test]
fn hosts_the_running_ca_cannot_sign_for_are_inspect_failed_with_the_cause() {
    for why in [DenyReason::OutsideSandboxCa, DenyReason::NoSandboxCa] {
        let v = why.verdict();
        assert_eq!(v.reason, Reason::InspectFailed);
        assert_eq!(v.reason.decision(), Decision::Deny);
        assert!(
            v.detail.is_some_and(|d| d.contains("restart to inspect")),
            "{why:?}"
        );
    }
}

/// The `dns` lines name the rule the decider's verdict carries: the
/// allow rule of an answered or private answer, the deny rule of a
/// refused question, and none for a CNAME chain refused through a
/// denied name (the question's own rule did not decide) or for a name
/// nothing allows.
#[test]
fn dns_lines_name_the_rule_that_decided() {
    use crate::decide::Decider as _;
    use crate::dns::server::Outcome;

    let p = policy();
    let decider = crate::decide::PolicyDecider::new(
        Arc::clone(&p),
        crate::decide::PlatformDenySet::default(),
    );
    let buf = Shared::default();
    let mut sink = AuditSink::new(Box::new(buf.clone()), "sb1");
    sink.set_policy(Some(Arc::clone(&p)));
    let DnsDecision::Forward(allowed) = decider.dns_query("alias.example.com") else {
        panic!("alias.example.com is allowed");
    };
    let chain = decider
        .dns_cname_target("bad.example.com")
        .expect("a chain through a denied name is refused");
    let DnsDecision::Answer {
        verdict: denied,
        rcode,
    } = decider.dns_query("bad.example.com")
    else {
        panic!("bad.example.com is denied");
    };
    let DnsDecision::Answer {
        verdict: unlisted, ..
    } = decider.dns_query("other.test")
    else {
        panic!("other.test is not allowed");
    };
    let outcomes = [
        (
            "alias.example.com",
            Outcome::Answered {
                rcode: ResponseCode::NoError,
                addresses: vec!["93.184.216.34".parse().unwrap()],
                cached: false,
                verdict: allowed.clone(),
            },
        ),
        (
            "alias.example.com",
            Outcome::PrivateAnswer {
                verdict: Verdict {
                    reason: Reason::PrivateAnswer,
                    ..allowed
                },
            },
        ),
        ("alias.example.com", Outcome::ChainDenied { verdict: chain }),
        (
            "bad.example.com",
            Outcome::Denied {
                rcode,
                verdict: denied,
            },
        ),
        (
            "other.test",
            Outcome::Denied {
                rcode,
                verdict: unlisted,
            },
        ),
        ("alias.example.com", Outcome::Busy),
    ];
    for (qname, outcome) in &outcomes {
        sink.record(&AuditEvent::Dns {
            qname,
            qtype: "A",
            rcode: outcome.rcode(),
            answers: &[],
            verdict: &outcome.verdict(),
        });
    }
    let lines = parse_all(&buf.text());
    let got: Vec<(&str, &str, Option<&str>)> = lines
        .iter()
        .map(|l| {
            (
                l["reason"].as_str().unwrap(),
                l["rcode"].as_str().unwrap(),
                l["rule"]["pattern"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("dns_answered", "NOERROR", Some("**.example.com")),
            ("private_answer", "REFUSED", Some("**.example.com")),
            ("denylisted", "REFUSED", None),
            ("denylisted", "REFUSED", Some("bad.example.com")),
            ("not_allowlisted", "REFUSED", None),
            ("upstream_error", "SERVFAIL", None),
        ]
    );
    assert_eq!(lines[0]["rule"]["name"], "alias.example.com");
    assert_eq!(
        lines[5]["detail"],
        "no upstream resolver or too many queries in flight"
    );
}

/// A sink whose current window lasts until `ended` is called.
fn held_sink() -> (AuditSink, Shared) {
    let buf = Shared::default();
    let mut sink = AuditSink::new(Box::new(buf.clone()), "sb1");
    sink.set_policy(Some(policy()));
    // One window however slowly a loaded machine runs the test.
    sink.limiter
        .hold_window(Instant::now() + Duration::from_secs(3600));
    (sink, buf)
}

/// Ends the sink's current window at its next record or tick.
fn end_window(sink: &mut AuditSink) {
    let past = Instant::now().checked_sub(WINDOW).unwrap();
    sink.limiter.hold_window(past);
}

/// Written lines per (kind, reason) and suppressed counts per (kind,
/// reason) from the summaries.
/// Counts per (kind, reason).
type Tally = BTreeMap<(String, String), u64>;

fn tally(lines: &[serde_json::Value]) -> (Tally, Tally) {
    let mut written = BTreeMap::new();
    let mut suppressed = BTreeMap::new();
    for l in lines {
        if l["kind"] == "summary" {
            for s in l["suppressed"].as_array().unwrap() {
                let key = (
                    s["kind"].as_str().unwrap().to_owned(),
                    s["reason"].as_str().unwrap().to_owned(),
                );
                *suppressed.entry(key).or_insert(0) += s["count"].as_u64().unwrap();
            }
        } else {
            let key = (
                l["kind"].as_str().unwrap().to_owned(),
                l["reason"].as_str().unwrap().to_owned(),
            );
            *written.entry(key).or_insert(0) += 1;
        }
    }
    (written, suppressed)
}

/// An `http` record as the proxies write it (through
/// [`AuditSink::write_record`]).
fn http_record(reason: Reason, host: &str) -> AuditRecord<'_> {
    let policy = PolicyRef {
        id: NO_POLICY_ID.into(),
        version: NO_POLICY_ID.into(),
        label: None,
    };
    let mut r = AuditRecord::new(Timestamp::now(), "sb1", Kind::Http, reason, policy);
    r.host = Some(Cow::Borrowed(host));
    r.method = Some(Cow::Borrowed("GET"));
    r.path = Some(Cow::Borrowed("/"));
    r
}

/// One event of each kind and decision the datapath writes, about
/// `name` (`i` varies the flow and ports).
fn flood_event<'a>(
    which: usize,
    name: &'a str,
    wire: &'a WireName,
    answers: &'a [IpAddr],
    i: u64,
) -> AuditEvent<'a> {
    let port = 1000 + u16::try_from(i % 50_000).unwrap();
    let src: SocketAddr = SocketAddr::new("10.0.2.15".parse().unwrap(), port);
    let dst: SocketAddr = "93.184.216.34:443".parse().unwrap();
    let totals = FlowTotals {
        flow: i,
        transport: Transport::Tcp,
        src,
        dst,
        bytes_up: 1,
        bytes_down: 2,
        duration_ms: 3,
    };
    match which {
        0 => AuditEvent::Dns {
            qname: name,
            qtype: "A",
            rcode: ResponseCode::NoError,
            answers,
            verdict: &ANSWERED,
        },
        1 => AuditEvent::Dns {
            qname: name,
            qtype: "A",
            rcode: ResponseCode::Refused,
            answers: &[],
            verdict: &NOT_ALLOWLISTED,
        },
        2 => AuditEvent::InspectedOpen {
            flow: i,
            src,
            dst,
            wire,
            verdict: &ALLOWLISTED,
        },
        3 => AuditEvent::InspectedDeny {
            flow: i,
            src,
            dst,
            verdict: &DENYLISTED,
            wire: Some(wire),
        },
        4 => AuditEvent::FlowClose {
            totals,
            end: FlowEnd::Closed,
        },
        5 => AuditEvent::Reload {
            applied: false,
            trigger: "sighup",
            detail: name,
        },
        _ => AuditEvent::Gateway {
            reason: Reason::FrameError,
            detail: name,
        },
    }
}

const FLOOD_KINDS: usize = 7;

static ANSWERED: Verdict = Verdict::of(Reason::DnsAnswered);
static NOT_ALLOWLISTED: Verdict = Verdict::of(Reason::NotAllowlisted);
static ALLOWLISTED: Verdict = Verdict::of(Reason::Allowlisted);
static DENYLISTED: Verdict = Verdict::of(Reason::Denylisted);

/// A flood of one record, repeated, of each kind (allow and deny): one
/// window writes [`LINES_PER_REASON`] lines of it, and one summary
/// counts every other one exactly.
#[test]
fn a_flood_of_one_record_of_each_kind_is_bounded_and_counted() {
    let answers = ["93.184.216.34".parse().unwrap()];
    let wire = WireName::Sni("www.example.com".into());
    let n: u64 = 1000;
    for which in 0..FLOOD_KINDS {
        let (mut sink, buf) = held_sink();
        for i in 0..n {
            sink.record(&flood_event(which, "www.example.com", &wire, &answers, i));
        }
        sink.flush();
        let lines = parse_all(&buf.text());
        let (written, suppressed) = tally(&lines);
        assert_eq!(written.len(), 1, "{which}: {written:?}");
        let (key, w) = written.iter().next().unwrap();
        assert_eq!(*w, u64::from(LINES_PER_REASON), "{which}: {key:?}");
        assert_eq!(
            suppressed.get(key).copied(),
            Some(n - w),
            "{which}: {suppressed:?}"
        );
        assert_eq!(lines.iter().filter(|l| l["kind"] == "summary").count(), 1);
    }
    // `http` records written by the proxies: the same bound.
    for reason in [Reason::Allowlisted, Reason::HostMismatch] {
        let (mut sink, buf) = held_sink();
        let rec = http_record(reason, "www.example.com");
        for _ in 0..n {
            sink.write_record(&rec);
        }
        sink.flush();
        let (written, suppressed) = tally(&parse_all(&buf.text()));
        let key = ("http".to_owned(), reason.as_str().to_owned());
        assert_eq!(
            written.get(&key).copied(),
            Some(u64::from(LINES_PER_REASON))
        );
        assert_eq!(
            suppressed.get(&key).copied(),
            Some(n - u64::from(LINES_PER_REASON))
        );
    }
}

/// Past the per-reason budget, the first record about each name is
/// still written (up to [`FIRST_SEEN_PER_WINDOW`] of them), repeats are
/// not, and a reason not yet seen in the window is always written.
#[test]
fn the_first_record_of_each_name_and_reason_is_written() {
    let answers = ["93.184.216.34".parse().unwrap()];
    let wire = WireName::Sni("www.example.com".into());
    let (mut sink, buf) = held_sink();
    // 60 names, each asked 10 times, round robin.
    let names: Vec<String> = (0..60).map(|i| format!("n{i}.example.com")).collect();
    for round in 0..10 {
        for name in &names {
            sink.record(&flood_event(0, name, &wire, &answers, round));
        }
    }
    let lines = parse_all(&buf.text());
    for name in &names {
        assert!(
            lines.iter().any(|l| l["qname"] == name.as_str()),
            "{name} never written"
        );
    }
    // 20 by the per-reason budget, then the 40 names not seen yet.
    assert_eq!(lines.len(), 60);

    // Many more distinct names: the first-seen allowance runs out.
    for i in 0..1000 {
        let name = format!("m{i}.example.com");
        sink.record(&flood_event(0, &name, &wire, &answers, i));
    }
    let dns = parse_all(&buf.text()).len();
    assert_eq!(
        dns,
        LINES_PER_REASON as usize + FIRST_SEEN_PER_WINDOW as usize
    );

    // Other reasons and kinds are written however flooded the window.
    sink.record(&flood_event(1, "bad.example.com", &wire, &answers, 0));
    sink.record(&flood_event(4, "", &wire, &answers, 0));
    let lines = parse_all(&buf.text());
    assert_eq!(lines.len(), dns + 2);
    assert_eq!(lines[dns]["reason"], "not_allowlisted");
    assert_eq!(lines[dns + 1]["kind"], "flow_close");
    sink.flush();
    let (written, suppressed) = tally(&parse_all(&buf.text()));
    let key = ("dns".to_owned(), "dns_answered".to_owned());
    assert_eq!(written[&key] + suppressed[&key], 600 + 1000);
}

/// The worst case: a flood of every kind and reason with a new name on
/// every record, over several windows. No window writes more than
/// [`MAX_LINES_PER_WINDOW`] lines or a line longer than its bound,
/// summaries come once per window, and for each (kind, reason) the
/// lines written plus the summaries' counts are exactly what was sent.
#[test]
fn a_flood_of_every_kind_never_exceeds_the_window_bound_and_loses_no_count() {
    let answers = ["93.184.216.34".parse().unwrap()];
    let (mut sink, buf) = held_sink();
    let mut sent: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut per_window = Vec::new();
    for window in 0..3 {
        let before = parse_all(&buf.text()).len();
        for i in 0..6000 {
            let name = format!("w{window}-{i}.example.com");
            let wire = WireName::Sni(name.clone());
            let which = i % (FLOOD_KINDS + 1);
            if which == FLOOD_KINDS {
                // `http` records of every reason: more (kind, reason)
                // pairs than the ceiling leaves budgets for.
                let reason = Reason::ALL[(i / 8) % Reason::ALL.len()];
                let rec = http_record(reason, &name);
                *sent
                    .entry(("http".into(), reason.as_str().into()))
                    .or_insert(0) += 1;
                sink.write_record(&rec);
            } else {
                let ev = flood_event(which, &name, &wire, &answers, u64::try_from(i).unwrap());
                let rec = build("sb1", None, &ev);
                *sent
                    .entry((
                        serde_json::to_value(rec.kind)
                            .unwrap()
                            .as_str()
                            .unwrap()
                            .to_owned(),
                        rec.reason.as_str().to_owned(),
                    ))
                    .or_insert(0) += 1;
                sink.record(&ev);
            }
        }
        let lines = parse_all(&buf.text());
        per_window.push(lines.len() - before);
        // The next record ends this window (and writes its summary).
        end_window(&mut sink);
    }
    sink.flush();
    let text = buf.text();
    for l in text.lines() {
        assert!(l.len() < MAX_LINE_BYTES, "{}", l.len());
    }
    for (w, n) in per_window.iter().enumerate() {
        // This window's lines plus the summary of the previous one.
        assert!(*n <= MAX_LINES_PER_WINDOW, "window {w}: {n} lines");
        // The ceiling was reached (the flood is the worst case).
        assert!(
            *n >= LINES_PER_WINDOW as usize,
            "window {w}: only {n} lines"
        );
    }
    let lines = parse_all(&text);
    assert_eq!(lines.iter().filter(|l| l["kind"] == "summary").count(), 3);
    let (written, suppressed) = tally(&lines);
    for (key, n) in &sent {
        let got =
            written.get(key).copied().unwrap_or(0) + suppressed.get(key).copied().unwrap_or(0);
        assert_eq!(got, *n, "{key:?}");
    }
    assert_eq!(written.keys().filter(|k| !sent.contains_key(*k)).count(), 0);
}

/// A record with kilobytes of guest text is written cut, within
/// [`MAX_LINE_BYTES`], still a valid record; the largest possible
/// summary fits [`MAX_SUMMARY_BYTES`].
#[test]
fn oversized_records_are_clamped_and_summaries_are_bounded() {
    let (mut sink, buf) = held_sink();
    let long = "\u{1}".repeat(100_000);
    let mut rec = http_record(Reason::Allowlisted, &long);
    rec.path = Some(Cow::Borrowed(&long));
    rec.host = Some(Cow::Borrowed(&long));
    rec.sni = Some(Cow::Borrowed(&long));
    rec.method = Some(Cow::Borrowed(&long));
    rec.detail = Some(Cow::Borrowed(&long));
    rec.answers = vec!["1.2.3.4".parse().unwrap(); 1000];
    sink.write_record(&rec);
    let text = buf.text();
    assert!(text.len() <= MAX_LINE_BYTES, "{}", text.len());
    let l = &parse_all(&text)[0];
    assert_eq!(l["path"].as_str().unwrap().chars().count(), CLAMP_CHARS + 3);
    assert_eq!(l["answers"].as_array().unwrap().len(), CLAMP_ENTRIES);

    let mut summary = http_record(Reason::RateLimitSummary, "");
    summary.kind = Kind::Summary;
    summary.host = None;
    summary.method = None;
    summary.path = None;
    for kind in [
        Kind::Dns,
        Kind::Connection,
        Kind::Http,
        Kind::FlowClose,
        Kind::PolicyReload,
        Kind::Gateway,
    ] {
        for &reason in Reason::ALL {
            summary.suppressed.push(Suppressed {
                kind: Some(kind),
                reason,
                count: u64::MAX,
            });
        }
    }
    assert_eq!(summary.suppressed.len(), LIMITED_KINDS * Reason::ALL.len());
    let line = summary.to_json();
    assert!(
        line.len() < MAX_SUMMARY_BYTES,
        "{} > {MAX_SUMMARY_BYTES}",
        line.len()
    );
}

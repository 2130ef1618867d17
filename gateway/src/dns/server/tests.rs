//! Unit tests of the guest side: id mapping, collapse, the cache's TTL
//! countdown, the TCP framing and the sanitising rules.

use super::*;
use crate::decide::{DecideContext, Decision, FlowKey};
use crate::dns::table::DEFAULT_MAX_TTL;
use hickory_proto::op::{Message, OpCode, Query};
use hickory_proto::rr::rdata::{A, AAAA, CNAME};
use hickory_proto::rr::{Name, RData, Record};
use std::str::FromStr;
use std::sync::Mutex;

fn query(name: &str, qtype: RecordType) -> Vec<u8> {
    query_with(0x1234, name, qtype)
}

fn query_with(id: u16, name: &str, qtype: RecordType) -> Vec<u8> {
    let mut m = Message::query();
    m.metadata.id = id;
    m.metadata.recursion_desired = true;
    // from_ascii keeps the letter case (from_str would fold it).
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    m.to_vec().unwrap()
}

/// The old one-call path, for the sanitising tests.
fn sanitize_and_record(
    question: &Question,
    upstream: &[u8],
    table: &mut DnsTable,
    now: Instant,
    keep: impl Fn(IpAddr) -> bool,
    ttl: RangeInclusive<u32>,
) -> Result<Sanitized, DnsReject> {
    let clean = sanitize(question, upstream, keep, ttl)?;
    record(question, &clean, table, now);
    Ok(clean)
}

/// A policy stand-in: denies the names in `deny`, clamps TTLs to `bounds`.
#[derive(Default)]
struct Policy {
    deny: Mutex<Vec<&'static str>>,
    bounds: Option<(Duration, Duration)>,
}

impl Decider for Policy {
    fn decide_tcp(&self, _flow: &FlowKey, _ctx: &DecideContext<'_>) -> Decision {
        Decision::Allow(Verdict::of(Reason::Allowlisted))
    }
    fn decide_udp(&self, _flow: &FlowKey, _ctx: &DecideContext<'_>) -> Decision {
        Decision::Allow(Verdict::of(Reason::Allowlisted))
    }
    fn dns_query(&self, qname: &str) -> DnsDecision {
        if self.deny.lock().unwrap().contains(&qname) {
            DnsDecision::Answer {
                rcode: ResponseCode::Refused,
                verdict: Verdict::of(Reason::NotAllowlisted),
            }
        } else {
            DnsDecision::Forward(Verdict::of(Reason::DnsAnswered))
        }
    }
    fn dns_ttl_bounds(&self) -> Option<(Duration, Duration)> {
        self.bounds
    }
}

const GUEST: Asker = Asker::Udp(SocketAddrV4::new(
    std::net::Ipv4Addr::new(10, 0, 2, 15),
    40000,
));

/// The upstream answer (id 0, as `upstream::resolve` returns it) for
/// `name`: one A record 198.51.100.`last` with `ttl`.
fn upstream_answer(name: &str, last: u8, ttl: u32) -> Vec<u8> {
    let mut m = Message::response(0, OpCode::Query);
    // The case the gateway sent upstream: not the guest's.
    let sent = Name::from_ascii(format!("{}.", name.to_ascii_uppercase())).unwrap();
    m.add_query(Query::query(sent.clone(), RecordType::A));
    m.add_answer(Record::from_rdata(
        sent,
        ttl,
        RData::A(A::new(198, 51, 100, last)),
    ));
    m.to_vec().unwrap()
}

fn ask(s: &mut DnsServer, d: &Policy, to: Asker, id: u16, name: &str, now: Instant) -> Served {
    s.query(&query_with(id, name, RecordType::A), to, d, true, now)
}

fn key(name: &str) -> UpstreamKey {
    UpstreamKey {
        name: name.into(),
        qtype: RecordType::A,
        tcp: false,
    }
}

fn ttls(bytes: &[u8]) -> Vec<u32> {
    Message::from_vec(bytes)
        .unwrap()
        .answers
        .iter()
        .map(|r| r.ttl)
        .collect()
}

#[test]
fn identical_questions_collapse_and_each_guest_gets_its_own_id_and_question() {
    let now = Instant::now();
    let d = Policy::default();
    let mut s = DnsServer::new(64);
    let other = Asker::Tcp(9);
    assert!(matches!(
        ask(&mut s, &d, GUEST, 0x1111, "www.example.com.", now),
        Served::Ask(k) if k == key("www.example.com")
    ));
    // Same name and type, other case, id and asker: waits on the same question.
    assert!(matches!(
        s.query(
            &query_with(0x2222, "WwW.Example.COM.", RecordType::A),
            GUEST,
            &d,
            true,
            now
        ),
        Served::Joined
    ));
    assert!(matches!(
        ask(&mut s, &d, other, 0x3333, "www.example.com.", now),
        Served::Ask(k) if k.tcp
    ));
    assert!(matches!(
        ask(&mut s, &d, GUEST, 0x4444, "b.example.", now),
        Served::Ask(_)
    ));
    assert_eq!(s.in_flight(), 3);

    let reply = UpstreamReply {
        key: key("www.example.com"),
        message: Some(upstream_answer("www.example.com", 9, 60)),
        dropped: 0,
    };
    let out = s.answered(reply, &d, now);
    assert_eq!(out.len(), 2);
    for (delivery, (id, name)) in out
        .iter()
        .zip([(0x1111, "www.example.com."), (0x2222, "WwW.Example.COM.")])
    {
        assert_eq!(delivery.to, GUEST);
        let m = Message::from_vec(delivery.bytes.as_ref().unwrap()).unwrap();
        assert_eq!(m.metadata.id, id);
        assert_eq!(
            m.queries[0].name.to_ascii(),
            name,
            "the guest's own question, case and all"
        );
        assert!(
            matches!(&delivery.outcome, Outcome::Answered { addresses, cached: false, .. } if addresses.len() == 1)
        );
    }
    assert_eq!(s.in_flight(), 2);
    let ip: IpAddr = "198.51.100.9".parse().unwrap();
    assert!(s.table().resolved_for(ip, "www.example.com", now));
    // A late duplicate reply finds nobody waiting.
    let again = UpstreamReply {
        key: key("www.example.com"),
        message: Some(upstream_answer("www.example.com", 66, 60)),
        dropped: 0,
    };
    assert!(s.answered(again, &d, now).is_empty());
    assert_eq!(
        s.table()
            .names_for("198.51.100.66".parse().unwrap(), now)
            .count(),
        0
    );
}

#[test]
fn waiters_and_questions_in_flight_are_bounded() {
    let now = Instant::now();
    let d = Policy::default();
    let mut s = DnsServer::new(64);
    for i in 0..MAX_WAITERS_PER_QUESTION {
        let id = u16::try_from(i).unwrap();
        assert!(!matches!(
            ask(&mut s, &d, GUEST, id, "a.example.", now),
            Served::Now(_)
        ));
    }
    assert!(matches!(
        ask(&mut s, &d, GUEST, 9999, "a.example.", now),
        Served::Now(Delivery {
            outcome: Outcome::Busy,
            ..
        })
    ));
    for i in 1..MAX_IN_FLIGHT {
        assert!(matches!(
            ask(&mut s, &d, GUEST, 1, &format!("n{i}.example."), now),
            Served::Ask(_)
        ));
    }
    assert!(matches!(
        ask(&mut s, &d, GUEST, 1, "one-more.example.", now),
        Served::Now(Delivery {
            outcome: Outcome::Busy,
            ..
        })
    ));
    // No resolver: SERVFAIL locally.
    let mut s = DnsServer::new(64);
    assert!(matches!(
        s.query(&query("a.example.", RecordType::A), GUEST, &d, false, now),
        Served::Now(Delivery {
            outcome: Outcome::Busy,
            ..
        })
    ));
}

#[test]
fn no_answer_fails_every_waiter() {
    let now = Instant::now();
    let d = Policy::default();
    let mut s = DnsServer::new(64);
    ask(&mut s, &d, GUEST, 1, "a.example.", now);
    ask(&mut s, &d, GUEST, 2, "a.example.", now);
    let out = s.answered(
        UpstreamReply {
            key: key("a.example"),
            message: None,
            dropped: 3,
        },
        &d,
        now,
    );
    assert_eq!(out.len(), 2);
    for delivery in out {
        assert_eq!(delivery.outcome, Outcome::Failed);
        let m = Message::from_vec(&delivery.bytes.unwrap()).unwrap();
        assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
    }
    assert!(s.table().is_empty());
}

#[test]
fn a_repeat_within_the_ttl_is_answered_from_the_cache_counting_down() {
    let now = Instant::now();
    let secs = Duration::from_secs;
    let d = Policy {
        bounds: Some((secs(5), secs(100))),
        ..Policy::default()
    };
    let mut s = DnsServer::new(64);
    ask(&mut s, &d, GUEST, 1, "www.example.com.", now);
    // Upstream said 300 s: clamped to 100.
    let out = s.answered(
        UpstreamReply {
            key: key("www.example.com"),
            message: Some(upstream_answer("www.example.com", 9, 300)),
            dropped: 0,
        },
        &d,
        now,
    );
    assert_eq!(ttls(out[0].bytes.as_ref().unwrap()), [100]);
    // 40 s later: from the cache, 60 s left, the guest's id, table refreshed.
    let later = now + secs(40);
    let Served::Now(hit) = ask(&mut s, &d, GUEST, 0xbeef, "WWW.example.com.", later) else {
        panic!("not answered from the cache");
    };
    assert!(matches!(
        &hit.outcome,
        Outcome::Answered { cached: true, .. }
    ));
    let m = Message::from_vec(hit.bytes.as_ref().unwrap()).unwrap();
    assert_eq!(m.metadata.id, 0xbeef);
    assert_eq!(m.queries[0].name.to_ascii(), "WWW.example.com.");
    assert_eq!(ttls(hit.bytes.as_ref().unwrap()), [60]);
    let ip: IpAddr = "198.51.100.9".parse().unwrap();
    assert!(
        s.table()
            .resolved_for(ip, "www.example.com", later + secs(59))
    );
    // 99 s: 1 s left; at 100 s it has expired and the question goes upstream.
    let Served::Now(hit) = ask(&mut s, &d, GUEST, 2, "www.example.com.", now + secs(99)) else {
        panic!("not answered from the cache");
    };
    assert_eq!(ttls(hit.bytes.as_ref().unwrap()), [1]);
    assert!(matches!(
        ask(&mut s, &d, GUEST, 3, "www.example.com.", now + secs(100)),
        Served::Ask(_)
    ));
}

#[test]
fn the_cache_never_answers_what_the_policy_now_denies() {
    let now = Instant::now();
    let d = Policy::default();
    let mut s = DnsServer::new(64);
    ask(&mut s, &d, GUEST, 1, "gone.example.", now);
    s.answered(
        UpstreamReply {
            key: key("gone.example"),
            message: Some(upstream_answer("gone.example", 7, 300)),
            dropped: 0,
        },
        &d,
        now,
    );
    assert!(matches!(
        ask(&mut s, &d, GUEST, 2, "gone.example.", now),
        Served::Now(Delivery {
            outcome: Outcome::Answered { cached: true, .. },
            ..
        })
    ));
    // The policy now denies the name: the deny is answered, not the cache.
    d.deny.lock().unwrap().push("gone.example");
    assert!(matches!(
        ask(&mut s, &d, GUEST, 3, "gone.example.", now),
        Served::Now(Delivery {
            outcome: Outcome::Denied { .. },
            ..
        })
    ));
    // A reload clears the cache: allowed again, the name is asked afresh.
    d.deny.lock().unwrap().clear();
    s.clear_cache();
    assert!(matches!(
        ask(&mut s, &d, GUEST, 4, "gone.example.", now),
        Served::Ask(_)
    ));
    // An answer arriving after the name was denied is refused, not recorded.
    d.deny.lock().unwrap().push("gone.example");
    s.table_mut().retain_names(|_| false);
    let out = s.answered(
        UpstreamReply {
            key: key("gone.example"),
            message: Some(upstream_answer("gone.example", 7, 300)),
            dropped: 0,
        },
        &d,
        now,
    );
    assert!(matches!(out[0].outcome, Outcome::Denied { .. }));
    assert!(s.table().is_empty());
}

#[test]
fn local_answers_are_typed() {
    let now = Instant::now();
    let d = Policy::default();
    d.deny.lock().unwrap().push("bad.example");
    let mut s = DnsServer::new(64);
    let outcome = |served: Served| match served {
        Served::Now(delivery) => delivery.outcome,
        other => panic!("not answered locally: {other:?}"),
    };
    assert_eq!(
        outcome(s.query(&query("bad.example.", RecordType::A), GUEST, &d, true, now)),
        Outcome::Denied {
            rcode: ResponseCode::Refused,
            verdict: Verdict::of(Reason::NotAllowlisted)
        }
    );
    assert_eq!(
        outcome(s.query(
            &query("ok.example.", RecordType::AAAA),
            GUEST,
            &d,
            true,
            now
        )),
        Outcome::TypeWithheld
    );
    assert_eq!(
        outcome(s.query(b"\x00\x01\x00", GUEST, &d, true, now)),
        Outcome::Unreadable(ResponseCode::FormErr)
    );
}

#[test]
fn tcp_messages_are_taken_whole_from_the_front() {
    let mut buf = vec![0, 3, b'a', b'b'];
    assert_eq!(tcp_message(&mut buf), None);
    buf.extend_from_slice(&[b'c', 0, 1, b'x', 0]);
    assert_eq!(tcp_message(&mut buf).as_deref(), Some(&b"abc"[..]));
    assert_eq!(tcp_message(&mut buf).as_deref(), Some(&b"x"[..]));
    assert_eq!(tcp_message(&mut buf), None);
    assert_eq!(buf, [0]);
    let mut empty = vec![0, 0];
    assert_eq!(tcp_message(&mut empty).as_deref(), Some(&b""[..]));
    assert!(empty.is_empty());
    // Split at every point, the same messages come out.
    let stream = [0u8, 2, 1, 2, 0, 1, 9, 0, 0];
    for cut in 0..=stream.len() {
        let mut buf = Vec::new();
        let mut got = Vec::new();
        for part in [&stream[..cut], &stream[cut..]] {
            buf.extend_from_slice(part);
            while let Some(m) = tcp_message(&mut buf) {
                got.push(m);
            }
        }
        assert_eq!(got, [vec![1, 2], vec![9], vec![]], "cut at {cut}");
    }
}

fn question(q: &[u8]) -> Question {
    sluice_inspect::dns::parse_query(q).unwrap()
}

/// An upstream answer to `q`: www -> CNAME cdn -> A 198.51.100.9 and an
/// AAAA, plus an unrelated A record for another owner.
fn cname_answer(q: &[u8]) -> Vec<u8> {
    let qmsg = Message::from_vec(q).unwrap();
    let mut resp = Message::response(qmsg.metadata.id, OpCode::Query);
    resp.add_queries(qmsg.queries.clone());
    let www = Name::from_str("WWW.example.com.").unwrap();
    let cdn = Name::from_str("cdn.example.net.").unwrap();
    resp.add_answer(Record::from_rdata(
        www,
        300,
        RData::CNAME(CNAME(cdn.clone())),
    ));
    resp.add_answer(Record::from_rdata(
        cdn.clone(),
        60,
        RData::A(A::new(198, 51, 100, 9)),
    ));
    resp.add_answer(Record::from_rdata(
        cdn,
        60,
        RData::AAAA(AAAA::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1)),
    ));
    resp.add_answer(Record::from_rdata(
        Name::from_str("elsewhere.example.").unwrap(),
        60,
        RData::A(A::new(198, 51, 100, 66)),
    ));
    resp.to_vec().unwrap()
}

#[test]
fn sanitised_answer_records_the_chain_end_under_question_and_owner() {
    let q = query("www.EXAMPLE.com.", RecordType::A);
    let question = question(&q);
    assert_eq!(question.name, "www.example.com");
    let bytes = cname_answer(&q);
    let now = Instant::now();
    let mut t = DnsTable::new(16);
    let out = sanitize_and_record(&question, &bytes, &mut t, now, |_| true, 0..=u32::MAX).unwrap();
    let ip: IpAddr = "198.51.100.9".parse().unwrap();
    assert_eq!(out.answers.len(), 1);
    assert_eq!(out.answers[0].1, ip);
    assert!(t.resolved_for(ip, "www.example.com", now));
    assert!(t.resolved_for(ip, "cdn.example.net", now));
    // The record off the chain is neither answered nor recorded.
    let stray: IpAddr = "198.51.100.66".parse().unwrap();
    assert_eq!(t.names_for(stray, now).count(), 0);
    let back = Message::from_vec(&out.bytes).unwrap();
    assert_eq!(back.answers.len(), 2, "CNAME + A only: {back:?}");
    assert!(
        back.answers
            .iter()
            .all(|r| matches!(r.record_type(), RecordType::A | RecordType::CNAME))
    );

    // TTLs are clamped into the bounds, in the bytes and in the table.
    let mut t = DnsTable::new(16);
    t.set_ttl_bounds(Duration::ZERO, DEFAULT_MAX_TTL);
    let out = sanitize_and_record(&question, &bytes, &mut t, now, |_| true, 10..=30).unwrap();
    let back = Message::from_vec(&out.bytes).unwrap();
    assert!(back.answers.iter().all(|r| (10..=30).contains(&r.ttl)));
    assert!(t.resolved_for(ip, "www.example.com", now + Duration::from_secs(29)));
    assert!(!t.resolved_for(ip, "www.example.com", now + Duration::from_secs(31)));

    // Every address refused: nothing recorded, private_answer set.
    let mut t = DnsTable::new(16);
    let out =
        sanitize_and_record(&question, &bytes, &mut t, now, |a| a != ip, 0..=u32::MAX).unwrap();
    assert!(out.private_answer());
    assert!(out.answers.is_empty());
    assert!(t.is_empty());
}

#[test]
fn only_a_questions_are_forwarded() {
    assert!(forwarded_type(RecordType::A));
    for t in [
        RecordType::AAAA,
        RecordType::HTTPS,
        RecordType::SVCB,
        RecordType::TXT,
        RecordType::MX,
        RecordType::CNAME,
        RecordType::ANY,
    ] {
        assert!(!forwarded_type(t), "{t}");
    }
}

#[test]
fn mismatched_or_garbage_responses_are_errors() {
    let question = question(&query("a.example.", RecordType::A));
    let mut t = DnsTable::new(4);
    let now = Instant::now();
    assert_eq!(
        sanitize_and_record(&question, b"\x00\x01garbage", &mut t, now, |_| true, 0..=9),
        Err(DnsReject::Malformed)
    );
    let other = Message::response(0x9999, OpCode::Query).to_vec().unwrap();
    assert_eq!(
        sanitize_and_record(&question, &other, &mut t, now, |_| true, 0..=9),
        Err(DnsReject::Mismatch)
    );
    // An answer to another question with the right id.
    let q2 = query("b.example.", RecordType::A);
    let wrong = cname_answer(&q2);
    assert_eq!(
        sanitize_and_record(&question, &wrong, &mut t, now, |_| true, 0..=9),
        Err(DnsReject::Mismatch)
    );
    assert!(t.is_empty());
}

#[test]
fn a_full_cache_makes_room_for_the_newest_answer() {
    let now = Instant::now();
    let secs = Duration::from_secs;
    let d = Policy {
        bounds: Some((secs(5), secs(100_000))),
        ..Policy::default()
    };
    let mut s = DnsServer::new(4 * MAX_CACHED_ANSWERS);
    let name = |i: usize| format!("n{i}.example.com");
    // One more answer than the cache holds, none expired; the first name's
    // answer expires first.
    for i in 0..=MAX_CACHED_ANSWERS {
        let n = name(i);
        assert!(matches!(
            ask(&mut s, &d, GUEST, 1, &format!("{n}."), now),
            Served::Ask(_)
        ));
        let ttl = 1_000 + u32::try_from(i).unwrap();
        let out = s.answered(
            UpstreamReply {
                key: key(&n),
                message: Some(upstream_answer(&n, 7, ttl)),
                dropped: 0,
            },
            &d,
            now,
        );
        assert_eq!(out.len(), 1);
    }
    let newest = format!("{}.", name(MAX_CACHED_ANSWERS));
    assert!(
        matches!(ask(&mut s, &d, GUEST, 2, &newest, now), Served::Now(_)),
        "the newest answer was not cached"
    );
    assert!(
        matches!(
            ask(&mut s, &d, GUEST, 3, "n1.example.com.", now),
            Served::Now(_)
        ),
        "an answer that does not expire first was dropped"
    );
    assert!(
        matches!(
            ask(&mut s, &d, GUEST, 4, "n0.example.com.", now),
            Served::Ask(_)
        ),
        "the answer that expires first was kept"
    );
}

/// Runtime approval (`unlisted: ask`): a real compiled policy and its
/// decider; the backend is never called here (the broker hands out the
/// question, the test plays the answer).
mod approval {
    use super::*;
    use crate::config::ApprovalSetup;
    use crate::decide::{Approvals, PlatformDenySet, PolicyDecider};
    use sluice_approval::{Answer, BackendError, Choice};
    use std::sync::Arc;

    const ASK: &str = "version: 1\nid: t\nunlisted: ask\napproval:\n  backend:\n    unix: /nonexistent/ask.sock\n  max_pending: 2\nallow:\n  - domain: listed.example.com\ndeny:\n  - blocked.example.org\ninternal:\n  - 198.51.100.0/24\n";

    fn decider() -> PolicyDecider {
        let p = sluice_policy::from_yaml_str(ASK, "t.yaml", &Default::default()).unwrap();
        PolicyDecider::new(
            Arc::new(p),
            PlatformDenySet::new(
                [],
                std::net::Ipv4Addr::new(10, 0, 2, 2),
                std::net::Ipv4Addr::new(10, 0, 2, 255),
            ),
        )
    }

    fn server() -> DnsServer {
        DnsServer::with_approvals(64, Approvals::new("sb", ApprovalSetup::default()))
    }

    fn q(s: &mut DnsServer, d: &PolicyDecider, id: u16, name: &str, now: Instant) -> Served {
        s.query(&query_with(id, name, RecordType::A), GUEST, d, true, now)
    }

    fn refused_for(served: &Served) -> Option<Reason> {
        match served {
            Served::Now(Delivery {
                outcome: Outcome::Denied { rcode, verdict },
                ..
            }) if *rcode == ResponseCode::Refused => Some(verdict.reason),
            _ => None,
        }
    }

    #[test]
    fn an_unlisted_name_is_held_asked_once_and_forwarded_on_allow() {
        let now = Instant::now();
        let d = decider();
        let mut s = server();
        let Served::Approve(_) = q(&mut s, &d, 1, "new.example.org", now) else {
            panic!("not asked");
        };
        // An identical query (and another type) waits on the same question.
        assert!(matches!(
            q(&mut s, &d, 2, "new.example.org", now),
            Served::Joined
        ));
        assert!(matches!(
            s.query(
                &query_with(3, "new.example.org", RecordType::AAAA),
                GUEST,
                &d,
                true,
                now
            ),
            Served::Joined
        ));
        let g = s
            .approval_answered(
                "new.example.org",
                "unix",
                Ok(Answer::of(Choice::AllowOnce)),
                now,
            )
            .unwrap();
        assert!(g.choice.allows());
        let served = s.approval_decided("new.example.org", true, &d, true, now);
        assert_eq!(served.len(), 3);
        // The A queries go upstream once (collapsed); AAAA is withheld as
        // for any listed name.
        assert!(matches!(&served[0], Served::Ask(k) if *k == key("new.example.org")));
        assert!(matches!(&served[1], Served::Joined));
        assert!(matches!(
            &served[2],
            Served::Now(Delivery {
                outcome: Outcome::TypeWithheld,
                ..
            })
        ));
        let out = s.answered(
            UpstreamReply {
                key: key("new.example.org"),
                message: Some(upstream_answer("new.example.org", 7, 60)),
                dropped: 0,
            },
            &d,
            now,
        );
        assert_eq!(out.len(), 2);
        for del in &out {
            assert!(
                matches!(&del.outcome, Outcome::Answered { addresses, .. } if addresses.len() == 1),
                "{del:?}"
            );
        }
        // The approval now opens the name to the flow decider, on 443.
        let ip: IpAddr = "198.51.100.7".parse().unwrap();
        assert!(s.table().resolved_for(ip, "new.example.org", now));
        let ctx = DecideContext {
            dns: s.table(),
            approved: Some(s.approvals()),
            now,
        };
        let flow = |port| FlowKey {
            transport: crate::decide::Transport::Tcp,
            src: "10.0.2.15:40000".parse().unwrap(),
            dst: std::net::SocketAddr::new(ip, port),
        };
        assert!(matches!(
            d.decide_tcp(&flow(443), &ctx),
            Decision::Inspect { .. }
        ));
        assert!(matches!(d.decide_tcp(&flow(80), &ctx), Decision::Deny(_)));
        // A repeat within the answer's TTL is answered without asking.
        assert!(matches!(
            q(
                &mut s,
                &d,
                4,
                "new.example.org",
                now + Duration::from_secs(1)
            ),
            Served::Now(Delivery {
                outcome: Outcome::Answered { cached: true, .. },
                ..
            })
        ));
        // Once the answer's TTL (60 s) has ended, the allow once has too.
        let later = now + Duration::from_secs(61);
        assert!(!s.approvals().allows("new.example.org", later));
        assert!(matches!(
            q(&mut s, &d, 5, "new.example.org", later),
            Served::Approve(_)
        ));
    }

    #[test]
    fn deny_timeout_and_failure_refuse_and_never_forward() {
        let now = Instant::now();
        let d = decider();
        let mut s = server();
        for (name, result) in [
            ("no.example.org", Ok(Answer::of(Choice::DenySandbox))),
            ("late.example.org", Err(BackendError::Timeout)),
            ("down.example.org", Err(BackendError::Closed)),
        ] {
            assert!(matches!(q(&mut s, &d, 1, name, now), Served::Approve(_)));
            let g = s.approval_answered(name, "unix", result, now).unwrap();
            assert!(!g.choice.allows());
            let served = s.approval_decided(name, false, &d, true, now);
            assert_eq!(served.len(), 1);
            assert_eq!(
                refused_for(&served[0]),
                Some(Reason::ApprovalDenied),
                "{name}"
            );
            // Decided: the retry is refused without asking again.
            assert_eq!(
                refused_for(&q(&mut s, &d, 2, name, now)),
                Some(Reason::ApprovalDenied)
            );
        }
        assert_eq!(s.in_flight(), 0);
    }

    #[test]
    fn what_must_never_ask_is_refused_at_once_and_overflow_is_limited() {
        let now = Instant::now();
        let d = decider();
        let mut s = server();
        // A `deny:` name, a single label and a public suffix never ask.
        for (name, reason) in [
            ("blocked.example.org", Reason::Denylisted),
            ("localhost", Reason::NotAllowlisted),
            ("co.uk", Reason::NotAllowlisted),
        ] {
            assert_eq!(refused_for(&q(&mut s, &d, 1, name, now)), Some(reason));
        }
        // max_pending 2: the third name is refused without asking.
        assert!(matches!(
            q(&mut s, &d, 1, "a.example.org", now),
            Served::Approve(_)
        ));
        assert!(matches!(
            q(&mut s, &d, 1, "b.example.org", now),
            Served::Approve(_)
        ));
        assert_eq!(
            refused_for(&q(&mut s, &d, 1, "c.example.org", now)),
            Some(Reason::ApprovalLimited)
        );
    }

    #[test]
    fn an_approved_name_whose_answer_is_private_is_still_refused() {
        let now = Instant::now();
        let d = decider();
        let mut s = server();
        assert!(matches!(
            q(&mut s, &d, 1, "inner.example.org", now),
            Served::Approve(_)
        ));
        s.approval_answered(
            "inner.example.org",
            "unix",
            Ok(Answer::of(Choice::AllowSandbox)),
            now,
        );
        let served = s.approval_decided("inner.example.org", true, &d, true, now);
        assert!(matches!(&served[0], Served::Ask(_)));
        let mut m = Message::response(0, OpCode::Query);
        let n = Name::from_ascii("inner.example.org.").unwrap();
        m.add_query(Query::query(n.clone(), RecordType::A));
        m.add_answer(Record::from_rdata(n, 60, RData::A(A::new(10, 1, 2, 3))));
        let out = s.answered(
            UpstreamReply {
                key: key("inner.example.org"),
                message: Some(m.to_vec().unwrap()),
                dropped: 0,
            },
            &d,
            now,
        );
        assert!(matches!(out[0].outcome, Outcome::PrivateAnswer { .. }));
        let ip: IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(s.table().names_for(ip, now).count(), 0);
    }
}

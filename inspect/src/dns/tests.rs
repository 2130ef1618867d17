//! DNS tests: queries captured from dig 9.18 and answers captured from
//! dnsmasq 2.89 on loopback (see `testdata/dns/README.md`), plus messages
//! built with hickory for the cases a real server does not produce.

use std::net::{Ipv4Addr, Ipv6Addr};

use hickory_proto::rr::rdata::{A, AAAA, CNAME, NS};

use super::*;

macro_rules! vector {
    ($name:literal) => {
        include_bytes!(concat!("../../testdata/dns/", $name, ".bin")).as_slice()
    };
}

const DIG_A: &[u8] = vector!("dig-a");
const DIG_AAAA: &[u8] = vector!("dig-aaaa");
const DIG_CNAME: &[u8] = vector!("dig-cname");
const DIG_PRIVATE: &[u8] = vector!("dig-private");
const DIG_HTTPS: &[u8] = vector!("dig-https");
const DIG_NOEDNS: &[u8] = vector!("dig-noedns");
const DIG_TXT: &[u8] = vector!("dig-txt");
const DIG_SVC: &[u8] = vector!("dig-svc-https");
const DNSMASQ_A: &[u8] = vector!("dnsmasq-a");
const DNSMASQ_AAAA: &[u8] = vector!("dnsmasq-aaaa");
const DNSMASQ_CNAME: &[u8] = vector!("dnsmasq-cname");
const DNSMASQ_PRIVATE: &[u8] = vector!("dnsmasq-private");
const DNSMASQ_HTTPS: &[u8] = vector!("dnsmasq-https");
const DNSMASQ_NOEDNS: &[u8] = vector!("dnsmasq-noedns");
const DNSMASQ_TXT: &[u8] = vector!("dnsmasq-txt");
const DNSMASQ_SVC: &[u8] = vector!("dnsmasq-svc-https");

fn keep_public(_: &str, ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => !(v4.is_private() || v4.is_loopback() || v4.is_link_local()),
        IpAddr::V6(v6) => !v6.is_loopback(),
    }
}

fn keep_all(_: &str, _: IpAddr) -> bool {
    true
}

fn decode(bytes: &[u8]) -> Message {
    Message::from_vec(bytes).unwrap()
}

fn name(s: &str) -> Name {
    Name::from_ascii(s).unwrap()
}

// ---- queries ----

#[test]
fn real_queries_parse() {
    let cases = [
        (DIG_A, "www.example.com", RecordType::A),
        (DIG_AAAA, "www.example.com", RecordType::AAAA),
        (DIG_CNAME, "alias.example.com", RecordType::A),
        (DIG_PRIVATE, "private.example.com", RecordType::A),
        (DIG_HTTPS, "www.example.com", RecordType::HTTPS),
        (DIG_TXT, "www.example.com", RecordType::TXT),
        (DIG_SVC, "svc.example.com", RecordType::HTTPS),
    ];
    for (bytes, qname, qtype) in cases {
        let query = parse_query(bytes).unwrap();
        assert_eq!(query.name, qname);
        assert_eq!(query.qtype, qtype);
        assert_eq!(query.qclass, DNSClass::IN);
        assert!(query.rd);
        assert_eq!(query.id, u16::from_be_bytes([bytes[0], bytes[1]]));
        let edns = query.edns.unwrap();
        assert!(edns.max_payload >= 512);
        assert_eq!(query.max_udp_payload(), usize::from(edns.max_payload));
    }
}

#[test]
fn query_name_is_normalised_and_echoed_as_sent() {
    let query = parse_query(DIG_NOEDNS).unwrap();
    assert_eq!(query.name, "www.example.com");
    assert_eq!(query.edns, None);
    assert_eq!(query.max_udp_payload(), 512);
    let answer = decode(&refused_response(&query).unwrap());
    assert_eq!(answer.metadata.id, query.id);
    assert_eq!(answer.metadata.response_code, ResponseCode::Refused);
    assert_eq!(answer.metadata.message_type, MessageType::Response);
    assert!(answer.edns.is_none());
    // The question keeps the guest's letter case (0x20 randomisation).
    assert_eq!(answer.queries[0].name.to_ascii(), "WWW.Example.COM.");
}

#[test]
fn local_answers_echo_id_question_and_edns() {
    let query = parse_query(DIG_A).unwrap();
    for (bytes, rcode) in [
        (nxdomain_response(&query), ResponseCode::NXDomain),
        (refused_response(&query), ResponseCode::Refused),
        (
            error_response(&query, ResponseCode::ServFail),
            ResponseCode::ServFail,
        ),
    ] {
        let answer = decode(&bytes.unwrap());
        assert_eq!(answer.metadata.id, query.id);
        assert_eq!(answer.metadata.response_code, rcode);
        assert!(answer.metadata.recursion_desired);
        assert_eq!(answer.queries, vec![query.question.clone()]);
        assert!(answer.answers.is_empty());
        assert_eq!(answer.edns.map(|e| e.max_payload()), Some(EDNS_PAYLOAD));
    }
    let tc = decode(&truncated(&query).unwrap());
    assert!(tc.metadata.truncation);
    assert_eq!(tc.metadata.response_code, ResponseCode::NoError);
}

/// A query header with `qdcount` questions followed by `rest`.
fn raw_query(flags: u16, qdcount: u16, rest: &[u8]) -> Vec<u8> {
    let mut out = vec![0xbe, 0xef];
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&qdcount.to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    out.extend_from_slice(rest);
    out
}

#[test]
fn odd_queries_are_refused_with_formerr() {
    let a_in = [0, 1, 0, 1];
    let question = |labels: &[&[u8]]| {
        let mut q = Vec::new();
        for label in labels {
            q.push(u8::try_from(label.len()).unwrap());
            q.extend_from_slice(label);
        }
        q.push(0);
        q.extend_from_slice(&a_in);
        q
    };
    let cases: Vec<(Vec<u8>, DnsReject)> = vec![
        (vec![], DnsReject::Malformed),
        (vec![0xbe, 0xef, 1, 0, 0], DnsReject::Malformed),
        (raw_query(0x0100, 0, &[]), DnsReject::QuestionCount(0)),
        (
            raw_query(
                0x0100,
                2,
                &[question(&[b"a", b"example"]), question(&[b"b"])].concat(),
            ),
            DnsReject::QuestionCount(2),
        ),
        // Non-ASCII label.
        (
            raw_query(0x0100, 1, &question(&[b"b\xfccher", b"example"])),
            DnsReject::BadName(NameError::InvalidChar),
        ),
        (
            raw_query(0x0100, 1, &question(&[b"a b", b"example"])),
            DnsReject::BadName(NameError::InvalidChar),
        ),
        // A label holding a dot: another name than `x` then `origin`.
        (
            raw_query(0x0100, 1, &question(&[b"x.Origin", b"test"])),
            DnsReject::BadName(NameError::InvalidChar),
        ),
        // The root name.
        (
            raw_query(0x0100, 1, &question(&[])),
            DnsReject::BadName(NameError::Empty),
        ),
        // A compression pointer to itself (offset 12): a loop.
        (
            raw_query(0x0100, 1, &[0xc0, 0x0c, 0, 1, 0, 1]),
            DnsReject::Malformed,
        ),
        // A pointer forward, past the end.
        (
            raw_query(0x0100, 1, &[0xc0, 0x40, 0, 1, 0, 1]),
            DnsReject::Malformed,
        ),
        // A label length of 64 (reserved bits 01).
        (
            raw_query(
                0x0100,
                1,
                &[&[64u8][..], &[b'a'; 64], &[0, 0, 1, 0, 1]].concat(),
            ),
            DnsReject::Malformed,
        ),
        // Truncated question.
        (raw_query(0x0100, 1, &[3, b'w', b'w']), DnsReject::Malformed),
        // A response, and opcode STATUS.
        (
            raw_query(0x8100, 1, &question(&[b"a"])),
            DnsReject::NotQuery,
        ),
        (
            raw_query(0x1100, 1, &question(&[b"a"])),
            DnsReject::NotQuery,
        ),
    ];
    for (bytes, expected) in cases {
        let got = parse_query(&bytes).unwrap_err();
        assert_eq!(got, expected, "{bytes:?}");
        match reject_response(&bytes, &got) {
            None => assert!(bytes.len() < 12 || bytes[2] & 0x80 != 0, "{bytes:?}"),
            Some(answer) => {
                let answer = decode(&answer);
                assert_eq!(answer.metadata.id, 0xbeef);
                assert_eq!(answer.metadata.response_code, got.rcode());
            }
        }
    }
}

#[test]
fn overlong_name_is_refused() {
    // 5 labels of 63 = 319 octets: over the 255-octet wire limit.
    let mut q = Vec::new();
    for _ in 0..5 {
        q.push(63);
        q.extend_from_slice(&[b'a'; 63]);
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    let bytes = raw_query(0x0100, 1, &q);
    assert_eq!(parse_query(&bytes).unwrap_err(), DnsReject::Malformed);
    let answer = decode(&formerr_response(&bytes).unwrap());
    assert_eq!(answer.metadata.response_code, ResponseCode::FormErr);
    assert!(answer.metadata.recursion_desired);
}

#[test]
fn other_classes_are_refused_with_the_question() {
    let bytes = raw_query(0x0100, 1, &[1, b'a', 0, 0, 1, 0, 3]);
    let reject = parse_query(&bytes).unwrap_err();
    assert_eq!(reject, DnsReject::NotInternet);
    let answer = decode(&reject_response(&bytes, &reject).unwrap());
    assert_eq!(answer.metadata.response_code, ResponseCode::Refused);
    assert_eq!(answer.queries.len(), 1);
}

#[test]
fn formerr_is_not_sent_for_responses_or_short_input() {
    assert_eq!(formerr_response(&[0xbe]), None);
    assert_eq!(formerr_response(&[0xbe, 0xef, 0x01]), None);
    assert_eq!(formerr_response(DNSMASQ_A), None);
    assert!(formerr_response(&raw_query(0x0100, 9, &[0xff])).is_some());
}

// ---- responses ----

fn sanitize(query: &[u8], answer: &[u8], ipv6: bool) -> Sanitized {
    let query = parse_query(query).unwrap();
    sanitize_response(&query, answer, keep_public, ipv6).unwrap()
}

fn assert_clean(s: &Sanitized, query: &[u8]) {
    let m = decode(&s.bytes);
    let q = parse_query(query).unwrap();
    assert_eq!(m.metadata.id, q.id);
    assert_eq!(m.queries, vec![q.question.clone()]);
    assert!(m.authorities.is_empty());
    assert!(m.additionals.is_empty());
    assert_eq!(m.answers.len(), s.answers.len() + s.cname_chain.len());
}

#[test]
fn real_a_answer_is_kept() {
    let s = sanitize(DIG_A, DNSMASQ_A, true);
    assert_eq!(s.rcode, ResponseCode::NoError);
    assert_eq!(s.answers.len(), 1);
    assert_eq!(s.answers[0].0, "www.example.com");
    assert_eq!(s.answers[0].1, IpAddr::V4(Ipv4Addr::new(93, 184, 216, 34)));
    assert!(s.cname_chain.is_empty());
    assert!(!s.private_answer());
    assert_clean(&s, DIG_A);
    let s = sanitize(DIG_NOEDNS, DNSMASQ_NOEDNS, true);
    assert_eq!(s.answers.len(), 1);
    assert!(decode(&s.bytes).edns.is_none());
}

#[test]
fn real_aaaa_answer_follows_the_ipv6_switch() {
    let s = sanitize(DIG_AAAA, DNSMASQ_AAAA, true);
    assert_eq!(
        s.answers[0].1,
        IpAddr::V6("2001:db8::34".parse::<Ipv6Addr>().unwrap())
    );
    assert_clean(&s, DIG_AAAA);
    let off = sanitize(DIG_AAAA, DNSMASQ_AAAA, false);
    assert!(off.answers.is_empty());
    assert_eq!(off.rcode, ResponseCode::NoError);
    assert_eq!(off.dropped_private, 0);
    assert!(decode(&off.bytes).answers.is_empty());
}

#[test]
fn real_cname_chain_is_followed() {
    let s = sanitize(DIG_CNAME, DNSMASQ_CNAME, true);
    assert_eq!(s.cname_chain, vec!["www.example.com".to_owned()]);
    assert_eq!(s.answers.len(), 1);
    assert_eq!(s.answers[0].0, "www.example.com");
    assert_clean(&s, DIG_CNAME);
    let m = decode(&s.bytes);
    assert_eq!(m.answers[0].record_type(), RecordType::CNAME);
    assert_eq!(m.answers[1].record_type(), RecordType::A);
}

#[test]
fn real_private_answer_is_dropped() {
    let s = sanitize(DIG_PRIVATE, DNSMASQ_PRIVATE, true);
    assert!(s.answers.is_empty());
    assert_eq!(s.dropped_private, 1);
    assert!(s.private_answer());
    assert!(decode(&s.bytes).answers.is_empty());
    // The caller's policy may allow it (internal networks).
    let query = parse_query(DIG_PRIVATE).unwrap();
    let s = sanitize_response(&query, DNSMASQ_PRIVATE, keep_all, true).unwrap();
    assert_eq!(s.answers[0].1, IpAddr::V4(Ipv4Addr::new(10, 0, 0, 5)));
}

#[test]
fn keep_addr_is_asked_with_the_question_name() {
    let query = parse_query(DIG_CNAME).unwrap();
    let asked = std::cell::RefCell::new(Vec::new());
    let keep = |n: &str, ip: IpAddr| {
        asked.borrow_mut().push((n.to_owned(), ip));
        true
    };
    sanitize_response(&query, DNSMASQ_CNAME, keep, true).unwrap();
    assert_eq!(
        asked.into_inner(),
        vec![(
            "alias.example.com".to_owned(),
            IpAddr::V4(Ipv4Addr::new(93, 184, 216, 34))
        )]
    );
}

#[test]
fn https_svcb_and_other_types_are_withheld() {
    // dnsmasq serves a real HTTPS record (alpn=h2, ech=...) for svc.example.com.
    let upstream = decode(DNSMASQ_SVC);
    assert_eq!(upstream.answers.len(), 1);
    assert_eq!(upstream.answers[0].record_type(), RecordType::HTTPS);
    for (query, answer) in [
        (DIG_SVC, DNSMASQ_SVC),
        (DIG_HTTPS, DNSMASQ_HTTPS),
        (DIG_TXT, DNSMASQ_TXT),
    ] {
        let s = sanitize(query, answer, true);
        // dnsmasq (no upstream) answered REFUSED to the www HTTPS query:
        // the code passes through.
        assert_eq!(s.rcode, decode(answer).metadata.response_code);
        assert!(s.answers.is_empty());
        assert!(decode(&s.bytes).answers.is_empty());
        assert_clean(&s, query);
    }
}

#[test]
fn mismatching_responses_are_refused() {
    let query = parse_query(DIG_A).unwrap();
    // Answer to another question (AAAA), to another name, another id.
    assert_eq!(
        sanitize_response(&query, DNSMASQ_AAAA, keep_all, true).unwrap_err(),
        DnsReject::Mismatch
    );
    assert_eq!(
        sanitize_response(&query, DNSMASQ_PRIVATE, keep_all, true).unwrap_err(),
        DnsReject::Mismatch
    );
    let mut other_id = DNSMASQ_A.to_vec();
    other_id[0] ^= 0xff;
    assert_eq!(
        sanitize_response(&query, &other_id, keep_all, true).unwrap_err(),
        DnsReject::Mismatch
    );
    // The query itself is not a response.
    assert_eq!(
        sanitize_response(&query, DIG_A, keep_all, true).unwrap_err(),
        DnsReject::Mismatch
    );
    assert_eq!(
        sanitize_response(&query, &DNSMASQ_A[..20], keep_all, true).unwrap_err(),
        DnsReject::Malformed
    );
    assert_eq!(DnsReject::Mismatch.rcode(), ResponseCode::ServFail);
}

/// An upstream response to `query` built with hickory.
fn response(query: &Query, rcode: ResponseCode, answers: Vec<Record>) -> Vec<u8> {
    let mut m = Message::error_msg(query.id, OpCode::Query, rcode);
    m.add_query(query.question.clone());
    m.add_answers(answers);
    m.add_authority(Record::from_rdata(
        name("example.com."),
        60,
        RData::NS(NS(name("ns.example.com."))),
    ));
    m.add_additional(Record::from_rdata(
        name("ns.example.com."),
        60,
        RData::A(A(Ipv4Addr::new(192, 0, 2, 53))),
    ));
    m.to_vec().unwrap()
}

fn a(owner: &str, ip: [u8; 4], ttl: u32) -> Record {
    Record::from_rdata(name(owner), ttl, RData::A(A(Ipv4Addr::from(ip))))
}

fn cname(owner: &str, target: &str) -> Record {
    Record::from_rdata(name(owner), 300, RData::CNAME(CNAME(name(target))))
}

#[test]
fn only_the_chain_from_the_question_is_answered() {
    let query = parse_query(DIG_A).unwrap();
    let upstream = response(
        &query,
        ResponseCode::NoError,
        vec![
            cname("WWW.example.com.", "edge.cdn.example."),
            a("edge.cdn.example.", [203, 0, 113, 7], 42),
            a("edge.cdn.example.", [127, 0, 0, 1], 42),
            // Records off the chain: never answered.
            a("www.example.com.", [198, 51, 100, 1], 42),
            a("evil.example.", [198, 51, 100, 2], 42),
            Record::from_rdata(
                name("edge.cdn.example."),
                42,
                RData::AAAA(AAAA(Ipv6Addr::LOCALHOST)),
            ),
        ],
    );
    let s = sanitize_response(&query, &upstream, keep_public, true).unwrap();
    assert_eq!(s.cname_chain, vec!["edge.cdn.example".to_owned()]);
    assert_eq!(
        s.answers,
        vec![(
            "edge.cdn.example".to_owned(),
            IpAddr::V4(Ipv4Addr::new(203, 0, 113, 7)),
            42
        )]
    );
    assert_eq!(s.dropped_private, 1);
    assert!(!s.private_answer());
    assert_clean(&s, DIG_A);
}

#[test]
fn broken_chains_are_refused() {
    let query = parse_query(DIG_A).unwrap();
    let cases = [
        vec![
            cname("www.example.com.", "b.example."),
            cname("b.example.", "www.example.com."),
        ],
        vec![
            cname("www.example.com.", "b.example."),
            cname("b.example.", "b.example."),
        ],
        vec![
            cname("www.example.com.", "b.example."),
            cname("www.example.com.", "c.example."),
        ],
        (0..=MAX_CNAME_CHAIN)
            .map(|i| {
                let owner = if i == 0 {
                    "www.example.com.".to_owned()
                } else {
                    format!("c{i}.example.")
                };
                cname(&owner, &format!("c{}.example.", i + 1))
            })
            .collect(),
    ];
    for answers in cases {
        let upstream = response(&query, ResponseCode::NoError, answers);
        assert_eq!(
            sanitize_response(&query, &upstream, keep_all, true).unwrap_err(),
            DnsReject::BadChain
        );
    }
    // A chain of exactly MAX_CNAME_CHAIN is fine.
    let mut answers: Vec<Record> = (0..MAX_CNAME_CHAIN)
        .map(|i| {
            let owner = if i == 0 {
                "www.example.com.".to_owned()
            } else {
                format!("c{i}.example.")
            };
            cname(&owner, &format!("c{}.example.", i + 1))
        })
        .collect();
    answers.push(a(
        &format!("c{MAX_CNAME_CHAIN}.example."),
        [203, 0, 113, 9],
        5,
    ));
    let upstream = response(&query, ResponseCode::NoError, answers);
    let s = sanitize_response(&query, &upstream, keep_all, true).unwrap();
    assert_eq!(s.cname_chain.len(), MAX_CNAME_CHAIN);
    assert_eq!(s.answers.len(), 1);
}

#[test]
fn error_codes_pass_through_without_records() {
    let query = parse_query(DIG_A).unwrap();
    for rcode in [
        ResponseCode::NXDomain,
        ResponseCode::ServFail,
        ResponseCode::Refused,
    ] {
        let upstream = response(
            &query,
            rcode,
            vec![a("www.example.com.", [203, 0, 113, 1], 5)],
        );
        let s = sanitize_response(&query, &upstream, keep_all, true).unwrap();
        assert_eq!(s.rcode, rcode);
        assert!(s.answers.is_empty());
        let m = decode(&s.bytes);
        assert_eq!(m.metadata.response_code, rcode);
        assert!(m.answers.is_empty() && m.authorities.is_empty());
    }
}

#[test]
fn mutations_never_panic() {
    let query = parse_query(DIG_CNAME).unwrap();
    for base in [DNSMASQ_CNAME, DIG_CNAME, DNSMASQ_SVC] {
        for i in 0..base.len() {
            for value in [0x00, 0x01, 0x3f, 0xc0, 0xff] {
                let mut bytes = base.to_vec();
                bytes[i] = value;
                let _ = parse_query(&bytes);
                let _ = formerr_response(&bytes);
                let _ = sanitize_response(&query, &bytes, keep_all, true);
                let _ = sanitize_response(&query, &bytes[..i], keep_all, true);
            }
        }
    }
}

#[test]
fn ttls_are_clamped_into_the_policy_bounds() {
    let query = parse_query(DIG_A).unwrap();
    let upstream = response(
        &query,
        ResponseCode::NoError,
        vec![
            cname("www.example.com.", "edge.cdn.example."),
            a("edge.cdn.example.", [203, 0, 113, 7], 1),
            a("edge.cdn.example.", [203, 0, 113, 8], 86_400),
        ],
    );
    let s = sanitize_response_clamped(&query, &upstream, keep_all, true, 30..=600).unwrap();
    let ttls: Vec<u32> = s.answers.iter().map(|(_, _, ttl)| *ttl).collect();
    assert_eq!(ttls, vec![30, 600]);
    let m = decode(&s.bytes);
    let wire: Vec<u32> = m.answers.iter().map(|r| r.ttl).collect();
    // CNAME 300 stays inside the bounds.
    assert_eq!(wire, vec![300, 30, 600]);
    // Unclamped: upstream TTLs pass through.
    let s = sanitize_response(&query, &upstream, keep_all, true).unwrap();
    assert_eq!(
        s.answers.iter().map(|(_, _, t)| *t).collect::<Vec<_>>(),
        vec![1, 86_400]
    );
}

//! The shared name corpus (sluice-name's `tests/corpus.txt`) through every
//! path the gateway compares names on, each by its own entry point: the
//! policy (compiling `domain: NAME`, matching a wire name), sluice-inspect's
//! readers (TLS SNI, the `Host`/authority value, the DNS question) and the
//! gateway's DNS table (recording an answer, checking a flow's name against
//! it). Every path must accept exactly what the corpus says, in the same
//! canonical form. (The interceptors' checks run the same corpus in
//! sluice-intercept; the normaliser's own entries in sluice-name.)

use std::net::IpAddr;
use std::time::{Duration, Instant};

use sluice_inspect::dns::{DnsReject, parse_query};
use sluice_inspect::http::{Host, parse_authority};
use sluice_inspect::tls::{ClientHelloReader, Progress, Reject};
use sluice_name::corpus::{Case, cases};
use sluice_policy::{CompileOptions, Reason, from_yaml_str};

use crate::dns::DnsTable;

/// One TLS record holding a ClientHello whose only extension is an SNI
/// naming `name`.
fn client_hello(name: &[u8]) -> Vec<u8> {
    let be16 = |n: usize| u16::try_from(n).unwrap().to_be_bytes();
    let mut entry = vec![0];
    entry.extend_from_slice(&be16(name.len()));
    entry.extend_from_slice(name);
    let mut list = be16(entry.len()).to_vec();
    list.extend_from_slice(&entry);
    let mut ext = vec![0, 0];
    ext.extend_from_slice(&be16(list.len()));
    ext.extend_from_slice(&list);
    let mut body = vec![0x03, 0x03];
    body.extend_from_slice(&[0x42; 32]);
    body.push(0);
    body.extend_from_slice(&[0, 2, 0x13, 0x01, 1, 0]);
    body.extend_from_slice(&be16(ext.len()));
    body.extend_from_slice(&ext);
    let len = u32::try_from(body.len()).unwrap().to_be_bytes();
    let mut hs = vec![1, len[1], len[2], len[3]];
    hs.extend_from_slice(&body);
    let mut record = vec![22, 0x03, 0x01];
    record.extend_from_slice(&be16(hs.len()));
    record.extend_from_slice(&hs);
    record
}

/// A DNS query for `name` (A, IN) in wire form; `None` when the wire form
/// cannot carry the name (an empty label inside it, a label over 63 bytes).
fn dns_query(name: &[u8]) -> Option<Vec<u8>> {
    let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    let name = name.strip_suffix(b".").unwrap_or(name);
    if !name.is_empty() {
        for label in name.split(|&b| b == b'.') {
            if label.is_empty() || label.len() > 63 {
                return None;
            }
            q.push(u8::try_from(label.len()).ok()?);
            q.extend_from_slice(label);
        }
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    Some(q)
}

/// What a lenient normaliser (lower case, every trailing dot gone) would make
/// of `input`.
fn loose(input: &str) -> String {
    input.trim_end_matches('.').to_ascii_lowercase()
}

fn sni_path(case: &Case) {
    let mut reader = ClientHelloReader::new(sluice_inspect::DEFAULT_MAX_BYTES);
    match reader.push(&client_hello(&case.input)) {
        Progress::Done(info) => assert_eq!(
            Some(info.server_name.as_str()),
            case.wire.name(),
            "line {}: SNI",
            case.line
        ),
        Progress::Reject(Reject::SniUnreadable) => {
            assert_eq!(case.wire.name(), None, "line {}: SNI refused", case.line);
        }
        other => panic!("line {}: SNI reader gave {other:?}", case.line),
    }
}

fn host_path(case: &Case) {
    let as_name = |value: &[u8]| match parse_authority(value) {
        Ok((Host::Name(n), port)) => Some((n, port)),
        Ok((Host::V4(ip), port)) => Some((ip.to_string(), port)),
        Ok((Host::V6(_), _)) | Err(_) => None,
    };
    let want = case.wire.name();
    let got = as_name(&case.input);
    assert_eq!(
        got.as_ref().map(|(n, _)| n.as_str()),
        want,
        "line {}: Host",
        case.line
    );
    assert_eq!(got.and_then(|(_, port)| port), None);
    let mut with_port = case.input.clone();
    with_port.extend_from_slice(b":8080");
    let got = as_name(&with_port);
    assert_eq!(
        got.as_ref().map(|(n, _)| n.as_str()),
        want,
        "line {}: Host with port",
        case.line
    );
    if want.is_some() {
        assert_eq!(got.and_then(|(_, port)| port), Some(8080));
    }
}

fn dns_path(case: &Case) {
    let want = case.wire.name();
    let Some(query) = dns_query(&case.input) else {
        assert_eq!(want, None, "line {}: not encodable", case.line);
        return;
    };
    match parse_query(&query) {
        Ok(q) => assert_eq!(Some(q.name.as_str()), want, "line {}: DNS", case.line),
        Err(DnsReject::BadName(_) | DnsReject::Malformed) => {
            assert_eq!(want, None, "line {}: DNS refused", case.line);
        }
        Err(e) => panic!("line {}: DNS reader gave {e:?}", case.line),
    }
}

fn dns_table_path(case: &Case, input: &str) {
    let want = case.wire.name();
    let now = Instant::now();
    let ip: IpAddr = "198.51.100.7".parse().unwrap();
    let ttl = Duration::from_secs(60);
    let mut t = DnsTable::new(8);
    t.insert(ip, input, ttl, now);
    let held: Vec<&str> = t.names_for(ip, now).collect();
    assert_eq!(
        held,
        want.into_iter().collect::<Vec<_>>(),
        "line {}",
        case.line
    );
    assert_eq!(t.resolved_for(ip, input, now), want.is_some());
    // A flow whose wire name is `input`, to an address resolved for what a
    // lenient normaliser makes of it.
    let lenient = loose(input);
    let mut t = DnsTable::new(8);
    t.insert(ip, &lenient, ttl, now);
    assert_eq!(
        t.resolved_for(ip, input, now),
        want.is_some_and(|w| w == lenient),
        "line {}: lenient",
        case.line
    );
}

fn policy_paths(case: &Case, input: &str, deny_tlds: &sluice_policy::CompiledPolicy) {
    // Compiling `domain: INPUT` (JSON string syntax is YAML).
    let yaml = format!(
        "version: 1\nid: corpus\nallow:\n  - domain: {}\n",
        serde_json::to_string(input).unwrap()
    );
    let compiled = from_yaml_str(&yaml, "corpus.yaml", &CompileOptions::default()).ok();
    assert_eq!(
        compiled.is_some(),
        case.policy.name().is_some(),
        "line {}: compile {input:?}",
        case.line
    );
    let pattern = compiled.as_ref().map(|p| {
        let base = case.policy.name().unwrap_or_default();
        let base = base.trim_start_matches("**.").trim_start_matches("*.");
        let probe = format!("x.{base}");
        let v = p.check_name(&probe);
        let v = if v.rule.is_some() {
            v
        } else {
            p.check_name(base)
        };
        v.rule.map(|r| r.pattern.to_owned())
    });
    assert_eq!(
        pattern.flatten().as_deref(),
        case.policy.name(),
        "line {}: compile {input:?}",
        case.line
    );
    // Matching a wire name.
    let covered = |n: &str| n == "localhost" || n.ends_with(".com") || n.ends_with(".de");
    let got = deny_tlds.check_name(input).reason == Reason::Denylisted;
    assert_eq!(
        got,
        case.wire.name().is_some_and(covered),
        "line {}: match {input:?}",
        case.line
    );
}

#[test]
fn corpus_through_every_gateway_path() {
    let cases = cases().unwrap();
    assert!(cases.len() >= 50, "only {} cases", cases.len());
    let deny_tlds = from_yaml_str(
        "version: 1\nid: corpus\nallow: []\ndeny:\n  - \"**.com\"\n  - \"**.de\"\n  - localhost\n",
        "corpus.yaml",
        &CompileOptions::default(),
    )
    .unwrap();
    for case in &cases {
        sni_path(case);
        host_path(case);
        dns_path(case);
        match std::str::from_utf8(&case.input) {
            Ok(input) => {
                dns_table_path(case, input);
                policy_paths(case, input, &deny_tlds);
            }
            // The table and the policy take text; the readers above refuse
            // such bytes before a name ever reaches them.
            Err(_) => assert_eq!(case.wire.name(), None, "line {}", case.line),
        }
    }
}

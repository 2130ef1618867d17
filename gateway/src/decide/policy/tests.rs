use std::net::Ipv4Addr;

use sluice_policy::{CompileOptions, from_yaml_str};

use super::*;
use crate::flow::Transport;

mod dns;
mod swap;

const POLICY: &str = r#"
version: 1
id: enforce-test
allow:
  - domain: "www.example.com"
    ports: [80, 443]
  - domain: "**.github.com"
  - domains: ["example.org", "**.example.org"]
    ports: [80, 443]
  - domains: ["python.example.com", "big.example.com", "pq.example.com", "tls12.example.net"]
  - domain: "db.example.net"
    ports: [5432]
  - domain: "quic.example.net"
    ports: [443]
    udp_ports: [443]
  - cidr: "203.0.113.0/24"
    ports: [22, 443]
deny:
  - "bad.example.org"
internal:
  - "10.20.0.0/16"
"#;

const WWW: &str = "93.184.216.34";
const GITHUB: &str = "140.82.112.3";
const OTHER: &str = "151.101.1.1";
const GUEST: &str = "10.0.2.15:40000";

fn policy() -> Arc<CompiledPolicy> {
    let mut host = CompileOptions::default();
    host.host_addresses = vec!["192.0.2.77".parse().unwrap()];
    Arc::new(from_yaml_str(POLICY, "enforce-test.yaml", &host).unwrap())
}

fn platform() -> PlatformDenySet {
    PlatformDenySet::new(
        ["192.0.2.77".parse().unwrap()],
        Ipv4Addr::new(10, 0, 2, 2),
        Ipv4Addr::new(10, 0, 2, 255),
    )
}

fn decider() -> PolicyDecider {
    PolicyDecider::new(policy(), platform())
}

/// A table as the forwarder leaves it after resolving the test names.
fn table(now: Instant) -> DnsTable {
    let mut t = DnsTable::new(64);
    let ttl = Duration::from_secs(60);
    t.insert(WWW.parse().unwrap(), "www.example.com.", ttl, now);
    t.insert(GITHUB.parse().unwrap(), "api.github.com", ttl, now);
    t.insert(OTHER.parse().unwrap(), "python.example.com", ttl, now);
    for name in [
        "example.org",
        "big.example.com",
        "pq.example.com",
        "tls12.example.net",
    ] {
        t.insert(OTHER.parse().unwrap(), name, ttl, now);
    }
    t.insert("151.101.2.2".parse().unwrap(), "db.example.net", ttl, now);
    t.insert("151.101.3.3".parse().unwrap(), "quic.example.net", ttl, now);
    t.insert("151.101.4.4".parse().unwrap(), "bad.example.org", ttl, now);
    t.insert("10.20.1.1".parse().unwrap(), "www.example.com", ttl, now);
    t
}

/// A policy compiled from `yaml` with default options.
fn compile(yaml: &str) -> Arc<CompiledPolicy> {
    Arc::new(from_yaml_str(yaml, "test.yaml", &CompileOptions::default()).unwrap())
}

/// The test decider and the table the forwarder leaves, at one instant.
struct Fixture {
    d: PolicyDecider,
    t: DnsTable,
    now: Instant,
}

impl Fixture {
    fn new() -> Self {
        let now = Instant::now();
        Self {
            d: decider(),
            t: table(now),
            now,
        }
    }

    fn ctx(&self) -> DecideContext<'_> {
        DecideContext {
            dns: &self.t,
            approved: None,
            now: self.now,
        }
    }
}

fn tcp(dst: &str) -> FlowKey {
    FlowKey {
        transport: Transport::Tcp,
        src: GUEST.parse().unwrap(),
        dst: dst.parse().unwrap(),
    }
}

fn udp(dst: &str) -> FlowKey {
    FlowKey {
        transport: Transport::Udp,
        src: GUEST.parse().unwrap(),
        dst: dst.parse().unwrap(),
    }
}

/// The verdict every allow compares equal to after [`bare`].
const ALLOWED: Verdict = Verdict::of(Reason::Allowlisted);

/// A decision's or an inspection's outcome with its reason alone (the
/// rules are checked by the audit tests): every allow is [`ALLOWED`].
fn bare<T: Bare>(v: T) -> T {
    v.bare()
}

trait Bare {
    fn bare(self) -> Self;
}

impl Bare for Decision {
    fn bare(self) -> Self {
        match self {
            Decision::Allow(_) => Decision::Allow(ALLOWED),
            Decision::Deny(v) => Decision::Deny(Verdict::of(v.reason)),
            inspect => inspect,
        }
    }
}

impl Bare for InspectVerdict {
    fn bare(self) -> Self {
        match self {
            InspectVerdict::Allow(_) => InspectVerdict::Allow(ALLOWED),
            InspectVerdict::Deny(v) => InspectVerdict::Deny(Verdict::of(v.reason)),
            more => more,
        }
    }
}

fn denied(reason: &str) -> Decision {
    match Reason::from_name(reason) {
        Some(r) => Decision::Deny(Verdict::of(r)),
        None => panic!("unknown reason {reason}"),
    }
}

fn inspect_denied(reason: &str) -> InspectVerdict {
    match denied(reason) {
        Decision::Deny(r) => InspectVerdict::Deny(r),
        other => panic!("{other:?}"),
    }
}

const INSPECT: Decision = Decision::Inspect {
    max_bytes: INSPECT_MAX_BYTES,
    deadline: INSPECT_DEADLINE,
};

fn testdata(path: &str) -> Vec<u8> {
    let p = format!("{}/../inspect/testdata/{path}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
}

/// A TLS 1.3-style ClientHello in one record with the given host names
/// (one server_name extension listing them all) and, optionally, an
/// encrypted_client_hello extension.
fn client_hello(names: &[&str], ech: bool) -> Vec<u8> {
    fn u16be(v: usize) -> [u8; 2] {
        u16::try_from(v).unwrap().to_be_bytes()
    }
    let mut exts = Vec::new();
    if !names.is_empty() {
        let mut list = Vec::new();
        for n in names {
            list.push(0u8);
            list.extend(u16be(n.len()));
            list.extend(n.as_bytes());
        }
        exts.extend([0, 0]);
        exts.extend(u16be(list.len() + 2));
        exts.extend(u16be(list.len()));
        exts.extend(list);
    }
    // supported_versions: TLS 1.3.
    exts.extend([0x00, 0x2b, 0x00, 0x03, 0x02, 0x03, 0x04]);
    if ech {
        // outer ECH: type 0, kdf 1, aead 1, config id 7, empty enc, 4-byte payload.
        let body = [0u8, 0, 1, 0, 1, 7, 0, 0, 0, 4, 1, 2, 3, 4];
        exts.extend([0xfe, 0x0d]);
        exts.extend(u16be(body.len()));
        exts.extend(body);
    }
    let mut hello = vec![0x03, 0x03];
    hello.extend([0x5a; 32]);
    hello.push(0); // session id
    hello.extend([0x00, 0x02, 0x13, 0x01]); // one cipher suite
    hello.extend([0x01, 0x00]); // null compression
    hello.extend(u16be(exts.len()));
    hello.extend(exts);
    let len = u32::try_from(hello.len()).unwrap().to_be_bytes();
    let mut hs = vec![0x01, len[1], len[2], len[3]];
    hs.extend(hello);
    let mut rec = vec![0x16, 0x03, 0x01];
    rec.extend(u16be(hs.len()));
    rec.extend(hs);
    rec
}

/// Runs a flow through `decide_tcp` and, when asked to, `inspect`.
fn run_tcp(d: &PolicyDecider, dst: &str, first: &[u8]) -> InspectVerdict {
    let now = Instant::now();
    let t = table(now);
    let ctx = DecideContext {
        dns: &t,
        approved: None,
        now,
    };
    let f = tcp(dst);
    match bare(d.decide_tcp(&f, &ctx)) {
        Decision::Allow(v) => InspectVerdict::Allow(v),
        Decision::Deny(v) => InspectVerdict::Deny(v),
        Decision::Inspect { .. } => bare(d.inspect(&f, first, &ctx)),
    }
}

#[test]
fn allowed_tls_with_real_client_hellos() {
    let d = decider();
    // curl, SNI www.example.com, to the address www.example.com resolved to.
    let hello = testdata("tls/curl-https.bin");
    assert_eq!(
        bare(run_tcp(&d, &format!("{WWW}:443"), &hello)),
        InspectVerdict::Allow(ALLOWED)
    );
    // curl --http1.1, SNI api.github.com (allowed by **.github.com).
    let hello = testdata("tls/curl-http11.bin");
    assert_eq!(
        bare(run_tcp(&d, &format!("{GITHUB}:443"), &hello)),
        InspectVerdict::Allow(ALLOWED)
    );
    // python ssl, on an address shared with another allowed name.
    let hello = testdata("tls/python-ssl.bin");
    assert_eq!(
        bare(run_tcp(&d, &format!("{OTHER}:443"), &hello)),
        InspectVerdict::Allow(ALLOWED)
    );
    // A 7 KB ClientHello (112 ALPN names) passes within the bound.
    let hello = testdata("tls/openssl-big-alpn.bin");
    assert!(hello.len() > 4096);
    assert_eq!(
        bare(run_tcp(&d, &format!("{OTHER}:443"), &hello)),
        InspectVerdict::Allow(ALLOWED)
    );
    // Upper-case SNI (Example.ORG), many groups, TLS 1.2 only.
    for f in ["openssl-sni", "openssl-pq", "openssl-tls12"] {
        let hello = testdata(&format!("tls/{f}.bin"));
        assert_eq!(
            bare(run_tcp(&d, &format!("{OTHER}:443"), &hello)),
            InspectVerdict::Allow(ALLOWED),
            "{f}"
        );
    }
}

#[test]
fn tls_is_inspected_and_needs_more_until_complete() {
    let f = Fixture::new();
    let (d, ctx) = (&f.d, f.ctx());
    let f = tcp(&format!("{WWW}:443"));
    assert_eq!(bare(d.decide_tcp(&f, &ctx)), INSPECT);
    let hello = testdata("tls/curl-https.bin");
    // Every proper prefix (one-byte segments accumulated) needs more.
    for cut in [0, 1, 5, 6, hello.len() / 2, hello.len() - 1] {
        assert_eq!(
            bare(d.inspect(&f, &hello[..cut], &ctx)),
            InspectVerdict::NeedMore,
            "prefix {cut}"
        );
    }
    assert_eq!(
        bare(d.inspect(&f, &hello, &ctx)),
        InspectVerdict::Allow(ALLOWED)
    );
}

#[test]
fn client_hello_split_across_records_is_reassembled() {
    let d = decider();
    let one = testdata("tls/curl-https.bin");
    // Re-frame the handshake message as three records of uneven sizes.
    let hs = &one[5..];
    let mut split = Vec::new();
    for part in [&hs[..7], &hs[7..100], &hs[100..]] {
        split.extend([0x16, 0x03, 0x01]);
        split.extend(u16::try_from(part.len()).unwrap().to_be_bytes());
        split.extend(part);
    }
    assert_eq!(
        bare(run_tcp(&d, &format!("{WWW}:443"), &split)),
        InspectVerdict::Allow(ALLOWED)
    );
    assert_eq!(
        bare(run_tcp(&d, &format!("{GITHUB}:443"), &split)),
        inspect_denied("sni_dns_mismatch")
    );
}

#[test]
fn garbage_first_bytes_never_allow_or_panic() {
    let f = Fixture::new();
    let (d, ctx) = (&f.d, f.ctx());
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for round in 0..2000 {
        let len = usize::try_from(next() % 600).unwrap();
        let mut bytes: Vec<u8> = (0..len).map(|_| next().to_le_bytes()[0]).collect();
        // Half the rounds start like a handshake record to get past the first check.
        if round % 2 == 0 && bytes.len() > 3 {
            bytes[..3].copy_from_slice(&[0x16, 0x03, 0x01]);
        }
        for dst in [format!("{WWW}:443"), format!("{WWW}:80")] {
            let v = bare(d.inspect(&tcp(&dst), &bytes, &ctx));
            assert_ne!(v, InspectVerdict::Allow(ALLOWED), "{dst} {bytes:?}");
        }
    }
}

#[test]
fn ip_literal_not_in_table_is_denied_at_syn() {
    let d = decider();
    for dst in [
        "8.8.4.4:443",
        "8.8.4.4:80",
        "8.8.4.4:5432",
        "[2606:4700::1]:443",
    ] {
        assert_eq!(
            bare(run_tcp(&d, dst, &testdata("tls/curl-https.bin"))),
            inspect_denied("ip_not_resolved_for_name"),
            "{dst}"
        );
    }
}

#[test]
fn sni_of_allowed_host_sent_to_another_ip() {
    let d = decider();
    // GITHUB's address is in the table (for api.github.com) and allowed,
    // but the SNI names www.example.com, which did not resolve there.
    let hello = testdata("tls/curl-https.bin");
    assert_eq!(
        bare(run_tcp(&d, &format!("{GITHUB}:443"), &hello)),
        inspect_denied("sni_dns_mismatch")
    );
}

#[test]
fn sni_not_allowed_or_denylisted() {
    let d = decider();
    let hello = client_hello(&["evil.example.net"], false);
    assert_eq!(
        bare(run_tcp(&d, &format!("{WWW}:443"), &hello)),
        inspect_denied("not_allowlisted")
    );
    let hello = client_hello(&["bad.example.org"], false);
    assert_eq!(
        bare(run_tcp(&d, &format!("{OTHER}:443"), &hello)),
        inspect_denied("denylisted")
    );
    // A denylisted name alone in the table does not open its address.
    assert_eq!(
        bare(run_tcp(&d, "151.101.4.4:443", &hello)),
        inspect_denied("denylisted")
    );
}

#[test]
fn tls_without_sni_with_two_names_or_ech() {
    let d = decider();
    let dst = format!("{WWW}:443");
    assert_eq!(
        bare(run_tcp(&d, &dst, &testdata("tls/openssl-nosni.bin"))),
        inspect_denied("sni_absent")
    );
    assert_eq!(
        bare(run_tcp(&d, &dst, &client_hello(&[], false))),
        inspect_denied("sni_absent")
    );
    assert_eq!(
        bare(run_tcp(
            &d,
            &dst,
            &client_hello(&["www.example.com"], false)
        )),
        InspectVerdict::Allow(ALLOWED),
        "the crafted hello is well-formed"
    );
    assert_eq!(
        bare(run_tcp(
            &d,
            &dst,
            &client_hello(&["www.example.com", "evil.example.net"], false)
        )),
        inspect_denied("sni_multiple")
    );
    assert_eq!(
        bare(run_tcp(&d, &dst, &client_hello(&["www.example.com"], true))),
        inspect_denied("ech_present")
    );
}

#[test]
fn non_tls_and_unreadable_on_443() {
    let d = decider();
    let dst = format!("{WWW}:443");
    assert_eq!(
        bare(run_tcp(
            &d,
            &dst,
            b"GET / HTTP/1.1\r\nHost: www.example.com\r\n\r\n"
        )),
        inspect_denied("not_tls")
    );
    assert_eq!(
        bare(run_tcp(&d, &dst, b"SSH-2.0-OpenSSH_9.2\r\n")),
        inspect_denied("not_tls")
    );
    // A handshake record claiming more than the bound.
    let mut big = client_hello(&["www.example.com"], false);
    big.resize(INSPECT_MAX_BYTES + 1, 0);
    let v = bare(run_tcp(&d, &dst, &big));
    assert_eq!(v, inspect_denied("sni_unreadable"));
    // Garbage extensions after a valid header.
    let mut bad = client_hello(&["www.example.com"], false);
    let n = bad.len();
    bad[n - 9] = 0xff; // corrupt the server_name/extension lengths
    bad[n - 10] = 0xff;
    assert_eq!(
        bare(run_tcp(&d, &dst, &bad)),
        inspect_denied("sni_unreadable")
    );
}

#[test]
fn http_host_allowed_spoofed_and_connect() {
    let d = decider();
    let dst = format!("{WWW}:80");
    let ok = b"GET /path HTTP/1.1\r\nHost: www.example.com\r\nUser-Agent: t\r\n\r\n";
    assert_eq!(bare(run_tcp(&d, &dst, ok)), InspectVerdict::Allow(ALLOWED));
    // Real curl head (Host: www.example.com:18443): the port in Host does not matter.
    assert_eq!(
        bare(run_tcp(&d, &dst, &testdata("http/curl-http-plain.bin"))),
        InspectVerdict::Allow(ALLOWED)
    );
    // Host spoofing: a name allowed on port 80, but this IP was not resolved for it.
    let spoof = b"GET / HTTP/1.1\r\nHost: example.org\r\n\r\n";
    assert_eq!(
        bare(run_tcp(&d, &dst, spoof)),
        inspect_denied("http_host_mismatch")
    );
    // Host naming a name the policy does not allow at all.
    let other = b"GET / HTTP/1.1\r\nHost: evil.example.net\r\n\r\n";
    assert_eq!(
        bare(run_tcp(&d, &dst, other)),
        inspect_denied("not_allowlisted")
    );
    // An IP literal in Host.
    let lit = b"GET / HTTP/1.1\r\nHost: 93.184.216.34\r\n\r\n";
    assert_eq!(
        bare(run_tcp(&d, &dst, lit)),
        inspect_denied("not_allowlisted")
    );
    let connect = b"CONNECT www.example.com:443 HTTP/1.1\r\nHost: www.example.com:443\r\n\r\n";
    assert_eq!(
        bare(run_tcp(&d, &dst, connect)),
        inspect_denied("http_connect_denied")
    );
    let no_host = b"GET / HTTP/1.0\r\n\r\n";
    assert_eq!(
        bare(run_tcp(&d, &dst, no_host)),
        inspect_denied("http_host_absent")
    );
    assert_eq!(
        bare(run_tcp(&d, &dst, &testdata("tls/curl-https.bin"))),
        inspect_denied("http_unreadable")
    );
    assert_eq!(
        bare(run_tcp(&d, &dst, b"SSH-2.0-OpenSSH_9.2\r\n")),
        inspect_denied("http_unreadable")
    );
    for partial in [&b""[..], b"G", b"GET", b"GET / HTTP/1.1\r\nHost: www.exa"] {
        assert_eq!(
            bare(run_tcp(&d, &dst, partial)),
            InspectVerdict::NeedMore,
            "{partial:?}"
        );
    }
    // api.github.com is allowed on 443 only (the default): port 80 is not.
    let github = b"GET / HTTP/1.1\r\nHost: api.github.com\r\n\r\n";
    assert_eq!(
        bare(run_tcp(&d, &format!("{GITHUB}:80"), github)),
        inspect_denied("port_not_allowed")
    );
}

#[test]
fn raw_tcp_ports_need_a_rule_for_the_port() {
    let d = decider();
    assert_eq!(
        bare(run_tcp(&d, "151.101.2.2:5432", b"")),
        InspectVerdict::Allow(ALLOWED)
    );
    assert_eq!(
        bare(run_tcp(&d, "151.101.2.2:22", b"")),
        inspect_denied("port_not_allowed")
    );
    assert_eq!(
        bare(run_tcp(&d, &format!("{WWW}:8080"), b"")),
        inspect_denied("port_not_allowed")
    );
    // db.example.net resolved elsewhere; 5432 to WWW is not opened by it.
    assert_eq!(
        bare(run_tcp(&d, &format!("{WWW}:5432"), b"")),
        inspect_denied("port_not_allowed")
    );
    // CIDR rule: no name needed, on its ports only, even on TLS ports.
    assert_eq!(
        bare(run_tcp(&d, "203.0.113.9:22", b"")),
        InspectVerdict::Allow(ALLOWED)
    );
    assert_eq!(
        bare(run_tcp(&d, "203.0.113.9:443", b"not tls")),
        InspectVerdict::Allow(ALLOWED)
    );
    assert_eq!(
        bare(run_tcp(&d, "203.0.113.9:23", b"")),
        inspect_denied("ip_not_resolved_for_name")
    );
}

#[test]
fn dns_to_other_resolvers_is_denied() {
    let f = Fixture::new();
    let (d, ctx) = (&f.d, f.ctx());
    for dst in ["8.8.8.8:53", "1.1.1.1:853", "203.0.113.9:53"] {
        assert_eq!(
            bare(d.decide_tcp(&tcp(dst), &ctx)),
            denied("dns_resolver_denied")
        );
        assert_eq!(
            bare(d.decide_udp(&udp(dst), &ctx)),
            denied("dns_resolver_denied")
        );
    }
}

#[test]
fn platform_and_private_destinations() {
    let d = decider();
    let now = Instant::now();
    let mut t = table(now);
    let ttl = Duration::from_secs(60);
    // Even names the policy allows do not open platform addresses.
    for ip in [
        "127.0.0.1",
        "169.254.169.254",
        "10.0.2.2",
        "192.0.2.77",
        "::ffff:127.0.0.1",
    ] {
        t.insert(ip.parse().unwrap(), "www.example.com", ttl, now);
    }
    t.insert("10.9.9.9".parse().unwrap(), "www.example.com", ttl, now);
    let ctx = DecideContext {
        dns: &t,
        approved: None,
        now,
    };
    for dst in [
        "127.0.0.1:443",
        "169.254.169.254:80",
        "10.0.2.2:443",
        "10.0.2.255:443",
        "192.0.2.77:443",
        "[::ffff:127.0.0.1]:443",
        "[fe80::1]:443",
    ] {
        assert_eq!(
            bare(d.decide_tcp(&tcp(dst), &ctx)),
            denied("platform_denied"),
            "{dst}"
        );
        assert_eq!(
            bare(d.decide_udp(&udp(dst), &ctx)),
            denied("platform_denied"),
            "{dst}"
        );
    }
    assert_eq!(
        bare(d.decide_tcp(&tcp("10.9.9.9:443"), &ctx)),
        denied("private_destination")
    );
    // `internal:` opens 10.20/16 to names that resolved there.
    assert_eq!(bare(d.decide_tcp(&tcp("10.20.1.1:443"), &ctx)), INSPECT);
}

#[test]
fn udp_and_quic() {
    let f = Fixture::new();
    let (d, ctx) = (&f.d, f.ctx());
    assert_eq!(
        bare(d.decide_udp(&udp(&format!("{WWW}:443")), &ctx)),
        denied("quic_blocked")
    );
    assert_eq!(
        bare(d.decide_udp(&udp(&format!("{WWW}:3478")), &ctx)),
        denied("udp_blocked")
    );
    assert_eq!(
        bare(d.decide_udp(&udp("8.8.4.4:443"), &ctx)),
        denied("quic_blocked")
    );
    // A rule with udp_ports opens exactly that.
    assert_eq!(
        bare(d.decide_udp(&udp("151.101.3.3:443"), &ctx)),
        Decision::Allow(ALLOWED)
    );
    assert_eq!(
        bare(d.decide_udp(&udp("151.101.3.3:444"), &ctx)),
        denied("udp_blocked")
    );
}

#[test]
fn expired_entries_do_not_count() {
    let d = decider();
    let now = Instant::now();
    let t = table(now);
    let later = now + Duration::from_secs(3600);
    let ctx = DecideContext {
        dns: &t,
        approved: None,
        now: later,
    };
    assert_eq!(
        bare(d.decide_tcp(&tcp(&format!("{WWW}:443")), &ctx)),
        denied("ip_not_resolved_for_name")
    );
    let f = tcp(&format!("{WWW}:443"));
    assert_eq!(
        bare(d.inspect(&f, &testdata("tls/curl-https.bin"), &ctx)),
        inspect_denied("ip_not_resolved_for_name")
    );
}

#[test]
fn wire_name_reports_sni_and_host() {
    assert_eq!(
        wire_name(PortProtocol::Tls, &testdata("tls/openssl-sni.bin")),
        Some(WireName::Sni("example.org".into()))
    );
    assert_eq!(
        wire_name(PortProtocol::Tls, &testdata("tls/openssl-nosni.bin")),
        None
    );
    let head = wire_name(
        PortProtocol::Http,
        b"GET / HTTP/1.1\r\nHost: WWW.Example.com:8080\r\n\r\n",
    );
    assert_eq!(head, Some(WireName::Host("www.example.com".into())));
    assert_eq!(head.map(|h| h.as_str().len()), Some(15));
    assert_eq!(
        wire_name(
            PortProtocol::Http,
            b"GET / HTTP/1.1\r\nHost: [2001:db8::1]\r\n\r\n"
        ),
        Some(WireName::Host("[2001:db8::1]".into()))
    );
    assert_eq!(
        wire_name(PortProtocol::Tcp, b"GET / HTTP/1.1\r\n\r\n"),
        None
    );
}

//! A swapped policy: the next decision follows it, and flows it no longer
//! allows are revoked on recheck.

use super::*;

#[test]
fn swap_takes_effect_for_the_next_decision() {
    let f = Fixture::new();
    let (d, ctx) = (&f.d, f.ctx());
    let f = tcp(&format!("{WWW}:443"));
    assert_eq!(bare(d.decide_tcp(&f, &ctx)), INSPECT);
    let hello = testdata("tls/curl-https.bin");
    let narrow = compile("version: 1\nid: narrow\nallow:\n  - domain: \"**.github.com\"\n");
    let old = d.swap(narrow);
    assert_eq!(old.id(), "enforce-test");
    assert_eq!(d.policy().id(), "narrow");
    // A flow admitted before the swap is re-checked when its bytes arrive.
    assert_eq!(
        bare(d.inspect(&f, &hello, &ctx)),
        inspect_denied("not_allowlisted")
    );
    assert_eq!(bare(d.decide_tcp(&f, &ctx)), denied("not_allowlisted"));
    d.swap(old);
    assert_eq!(
        bare(d.inspect(&f, &hello, &ctx)),
        InspectVerdict::Allow(ALLOWED)
    );
}

#[test]
fn recheck_after_swap_revokes_what_the_new_policy_denies() {
    let d = decider();
    let www = tcp(&format!("{WWW}:443"));
    let db = tcp("151.101.2.2:5432");
    let ssh = tcp("203.0.113.9:22");
    assert_eq!(d.recheck_tcp(&www, &["www.example.com"]), Ok(()));
    assert_eq!(d.recheck_tcp(&db, &["db.example.net"]), Ok(()));
    assert_eq!(d.recheck_tcp(&ssh, &[]), Ok(()));
    let narrow = compile(
        "version: 1\nid: narrow\nallow:\n  - domain: www.example.com\n  - cidr: 203.0.113.0/24\n    ports: [23]\n",
    );
    d.swap(narrow);
    assert_eq!(d.recheck_tcp(&www, &["www.example.com"]), Ok(()));
    assert_eq!(
        d.recheck_tcp(&db, &["db.example.net"]),
        Err(Verdict::of(Reason::NotAllowlisted))
    );
    assert_eq!(
        d.recheck_tcp(&ssh, &[]),
        Err(Verdict::of(Reason::IpNotResolvedForName))
    );
    assert_eq!(
        d.recheck_tcp(&tcp("127.0.0.1:443"), &["www.example.com"]),
        Err(DenyReason::PlatformDenied.verdict())
    );
}

#[test]
fn recheck_of_an_uninspected_tls_flow_needs_a_cidr_rule() {
    let with_cidr = compile(
        "version: 1\nid: wide\nallow:\n  - domain: www.example.com\n  - cidr: 93.184.216.0/24\n    ports: [443, 80]\n",
    );
    let d = PolicyDecider::new(with_cidr, platform());
    // Admitted by the CIDR rule, never SNI-checked.
    let flow = tcp("93.184.216.34:443");
    let plain = tcp("93.184.216.34:80");
    let names = ["www.example.com"];
    assert_eq!(d.recheck_tcp_uninspected(&flow, &names), Ok(()));
    let narrow = compile(
        "version: 1\nid: narrow\nallow:\n  - domain: www.example.com\n    ports: [443, 80]\n",
    );
    d.swap(narrow);
    // An allowed table name for the address no longer keeps it ...
    assert_eq!(
        d.recheck_tcp_uninspected(&flow, &names),
        Err(Verdict::of(Reason::IpNotResolvedForName))
    );
    assert_eq!(
        d.recheck_tcp_uninspected(&plain, &names),
        Err(Verdict::of(Reason::IpNotResolvedForName))
    );
    // ... while a flow whose SNI was that name stays.
    assert_eq!(d.recheck_tcp(&flow, &names), Ok(()));
    // Raw TCP ports keep the table-name rule.
    let raw =
        compile("version: 1\nid: raw\nallow:\n  - domain: www.example.com\n    ports: [8022]\n");
    d.swap(raw);
    assert_eq!(
        d.recheck_tcp_uninspected(&tcp("93.184.216.34:8022"), &names),
        Ok(())
    );
}

#[test]
fn udp_recheck_after_swap_revokes_what_the_new_policy_denies() {
    let d = decider();
    // quic.example.net allows UDP 443 in POLICY.
    let quic = udp("151.101.3.3:443");
    assert_eq!(d.recheck_udp(&quic, &["quic.example.net"]), Ok(()));
    assert_eq!(
        d.recheck_udp(&udp("151.101.3.3:53"), &["quic.example.net"]),
        Err(Verdict::of(Reason::DnsResolverDenied))
    );
    let narrow = compile("version: 1\nid: narrow\nallow:\n  - domain: quic.example.net\n");
    d.swap(narrow);
    assert_eq!(
        d.recheck_udp(&quic, &["quic.example.net"]),
        Err(Verdict::of(Reason::QuicBlocked))
    );
    assert_eq!(
        d.recheck_udp(&udp("127.0.0.1:443"), &["quic.example.net"]),
        Err(DenyReason::PlatformDenied.verdict())
    );
}

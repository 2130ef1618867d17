//! What the decider tells the DNS server: TTL bounds, which names are
//! answered, which answers are kept, and the upstreams, across swaps.

use super::*;

#[test]
fn ttl_range_follows_the_policy() {
    let p = compile("version: 1\nid: t\nallow: []\ndns:\n  ttl_min: 7\n  ttl_max: 120\n");
    assert_eq!(ttl_range(&p), 7..=120);
    let b = policy().ttl_bounds();
    assert_eq!(
        ttl_range(&policy()),
        u32::try_from(b.min.as_secs()).unwrap()..=u32::try_from(b.max.as_secs()).unwrap()
    );
}

#[test]
fn dns_filter_refuses_names_not_allowed() {
    let p = policy();
    assert_eq!(dns_filter(&p, "www.example.com"), DnsAction::Forward);
    assert_eq!(dns_filter(&p, "deep.api.github.com"), DnsAction::Forward);
    // Allowed on some port only: still resolved (the port is checked at connect).
    assert_eq!(dns_filter(&p, "db.example.net"), DnsAction::Forward);
    assert_eq!(
        dns_filter(&p, "exfil-4142434445.attacker.net"),
        DnsAction::Answer {
            rcode: ResponseCode::Refused,
            reason: Reason::NotAllowlisted
        }
    );
    assert_eq!(
        dns_filter(&p, "bad.example.org"),
        DnsAction::Answer {
            rcode: ResponseCode::Refused,
            reason: Reason::Denylisted
        }
    );
}

#[test]
fn keep_addr_drops_platform_and_private_answers() {
    let p = policy();
    let plat = platform();
    let keep = keep_addr(&p, &plat);
    for ip in [WWW, GITHUB, "2606:4700::6810:84e5", "10.20.3.4"] {
        assert!(keep("www.example.com", ip.parse().unwrap()), "{ip}");
    }
    for ip in [
        "127.0.0.1",
        "169.254.169.254",
        "10.0.0.5",
        "192.168.1.1",
        "100.64.0.1",
        "fd00::1",
        "::ffff:10.0.0.5",
        "::ffff:127.0.0.1",
        "10.0.2.2",
        "192.0.2.77",
        "0.0.0.0",
    ] {
        assert!(!keep("www.example.com", ip.parse().unwrap()), "{ip}");
    }
}

#[test]
fn policy_dns_upstreams_follow_swaps() {
    let d = decider();
    assert_eq!(d.policy_dns_upstreams(), None, "no dns.upstream: system");
    d.swap(compile(
        "version: 1\nid: up\ndns:\n  upstream: [192.0.2.53, \"198.51.100.7:5353\"]\n",
    ));
    assert_eq!(
        d.policy_dns_upstreams(),
        Some(vec![
            "192.0.2.53:53".parse().unwrap(),
            "198.51.100.7:5353".parse().unwrap()
        ])
    );
    d.swap(compile("version: 1\nid: sys\ndns:\n  upstream: system\n"));
    assert_eq!(d.policy_dns_upstreams(), None);
}

#[test]
fn decider_dns_helpers_follow_swaps() {
    let d = decider();
    assert_eq!(d.dns_action("api.github.com"), DnsAction::Forward);
    assert!(d.keep_answer("10.20.0.9".parse().unwrap()));
    assert!(!d.keep_answer("10.0.2.2".parse().unwrap()));
    let narrow = compile("version: 1\nid: narrow\nallow:\n  - domain: www.example.com\n");
    d.swap(narrow);
    assert_eq!(
        d.dns_action("api.github.com"),
        DnsAction::Answer {
            rcode: ResponseCode::Refused,
            reason: Reason::NotAllowlisted
        }
    );
    assert!(!d.keep_answer("10.20.0.9".parse().unwrap()));
}

#[test]
fn decider_trait_dns_hooks_apply_the_policy() {
    let d = decider();
    let dyn_d: &dyn Decider = &d;
    assert!(matches!(
        dyn_d.dns_query("api.github.com"),
        DnsDecision::Forward(Verdict {
            reason: Reason::DnsAnswered,
            rule: Some(_),
            ..
        })
    ));
    assert_eq!(
        dyn_d.dns_query("evil.example.net"),
        DnsDecision::Answer {
            rcode: ResponseCode::Refused,
            verdict: Verdict::of(Reason::NotAllowlisted)
        }
    );
    assert!(dyn_d.keep_dns_answer("10.20.0.9".parse().unwrap()));
    assert!(!dyn_d.keep_dns_answer("10.0.2.2".parse().unwrap()));
    assert!(!dyn_d.keep_dns_answer("192.168.1.1".parse().unwrap()));
    let b = d.policy().ttl_bounds();
    assert_eq!(dyn_d.dns_ttl_bounds(), Some((b.min, b.max)));
    // The platform-only decider keeps the defaults: forward everything.
    let p = crate::decide::PlatformDecider::new(platform());
    let dyn_p: &dyn Decider = &p;
    assert_eq!(
        dyn_p.dns_query("evil.example.net"),
        DnsDecision::Forward(Verdict::of(Reason::DnsAnswered))
    );
    assert_eq!(dyn_p.dns_ttl_bounds(), None);
}

#[test]
fn keep_addr_with_a_real_private_answer_empties_it() {
    use sluice_inspect::dns::{parse_query, sanitize_response};
    let p = policy();
    let plat = platform();
    // dig's query for private.example.com and dnsmasq's answer (10.0.0.5).
    let q = parse_query(&testdata("dns/dig-private.bin")).unwrap();
    let s = sanitize_response(
        &q,
        &testdata("dns/dnsmasq-private.bin"),
        keep_addr(&p, &plat),
        false,
    )
    .unwrap();
    assert!(s.private_answer(), "{s:?}");
    // The public answer for www.example.com is kept.
    let q = parse_query(&testdata("dns/dig-a.bin")).unwrap();
    let s = sanitize_response(
        &q,
        &testdata("dns/dnsmasq-a.bin"),
        keep_addr(&p, &plat),
        false,
    )
    .unwrap();
    assert!(!s.private_answer());
    let kept: Vec<IpAddr> = s.answers.iter().map(|a| a.1).collect();
    assert_eq!(kept, vec![WWW.parse::<IpAddr>().unwrap()]);
}

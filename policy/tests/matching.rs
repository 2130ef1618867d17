//! Behaviour of the compiled policy: wildcard semantics, normalisation,
//! deny-over-allow, destinations, the platform deny set, UDP, DNS answers,
//! secrets and inspection, version hashes.

#![allow(clippy::unwrap_used, reason = "test helpers: a panic is a failed test")]

use std::net::IpAddr;

use sluice_policy::{
    CompileOptions, CompiledPolicy, Decision, PortProtocol, Reason, SecretSource, Transport,
    Upstream, from_domains, from_yaml_str,
};

const POLICY: &str = r#"
version: 1
id: test-policy
label: "matching tests"
allow:
  - id: openai
    domain: api.openai.com
  - domain: "*.pythonhosted.org"
  - domain: "**.github.com"
    ports: [443, 22]
  - domain: plain.example.com
    ports: [80, 8080]
  - domain: "**.bücher.example"
  - domains: [a.example.net, b.example.net]
    ports: [443, 5432]
  - domain: ntp.example.org
    ports: []
    udp_ports: [123]
  - id: db
    cidr: 203.0.113.77/24
    ports: [5432]
  - cidrs: ["2001:db8:1::/48", 10.99.0.0/16]
    ports: [443]
    udp_ports: [443, 4789]
deny:
  - evil.github.com
  - "**.corp.github.com"
  - "*.tk"
internal:
  - 10.20.0.0/16
ports:
  tls: [8443]
  http: [8080]
inspect:
  - "*.inspected.example"
dns:
  upstream: [192.0.2.53, "[2001:db8::53]:5353"]
  ttl_min: 10
  ttl_max: 600
secrets:
  - name: openai
    placeholder: sk-sluice-placeholder-openai
    env: OPENAI_API_KEY
    hosts: [API.OpenAI.com.]
  - name: gh
    placeholder: ghp-sluice-placeholder
    file: /run/secrets/gh
    hosts: [api.github.com, api.openai.com]
    locations: [headers, query]
"#;

fn policy() -> CompiledPolicy {
    let mut opts = CompileOptions::default();
    opts.host_addresses = vec![
        "198.51.100.10".parse().unwrap(),
        "2001:db8:ffff::10".parse().unwrap(),
    ];
    from_yaml_str(POLICY, "test.yaml", &opts).unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn wildcard_semantics_table() {
    let p = policy();
    // (name, verdict reason, matched pattern)
    let table: &[(&str, Reason, Option<&str>)] = &[
        (
            "api.openai.com",
            Reason::Allowlisted,
            Some("api.openai.com"),
        ),
        ("www.openai.com", Reason::NotAllowlisted, None),
        ("openai.com", Reason::NotAllowlisted, None),
        ("x.api.openai.com", Reason::NotAllowlisted, None),
        ("pythonhosted.org", Reason::NotAllowlisted, None),
        (
            "files.pythonhosted.org",
            Reason::Allowlisted,
            Some("*.pythonhosted.org"),
        ),
        (
            "a.b.pythonhosted.org",
            Reason::Allowlisted,
            Some("*.pythonhosted.org"),
        ),
        ("evilpythonhosted.org", Reason::NotAllowlisted, None),
        ("github.com", Reason::Allowlisted, Some("**.github.com")),
        ("api.github.com", Reason::Allowlisted, Some("**.github.com")),
        ("x.y.github.com", Reason::Allowlisted, Some("**.github.com")),
        ("github.com.evil.io", Reason::NotAllowlisted, None),
        ("notgithub.com", Reason::NotAllowlisted, None),
        (
            "evil.github.com",
            Reason::Denylisted,
            Some("evil.github.com"),
        ),
        (
            "x.evil.github.com",
            Reason::Allowlisted,
            Some("**.github.com"),
        ),
        (
            "corp.github.com",
            Reason::Denylisted,
            Some("**.corp.github.com"),
        ),
        (
            "a.corp.github.com",
            Reason::Denylisted,
            Some("**.corp.github.com"),
        ),
        ("anything.tk", Reason::Denylisted, Some("*.tk")),
        (
            "xn--bcher-kva.example",
            Reason::Allowlisted,
            Some("**.xn--bcher-kva.example"),
        ),
        (
            "shop.XN--BCHER-KVA.example.",
            Reason::Allowlisted,
            Some("**.xn--bcher-kva.example"),
        ),
        ("bücher.example", Reason::NotAllowlisted, None), // wire names are A-labels
        ("", Reason::NotAllowlisted, None),
        ("a..github.com", Reason::NotAllowlisted, None),
    ];
    for (name, reason, pattern) in table {
        let v = p.check_name(name);
        assert_eq!(v.reason, *reason, "{name}");
        assert_eq!(v.decision, reason.decision(), "{name}");
        assert_eq!(v.rule.map(|r| r.pattern), *pattern, "{name}");
        if let Some(r) = v.rule {
            assert_eq!(r.name, Some(*name));
        }
    }
}

#[test]
fn normalisation_case_and_trailing_dot() {
    let p = policy();
    for n in ["API.OPENAI.COM", "api.openai.com.", "Api.OpenAI.Com."] {
        let v = p.check_name(n);
        assert_eq!(v.reason, Reason::Allowlisted, "{n}");
        assert_eq!(v.rule.unwrap().id, "openai");
    }
}

#[test]
fn rule_ids_default_to_position() {
    let p = policy();
    assert_eq!(
        p.check_name("files.pythonhosted.org").rule.unwrap().id,
        "allow[1]"
    );
    assert_eq!(p.check_name("evil.github.com").rule.unwrap().id, "deny[0]");
    assert_eq!(p.check_name("b.example.net").rule.unwrap().id, "allow[5]");
}

#[test]
fn destination_checks() {
    let p = policy();
    let pub_ip = ip("140.82.112.3");
    type Case<'a> = (IpAddr, u16, &'a [&'a str], Reason, Option<&'a str>);
    let cases: &[Case<'_>] = &[
        (
            pub_ip,
            443,
            &["api.github.com"],
            Reason::Allowlisted,
            Some("**.github.com"),
        ),
        (
            pub_ip,
            22,
            &["api.github.com"],
            Reason::Allowlisted,
            Some("**.github.com"),
        ),
        (
            pub_ip,
            80,
            &["api.github.com"],
            Reason::PortNotAllowed,
            Some("**.github.com"),
        ),
        (
            pub_ip,
            443,
            &["evil.github.com"],
            Reason::Denylisted,
            Some("evil.github.com"),
        ),
        (pub_ip, 443, &[], Reason::IpNotResolvedForName, None),
        (
            pub_ip,
            443,
            &["unknown.example"],
            Reason::NotAllowlisted,
            None,
        ),
        // The first name allowed on the port wins; a denied alias does not spoil it.
        (
            pub_ip,
            443,
            &["evil.github.com", "api.github.com"],
            Reason::Allowlisted,
            Some("**.github.com"),
        ),
        // Port miss is reported before a deny when no name fits.
        (
            pub_ip,
            80,
            &["evil.github.com", "api.github.com"],
            Reason::PortNotAllowed,
            Some("**.github.com"),
        ),
        (
            pub_ip,
            5432,
            &["a.example.net"],
            Reason::Allowlisted,
            Some("a.example.net"),
        ),
        (
            pub_ip,
            8080,
            &["plain.example.com"],
            Reason::Allowlisted,
            Some("plain.example.com"),
        ),
        // CIDR rule, canonicalised from 203.0.113.77/24 (documentation space opened by the rule).
        (
            ip("203.0.113.5"),
            5432,
            &[],
            Reason::CidrAllowed,
            Some("203.0.113.0/24"),
        ),
        (
            ip("203.0.113.5"),
            443,
            &[],
            Reason::IpNotResolvedForName,
            None,
        ),
        (
            ip("2001:db8:1::5"),
            443,
            &[],
            Reason::CidrAllowed,
            Some("2001:db8:1::/48"),
        ),
        (
            ip("10.99.1.1"),
            443,
            &[],
            Reason::CidrAllowed,
            Some("10.99.0.0/16"),
        ),
        // Private space: denied unless CIDR or internal names it.
        (
            ip("10.1.2.3"),
            443,
            &["api.github.com"],
            Reason::PrivateDestination,
            None,
        ),
        (
            ip("192.168.1.1"),
            443,
            &["api.github.com"],
            Reason::PrivateDestination,
            None,
        ),
        (
            ip("100.64.0.1"),
            443,
            &["api.github.com"],
            Reason::PrivateDestination,
            None,
        ),
        (
            ip("fd12::1"),
            443,
            &["api.github.com"],
            Reason::PrivateDestination,
            None,
        ),
        (
            ip("10.20.3.4"),
            443,
            &["api.github.com"],
            Reason::Allowlisted,
            Some("**.github.com"),
        ),
        // Platform deny set: nothing opens it.
        (
            ip("127.0.0.1"),
            443,
            &["api.github.com"],
            Reason::PlatformDenied,
            None,
        ),
        (
            ip("169.254.169.254"),
            80,
            &["plain.example.com"],
            Reason::PlatformDenied,
            None,
        ),
        (
            ip("fd00:ec2::254"),
            443,
            &["api.github.com"],
            Reason::PlatformDenied,
            None,
        ),
        (
            ip("::ffff:127.0.0.1"),
            443,
            &["api.github.com"],
            Reason::PlatformDenied,
            None,
        ),
        (
            ip("0.0.0.0"),
            443,
            &["api.github.com"],
            Reason::PlatformDenied,
            None,
        ),
        (
            ip("224.0.0.1"),
            443,
            &["api.github.com"],
            Reason::PlatformDenied,
            None,
        ),
        (
            ip("255.255.255.255"),
            443,
            &["api.github.com"],
            Reason::PlatformDenied,
            None,
        ),
        (
            ip("198.51.100.10"),
            443,
            &["api.github.com"],
            Reason::PlatformDenied,
            None,
        ),
        (
            ip("::ffff:198.51.100.10"),
            443,
            &["api.github.com"],
            Reason::PlatformDenied,
            None,
        ),
        (
            ip("2001:db8:ffff::10"),
            443,
            &["api.github.com"],
            Reason::PlatformDenied,
            None,
        ),
    ];
    for (addr, port, names, reason, pattern) in cases {
        let v = p.check_destination(*addr, *port, names);
        assert_eq!(v.reason, *reason, "{addr}:{port} {names:?}");
        assert_eq!(
            v.rule.map(|r| r.pattern),
            *pattern,
            "{addr}:{port} {names:?}"
        );
    }
}

#[test]
fn udp_checks() {
    let p = policy();
    let pub_ip = ip("192.0.43.10");
    let v = p.check_udp(pub_ip, 123, &["ntp.example.org"]);
    assert_eq!(
        (v.decision, v.reason),
        (Decision::Allow, Reason::Allowlisted)
    );
    assert_eq!(
        p.check_udp(pub_ip, 443, &["api.github.com"]).reason,
        Reason::QuicBlocked
    );
    assert_eq!(
        p.check_udp(pub_ip, 53, &["api.github.com"]).reason,
        Reason::UdpBlocked
    );
    assert_eq!(p.check_udp(pub_ip, 123, &[]).reason, Reason::UdpBlocked);
    assert_eq!(
        p.check_udp(ip("10.99.0.1"), 4789, &[]).reason,
        Reason::CidrAllowed
    );
    assert_eq!(
        p.check_udp(ip("127.0.0.53"), 53, &[]).reason,
        Reason::PlatformDenied
    );
    // The TCP view of a UDP-only rule.
    assert_eq!(
        p.check_destination(pub_ip, 123, &["ntp.example.org"])
            .reason,
        Reason::PortNotAllowed
    );
}

#[test]
fn dns_answer_filter() {
    let p = policy();
    let cases = [
        ("140.82.112.3", Reason::DnsAnswered),
        ("10.20.0.9", Reason::DnsAnswered),
        ("10.99.0.9", Reason::DnsAnswered),
        ("10.1.0.9", Reason::PrivateAnswer),
        ("172.16.0.1", Reason::PrivateAnswer),
        ("::ffff:10.20.0.9", Reason::PrivateAnswer),
        ("fc00::1", Reason::PrivateAnswer),
        ("127.0.0.1", Reason::PlatformDenied),
        ("::1", Reason::PlatformDenied),
        ("169.254.169.254", Reason::PlatformDenied),
        ("198.51.100.10", Reason::PlatformDenied),
    ];
    for (a, want) in cases {
        assert_eq!(p.check_dns_answer(ip(a)).reason, want, "{a}");
    }
    assert!(p.internal_allows(ip("10.20.1.1")));
    assert!(!p.internal_allows(ip("10.21.1.1")));
    assert!(p.is_platform_denied(ip("198.51.100.10")));
    assert!(!p.is_platform_denied(ip("198.51.100.11")));
}

#[test]
fn ports_resolvers_ttl_and_ids() {
    let p = policy();
    assert_eq!(p.port_protocol(443), PortProtocol::Tls);
    assert_eq!(p.port_protocol(8443), PortProtocol::Tls);
    assert_eq!(p.port_protocol(80), PortProtocol::Http);
    assert_eq!(p.port_protocol(8080), PortProtocol::Http);
    assert_eq!(p.port_protocol(22), PortProtocol::Tcp);
    assert!(p.is_tls_port(443) && !p.is_tls_port(80));
    assert_eq!(
        p.upstream_resolvers(),
        &Upstream::Servers(vec![
            "192.0.2.53:53".parse().unwrap(),
            "[2001:db8::53]:5353".parse().unwrap()
        ])
    );
    assert_eq!(p.ttl_bounds().min.as_secs(), 10);
    assert_eq!(p.ttl_bounds().max.as_secs(), 600);
    assert_eq!(
        p.ttl_bounds().clamp(std::time::Duration::ZERO).as_secs(),
        10
    );
    assert_eq!(p.id(), "test-policy");
    assert_eq!(p.label(), Some("matching tests"));
    assert!(p.version_hash().starts_with("sha256:") && p.version_hash().len() == 23);
}

#[test]
fn secrets_and_inspection() {
    let p = policy();
    let names: Vec<&str> = p
        .secrets_for_host("API.openai.com")
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(names, ["openai", "gh"]);
    let gh: Vec<_> = p.secrets_for_host("api.github.com").collect();
    assert_eq!(gh.len(), 1);
    assert_eq!(gh[0].source, SecretSource::File("/run/secrets/gh".into()));
    assert!(gh[0].locations.headers && gh[0].locations.query && !gh[0].locations.body);
    let openai = &p.secrets()[0];
    assert_eq!(openai.source, SecretSource::Env("OPENAI_API_KEY".into()));
    assert!(openai.locations.headers && !openai.locations.query && !openai.locations.body);
    assert_eq!(openai.hosts, ["api.openai.com"]);
    assert_eq!(p.secrets_for_host("github.com").count(), 0);
    assert_eq!(p.secrets_for_host("not a name").count(), 0);

    assert!(p.inspect_host("api.openai.com"));
    assert!(p.inspect_host("API.GITHUB.COM."));
    assert!(p.inspect_host("x.inspected.example"));
    assert!(!p.inspect_host("inspected.example"));
    assert!(!p.inspect_host("github.com"));
    let pats: Vec<String> = p
        .inspected_patterns()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        pats,
        ["*.inspected.example", "api.openai.com", "api.github.com"]
    );
}

#[test]
fn websocket_opt_in_is_per_secret_and_needs_every_bound_secret() {
    let src = |ws_a: &str, ws_b: &str| {
        format!(
            "version: 1\nid: w\nallow:\n  - domains: [one.example.com, two.example.com, free.example.com]\n\
             secrets:\n  - name: a\n    placeholder: sk-ph-aaaaaaaa\n    env: A\n    hosts: [one.example.com, two.example.com]\n{ws_a}\
             \n  - name: b\n    placeholder: sk-ph-bbbbbbbb\n    env: B\n    hosts: [two.example.com]\n{ws_b}\n"
        )
    };
    let compile = |text: String| from_yaml_str(&text, "w", &CompileOptions::default()).unwrap();

    // Default: no secret opted in; a host without secrets is not concerned.
    let none = compile(src("", ""));
    assert!(none.secrets().iter().all(|s| !s.websocket));
    assert!(!none.websocket_allowed("one.example.com"));
    assert!(!none.websocket_allowed("two.example.com"));
    assert!(none.websocket_allowed("free.example.com"));

    // `a` opted in: its host alone is open; the host `b` shares is not.
    let a_only = compile(src("    websocket: true", ""));
    assert!(a_only.secrets()[0].websocket && !a_only.secrets()[1].websocket);
    assert!(a_only.websocket_allowed("ONE.example.com."));
    assert!(!a_only.websocket_allowed("two.example.com"));

    let both = compile(src("    websocket: true", "    websocket: true"));
    assert!(both.websocket_allowed("one.example.com"));
    assert!(both.websocket_allowed("two.example.com"));

    // `websocket: false` is the default, the hash says so; opting in is a
    // policy change.
    let explicit_false = compile(src("    websocket: false", "    websocket: false"));
    assert!(!explicit_false.websocket_allowed("one.example.com"));
    assert_eq!(none.version_hash(), explicit_false.version_hash());
    assert_ne!(none.version_hash(), a_only.version_hash());
    assert_ne!(a_only.version_hash(), both.version_hash());
}

#[test]
fn version_hash_is_stable_under_formatting_and_changes_with_content() {
    let a = from_yaml_str(
        "version: 1\nid: h\nallow:\n  - domain: Example.COM.\n",
        "a",
        &CompileOptions::default(),
    )
    .unwrap();
    let b = from_yaml_str(
        "# comment\nid: h\nversion: 1\nallow:\n- {domain: example.com, ports: [443]}\n",
        "b",
        &CompileOptions::default(),
    )
    .unwrap();
    let c = from_yaml_str(
        "version: 1\nid: h\nallow:\n  - domain: example.com\n    ports: [8443]\n",
        "c",
        &CompileOptions::default(),
    )
    .unwrap();
    assert_eq!(a.version_hash(), b.version_hash());
    assert_ne!(a.version_hash(), c.version_hash());
}

#[test]
fn allow_domain_helper_and_default_policy() {
    let p = from_domains(&["example.com", "*.pypi.org"], &CompileOptions::default()).unwrap();
    assert!(p.check_name("example.com").is_allowed());
    assert!(p.check_name("files.pypi.org").is_allowed());
    assert!(!p.check_name("pypi.org").is_allowed());
    assert_eq!(
        p.check_destination(ip("93.184.215.14"), 443, &["example.com"])
            .reason,
        Reason::Allowlisted
    );
    assert_eq!(
        p.check_destination(ip("93.184.215.14"), 80, &["example.com"])
            .reason,
        Reason::PortNotAllowed
    );
    let err = from_domains(&["*.com"], &CompileOptions::default()).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("--allow-domain: `*.com` puts a wildcard"),
        "{err}"
    );

    let d = sluice_policy::default_policy(&CompileOptions::default()).unwrap();
    assert_eq!(d.id(), "sluice-default");
    assert_eq!(d.check_name("example.com").reason, Reason::NotAllowlisted);
    assert_eq!(
        d.check_destination(ip("93.184.215.14"), 443, &[]).reason,
        Reason::IpNotResolvedForName
    );
    assert_eq!(d.upstream_resolvers(), &Upstream::System);
}

#[test]
fn deny_wins_over_any_allow_regardless_of_order() {
    let src = "version: 1\nid: d\ndeny:\n  - \"**.example.com\"\nallow:\n  - domain: www.example.com\n  - domain: \"*.example.com\"\n  - domain: \"**.example.com\"\n";
    let p = from_yaml_str(src, "d", &CompileOptions::default()).unwrap();
    for n in ["example.com", "www.example.com", "a.b.example.com"] {
        assert_eq!(p.check_name(n).reason, Reason::Denylisted, "{n}");
        assert_eq!(
            p.check_destination(ip("93.184.215.14"), 443, &[n]).reason,
            Reason::Denylisted,
            "{n}"
        );
    }
}

#[test]
fn allow_domain_yaml_cannot_be_injected() {
    // An argument trying to smuggle a second rule stays one (invalid) scalar.
    let evil = "a.example.com\"\n  - cidr: 0.0.0.0/0\n    ports: [22]\n#";
    let err = from_domains(&[evil], &CompileOptions::default()).unwrap_err();
    assert_eq!(err.len(), 1, "{err}");
    assert!(err.to_string().contains("is not a valid domain"), "{err}");
    let empty = from_domains(&[], &CompileOptions::default()).unwrap();
    assert_eq!(
        empty.check_name("example.com").reason,
        Reason::NotAllowlisted
    );
    assert_eq!(empty.domain_rule_count(), 0);
}

#[test]
fn large_policies_are_accepted() {
    // Beyond the YAML parser's default node budget (250k nodes): 12k rules
    // of 23 nodes each.
    let mut src = String::from("version: 1\nid: big\nallow:\n");
    for i in 0..12_000 {
        src.push_str(&format!(
            "  - domain: h{i}.example.com\n    ports: [{}]\n",
            (1..=20)
                .map(|p| (1000 + p).to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let p = from_yaml_str(&src, "big.yaml", &CompileOptions::default()).unwrap();
    assert_eq!(p.domain_rule_count(), 12_000);
    assert!(p.check_name("h11999.example.com").is_allowed());
    assert!(!p.check_name("h12000.example.com").is_allowed());
}

/// A random policy and random names, checked against a naive reading of the
/// matching rules (normalise, then walk from the full name down to its
/// shortest suffix, rule by rule): reason, rule id and pattern must agree
/// for every check. Guards the name table's hashing, Bloom filter, depth
/// skipping, case-insensitive compare and rule order.
#[test]
fn name_table_agrees_with_a_naive_walk() {
    #[derive(Clone, Copy, PartialEq)]
    enum Kind {
        Exact,
        Sub,
        Apex,
    }
    struct Pat {
        kind: Kind,
        base: String,
        id: String,
        ports: Vec<u16>,
    }
    // xorshift64*: deterministic.
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut rnd = |n: usize| {
        seed ^= seed >> 12;
        seed ^= seed << 25;
        seed ^= seed >> 27;
        usize::try_from(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) % n as u64).unwrap()
    };
    const LABELS: [&str; 8] = ["a", "b", "www", "x-y", "_srv", "api0", "c", "ab"];
    const APEXES: [&str; 4] = ["ex.test", "ex2.test", "deep.ex.test", "test"];
    let base = |rnd: &mut dyn FnMut(usize) -> usize, wild: bool| {
        let mut parts: Vec<&str> = (0..rnd(3)).map(|_| LABELS[rnd(LABELS.len())]).collect();
        // A wildcard may not sit over a public suffix (`test`).
        parts.push(APEXES[rnd(if wild { 3 } else { 4 })]);
        parts.join(".")
    };
    for round in 0..40 {
        let mut pats: Vec<Pat> = Vec::new();
        let mut denies: Vec<Pat> = Vec::new();
        let mut yaml = format!("version: 1\nid: diff{round}\nallow:\n");
        for i in 0..(5 + rnd(40)) {
            let kind = [Kind::Exact, Kind::Sub, Kind::Apex][rnd(3)];
            let b = base(&mut rnd, kind != Kind::Exact);
            let ports: Vec<u16> = match rnd(3) {
                0 => vec![443],
                1 => vec![80, 443],
                _ => vec![8443],
            };
            let prefix = ["", "*.", "**."][kind as usize];
            yaml.push_str(&format!(
                "  - domain: \"{prefix}{b}\"\n    ports: {ports:?}\n"
            ));
            pats.push(Pat {
                kind,
                base: b,
                id: format!("allow[{i}]"),
                ports,
            });
        }
        yaml.push_str("deny:\n");
        for i in 0..(1 + rnd(6)) {
            let kind = [Kind::Exact, Kind::Sub, Kind::Apex][rnd(3)];
            let b = base(&mut rnd, false);
            let prefix = ["", "*.", "**."][kind as usize];
            yaml.push_str(&format!("  - \"{prefix}{b}\"\n"));
            denies.push(Pat {
                kind,
                base: b,
                id: format!("deny[{i}]"),
                ports: vec![],
            });
        }
        let p = from_yaml_str(&yaml, "diff.yaml", &CompileOptions::default()).unwrap();

        // The naive walk: (reason, rule id) for `port` (None: any port).
        let naive = |name: &str, port: Option<u16>| -> (Reason, Option<String>) {
            let Ok(n) = sluice_policy::normalize_name(name) else {
                return (Reason::NotAllowlisted, None);
            };
            let n = n.as_str().to_owned();
            let mut levels = vec![(n.clone(), true)];
            let mut rest = n.as_str();
            while let Some(dot) = rest.find('.') {
                rest = &rest[dot + 1..];
                levels.push((rest.to_owned(), false));
            }
            let applies = |pat: &Pat, level: &str, exact: bool| {
                pat.base == level
                    && match pat.kind {
                        Kind::Exact => exact,
                        Kind::Sub => !exact,
                        Kind::Apex => true,
                    }
            };
            let mut allowed = None;
            let mut filtered = None;
            for (level, exact) in &levels {
                if let Some(d) = denies.iter().find(|d| applies(d, level, *exact)) {
                    return (Reason::Denylisted, Some(d.id.clone()));
                }
                if allowed.is_some() {
                    continue;
                }
                for a in pats.iter().filter(|a| applies(a, level, *exact)) {
                    if port.is_none_or(|pt| a.ports.contains(&pt)) {
                        allowed = Some(a.id.clone());
                        break;
                    }
                    if filtered.is_none() {
                        filtered = Some(a.id.clone());
                    }
                }
            }
            match (allowed, filtered) {
                (Some(a), _) => (Reason::Allowlisted, Some(a)),
                (None, Some(f)) => (Reason::PortNotAllowed, Some(f)),
                (None, None) => (Reason::NotAllowlisted, None),
            }
        };

        for _ in 0..400 {
            let mut name = base(&mut rnd, false);
            for _ in 0..rnd(3) {
                name = format!("{}.{name}", LABELS[rnd(LABELS.len())]);
            }
            match rnd(12) {
                0 => name = name.to_uppercase(),
                1 => name.push('.'),
                2 => name = format!("{name}.."),
                3 => name = format!(".{name}"),
                4 => name = name.replacen('.', "..", 1),
                5 => name = format!("{}.{name}", "q".repeat(63 + rnd(2))),
                6 => name = format!("a b.{name}"),
                7 => name = format!("Ü.{name}"),
                _ => {}
            }
            let v = p.check_name(&name);
            let (reason, id) = naive(&name, None);
            assert_eq!(
                (v.reason, v.rule.map(|r| r.id.to_owned())),
                (reason, id),
                "check_name({name:?}) in\n{yaml}"
            );
            for port in [443, 80, 8443, 22] {
                let v = p.check_name_port(&name, Transport::Tcp, port);
                let (reason, id) = naive(&name, Some(port));
                assert_eq!(
                    (v.reason, v.rule.map(|r| r.id.to_owned())),
                    (reason, id),
                    "check_name_port({name:?}, {port}) in\n{yaml}"
                );
            }
        }
    }
}

/// Cloud host services: a `cidr` rule or `internal` entry around them opens
/// their neighbours, never them; a DNS answer pointing at them is refused
/// like a link-local one.
#[test]
fn cloud_host_services_cannot_be_opened_by_any_rule() {
    const CLOUD: &str = r#"
version: 1
id: cloud
allow:
  - cidrs: [168.63.0.0/16, 161.0.0.0/8, 166.0.0.0/8, 183.60.0.0/16, 192.0.0.0/24]
    ports: [80, 443, 32526]
    udp_ports: [53, 123]
  - cidrs: ["fd00::/8", "fd20::/16"]
    ports: [80]
internal:
  - 100.64.0.0/10
  - fd00::/8
"#;
    let p = from_yaml_str(CLOUD, "cloud.yaml", &CompileOptions::default()).unwrap();
    let services = [
        "168.63.129.16",
        "100.100.100.200",
        "100.100.2.136",
        "100.100.2.138",
        "100.100.100.100",
        "183.60.83.19",
        "183.60.82.98",
        "192.0.0.192",
        "161.26.0.10",
        "161.26.255.255",
        "166.8.0.1",
        "166.11.255.254",
        "fd00:ec2::254",
        "fd00:ec2::253",
        "fd00:ec2::123",
        "fd00:ec2::23",
        "fd20:ce::254",
        "fd00:a9fe:a9fe::1",
        "fd00:42::42",
        // Embedded forms are classified by the IPv4 address.
        "::ffff:168.63.129.16",
        "64:ff9b::a83f:8110",
    ];
    for a in services {
        let addr = ip(a);
        for port in [80, 443, 32526] {
            let v = p.check_destination(addr, port, &["anything.example"]);
            assert_eq!(v.reason, Reason::PlatformDenied, "{a}:{port}");
            assert_eq!(v.decision, Decision::Deny, "{a}:{port}");
        }
        assert_eq!(p.check_udp(addr, 53, &[]).reason, Reason::PlatformDenied);
        assert_eq!(p.check_dns_answer(addr).reason, Reason::PlatformDenied);
        assert!(p.is_platform_denied(addr), "{a}");
    }
    // The neighbours are opened by the same rules.
    for a in [
        "168.63.129.15",
        "168.63.129.17",
        "161.25.255.255",
        "161.27.0.0",
        "166.7.255.255",
        "166.12.0.0",
        "183.60.83.18",
        "192.0.0.193",
    ] {
        let v = p.check_destination(ip(a), 443, &[]);
        assert_eq!(v.reason, Reason::CidrAllowed, "{a}");
        assert!(!p.is_platform_denied(ip(a)), "{a}");
    }
    for a in ["fd00:ec2::255", "fd00:ec2::252", "fd20:ce::253"] {
        assert_eq!(
            p.check_destination(ip(a), 80, &[]).reason,
            Reason::CidrAllowed,
            "{a}"
        );
    }
    for a in ["100.100.100.201", "100.100.2.137", "fd00:ec2::255"] {
        assert_eq!(p.check_dns_answer(ip(a)).reason, Reason::DnsAnswered, "{a}");
    }
}

//! Every policy error message, snapshot-style: each case is a small policy
//! and the exact `file:line:col: message` lines it must produce.

#![allow(clippy::unwrap_used, reason = "test helpers: a panic is a failed test")]

use sluice_policy::{CompileOptions, from_yaml_str};

fn errors_of(src: &str) -> Vec<String> {
    match from_yaml_str(src, "p.yaml", &CompileOptions::default()) {
        Ok(_) => vec!["<compiled>".to_owned()],
        Err(e) => e.errors().iter().map(ToString::to_string).collect(),
    }
}

/// Cases: (policy text, expected error lines).
const CASES: &[(&str, &[&str])] = &[
    // --- YAML structure, types, unknown and duplicate keys ---
    (
        "",
        &[
            "p.yaml:1:1: unexpected end of input; a policy needs at least `version: 1` and `id: NAME`",
        ],
    ),
    (
        "- 1\n",
        &[
            "p.yaml:1:1: expected a mapping (`key: value` lines); a policy starts with `version: 1` and `id: NAME`",
        ],
    ),
    ("version: 1\n", &["p.yaml:1:1: missing required key `id`"]),
    (
        "version: 1\nid: t\nbogus: 1\n",
        &[
            "p.yaml:3:1: unknown field `bogus`, expected one of version, id, label, comment, allow, deny, internal, ports, inspect, dns, secrets, unlisted, approval",
        ],
    ),
    (
        "version: 1\nid: t\nallow:\n  - domain: a.example.com\n    portz: [443]\n",
        &[
            "p.yaml:5:5: unknown field `portz`, expected one of id, domain, domains, cidr, cidrs, ports, udp_ports, comment",
        ],
    ),
    (
        "version: 1\nid: t\nlabel: a\nlabel: b\n",
        &["p.yaml:4:1: duplicate key `label`; each key may appear only once in a mapping"],
    ),
    (
        "version: 1\nid: t\nallow:\n  - domain: a.example.com\n    ports: \"443\"\n",
        &["p.yaml:5:12: expected a list here: `[a, b]` or one `- item` per line"],
    ),
    (
        "version: 1\nid: t\nallow:\n  - 5\n",
        &["p.yaml:4:5: expected a mapping here (`key: value` lines)"],
    ),
    (
        "version: 1\nid: t\nlabel: [1]\n",
        &["p.yaml:3:8: expected a single string here"],
    ),
    (
        "version: 1\nid: t\nallow:\n  - domain: a.example.com\n    ports: [true]\n",
        &["p.yaml:5:13: expected a whole number here"],
    ),
    (
        "version: 1\nid: t\nallow:\n  - domain: a.example.com\n\tports: [1]\n",
        &["p.yaml:4:13: found a tab character; YAML indentation and separation must use spaces"],
    ),
    (
        "version: 1\nid: t\n---\nversion: 1\nid: u\n",
        &[
            "p.yaml:4:1: a policy file holds one YAML document; remove the `---` and what follows it",
        ],
    ),
    (
        "version: 1\nid: t\nsecrets:\n  - name: k\n",
        &["p.yaml:4:5: missing required key `placeholder`"],
    ),
    // --- top level ---
    (
        "version: 2\nid: t\n",
        &["p.yaml:1:10: unsupported policy version 2; this sluice reads `version: 1`"],
    ),
    (
        "version: \"1\"\nid: t\n",
        &[
            "p.yaml:1:10: `version` is the string \"1\", not a number; write `version: 1` without quotes",
        ],
    ),
    (
        "version: '1'\nid: t\n",
        &[
            "p.yaml:1:10: `version` is the string \"1\", not a number; write `version: 1` without quotes",
        ],
    ),
    (
        "version: 1.0\nid: t\n",
        &["p.yaml:1:10: `version` is 1.0, not a whole number; write `version: 1`"],
    ),
    (
        "version: [1]\nid: t\n",
        &["p.yaml:1:10: `version` is a list, not a number; write `version: 1`"],
    ),
    (
        "version: 1\nid: \"bad id\"\n",
        &["p.yaml:2:5: policy id `bad id` is invalid; use 1-64 characters from A-Z a-z 0-9 . _ -"],
    ),
    // --- domains ---
    (
        "version: 1\nid: t\nallow:\n  - domain: \"*\"\n",
        &[
            "p.yaml:4:13: bare wildcard `*` is not allowed; name a domain, e.g. `*.example.com` (subdomains) or `**.example.com` (apex and subdomains)",
        ],
    ),
    (
        "version: 1\nid: t\nallow:\n  - domain: \"**\"\n",
        &[
            "p.yaml:4:13: bare wildcard `**` is not allowed; name a domain, e.g. `*.example.com` (subdomains) or `**.example.com` (apex and subdomains)",
        ],
    ),
    (
        "version: 1\nid: t\nallow:\n  - domain: \"api*.example.com\"\n",
        &[
            "p.yaml:4:13: wildcard in `api*.example.com` is not allowed there; a wildcard may only be the whole first label: `*.example.com` or `**.example.com`",
        ],
    ),
    (
        "version: 1\nid: t\nallow:\n  - domain: \"a.*.example.com\"\n",
        &[
            "p.yaml:4:13: wildcard in `a.*.example.com` is not allowed there; a wildcard may only be the whole first label: `*.example.com` or `**.example.com`",
        ],
    ),
    (
        "version: 1\nid: t\nallow:\n  - domain: \"*.com\"\n",
        &[
            "p.yaml:4:13: `*.com` puts a wildcard directly over the public suffix `com` (anyone can register names under it); allow a registrable domain instead, e.g. `*.example.com`",
        ],
    ),
    (
        "version: 1\nid: t\nallow:\n  - domain: \"*.co.uk\"\n",
        &[
            "p.yaml:4:13: `*.co.uk` puts a wildcard directly over the public suffix `co.uk` (anyone can register names under it); allow a registrable domain instead, e.g. `*.example.co.uk`",
        ],
    ),
    (
        "version: 1\nid: t\nallow:\n  - domain: \"**.github.io\"\n",
        &[
            "p.yaml:4:13: `**.github.io` puts a wildcard directly over the public suffix `github.io` (anyone can register names under it); allow a registrable domain instead, e.g. `**.example.github.io`",
        ],
    ),
    (
        "version: 1\nid: t\nallow:\n  - domain: 203.0.113.7\n",
        &[
            "p.yaml:4:13: `203.0.113.7` is an IP address, not a domain; use a `cidr:` rule (e.g. `cidr: 203.0.113.7/32`) for addresses",
        ],
    ),
    (
        "version: 1\nid: t\nallow:\n  - domain: \"[2001:db8::1]\"\n",
        &[
            "p.yaml:4:13: `[2001:db8::1]` is an IP address, not a domain; use a `cidr:` rule (e.g. `cidr: 2001:db8::1/128`) for addresses",
        ],
    ),
    (
        "version: 1\nid: t\nallow:\n  - domain: \"a..example.com\"\n",
        &[
            "p.yaml:4:13: `a..example.com` is not a valid domain (empty label); a domain is dot-separated labels of 1-63 letters, digits, `-` or `_`, at most 253 characters",
        ],
    ),
    (
        "version: 1\nid: t\nallow:\n  - domain: \"a b.example.com\"\n",
        &[
            "p.yaml:4:13: `a b.example.com` is not a valid domain (invalid character: only A-Z a-z 0-9 - _ and . are allowed); a domain is dot-separated labels of 1-63 letters, digits, `-` or `_`, at most 253 characters",
        ],
    ),
    (
        "version: 1\nid: t\nallow:\n  - domain: 10.1\n",
        &["p.yaml:4:13: `10.1` ends in an all-numeric label; that is an address, not a domain"],
    ),
    (
        "version: 1\nid: t\ndeny:\n  - \"*\"\n",
        &[
            "p.yaml:4:5: bare wildcard `*` is not allowed; name a domain, e.g. `*.example.com` (subdomains) or `**.example.com` (apex and subdomains)",
        ],
    ),
    // --- allow rule shape ---
    (
        "version: 1\nid: t\nallow:\n  - ports: [443]\n",
        &[
            "p.yaml:4:5: allow rule names no destination; give exactly one of `domain`, `domains`, `cidr`, `cidrs`",
        ],
    ),
    (
        "version: 1\nid: t\nallow:\n  - domain: a.example.com\n    cidr: 203.0.113.0/24\n",
        &[
            "p.yaml:4:5: allow rule mixes destinations; give exactly one of `domain`, `domains`, `cidr`, `cidrs` (split it into several rules)",
        ],
    ),
    (
        "version: 1\nid: t\nallow:\n  - domains: []\n",
        &["p.yaml:4:5: `domains` is empty; list at least one domain"],
    ),
    (
        "version: 1\nid: t\nallow:\n  - domain: a.example.com\n    ports: []\n",
        &[
            "p.yaml:4:5: allow rule has an empty `ports` list and no `udp_ports`; omit `ports` for the default [443] or list ports",
        ],
    ),
    (
        "version: 1\nid: t\nallow:\n  - id: x\n    domain: a.example.com\n  - id: x\n    domain: b.example.com\n",
        &["p.yaml:6:9: rule id `x` is already used at line 4, column 9; ids must be unique"],
    ),
    // --- ports ---
    (
        "version: 1\nid: t\nallow:\n  - domain: a.example.com\n    ports: [0, 65536, -1, 443]\n",
        &[
            "p.yaml:5:13: port 0 is out of range; ports are 1..65535",
            "p.yaml:5:16: port 65536 is out of range; ports are 1..65535",
            "p.yaml:5:23: port -1 is out of range; ports are 1..65535",
        ],
    ),
    (
        "version: 1\nid: t\nports:\n  tls: [80]\n  http: [443]\n",
        &[
            "p.yaml:4:9: port 80 is always plain HTTP; it cannot be a TLS port",
            "p.yaml:5:10: port 443 is already a TLS port; a port is either `tls` or `http`, not both",
        ],
    ),
    // --- CIDRs ---
    (
        "version: 1\nid: t\nallow:\n  - cidr: 203.0.113.0/33\n",
        &[
            "p.yaml:4:11: `203.0.113.0/33` is not a CIDR network; write an address with a prefix length, e.g. `203.0.113.0/24` or `2001:db8::/32`",
        ],
    ),
    (
        "version: 1\nid: t\nallow:\n  - cidr: 127.0.0.0/8\n",
        &[
            "p.yaml:4:11: allow network `127.0.0.0/8` lies entirely in the platform deny set (loopback), which no rule can open; remove it",
        ],
    ),
    (
        "version: 1\nid: t\ninternal:\n  - 169.254.169.254\n",
        &[
            "p.yaml:4:5: internal network `169.254.169.254/32` lies entirely in the platform deny set (link_local), which no rule can open; remove it",
        ],
    ),
    (
        "version: 1\nid: t\nallow:\n  - cidr: 168.63.129.16/32\n",
        &[
            "p.yaml:4:11: allow network `168.63.129.16/32` lies entirely in the platform deny set (cloud_host_service), which no rule can open; remove it",
        ],
    ),
    (
        "version: 1\nid: t\ninternal:\n  - 161.26.0.0/16\n",
        &[
            "p.yaml:4:5: internal network `161.26.0.0/16` lies entirely in the platform deny set (cloud_host_service), which no rule can open; remove it",
        ],
    ),
    // --- dns ---
    (
        "version: 1\nid: t\ndns:\n  upstream: 5\n",
        &[
            "p.yaml:4:13: `upstream` must be `system` or a list of resolver addresses, e.g. [192.0.2.53, \"[2001:db8::53]:53\"]",
        ],
    ),
    (
        "version: 1\nid: t\ndns:\n  upstream: local\n",
        &[
            "p.yaml:4:13: `upstream: local` is not understood; write `system` or a list of resolver addresses such as [192.0.2.53, \"[2001:db8::53]:53\"]",
        ],
    ),
    (
        "version: 1\nid: t\ndns:\n  upstream: [1.1.1.1, bad]\n",
        &[
            "p.yaml:4:13: resolver `bad` is not an address; write `192.0.2.53`, `192.0.2.53:5353` or `[2001:db8::53]:53`",
        ],
    ),
    (
        "version: 1\nid: t\ndns:\n  upstream: [127.0.0.53, \"[::1]:5353\", 0.0.0.0, 192.0.2.53]\n",
        &[
            "p.yaml:4:13: resolver `127.0.0.53` is a loopback or unspecified address: the guest must never reach the host's own resolver; name a resolver on the network",
            "p.yaml:4:13: resolver `[::1]:5353` is a loopback or unspecified address: the guest must never reach the host's own resolver; name a resolver on the network",
            "p.yaml:4:13: resolver `0.0.0.0` is a loopback or unspecified address: the guest must never reach the host's own resolver; name a resolver on the network",
        ],
    ),
    (
        "version: 1\nid: t\ndns:\n  upstream: []\n",
        &[
            "p.yaml:4:13: `upstream` is an empty list; omit it (or write `system`) to use the host's /etc/resolv.conf",
        ],
    ),
    (
        "version: 1\nid: t\ndns:\n  ttl_min: 600\n  ttl_max: 60\n",
        &["p.yaml:4:12: ttl_min (600) is larger than ttl_max (60); ttl_min must be <= ttl_max"],
    ),
    (
        "version: 1\nid: t\ndns:\n  ttl_min: -1\n  ttl_max: 0\n",
        &[
            "p.yaml:4:12: ttl_min -1 is out of range; use 0..86400 seconds",
            "p.yaml:5:12: ttl_max 0 is out of range; use 1..604800 seconds",
        ],
    ),
    // --- secrets ---
    (SECRET_OK_HEAD, &["<compiled>"]),
];

const SECRET_OK_HEAD: &str = "version: 1
id: t
allow:
  - domain: api.example.com
secrets:
  - name: key
    placeholder: sk-placeholder-key
    env: KEY
    hosts: [api.example.com]
";

#[test]
fn every_error_message() {
    let mut failures = Vec::new();
    for (src, want) in CASES {
        let got = errors_of(src);
        if got != *want {
            failures.push(format!(
                "--- policy ---\n{src}--- want ---\n{}\n--- got ---\n{}\n",
                want.join("\n"),
                got.join("\n")
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

fn secret_errors(secrets: &str) -> Vec<String> {
    let src = format!(
        "version: 1\nid: t\nallow:\n  - domain: api.example.com\n  - domain: plain.example.com\n    ports: [80]\ndeny:\n  - bad.example.com\nsecrets:\n{secrets}"
    );
    errors_of(&src)
}

#[test]
fn secret_errors_table() {
    let cases: &[(&str, &[&str])] = &[
        (
            "  - name: a\n    placeholder: sk-aaaaaaaa\n    value: hunter2\n    hosts: [api.example.com]\n",
            &[
                "p.yaml:12:12: secret values are never written in the policy; use `env: VARIABLE` or `file: /absolute/path`",
            ],
        ),
        (
            "  - name: a\n    placeholder: sk-aaaaaaaa\n    hosts: [api.example.com]\n",
            &[
                "p.yaml:10:5: secret `a` has no source; add `env: VARIABLE` or `file: /absolute/path`",
            ],
        ),
        (
            "  - name: a\n    placeholder: sk-aaaaaaaa\n    env: A\n    file: /run/a\n    hosts: [api.example.com]\n",
            &["p.yaml:13:11: secret `a` has both `env` and `file`; give exactly one"],
        ),
        (
            "  - name: a\n    placeholder: sk-aaaaaaaa\n    env: 1A\n    hosts: [api.example.com]\n",
            &[
                "p.yaml:12:10: `1A` is not an environment variable name; use A-Z a-z 0-9 _ (not starting with a digit)",
            ],
        ),
        (
            "  - name: a\n    placeholder: sk-aaaaaaaa\n    file: run/a\n    hosts: [api.example.com]\n",
            &["p.yaml:12:11: secret file `run/a` must be an absolute path"],
        ),
        (
            "  - name: a\n    placeholder: short\n    env: A\n    hosts: [api.example.com]\n",
            &[
                "p.yaml:11:18: placeholder `short` is invalid; use at least 8 printable ASCII characters without spaces, e.g. `sk-sluice-placeholder-a`",
            ],
        ),
        (
            "  - name: a\n    placeholder: sk-aaaaaaaa\n    env: A\n    hosts: [api.example.com]\n  - name: b\n    placeholder: sk-aaaaaaaa\n    env: B\n    hosts: [api.example.com]\n",
            &[
                "p.yaml:15:18: placeholder `sk-aaaaaaaa` is already used by the secret at line 11, column 18; each secret needs its own placeholder",
            ],
        ),
        (
            "  - name: a\n    placeholder: sk-aaaaaaaa\n    env: A\n    hosts: [api.example.com]\n  - name: b\n    placeholder: sk-aaaaaaaa-2\n    env: B\n    hosts: [api.example.com]\n",
            &[
                "p.yaml:15:18: placeholder `sk-aaaaaaaa-2` and `sk-aaaaaaaa` (line 11, column 18) contain one another; substitution would be ambiguous, make neither a substring of the other",
            ],
        ),
        (
            "  - name: a\n    placeholder: sk-aaaaaaaa\n    env: A\n    hosts: [api.example.com]\n  - name: a\n    placeholder: sk-bbbbbbbb\n    env: B\n    hosts: [api.example.com]\n",
            &[
                "p.yaml:14:11: secret `a` is already declared at line 10, column 11; secret names must be unique",
            ],
        ),
        (
            "  - name: a\n    placeholder: sk-aaaaaaaa\n    env: A\n    hosts: [other.example.com, plain.example.com, bad.example.com, \"*.example.com\"]\n",
            &[
                "p.yaml:13:13: secret `a` is bound to `other.example.com`, which no allow rule reaches on a TLS port (no allow rule matches it); add an allow rule for `other.example.com` on 443 or bind the secret to an allowed host",
                "p.yaml:13:32: secret `a` is bound to `plain.example.com`, which no allow rule reaches on a TLS port (its allow rules name no TLS port); add an allow rule for `plain.example.com` on 443 or bind the secret to an allowed host",
                "p.yaml:13:51: secret `a` is bound to `bad.example.com`, which no allow rule reaches on a TLS port (it is denied by a deny rule); add an allow rule for `bad.example.com` on 443 or bind the secret to an allowed host",
                "p.yaml:13:68: `*.example.com`: secret hosts must be exact names (no wildcards), e.g. `api.example.com`",
            ],
        ),
        (
            "  - name: a\n    placeholder: sk-aaaaaaaa\n    env: A\n    hosts: []\n",
            &["p.yaml:10:5: secret `a` has no hosts; list the exact hosts it may be sent to"],
        ),
        (
            "  - name: a\n    placeholder: sk-aaaaaaaa\n    env: A\n    hosts: [api.example.com]\n    locations: [headers, cookies]\n",
            &["p.yaml:14:26: unknown secret location `cookies`; use `headers`, `query` or `body`"],
        ),
        (
            "  - name: a\n    placeholder: sk-aaaaaaaa\n    env: A\n    hosts: [api.example.com]\n    websocket: sometimes\n",
            &["p.yaml:14:16: expected `true` or `false` here"],
        ),
    ];
    let mut failures = Vec::new();
    for (secrets, want) in cases {
        let got = secret_errors(secrets);
        if got != *want {
            failures.push(format!(
                "--- secrets ---\n{secrets}--- want ---\n{}\n--- got ---\n{}\n",
                want.join("\n"),
                got.join("\n")
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn several_errors_are_all_reported_in_file_order() {
    let src = "version: 1\nid: t\nallow:\n  - domain: \"*.com\"\n  - domain: ok.example.com\n    ports: [0]\n  - cidr: nonsense\ndeny:\n  - \"x*.example.com\"\n";
    let got = errors_of(src);
    assert_eq!(got.len(), 4, "{got:#?}");
    let lines: Vec<&str> = got.iter().map(|l| l.split(':').nth(1).unwrap()).collect();
    assert_eq!(lines, ["4", "6", "7", "9"]);
}

#[test]
fn unreadable_file_has_origin_without_position() {
    let err = sluice_policy::load_file(
        std::path::Path::new("/nonexistent/slp-policy.yaml"),
        &CompileOptions::default(),
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with("/nonexistent/slp-policy.yaml: cannot read policy file: "),
        "{text}"
    );
}

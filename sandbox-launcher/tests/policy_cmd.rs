//! `sluice policy check` / `explain`, run as the built binary: exit codes and
//! output.

#![allow(clippy::unwrap_used, reason = "test helpers: a panic is a failed test")]

use std::path::PathBuf;
use std::process::{Command, Output};

const GOOD: &str = "version: 1
id: demo
allow:
  - domain: \"**.example.com\"
  - domain: plain.example.org
    ports: [80]
  - cidr: 203.0.113.0/24
    ports: [5432]
deny:
  - evil.example.com
secrets:
  - name: api
    placeholder: sk-sluice-placeholder-api
    env: API_KEY
    hosts: [api.example.com]
";

const BAD: &str = "version: 1
id: demo
allow:
  - domain: \"*.com\"
  - domain: ok.example.com
    ports: [0]
";

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("slp-cli-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
    fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn sluice(args: &[&str]) -> (i32, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .unwrap();
    (
        status.code().unwrap_or(-1),
        String::from_utf8(stdout).unwrap(),
        String::from_utf8(stderr).unwrap(),
    )
}

#[test]
fn check_valid_file_exits_0() {
    let t = TempDir::new("ok");
    let good = t.file("good.yaml", GOOD);
    let (code, out, err) = sluice(&["policy", "check", good.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with(&format!("{}: ok (id demo, version sha256:", good.display())),
        "{out}"
    );
    assert!(out.contains("3 domain rules"), "{out}");
    assert!(err.is_empty(), "{err}");
}

#[test]
fn check_invalid_file_prints_every_error_and_exits_1() {
    let t = TempDir::new("bad");
    let good = t.file("good.yaml", GOOD);
    let bad = t.file("bad.yaml", BAD);
    let (code, _out, err) = sluice(&[
        "policy",
        "check",
        good.to_str().unwrap(),
        bad.to_str().unwrap(),
    ]);
    assert_eq!(code, 1);
    let b = bad.display();
    let want = format!(
        "{b}:4:13: `*.com` puts a wildcard directly over the public suffix `com` (anyone can register names under it); allow a registrable domain instead, e.g. `*.example.com`\n\
         {b}:6:13: port 0 is out of range; ports are 1..65535\n\
         {b}: 2 errors\n"
    );
    assert_eq!(err, want);
}

#[test]
fn check_missing_file_exits_1() {
    let (code, _out, err) = sluice(&["policy", "check", "/nonexistent/slp.yaml"]);
    assert_eq!(code, 1);
    assert!(
        err.starts_with("/nonexistent/slp.yaml: cannot read policy file:"),
        "{err}"
    );
}

#[test]
fn explain_text_allow() {
    let t = TempDir::new("explain");
    let good = t.file("good.yaml", GOOD);
    let (code, out, err) = sluice(&[
        "policy",
        "explain",
        good.to_str().unwrap(),
        "--name",
        "API.example.com",
        "--ip",
        "93.184.215.14",
    ]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().skip(1).collect();
    assert_eq!(
        lines,
        [
            "name:        API.example.com (normalised: api.example.com)",
            "dns query:   allow (allowlisted) by rule allow[0] `**.example.com`",
            "port 443:    allow (allowlisted) by rule allow[0] `**.example.com` [tcp, TLS (SNI checked)]",
            "address:     93.184.215.14 (public)",
            "dns answer:  allow (dns_answered)",
            "connect:     allow (allowlisted) by rule allow[0] `**.example.com`",
            "inspect:     yes (secrets: api; websocket: refused, a secret did not opt in)",
            "verdict:     allow (allowlisted) by rule allow[0] `**.example.com`",
        ]
    );
}

#[test]
fn explain_json_deny_exits_3() {
    let t = TempDir::new("json");
    let good = t.file("good.yaml", GOOD);
    let (code, out, _) = sluice(&[
        "policy",
        "explain",
        good.to_str().unwrap(),
        "--name",
        "evil.example.com",
        "--json",
    ]);
    assert_eq!(code, 3);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["verdict"]["decision"], "deny");
    assert_eq!(v["verdict"]["reason"], "denylisted");
    assert_eq!(v["verdict"]["pattern"], "evil.example.com");
    assert_eq!(v["port_protocol"], "tls");

    let (code, out, _) = sluice(&[
        "policy",
        "explain",
        good.to_str().unwrap(),
        "--name",
        "www.example.com",
        "--port",
        "80",
        "--json",
    ]);
    assert_eq!(code, 3);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["verdict"]["reason"], "port_not_allowed");

    let (code, out, _) = sluice(&[
        "policy",
        "explain",
        good.to_str().unwrap(),
        "--ip",
        "127.0.0.1",
        "--name",
        "www.example.com",
        "--json",
    ]);
    assert_eq!(code, 3);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["verdict"]["reason"], "platform_denied");
    assert_eq!(v["address_class"], "loopback");
}

#[test]
fn explain_cidr_and_usage_errors() {
    let t = TempDir::new("cidr");
    let good = t.file("good.yaml", GOOD);
    let bad = t.file("bad.yaml", BAD);
    let (code, out, _) = sluice(&[
        "policy",
        "explain",
        good.to_str().unwrap(),
        "--ip",
        "203.0.113.9",
        "--port",
        "5432",
    ]);
    assert_eq!(code, 0);
    assert!(
        out.contains("verdict:     allow (cidr_allowed) by rule allow[2] `203.0.113.0/24`"),
        "{out}"
    );
    let (code, _, _) = sluice(&["policy", "explain", good.to_str().unwrap()]);
    assert_eq!(code, 2, "neither --name nor --ip is a usage error");
    let (code, _, err) = sluice(&[
        "policy",
        "explain",
        bad.to_str().unwrap(),
        "--name",
        "x.example.com",
    ]);
    assert_eq!(code, 1);
    assert!(err.contains("bad.yaml:4:13:"), "{err}");
}

#[test]
fn explain_says_would_ask_only_for_a_plain_miss() {
    let t = TempDir::new("ask");
    let ask = t.file(
        "ask.yaml",
        "version: 1\nid: ask\nunlisted: ask\napproval:\n  backend: terminal\nallow:\n  - domain: listed.example.com\ndeny:\n  - blocked.example.com\n",
    );
    let path = ask.to_str().unwrap();
    let (code, out, err) = sluice(&["policy", "explain", path, "--name", "new.example.org"]);
    assert_eq!(code, 3, "{err}");
    assert!(out.contains("unlisted:    would ask"), "{out}");
    for name in ["blocked.example.com", "listed.example.com", "co.uk"] {
        let (_, out, _) = sluice(&["policy", "explain", path, "--name", name, "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["would_ask"], false, "{name}");
    }
    let (_, out, _) = sluice(&[
        "policy",
        "explain",
        path,
        "--name",
        "new.example.org",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["would_ask"], true);
}

#[test]
fn explain_says_whether_websocket_passes_the_secrets() {
    let t = TempDir::new("ws");
    let opted = GOOD.replace(
        "    env: API_KEY\n",
        "    env: API_KEY\n    websocket: true\n",
    );
    let files = [
        (t.file("refused.yaml", GOOD), false),
        (t.file("opted.yaml", &opted), true),
    ];
    for (file, allowed) in &files {
        let (code, out, err) = sluice(&[
            "policy",
            "explain",
            file.to_str().unwrap(),
            "--name",
            "api.example.com",
            "--json",
        ]);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["websocket"], *allowed, "{out}");
    }
    // No secret bound: the field is absent.
    let (_, out, _) = sluice(&[
        "policy",
        "explain",
        files[0].0.to_str().unwrap(),
        "--name",
        "www.example.com",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v.get("websocket").is_none(), "{out}");
}

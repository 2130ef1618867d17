//! End-to-end: every policy under `examples/` does what its comments say,
//! against the fake internet. The example names (pypi.org, github.com, ...)
//! are served by the fake internet's dnsmasq and origin, never the real
//! ones: each case adds its names to dnsmasq, pointing at the origin, whose
//! certificate covers them.
//!
//! Each example file is used as written, with one addition: the fake
//! internet lives in documentation ranges, which DNS answers may use only
//! when `internal:` lists them (and a long `ttl_min`, so that a slow machine
//! does not see a name expire between `dig` and `curl`). The examples do not
//! use those keys, so the addition cannot shadow one of theirs.
//!
//! One table ([`CASES`]) drives one check ([`exercise`]); a test without
//! root checks that every file under `examples/` has a case.
//!
//! Needs root: run via `scripts/test` (or
//! `cargo test --release -p sluice-e2e --test examples -- --include-ignored`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use sluice_e2e::{ORIGIN_ADDR, Publish, World};

/// What the harness appends to every example (see the module comment).
const FAKE_INTERNET: &str = "
internal:
  - \"198.51.100.0/24\"
  - \"203.0.113.0/24\"
dns:
  ttl_min: 600
  ttl_max: 3600
";

/// A secret the gateway holds: the example's `env:` variable, the
/// placeholder the guest sends and the header it sends it in.
struct Secret {
    env: &'static str,
    value: &'static str,
    placeholder: &'static str,
    header: &'static str,
    host: &'static str,
}

/// One example and what it must let through and keep out.
struct Case {
    /// The file under `examples/`.
    file: &'static str,
    /// The policy `id:` every audit line must carry.
    id: &'static str,
    /// Names reachable over HTTPS (port 443).
    https: &'static [&'static str],
    /// Names reachable over plain HTTP (port 80), each Host-checked.
    http: &'static [&'static str],
    /// Names that exist upstream but must be answered REFUSED and never
    /// asked upstream.
    refused: &'static [&'static str],
    /// A secret substituted for one HTTPS host.
    secret: Option<Secret>,
    /// Publishes host 127.0.0.1:18080 to guest 8080 and serves it.
    publish: bool,
}

/// Every example. `every_example_has_a_case` keeps this complete.
const CASES: &[Case] = &[
    Case {
        file: "python-agent.yaml",
        id: "python-agent",
        https: &["pypi.org", "files.pythonhosted.org"],
        http: &[],
        refused: &["upload.pypi.org", "evil.test"],
        secret: None,
        publish: false,
    },
    Case {
        file: "node.yaml",
        id: "node",
        https: &["registry.npmjs.org"],
        http: &[],
        refused: &["www.npmjs.com", "registry.yarnpkg.com"],
        secret: None,
        publish: false,
    },
    Case {
        file: "rust.yaml",
        id: "rust",
        https: &["index.crates.io", "crates.io", "static.crates.io"],
        http: &[],
        refused: &["github.com", "docs.rs"],
        secret: None,
        publish: false,
    },
    Case {
        file: "github-git.yaml",
        id: "github-git",
        https: &["github.com", "codeload.github.com"],
        http: &[],
        refused: &[
            "gist.github.com",
            "raw.githubusercontent.com",
            "objects.githubusercontent.com",
            "githubusercontent.com",
            "api.github.com",
        ],
        secret: None,
        publish: false,
    },
    Case {
        file: "debian-apt.yaml",
        id: "debian-apt",
        https: &[],
        http: &["deb.debian.org", "security.debian.org"],
        refused: &["ftp.debian.org", "evil.test"],
        secret: None,
        publish: false,
    },
    Case {
        file: "llm-api.yaml",
        id: "llm-api",
        https: &["api.anthropic.com"],
        http: &[],
        refused: &["api.openai.com"],
        secret: Some(Secret {
            env: "ANTHROPIC_API_KEY",
            value: "REAL-anthropic-key-0123456789",
            placeholder: "sk-sluice-placeholder-anthropic",
            header: "x-api-key",
            host: "api.anthropic.com",
        }),
        publish: false,
    },
    Case {
        file: "deny-all-published.yaml",
        id: "deny-all-published",
        https: &[],
        http: &[],
        refused: &["anything.test", "pypi.org"],
        secret: None,
        publish: true,
    },
];

fn examples_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

fn case(file: &str) -> Result<&'static Case> {
    CASES
        .iter()
        .find(|c| c.file == file)
        .with_context(|| format!("no case for {file}"))
}

/// The value of header `name` in an origin log entry.
fn header<'a>(entry: &'a Value, name: &str) -> Option<&'a str> {
    entry["headers"]
        .as_array()?
        .iter()
        .find(|h| h[0] == name)
        .and_then(|h| h[1].as_str())
}

/// Starts a world with the example's policy and checks everything the case
/// says, in one world.
fn exercise(file: &str) -> Result<()> {
    let c = case(file)?;
    let text = std::fs::read_to_string(examples_dir().join(c.file))
        .with_context(|| format!("reading examples/{}", c.file))?;
    let mut b = World::builder()
        .policy(&format!("{text}{FAKE_INTERNET}"))
        .sidecar_arg("--ca-out")
        .sidecar_arg("{dir}/sandbox-ca.pem")
        .sidecar_arg("--upstream-ca")
        .sidecar_arg("{dir}/ca.pem");
    for n in c.https.iter().chain(c.http).chain(c.refused) {
        b = b.dns_record(n, ORIGIN_ADDR);
    }
    if let Some(s) = &c.secret {
        b = b.sidecar_env(s.env, s.value);
    }
    if c.publish {
        b = b.publish(Publish {
            host_port: 18080,
            guest_port: 8080,
            udp: false,
        });
    }
    let w = b.start()?;

    // The guest trusts the origin's CA and, when the example inspects a
    // host, the sandbox CA (as `sluice run` installs it).
    let mut bundle = std::fs::read_to_string(w.ca_pem())?;
    let sandbox_ca = w.dir().join("sandbox-ca.pem");
    ensure!(
        c.secret.is_some() == sandbox_ca.exists(),
        "sandbox CA written: {} (the example binds a secret: {})",
        sandbox_ca.exists(),
        c.secret.is_some()
    );
    if let Ok(pem) = std::fs::read_to_string(&sandbox_ca) {
        bundle.push_str(&pem);
    }
    let bundle_path = w.dir().join("trust.pem");
    std::fs::write(&bundle_path, bundle)?;
    let trust = bundle_path.display();

    for n in c.https {
        let path = format!("/echo/{}/{n}", c.id);
        let out = w.guest_ok(
            &format!("curl -sS --max-time 60 --cacert {trust} https://{n}{path}"),
            90,
        )?;
        ensure!(out.contains(&path), "{file}: https://{n}: {out}");
    }

    for n in c.http {
        // Allowed, then another Host on the same kept-alive connection:
        // 421, never relayed (the Host check the example relies on).
        let path = |p: &str| format!("/echo/{}/{n}/{p}", c.id);
        let t = |p: &str, extra: &str| {
            format!(
                "-sS --max-time 60 -o /dev/null -w '%{{http_code}}\\n' {extra} http://{n}{}",
                path(p)
            )
        };
        let out = w.guest_ok(
            &format!(
                "curl {} --next {}",
                t("ok", ""),
                t("other", "-H 'Host: evil.test'")
            ),
            120,
        )?;
        let codes: Vec<&str> = out.lines().collect();
        ensure!(
            codes == ["200", "421"],
            "{file}: http://{n}: codes {codes:?}\n{}",
            w.sidecar_log()
        );
        let reqs = w.origin_requests();
        ensure!(
            reqs.iter().any(|r| r["path"] == path("ok"))
                && !reqs.iter().any(|r| r["path"] == path("other")),
            "{file}: origin log: {reqs:?}"
        );
    }

    for n in c.refused {
        let out = w.guest_sh(&format!("dig +time=20 +tries=1 {n} A"), 60)?;
        let text = String::from_utf8_lossy(&out.stdout);
        ensure!(
            text.contains("status: REFUSED"),
            "{file}: {n} not refused: {text}"
        );
        // The address is known to the guest (the origin's), but was never
        // resolved for this name through the gateway: no way out either.
        let out = w.guest_sh(
            &format!(
                "curl -sS --max-time 30 --cacert {trust} --resolve {n}:443:{ORIGIN_ADDR} https://{n}/echo/refused"
            ),
            60,
        )?;
        ensure!(!out.status.success(), "{file}: https://{n} reached");
    }
    let upstream = w.dns_log();
    for n in c.refused {
        ensure!(
            !upstream.contains(&format!(" {n} ")),
            "{file}: {n} was asked upstream: {upstream}"
        );
    }

    if let Some(s) = &c.secret {
        let path = format!("/echo/{}/secret", c.id);
        let out = w.guest_ok(
            &format!(
                "curl -sS --max-time 60 --cacert {trust} -H '{}: {}' https://{}{path}",
                s.header, s.placeholder, s.host
            ),
            90,
        )?;
        // The origin got the real key; the guest's copy of the echo is
        // scrubbed back to the placeholder.
        let got = w
            .origin_requests()
            .into_iter()
            .find(|r| r["path"] == path)
            .with_context(|| format!("{file}: the origin never saw {path}"))?;
        ensure!(
            header(&got, s.header) == Some(s.value),
            "{file}: origin got {:?}",
            header(&got, s.header)
        );
        ensure!(
            !out.contains(s.value) && out.contains(s.placeholder),
            "{file}: guest saw: {out}"
        );
        w.wait_audit("the secret's http record", Duration::from_secs(60), |r| {
            r["kind"] == "http"
                && r["path"] == path
                && r["secrets"]
                    .as_array()
                    .is_some_and(|v| v.iter().any(|x| x["name"] == "anthropic"))
        })?;
        ensure!(
            !w.audit_raw()?.contains(s.value),
            "{file}: the key is in the audit"
        );
    }

    if c.publish {
        let origin = sluice_e2e::bin_path("sluice-test-origin")?;
        let _srv = w.guest_spawn(
            "guest-origin",
            &[&origin.display().to_string(), "--http", "0.0.0.0:8080"],
        )?;
        sluice_e2e::wait_until("the guest's server", Duration::from_secs(60), || {
            w.guest_sh("nc -z 127.0.0.1 8080", 30)
                .is_ok_and(|o| o.status.success())
        })?;
        let body = w
            .host
            .sh_ok(
                "curl -sS --max-time 60 http://127.0.0.1:18080/echo/published",
                90,
            )
            .with_context(|| w.sidecar_log())?;
        ensure!(
            body.contains("/echo/published"),
            "{file}: published: {body}"
        );
        // Outbound by address (no DNS at all) is refused too.
        let out = w.guest_sh(
            &format!("curl -sS --max-time 30 http://{ORIGIN_ADDR}/echo/out"),
            60,
        )?;
        ensure!(!out.status.success(), "{file}: an outbound flow got out");
    }

    // Every decision was taken under the example's policy.
    let audit = w.audit()?;
    ensure!(!audit.is_empty(), "{file}: empty audit");
    for r in &audit {
        ensure!(
            r["policy"]["id"] == c.id,
            "{file}: a record under another policy: {r}"
        );
    }
    ensure!(
        audit
            .iter()
            .any(|r| r["kind"] == "dns" && r["decision"] == "deny"),
        "{file}: no DNS denial in the audit"
    );
    Ok(())
}

/// One end-to-end test per example file, each in its own world.
macro_rules! example {
    ($name:ident, $file:literal) => {
        #[test]
        #[ignore = "needs root: run via scripts/test"]
        fn $name() -> Result<()> {
            exercise($file)
        }
    };
}

example!(python_agent, "python-agent.yaml");
example!(node, "node.yaml");
example!(rust, "rust.yaml");
example!(github_git, "github-git.yaml");
example!(debian_apt, "debian-apt.yaml");
example!(llm_api, "llm-api.yaml");
example!(deny_all_published, "deny-all-published.yaml");

/// Every `examples/*.yaml` has a case and a test: an example added without
/// one fails here (no root needed).
#[test]
fn every_example_has_a_case() -> Result<()> {
    let mut files: Vec<String> = std::fs::read_dir(examples_dir())?
        .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .filter(|f| f.ends_with(".yaml"))
        .collect();
    files.sort();
    let mut cased: Vec<String> = CASES.iter().map(|c| c.file.to_string()).collect();
    cased.sort();
    ensure!(files == cased, "examples {files:?} vs cases {cased:?}");
    let me = include_str!("examples.rs");
    for c in CASES {
        ensure!(
            me.contains(&format!(", \"{}\");", c.file)),
            "no example!() test for {}",
            c.file
        );
    }
    Ok(())
}

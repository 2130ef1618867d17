//! End-to-end: `sluice-gateway --audit-format ocsf` writes OCSF events, and
//! every line a run writes is valid against the shipped subset of the OCSF
//! 1.1.0 schema (`docs/ocsf/ocsf-1.1.0-subset.schema.json`), checked by a
//! real JSON-schema validator (python3-jsonschema, `scripts/install-deps`).
//! One world drives allowed and denied DNS, TCP and HTTP, a reload applied
//! and one rejected, then stops the gateway so flow closes and the stop are
//! written too.
//!
//! Needs root: run via `scripts/test` (or
//! `cargo test --release -p sluice-e2e --test ocsf -- --include-ignored`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;
use sluice_e2e::{ECHO_PORT, ORIGIN_NAME, ORIGIN2_ADDR, ORIGIN2_NAME, World, wait_until};

const POLICY: &str = r#"
version: 1
id: e2e-ocsf
label: "OCSF end to end"
allow:
  - domain: "origin.test"
    ports: [80, 443]
internal:
  - "198.51.100.0/24"
  - "203.0.113.0/24"
dns:
  ttl_min: 600
  ttl_max: 3600
"#;

/// Validates every line of the file `argv[2]` against the schema `argv[1]`
/// (its own draft, formats checked); prints `line N: error` for each
/// failure and exits 1 if there was one, else prints `valid N`.
const VALIDATOR: &str = r#"
import json, sys
import jsonschema
schema = json.load(open(sys.argv[1]))
cls = jsonschema.validators.validator_for(schema)
cls.check_schema(schema)
v = cls(schema, format_checker=jsonschema.FormatChecker())
bad = 0
n = 0
for i, line in enumerate(open(sys.argv[2]), 1):
    if not line.strip():
        continue
    n += 1
    try:
        ev = json.loads(line)
    except ValueError as e:
        print(f"line {i}: not JSON: {e}")
        bad += 1
        continue
    for err in v.iter_errors(ev):
        print(f"line {i}: {list(err.absolute_path)}: {err.message}")
        bad += 1
print(f"valid {n}" if bad == 0 else f"invalid {bad}")
sys.exit(1 if bad else 0)
"#;

fn schema_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/ocsf/ocsf-1.1.0-subset.schema.json")
}

/// Runs the validator on `events`; Ok(stdout) when every line is valid.
fn validate(events: &Path) -> Result<String> {
    let out = Command::new("python3")
        .arg("-c")
        .arg(VALIDATOR)
        .arg(schema_path())
        .arg(events)
        .output()
        .context("running python3 (the JSON-schema validator)")?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "{}{}",
            stdout,
            String::from_utf8_lossy(&out.stderr)
                .chars()
                .take(2000)
                .collect::<String>()
        );
    }
    Ok(stdout)
}

/// The complete lines written so far, parsed as JSON (a line that is not
/// JSON fails).
fn events(w: &World) -> Result<Vec<Value>> {
    let raw = w.audit_raw()?;
    let complete = raw.rfind('\n').map_or("", |i| &raw[..=i]);
    complete
        .lines()
        .enumerate()
        .map(|(i, l)| serde_json::from_str(l).with_context(|| format!("line {}: {l}", i + 1)))
        .collect()
}

/// Waits for an event matching `pred`.
fn wait_event(w: &World, what: &str, pred: impl Fn(&Value) -> bool) -> Result<()> {
    let mut seen = Vec::new();
    let found = wait_until(what, Duration::from_secs(60), || {
        seen = events(w).unwrap_or_default();
        seen.iter().any(&pred)
    });
    found.with_context(|| format!("events: {seen:#?}\n{}", w.sidecar_log()))
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn every_event_of_a_run_is_valid_ocsf() -> Result<()> {
    // The validator must bite: a schema-1 line and an event with a wrong
    // type_uid are rejected (else a pass below would prove nothing).
    let tmp = sluice_e2e::TempDir::new(&format!("{}-ocsf", sluice_e2e::unique_name()))?;
    let bad = tmp.path().join("bad.jsonl");
    std::fs::write(
        &bad,
        r#"{"schema":1,"ts":"2026-11-21T19:20:30.123Z","sandbox":"vm-1","kind":"dns","decision":"deny","reason":"not_allowlisted","policy":{"id":"a","version":"b"}}"#,
    )?;
    ensure!(validate(&bad).is_err(), "a schema-1 line passed");

    let mut w = World::builder()
        .policy(POLICY)
        .sidecar_arg("--audit-format")
        .sidecar_arg("ocsf")
        .start()?;

    // DNS: allowed (answered) and refused.
    w.guest_ok(&format!("dig +time=20 +tries=1 {ORIGIN_NAME} A"), 60)?;
    let out = w.guest_sh(&format!("dig +time=20 +tries=1 {ORIGIN2_NAME} A"), 60)?;
    ensure!(String::from_utf8_lossy(&out.stdout).contains("status: REFUSED"));
    // TCP: TLS allowed; an address never resolved and a port not allowed
    // refused.
    let ca = w.ca_pem();
    w.guest_ok(
        &format!(
            "curl -sS --max-time 60 --cacert {} https://{ORIGIN_NAME}/echo/tls",
            ca.display()
        ),
        90,
    )?;
    let lit = w.guest_sh(
        &format!("curl -sS --max-time 30 http://{ORIGIN2_ADDR}/"),
        60,
    )?;
    ensure!(!lit.status.success(), "IP literal reached");
    let port = w.guest_sh(&format!("nc -w 10 -z {ORIGIN_NAME} {ECHO_PORT}"), 60)?;
    ensure!(!port.status.success(), "port {ECHO_PORT} reached");
    // HTTP: an allowed request, then another Host on the same connection.
    w.guest_ok(
        &format!(
            "curl -sS --max-time 60 -o /dev/null http://{ORIGIN_NAME}/echo/plain \
             --next -sS --max-time 60 -o /dev/null -H 'Host: {ORIGIN2_NAME}' http://{ORIGIN_NAME}/echo/other"
        ),
        120,
    )?;
    wait_event(&w, "the 421 http event", |e| {
        e["class_uid"] == 4002 && e["http_response"]["code"] == 421
    })?;

    // A reload applied, then one rejected.
    let policy = w.dir().join("policy.yaml");
    std::fs::write(&policy, POLICY.replace("OCSF end to end", "OCSF, reloaded"))?;
    wait_event(&w, "the applied reload", |e| {
        e["unmapped"]["schema1_kind"] == "policy_reload" && e["status_detail"] == "reload_applied"
    })?;
    std::fs::write(&policy, "version: 1\nid: [broken\n")?;
    wait_event(&w, "the rejected reload", |e| {
        e["unmapped"]["schema1_kind"] == "policy_reload" && e["status_detail"] == "reload_rejected"
    })?;

    // Stop: flow closes, the session's end and the stop are written.
    if let Some(p) = w.sidecar() {
        p.signal_and_wait(libc::SIGTERM, Duration::from_secs(30))?;
    }
    let all = events(&w)?;
    let stdout = validate(&w.audit_path()).with_context(|| w.audit_raw().unwrap_or_default())?;
    ensure!(
        stdout.trim() == format!("valid {}", all.len()),
        "validator: {stdout}"
    );

    // What the run covered: each class, allow and deny, and the mapped
    // kinds; a run that wrote less would validate trivially.
    let seen: BTreeSet<(i64, i64, i64)> = all
        .iter()
        .map(|e| {
            (
                e["class_uid"].as_i64().unwrap_or(0),
                e["activity_id"].as_i64().unwrap_or(0),
                e["action_id"].as_i64().unwrap_or(0),
            )
        })
        .collect();
    for want in [
        (4001, 1, 1),  // connection allowed: Open
        (4001, 5, 2),  // connection denied: Refuse
        (4001, 2, 1),  // flow close: Close
        (4001, 99, 1), // gateway start/stop, reload applied: Other
        (4002, 3, 1),  // GET allowed
        (4002, 3, 2),  // GET denied (421)
        (4003, 6, 1),  // DNS answered: Traffic
        (4003, 1, 2),  // DNS refused: Query
    ] {
        ensure!(seen.contains(&want), "no event {want:?} in {seen:?}");
    }
    for e in &all {
        let class = e["class_uid"].as_u64().unwrap_or(0);
        let activity = e["activity_id"].as_u64().unwrap_or(0);
        ensure!(e["type_uid"] == class * 100 + activity, "type_uid: {e}");
        ensure!(e["policy"]["uid"] == "e2e-ocsf", "policy: {e}");
    }
    ensure!(
        all.iter().any(|e| e["class_uid"] == 4003
            && e["answers"][0]["rdata"].is_string()
            && e["query"]["hostname"] == ORIGIN_NAME),
        "no answered DNS event with its answers"
    );
    ensure!(
        all.iter().any(|e| e["tls"]["sni"] == ORIGIN_NAME),
        "no event with the SNI"
    );

    // `sluice audit` reads what the gateway wrote: every denial, one line
    // each, and the reloads in the summary.
    let sluice = sluice_e2e::bin_path("sluice")?;
    let audit = w.audit_path();
    let out = Command::new(&sluice)
        .args(["audit", "--decision", "deny"])
        .arg(&audit)
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "sluice audit: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let denials = all.iter().filter(|e| e["action_id"] == 2).count();
    ensure!(
        text.lines().count() == denials && text.contains(ORIGIN2_NAME),
        "sluice audit --decision deny ({denials} denials): {text}"
    );
    let out = Command::new(&sluice)
        .args(["audit", "--summary"])
        .arg(&audit)
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let reloads = all
        .iter()
        .filter(|e| e["unmapped"]["schema1_kind"] == "policy_reload")
        .count();
    ensure!(
        out.status.success()
            && reloads >= 2
            && text.contains(&format!("reloads: {reloads}\n"))
            && text.contains(ORIGIN2_NAME),
        "sluice audit --summary ({reloads} reloads): {text}"
    );
    Ok(())
}

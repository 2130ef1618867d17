//! End-to-end policy enforcement (issue 4): the gateway started with
//! `--policy`, a namespace guest, real curl and dig, the fake internet's
//! dnsmasq. Needs root: run via `scripts/test` (or
//! `cargo test --release -p sluice-e2e --test enforce -- --include-ignored`).

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use sluice_e2e::{ORIGIN_ADDR, ORIGIN_NAME, ORIGIN2_ADDR, ORIGIN2_NAME, World, wait_until};

/// Allows only `origin.test` on 80 and 443; the fake internet lives in
/// documentation ranges, which DNS answers may use only when `internal:`
/// lists them.
const POLICY: &str = r#"
version: 1
id: e2e-enforce
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

/// The audit log's schema-1 records.
#[allow(clippy::panic)] // A bad audit line fails the calling test.
fn audit_lines(w: &World) -> Vec<serde_json::Value> {
    // Strict (World::audit): a line that does not parse fails the test.
    w.audit().unwrap_or_else(|e| panic!("{e:#}"))
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn policy_allows_by_name_and_denies_the_rest() -> Result<()> {
    let w = World::builder().policy(POLICY).start()?;
    let ca = w.ca_pem();
    let ca = ca.display();

    // An IP literal nothing resolved: denied at the SYN (curl gets a reset).
    let lit = w.guest_sh(
        &format!("curl -sS --connect-timeout 60 http://{ORIGIN2_ADDR}/"),
        90,
    )?;
    ensure!(!lit.status.success(), "IP literal fetch succeeded");

    // The allowed name, over HTTPS: resolved by the gateway, SNI checked.
    let ok = w
        .guest_ok(
            &format!("curl -sS --max-time 60 --cacert {ca} https://{ORIGIN_NAME}/echo/allowed"),
            90,
        )
        .with_context(|| format!("audit: {:?}", audit_lines(&w)))?;
    let v: serde_json::Value = serde_json::from_str(ok.trim()).context("echo JSON")?;
    ensure!(v["path"] == "/echo/allowed", "allowed fetch: {v}");

    // The allowed name's own address as a literal: no SNI, denied (once the
    // gateway has read the ClientHello: give curl time to send it).
    let lit443 = w.guest_sh(
        &format!("curl -sS --max-time 60 --cacert {ca} https://{ORIGIN_ADDR}/echo/literal"),
        90,
    )?;
    ensure!(!lit443.status.success(), "IP literal HTTPS fetch succeeded");

    // A name the policy does not allow: REFUSED by the gateway, never forwarded.
    let out = w.guest_sh(&format!("dig +time=20 +tries=1 {ORIGIN2_NAME} A"), 60)?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(text.contains("status: REFUSED"), "denied name: {text}");
    let out = w.guest_sh(&format!("dig +tcp +time=20 +tries=1 {ORIGIN2_NAME} A"), 60)?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        text.contains("status: REFUSED"),
        "denied name over TCP: {text}"
    );
    let dns_log = w.dns_log();
    ensure!(
        dns_log.contains(ORIGIN_NAME) && !dns_log.contains(ORIGIN2_NAME),
        "upstream DNS log: {dns_log}"
    );

    // Only the allowed request reached the origin.
    let reqs = w.origin_requests();
    ensure!(
        reqs.iter().any(|r| r["path"] == "/echo/allowed")
            && !reqs.iter().any(|r| r["path"] == "/echo/literal"),
        "origin log: {reqs:?}"
    );

    // The audit log names the reasons (each line is written as its decision
    // is taken; wait, bounded, until all three are in, then say which is not).
    let dns_denial = |audit: &[serde_json::Value]| {
        audit.iter().any(|l| {
            l["kind"] == "dns"
                && l["qname"] == ORIGIN2_NAME
                && l["rcode"] == "REFUSED"
                && l["reason"] == "not_allowlisted"
        })
    };
    let deny = |audit: &[serde_json::Value], kind: &str, reason: &str| {
        audit
            .iter()
            .any(|l| l["kind"] == kind && l["reason"] == reason && l["decision"] == "deny")
    };
    let mut audit = Vec::new();
    let _ = wait_until(
        "the three denials in the audit",
        Duration::from_secs(60),
        || {
            audit = audit_lines(&w);
            dns_denial(&audit)
                && deny(&audit, "connection", "ip_not_resolved_for_name")
                && deny(&audit, "connection", "sni_absent")
        },
    );
    let has = |kind: &str, reason: &str| deny(&audit, kind, reason);
    ensure!(
        dns_denial(&audit),
        "no DNS denial in the audit: {audit:?}\n{}",
        w.sidecar_log()
    );
    ensure!(
        has("connection", "ip_not_resolved_for_name"),
        "no IP-literal denial in the audit: {audit:?}"
    );
    ensure!(
        has("connection", "sni_absent"),
        "no SNI denial in the audit: {audit:?}"
    );
    Ok(())
}

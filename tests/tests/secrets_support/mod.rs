//! What the secret-injection end-to-end tests share (`secrets.rs`,
//! `secrets_reload.rs`): the policy with its two secrets, the world that
//! serves it, and the ways to read what the origin and the audit saw.

#![allow(
    dead_code,
    reason = "each test binary uses its own part of these helpers"
)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use sluice_e2e::{ORIGIN_NAME, ORIGIN2_NAME, TempDir, World};

pub(crate) const TOK_PLACEHOLDER: &str = "sk-sluice-placeholder-tok1";
pub(crate) const TOK_VALUE: &str = "REAL-tok-value-0123456789";
pub(crate) const BOD_PLACEHOLDER: &str = "sk-sluice-placeholder-body";
pub(crate) const BOD_VALUE: &str = "REAL-body-value-9876543210";
/// An inspected name whose origin connection does not enable HTTP/2
/// extended CONNECT (the origin's `noconnect.` convention); same address as
/// [`ORIGIN2_NAME`].
pub(crate) const NOCONNECT_NAME: &str = "noconnect.test";

/// `origin.test` has two secrets (`tok`: headers only; `bod`: headers and
/// body); `other.test` and `noconnect.test` are inspected but have none. All
/// allowed on 80/443.
pub(crate) fn policy(secret_dir: &Path) -> String {
    policy_with(secret_dir, "tok", ORIGIN_NAME, true)
}

/// [`policy`] with `tok` read from `{secret_dir}/{tok_file}` and bound to
/// `tok_host`; without `other.test` (neither allowed nor inspected) unless
/// `other_allowed`.
pub(crate) fn policy_with(
    secret_dir: &Path,
    tok_file: &str,
    tok_host: &str,
    other_allowed: bool,
) -> String {
    let d = secret_dir.display();
    let other = if other_allowed {
        format!("\"{ORIGIN2_NAME}\", ")
    } else {
        String::new()
    };
    let inspect_other = if other_allowed {
        format!("  - \"{ORIGIN2_NAME}\"\n")
    } else {
        String::new()
    };
    format!(
        r#"
version: 1
id: e2e-secrets
allow:
  - domains: ["{ORIGIN_NAME}", {other}"{NOCONNECT_NAME}"]
    ports: [80, 443]
internal:
  - "198.51.100.0/24"
  - "203.0.113.0/24"
inspect:
{inspect_other}  - "{NOCONNECT_NAME}"
secrets:
  - name: tok
    placeholder: {TOK_PLACEHOLDER}
    file: {d}/{tok_file}
    hosts: ["{tok_host}"]
  - name: bod
    placeholder: {BOD_PLACEHOLDER}
    file: {d}/bod
    hosts: ["{ORIGIN_NAME}"]
    locations: [headers, body]
"#
    )
}

/// A world with the secrets policy, the sandbox CA at `{dir}/sandbox-ca.pem`
/// and (when `trust_origin`) the origin's test CA trusted upstream.
pub(crate) fn world(trust_origin: bool) -> Result<(World, TempDir)> {
    let secrets = TempDir::new(&format!("mi-{}", sluice_e2e::unique_name()))?;
    std::fs::write(secrets.path().join("tok"), format!("{TOK_VALUE}\n"))?;
    std::fs::write(secrets.path().join("bod"), BOD_VALUE)?;
    let mut b = World::builder()
        .dns_record(NOCONNECT_NAME, sluice_e2e::ORIGIN2_ADDR)
        .policy(&policy(secrets.path()))
        .sidecar_arg("--ca-out")
        .sidecar_arg("{dir}/sandbox-ca.pem");
    if trust_origin {
        b = b.sidecar_arg("--upstream-ca").sidecar_arg("{dir}/ca.pem");
    }
    Ok((b.start()?, secrets))
}

pub(crate) fn sandbox_ca(w: &World) -> PathBuf {
    w.dir().join("sandbox-ca.pem")
}

/// The audit log's schema-1 records.
#[allow(clippy::panic)] // A bad audit line fails the calling test.
pub(crate) fn audit_lines(w: &World) -> Vec<serde_json::Value> {
    // Strict (World::audit): a line that does not parse fails the test.
    w.audit().unwrap_or_else(|e| panic!("{e:#}"))
}

/// Waits (generously) for an audit record matching `pred`.
pub(crate) fn wait_audit(
    w: &World,
    what: &str,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> Result<serde_json::Value> {
    w.wait_audit(what, Duration::from_secs(60), pred)
}

/// The origin's log entries for `path`.
pub(crate) fn origin_got(w: &World, path: &str) -> Vec<serde_json::Value> {
    w.origin_requests()
        .into_iter()
        .filter(|r| r["path"] == path)
        .collect()
}

/// The value of header `name` in an origin log entry.
pub(crate) fn header<'a>(entry: &'a serde_json::Value, name: &str) -> Option<&'a str> {
    entry["headers"]
        .as_array()?
        .iter()
        .find(|h| h[0] == name)
        .and_then(|h| h[1].as_str())
}

pub(crate) fn curl(w: &World, args: &str) -> Result<String> {
    curl_within(w, 60, args)
}

/// [`curl`] with a transfer bound of `secs` (large transfers through the
/// interception proxy on a loaded machine need minutes, not seconds).
pub(crate) fn curl_within(w: &World, secs: u32, args: &str) -> Result<String> {
    let ca = sandbox_ca(w);
    w.guest_ok(
        &format!(
            "curl -sS --max-time {secs} --cacert {} {args}",
            ca.display()
        ),
        secs + 30,
    )
}

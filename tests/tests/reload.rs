//! End-to-end policy reload (issue 4): the gateway started with `--policy`,
//! the policy file rewritten (in place, by rename, invalid) or SIGHUP sent,
//! real curl downloads in the namespace guest, the schema-1 audit log
//! checked for `reload_applied`, `reload_rejected` and `reload_revoked`.
//! Needs root: run via `scripts/test` (or
//! `cargo test --release -p sluice-e2e --test reload -- --include-ignored`).
//!
//! No timed assertions: every wait polls the audit log (or the guest's
//! result) under a generous deadline.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use sluice_e2e::{ORIGIN_ADDR, ORIGIN_NAME, ORIGIN2_NAME, World, pattern, sha256_hex, wait_until};

/// Allows `origin.test` on 80 and 443 (the fake internet's documentation
/// ranges are opened with `internal:`). Table entries live at least ten
/// minutes (dnsmasq answers with TTL 0): a resolve followed by a connect on
/// a loaded machine is never decided against an expired entry, and an
/// address that stops mapping to its name did so because a reload purged
/// it, not because its entry expired.
const POLICY_A: &str = r#"
version: 1
id: e2e-reload
label: "policy A"
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

/// Allows only `other.test`: `origin.test` flows are revoked.
const POLICY_B: &str = r#"
version: 1
id: e2e-reload
label: "policy B"
allow:
  - domain: "other.test"
    ports: [80]
internal:
  - "198.51.100.0/24"
  - "203.0.113.0/24"
dns:
  ttl_min: 600
  ttl_max: 3600
"#;

/// Not a valid policy: an unknown key and a port out of range.
const POLICY_INVALID: &str = r#"
version: 1
id: e2e-reload
allow:
  - domain: "origin.test"
    ports: [70000]
colour: blue
"#;

/// Generous bound on every wait (the machine is shared and slow).
const DEADLINE: Duration = Duration::from_secs(90);

/// The audit log's lines; every one must be a schema-1 record (strict:
/// `World::audit`).
fn audit(w: &World) -> Result<Vec<serde_json::Value>> {
    w.audit()
}

#[allow(clippy::panic)] // A bad audit line fails the calling test.
fn count(w: &World, pred: impl Fn(&serde_json::Value) -> bool) -> usize {
    // A line that does not parse fails the test (never counts as 0).
    audit(w)
        .unwrap_or_else(|e| panic!("{e:#}"))
        .iter()
        .filter(|l| pred(l))
        .count()
}

fn reloads(w: &World, reason: &str) -> usize {
    count(w, |l| l["kind"] == "policy_reload" && l["reason"] == reason)
}

fn policy_path(w: &World) -> PathBuf {
    w.dir().join("policy.yaml")
}

/// Replaces the policy file the way editors do: write a temporary file in
/// the same directory, then rename it over the original.
fn replace_by_rename(path: &Path, yaml: &str) -> Result<()> {
    let tmp = path.with_extension("yaml.tmp");
    std::fs::write(&tmp, yaml)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// The gateway's pid.
fn gateway_pid(w: &mut World) -> Result<i32> {
    let pid = w.sidecar().and_then(|p| p.pid()).context("no sidecar")?;
    Ok(i32::try_from(pid)?)
}

fn sighup(pid: i32) -> Result<()> {
    // SAFETY: kill has no memory effects; pid is our own unreaped child.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::kill(pid, libc::SIGHUP) };
    ensure!(rc == 0, "kill(SIGHUP) failed");
    Ok(())
}

/// Whether the process lives (not gone, not a zombie).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

/// Waits until the audit shows an allowed connection to the origin on `port`.
fn wait_open(w: &World, port: u16) -> Result<()> {
    wait_until("the download's connection line", DEADLINE, || {
        count(w, |l| {
            l["kind"] == "connection"
                && l["decision"] == "allow"
                && l["dst"]["ip"] == ORIGIN_ADDR.to_string()
                && l["dst"]["port"] == port
        }) > 0
    })
    .with_context(|| w.sidecar_log())
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn rename_replace_revokes_an_open_download_and_purges_names() -> Result<()> {
    let mut w = World::builder().policy(POLICY_A).start()?;
    let start_reloads = reloads(&w, "reload_applied");
    std::thread::scope(|s| -> Result<()> {
        // A long download, slowed by the guest's reader (1 GB at 200 kB/s).
        let download = s.spawn(|| {
            w.guest_sh(
                &format!(
                    "curl -sS --limit-rate 200K -o /dev/null \
                     http://{ORIGIN_NAME}/bytes/1000000000"
                ),
                // Far beyond every wait below (3 x DEADLINE): the download
                // can only end by the revocation, or by this deadline (124).
                400,
            )
        });
        wait_open(&w, 80)?;
        replace_by_rename(&policy_path(&w), POLICY_B)?;
        wait_until("reload_applied", DEADLINE, || {
            reloads(&w, "reload_applied") > start_reloads
        })
        .with_context(|| w.sidecar_log())?;
        wait_until("reload_revoked", DEADLINE, || {
            count(&w, |l| {
                l["kind"] == "flow_close"
                    && l["reason"] == "reload_revoked"
                    && l["dst"]["port"] == 80
            }) > 0
        })?;
        let out = download
            .join()
            .map_err(|_| anyhow::anyhow!("download thread panicked"))??;
        ensure!(
            !out.status.success(),
            "the revoked download completed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // curl's "timed out" would mean the flow was merely stalled.
        ensure!(
            out.status.code() != Some(124),
            "the revoked download hung until the deadline"
        );
        Ok(())
    })?;
    w.check_alive()?;
    let a = audit(&w)?;
    let applied = a
        .iter()
        .rfind(|l| l["reason"] == "reload_applied")
        .context("no reload_applied")?;
    ensure!(
        applied["policy"]["label"] == "policy B"
            && applied["detail"]
                .as_str()
                .is_some_and(|d| d.contains("trigger: file_changed")),
        "reload line: {applied}"
    );
    let revoked = a
        .iter()
        .find(|l| l["reason"] == "reload_revoked")
        .context("no reload_revoked")?;
    ensure!(
        revoked["decision"] == "deny"
            && revoked["detail"].is_string()
            && revoked["bytes_down"].as_u64().is_some_and(|b| b > 0),
        "revoked line: {revoked}"
    );

    // The name is no longer resolved for the guest ...
    let out = w.guest_sh(&format!("dig +time=20 +tries=1 {ORIGIN_NAME} A"), 60)?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(text.contains("status: REFUSED"), "denied name: {text}");
    // ... and its address was purged from the table: a connection to it is
    // no longer tied to any name.
    let lit = w.guest_sh(
        &format!("curl -sS --connect-timeout 60 http://{ORIGIN_ADDR}/echo/after"),
        90,
    )?;
    ensure!(!lit.status.success(), "fetch after revocation succeeded");
    wait_until("the purged address denied", DEADLINE, || {
        count(&w, |l| {
            l["kind"] == "connection"
                && l["reason"] == "ip_not_resolved_for_name"
                && l["dst"]["ip"] == ORIGIN_ADDR.to_string()
        }) > 0
    })?;
    // The new policy is in force for new names.
    let out = w.guest_sh(&format!("dig +time=20 +tries=1 {ORIGIN2_NAME} A"), 60)?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(text.contains("status: NOERROR"), "allowed name: {text}");
    Ok(())
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn an_invalid_file_is_rejected_and_open_flows_complete() -> Result<()> {
    const SIZE: u64 = 8 << 20;
    let w = World::builder().policy(POLICY_A).start()?;
    let want = sha256_hex(&pattern(SIZE));
    std::thread::scope(|s| -> Result<()> {
        // About 8 s at 1 MB/s: the reload happens while it runs.
        let download = s.spawn(|| {
            w.guest_ok(
                &format!(
                    "curl -sS --max-time 300 --limit-rate 1M \
                     http://{ORIGIN_NAME}/bytes/{SIZE} | sha256sum"
                ),
                330,
            )
        });
        wait_open(&w, 80)?;
        // In place this time (not by rename).
        std::fs::write(policy_path(&w), POLICY_INVALID)?;
        wait_until("reload_rejected", DEADLINE, || {
            reloads(&w, "reload_rejected") > 0
        })
        .with_context(|| w.sidecar_log())?;
        let out = download
            .join()
            .map_err(|_| anyhow::anyhow!("download thread panicked"))??;
        ensure!(
            out.split_whitespace().next() == Some(want.as_str()),
            "download sha256 {out} want {want}"
        );
        Ok(())
    })?;
    let a = audit(&w)?;
    let rejected = a
        .iter()
        .find(|l| l["reason"] == "reload_rejected")
        .context("no reload_rejected")?;
    let detail = rejected["detail"].as_str().unwrap_or_default();
    ensure!(
        rejected["decision"] == "deny"
            && rejected["policy"]["label"] == "policy A"
            && detail.contains("policy.yaml:")
            && detail.contains("colour"),
        "rejected line: {rejected}"
    );
    ensure!(
        !a.iter().any(|l| l["reason"] == "reload_revoked"),
        "a flow was revoked by a rejected reload"
    );
    // New flows still follow the old policy: origin.test allowed, other.test
    // refused.
    let ok = w.guest_ok(
        &format!("curl -sS --max-time 60 http://{ORIGIN_NAME}/echo/still-allowed"),
        90,
    )?;
    ensure!(ok.contains("/echo/still-allowed"), "fetch: {ok}");
    let out = w.guest_sh(&format!("dig +time=20 +tries=1 {ORIGIN2_NAME} A"), 60)?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(text.contains("status: REFUSED"), "denied name: {text}");
    // Every line written after the rejection names policy A.
    let after: Vec<_> = a
        .iter()
        .skip_while(|l| l["reason"] != "reload_rejected")
        .collect();
    ensure!(
        after.iter().all(|l| l["policy"]["label"] == "policy A"),
        "lines after the rejection: {after:?}"
    );
    Ok(())
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn sighup_reloads_the_policy() -> Result<()> {
    let mut w = World::builder().policy(POLICY_A).start()?;
    let pid = gateway_pid(&mut w)?;
    // The file is unchanged: only the signal can cause this reload.
    sighup(pid)?;
    wait_until("reload_applied after SIGHUP", DEADLINE, || {
        count(&w, |l| {
            l["reason"] == "reload_applied"
                && l["detail"]
                    .as_str()
                    .is_some_and(|d| d.contains("trigger: sighup"))
        }) > 0
    })
    .with_context(|| w.sidecar_log())?;
    // A changed file then SIGHUP: the new policy is in force at once.
    std::fs::write(policy_path(&w), POLICY_B)?;
    sighup(pid)?;
    wait_until("policy B applied", DEADLINE, || {
        count(&w, |l| {
            l["reason"] == "reload_applied" && l["policy"]["label"] == "policy B"
        }) > 0
    })?;
    let out = w.guest_sh(&format!("dig +time=20 +tries=1 {ORIGIN_NAME} A"), 60)?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(text.contains("status: REFUSED"), "denied name: {text}");
    w.check_alive()
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn reload_under_load_loses_nothing_silently() -> Result<()> {
    const LOOPS: usize = 8;
    const RELOADS: usize = 20;
    const SIZE: u64 = 256 << 10;
    let mut w = World::builder().policy(POLICY_A).start()?;
    let pid = gateway_pid(&mut w)?;
    let path = policy_path(&w);
    let stop = w.dir().join("stop-load");
    // Decisions the load has caused so far (pacing: each policy must see
    // some traffic before the next flip).
    let activity = |w: &World| count(w, |l| l["kind"] == "dns" || l["kind"] == "connection");
    let allowed = |w: &World| {
        count(w, |l| {
            l["kind"] == "connection" && l["decision"] == "allow" && l["dst"]["port"] == 80
        })
    };
    let results = std::thread::scope(|s| -> Result<Vec<String>> {
        // Parallel download loops (until the stop file appears) while the
        // policy flips between A (allowed) and B (origin.test refused, open
        // flows revoked).
        let load = s.spawn(|| {
            w.guest_sh(
                &format!(
                    "for i in $(seq {LOOPS}); do \
                       (while [ ! -e {stop} ]; do \
                          curl -s -o /dev/null --max-time 120 \
                            -w '%{{http_code}} %{{size_download}} %{{exitcode}}\\n' \
                            http://{ORIGIN_NAME}/bytes/{SIZE}; \
                        done) & \
                     done; wait",
                    stop = stop.display()
                ),
                900,
            )
        });
        let result = (|| -> Result<()> {
            wait_open(&w, 80)?;
            for i in 0..RELOADS {
                let yaml = if i % 2 == 0 { POLICY_B } else { POLICY_A };
                let before = activity(&w);
                replace_by_rename(&path, yaml)?;
                sighup(pid)?;
                wait_until("reload applied", DEADLINE, || {
                    reloads(&w, "reload_applied") > i
                })
                .with_context(|| w.sidecar_log())?;
                wait_until("load under the new policy", DEADLINE, || {
                    activity(&w) >= before + 4
                })?;
                ensure!(alive(pid), "the gateway died: {}", w.sidecar_log());
            }
            // The last policy is A: wait for downloads to be admitted again.
            let before = allowed(&w);
            wait_until("downloads allowed again", DEADLINE, || {
                allowed(&w) >= before + 4
            })
        })();
        std::fs::write(&stop, b"")?;
        let out = load
            .join()
            .map_err(|_| anyhow::anyhow!("load thread panicked"))??;
        result?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect())
    })?;
    w.check_alive()?;
    let (mut failed, mut complete) = (0, 0);
    for r in &results {
        let f: Vec<&str> = r.split_whitespace().collect();
        match f.as_slice() {
            ["200", size, "0"] if *size == SIZE.to_string() => complete += 1,
            [_, _, code] if *code != "0" => failed += 1,
            _ => bail!("curl result neither complete nor failed: {r}"),
        }
    }
    // Every failure has an audit reason: a refused name, a denied or revoked
    // connection (counted directly or in a rate-limit summary). Withheld
    // AAAA queries (IPv6 is off) are denials every curl causes: not counted.
    let relevant =
        |reason: &serde_json::Value| reason.as_str().is_some_and(|r| r != "dns_type_withheld");
    let deny_reason = |reason: &serde_json::Value| {
        reason
            .as_str()
            .and_then(sluice_policy::Reason::from_name)
            .is_some_and(|r| r.decision() == sluice_policy::Decision::Deny)
    };
    let denials_in = |a: &[serde_json::Value]| -> u64 {
        a.iter()
            .map(|l| {
                if l["kind"] == "summary" {
                    // Summaries count allowed records too: denials only.
                    l["suppressed"].as_array().map_or(0, |s| {
                        s.iter()
                            .filter(|c| relevant(&c["reason"]) && deny_reason(&c["reason"]))
                            .filter_map(|c| c["count"].as_u64())
                            .sum()
                    })
                } else {
                    u64::from(
                        l["decision"] == "deny"
                            && relevant(&l["reason"])
                            && matches!(
                                l["kind"].as_str(),
                                Some("dns" | "connection" | "flow_close")
                            ),
                    )
                }
            })
            .sum()
    };
    // Denials suppressed in the last rate-limit window are counted in a
    // summary written when that window ends (on the gateway's next loop turn
    // a second later): wait, bounded, for the count to cover the failures.
    let mut denials = 0;
    let _ = wait_until(
        "the audit's denials to cover the failed curls",
        DEADLINE,
        || {
            denials = denials_in(&audit(&w).unwrap_or_else(|e| panic!("{e:#}")));
            denials >= failed
        },
    );
    eprintln!(
        "{complete} curls complete, {failed} failed during {RELOADS} reloads; \
         {denials} denials audited"
    );
    ensure!(
        complete > 0 && failed > 0,
        "complete {complete}, failed {failed}"
    );
    ensure!(
        denials >= failed,
        "{failed} failed curls but {denials} denials in the audit"
    );
    ensure!(
        reloads(&w, "reload_applied") >= RELOADS,
        "reloads applied: {}",
        reloads(&w, "reload_applied")
    );
    // The last policy (A) serves again.
    let ok = w.guest_ok(
        &format!("curl -sS --max-time 60 http://{ORIGIN_NAME}/echo/final"),
        90,
    )?;
    ensure!(ok.contains("/echo/final"), "fetch: {ok}");
    Ok(())
}

/// A policy allowing both origins on 443, with `tok` bound to `origin.test`
/// (when `tok`) and `tok2` bound to `other.test` (when `tok2`); secret files
/// in `dir`.
fn secrets_policy(dir: &Path, tok: bool, tok2: bool) -> String {
    let d = dir.display();
    let mut yaml = format!(
        r#"
version: 1
id: e2e-reload-ca
allow:
  - domains: ["{ORIGIN_NAME}", "{ORIGIN2_NAME}"]
    ports: [443]
internal:
  - "198.51.100.0/24"
  - "203.0.113.0/24"
"#
    );
    if tok || tok2 {
        yaml.push_str("secrets:\n");
    }
    if tok {
        yaml.push_str(&format!(
            "  - name: tok\n    placeholder: {TOK_PLACEHOLDER}\n    file: {d}/tok\n    hosts: [\"{ORIGIN_NAME}\"]\n"
        ));
    }
    if tok2 {
        yaml.push_str(&format!(
            "  - name: tok2\n    placeholder: sk-sluice-placeholder-tok2\n    file: {d}/tok2\n    hosts: [\"{ORIGIN2_NAME}\"]\n"
        ));
    }
    yaml
}

const TOK_PLACEHOLDER: &str = "sk-sluice-placeholder-tok1";

/// A world with `policy`, the sandbox CA written to `{dir}/sandbox-ca.pem`
/// (when anything is inspected) and the fake internet's CA trusted upstream.
fn ca_world(policy: &str) -> Result<World> {
    World::builder()
        .policy(policy)
        .sidecar_arg("--ca-out")
        .sidecar_arg("{dir}/sandbox-ca.pem")
        .sidecar_arg("--upstream-ca")
        .sidecar_arg("{dir}/ca.pem")
        .start()
}

/// Secret files `tok` and `tok2` in a fresh directory.
fn secret_files() -> Result<sluice_e2e::TempDir> {
    let dir = sluice_e2e::TempDir::new(&format!("sc-{}", sluice_e2e::unique_name()))?;
    std::fs::write(dir.path().join("tok"), "REAL-tok-value-0123456789\n")?;
    std::fs::write(dir.path().join("tok2"), "REAL-tok2-value-0123456789\n")?;
    Ok(dir)
}

/// `curl` in the guest trusting `ca` with `tok2`'s placeholder; its output.
fn curl_with(w: &World, ca: &Path, url: &str) -> Result<std::process::Output> {
    w.guest_sh(
        &format!(
            "curl -sS --max-time 60 --cacert {} -H 'Authorization: Bearer sk-sluice-placeholder-tok2' {url}",
            ca.display()
        ),
        90,
    )
}

/// Waits for an applied reload whose detail contains `note`; the record.
fn wait_reload_note(w: &World, note: &str) -> Result<serde_json::Value> {
    w.wait_audit(
        "reload_applied naming the uninspectable hosts",
        DEADLINE,
        |l| {
            l["reason"] == "reload_applied"
                && l["detail"].as_str().is_some_and(|d| d.contains(note))
        },
    )
}

/// Waits for the `inspect_failed` connection record of a flow to `sni`.
fn wait_refused(w: &World, sni: &str) -> Result<serde_json::Value> {
    w.wait_audit("inspect_failed connection record", DEADLINE, |l| {
        l["kind"] == "connection" && l["reason"] == "inspect_failed" && l["sni"] == sni
    })
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn a_reload_inspecting_a_host_outside_the_ca_refuses_its_tls_until_restart() -> Result<()> {
    let secrets = secret_files()?;
    // At start only `origin.test` is inspected: the CA is constrained to it.
    let mut w = ca_world(&secrets_policy(secrets.path(), true, false))?;
    let origin_ca = w.ca_pem();
    let sandbox_ca = w.dir().join("sandbox-ca.pem");
    // `other.test` is spliced: the guest reaches the origin with its own CA.
    let out = curl_with(
        &w,
        &origin_ca,
        &format!("https://{ORIGIN2_NAME}/echo/ca-before"),
    )?;
    ensure!(out.status.success(), "spliced before the reload: {out:?}");

    // The reload binds `tok2` to `other.test`, outside the CA's constraints.
    replace_by_rename(
        &policy_path(&w),
        &secrets_policy(secrets.path(), true, true),
    )?;
    sighup(gateway_pid(&mut w)?)?;
    let rec = wait_reload_note(
        &w,
        &format!(
            "not inspectable until restart (outside the sandbox CA's name constraints): {ORIGIN2_NAME};"
        ),
    )?;
    ensure!(rec["decision"] == "allow", "{rec}");

    // Its TLS is refused (neither intercepted nor spliced: the origin sees
    // nothing) with a reason that says why, whichever CA the guest trusts.
    for (ca, path) in [
        (&origin_ca, "/echo/ca-after"),
        (&sandbox_ca, "/echo/ca-after2"),
    ] {
        let out = curl_with(&w, ca, &format!("https://{ORIGIN2_NAME}{path}"))?;
        ensure!(
            !out.status.success(),
            "{path}: the guest got through: {out:?}"
        );
        ensure!(
            !w.origin_requests().iter().any(|r| r["path"] == path),
            "{path} reached the origin"
        );
    }
    let rec = wait_refused(&w, ORIGIN2_NAME)?;
    ensure!(
        rec["decision"] == "deny"
            && rec["detail"].as_str().is_some_and(|d| {
                d.contains("outside the sandbox CA's name constraints") && d.contains("restart")
            }),
        "{rec}"
    );

    // The host the CA covers is still intercepted, with its secret.
    let out = w.guest_ok(
        &format!(
            "curl -sS --max-time 60 --cacert {} -H 'Authorization: Bearer {TOK_PLACEHOLDER}' https://{ORIGIN_NAME}/echo/ca-still",
            sandbox_ca.display()
        ),
        90,
    )?;
    ensure!(out.contains(TOK_PLACEHOLDER), "{out}");
    let got: Vec<_> = w
        .origin_requests()
        .into_iter()
        .filter(|r| r["path"] == "/echo/ca-still")
        .collect();
    ensure!(
        got.len() == 1 && got[0].to_string().contains("REAL-tok-value-0123456789"),
        "{got:?}"
    );
    w.check_alive()
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn a_reload_inspecting_a_host_when_no_ca_exists_refuses_its_tls() -> Result<()> {
    let secrets = secret_files()?;
    // Nothing inspected at start: no sandbox CA at all.
    let mut w = ca_world(&secrets_policy(secrets.path(), false, false))?;
    ensure!(
        !w.dir().join("sandbox-ca.pem").exists(),
        "a CA was written though nothing is inspected"
    );
    let origin_ca = w.ca_pem();
    let out = curl_with(
        &w,
        &origin_ca,
        &format!("https://{ORIGIN2_NAME}/echo/noca-before"),
    )?;
    ensure!(out.status.success(), "spliced before the reload: {out:?}");

    replace_by_rename(
        &policy_path(&w),
        &secrets_policy(secrets.path(), false, true),
    )?;
    sighup(gateway_pid(&mut w)?)?;
    wait_reload_note(
        &w,
        &format!(
            "not inspectable until restart (no sandbox CA: the policy at start inspected no host): {ORIGIN2_NAME};"
        ),
    )?;

    // Never spliced uninspected: the secret bound to it would be missing.
    let out = curl_with(
        &w,
        &origin_ca,
        &format!("https://{ORIGIN2_NAME}/echo/noca-after"),
    )?;
    ensure!(!out.status.success(), "the guest got through: {out:?}");
    ensure!(
        !w.origin_requests()
            .iter()
            .any(|r| r["path"] == "/echo/noca-after"),
        "the flow was spliced to the origin"
    );
    let rec = wait_refused(&w, ORIGIN2_NAME)?;
    ensure!(
        rec["detail"]
            .as_str()
            .is_some_and(|d| d.contains("no sandbox CA") && d.contains("restart")),
        "{rec}"
    );
    // A host the new policy does not inspect is still spliced.
    let out = curl_with(
        &w,
        &origin_ca,
        &format!("https://{ORIGIN_NAME}/echo/noca-other"),
    )?;
    ensure!(
        out.status.success(),
        "uninspected host after the reload: {out:?}"
    );
    w.check_alive()
}

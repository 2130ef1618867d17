//! End-to-end: every request on a plain-HTTP connection is checked, not only
//! the first (issues 4 and 5). With a policy, the gateway hands plain-HTTP
//! flows to its plain-HTTP proxy (`sluice_intercept::PlainProxy`): a later
//! request on a kept-alive or pipelined connection naming another host gets
//! `421` and never reaches the origin (`host_mismatch`), placeholders in
//! later requests are logged, and normal keep-alive, large transfers and
//! `ws://` upgrades keep working. Real curl, nc and Python sockets in the
//! guest namespace; the origin's request log says what really arrived.
//!
//! Needs root: run via `scripts/test` (or
//! `cargo test --release -p sluice-e2e --test plain_http -- --include-ignored`).

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use sluice_e2e::{
    ORIGIN_ADDR, ORIGIN_NAME, ORIGIN2_ADDR, TempDir, World, pattern, sha256_hex, wait_until,
};

/// An allowed name on port 80 that resolves to the second origin.
const WEB2_NAME: &str = "web2.test";
/// A name the policy does not allow that shares the first origin's address
/// (virtual-host fronting on a shared CDN address).
const SHARED_NAME: &str = "shared.test";

const TOK_PLACEHOLDER: &str = "sk-sluice-placeholder-plaintok";
const TOK_VALUE: &str = "REAL-plain-tok-value-0123";

/// `origin.test` on 80 and 443, `web2.test` on 80; `shared.test` exists
/// upstream (on origin.test's address) but is not allowed. With
/// `secret_dir`, a secret is bound to `origin.test` (so the gateway runs the
/// interception proxy and knows the placeholder).
fn policy(secret_dir: Option<&std::path::Path>) -> String {
    let mut p = format!(
        r#"
version: 1
id: e2e-plain-http
allow:
  - domain: "{ORIGIN_NAME}"
    ports: [80, 443]
  - domain: "{WEB2_NAME}"
    ports: [80]
internal:
  - "198.51.100.0/24"
  - "203.0.113.0/24"
dns:
  ttl_min: 600
  ttl_max: 3600
"#
    );
    if let Some(d) = secret_dir {
        p.push_str(&format!(
            r#"secrets:
  - name: tok
    placeholder: {TOK_PLACEHOLDER}
    file: {}/tok
    hosts: ["{ORIGIN_NAME}"]
    locations: [headers, body]
"#,
            d.display()
        ));
    }
    p
}

fn world(secret_dir: Option<&std::path::Path>) -> Result<World> {
    World::builder()
        .policy(&policy(secret_dir))
        .dns_record(WEB2_NAME, ORIGIN2_ADDR)
        .dns_record(SHARED_NAME, ORIGIN_ADDR)
        .start()
}

/// The audit log's schema-1 records.
#[allow(clippy::panic)] // A bad audit line fails the calling test.
fn audit(w: &World) -> Vec<Value> {
    // Strict (World::audit): a line that does not parse fails the test.
    w.audit().unwrap_or_else(|e| panic!("{e:#}"))
}

/// Waits (generously) for an audit record matching `pred`.
fn wait_audit(w: &World, what: &str, pred: impl Fn(&Value) -> bool) -> Result<Value> {
    w.wait_audit(what, Duration::from_secs(60), pred)
}

/// The `http` record of the request for `path`.
fn http_record(w: &World, path: &str) -> Result<Value> {
    wait_audit(w, &format!("http record for {path}"), |r| {
        r["kind"] == "http" && r["path"] == path && r["reason"] != "secret_host_mismatch"
    })
}

/// Whether the origin logged a request for `path`.
fn origin_saw(w: &World, path: &str) -> bool {
    w.origin_requests().iter().any(|r| r["path"] == path)
}

/// The value of header `name` in an origin log entry.
fn header<'a>(entry: &'a Value, name: &str) -> Option<&'a str> {
    entry["headers"]
        .as_array()?
        .iter()
        .find(|h| h[0] == name)
        .and_then(|h| h[1].as_str())
}

/// The status codes of the HTTP/1.1 responses in `out`, in order.
fn statuses(out: &str) -> Vec<u16> {
    out.split("HTTP/1.1 ")
        .skip(1)
        .filter_map(|r| r.get(..3)?.parse().ok())
        .collect()
}

/// One curl transfer's options: `%{http_code} %{num_connects}` per line
/// (`num_connects` 0: the connection was reused).
fn transfer(url: &str, extra: &str) -> String {
    format!("-sS --max-time 60 -o /dev/null -w '%{{http_code}} %{{num_connects}}\\n' {extra} {url}")
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn kept_alive_requests_to_another_host_get_421() -> Result<()> {
    let w = world(None)?;
    let url = |p: &str| format!("http://{ORIGIN_NAME}/echo/{p}");
    // One connection (curl reuses it for the same URL host whatever the Host
    // header says): allowed, another allowed (differently resolved) host,
    // a denied host on the same address, allowed again.
    let out = w.guest_ok(
        &format!(
            "curl {} --next {} --next {} --next {}",
            transfer(&url("ka1"), ""),
            transfer(&url("ka2"), &format!("-H 'Host: {WEB2_NAME}'")),
            transfer(&url("ka3"), &format!("-H 'Host: {SHARED_NAME}'")),
            transfer(&url("ka4"), ""),
        ),
        300,
    )?;
    let lines: Vec<&str> = out.lines().collect();
    ensure!(
        lines == ["200 1", "421 0", "421 0", "200 0"],
        "curl (code, connects) per transfer: {lines:?}\n{}",
        w.sidecar_log()
    );
    ensure!(
        origin_saw(&w, "/echo/ka1") && origin_saw(&w, "/echo/ka4"),
        "origin log: {:?}",
        w.origin_requests()
    );
    ensure!(
        !origin_saw(&w, "/echo/ka2") && !origin_saw(&w, "/echo/ka3"),
        "a request naming another host reached the origin: {:?}",
        w.origin_requests()
    );
    for (path, host) in [("/echo/ka2", WEB2_NAME), ("/echo/ka3", SHARED_NAME)] {
        let r = http_record(&w, path)?;
        ensure!(
            r["reason"] == "host_mismatch"
                && r["decision"] == "deny"
                && r["status"] == 421
                && r["host"] == host
                && r["dst"]["ip"] == ORIGIN_ADDR.to_string(),
            "{r}"
        );
    }
    let ok = http_record(&w, "/echo/ka1")?;
    ensure!(
        ok["reason"] == "allowlisted" && ok["status"] == 200 && ok["host"] == ORIGIN_NAME,
        "{ok}"
    );
    // All four on one flow (one connection, admitted once).
    let flows = ["/echo/ka1", "/echo/ka2", "/echo/ka3", "/echo/ka4"]
        .iter()
        .map(|p| http_record(&w, p).map(|r| r["flow"].clone()))
        .collect::<Result<Vec<_>>>()?;
    ensure!(
        flows[0].is_u64() && flows.iter().all(|f| *f == flows[0]),
        "flows: {flows:?}"
    );
    Ok(())
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn pipelined_requests_are_each_checked() -> Result<()> {
    let w = world(None)?;
    // Four requests in one write: allowed; another allowed host; an
    // absolute-form target naming a denied host on the same address; the
    // allowed host in another case with the port (then close).
    let pipeline = format!(
        "GET /echo/p1 HTTP/1.1\\r\\nHost: {ORIGIN_NAME}\\r\\n\\r\\n\
         GET /echo/p2 HTTP/1.1\\r\\nHost: {WEB2_NAME}\\r\\n\\r\\n\
         GET http://{SHARED_NAME}/echo/p3 HTTP/1.1\\r\\nHost: {ORIGIN_NAME}\\r\\n\\r\\n\
         GET /echo/p4 HTTP/1.1\\r\\nHost: ORIGIN.Test:80\\r\\nConnection: close\\r\\n\\r\\n"
    );
    let out = w.guest_ok(
        &format!("printf '{pipeline}' | nc -w 60 {ORIGIN_NAME} 80"),
        90,
    )?;
    ensure!(
        statuses(&out) == [200, 421, 421, 200],
        "responses: {out}\n{}",
        w.sidecar_log()
    );
    ensure!(
        origin_saw(&w, "/echo/p1") && origin_saw(&w, "/echo/p4"),
        "origin log: {:?}",
        w.origin_requests()
    );
    ensure!(
        !origin_saw(&w, "/echo/p2") && !origin_saw(&w, "/echo/p3"),
        "a pipelined request naming another host reached the origin: {:?}",
        w.origin_requests()
    );
    let p2 = http_record(&w, "/echo/p2")?;
    ensure!(
        p2["reason"] == "host_mismatch" && p2["host"] == WEB2_NAME,
        "{p2}"
    );
    let p3 = http_record(&w, "/echo/p3")?;
    ensure!(
        p3["reason"] == "host_mismatch" && p3["host"] == SHARED_NAME,
        "{p3}"
    );

    // A later request the proxy cannot parse: 400, the connection closes,
    // what follows is never read.
    let broken = format!(
        "GET /echo/p5 HTTP/1.1\\r\\nHost: {ORIGIN_NAME}\\r\\n\\r\\n\
         GET /echo/p6 HTTP/1.1\\r\\nHost: {ORIGIN_NAME}\\r\\nno colon in this line\\r\\n\\r\\n\
         GET /echo/p7 HTTP/1.1\\r\\nHost: {ORIGIN_NAME}\\r\\n\\r\\n"
    );
    let out = w.guest_ok(
        &format!("printf '{broken}' | nc -w 60 {ORIGIN_NAME} 80"),
        90,
    )?;
    ensure!(statuses(&out) == [200, 400], "responses: {out}");
    ensure!(
        origin_saw(&w, "/echo/p5") && !origin_saw(&w, "/echo/p6") && !origin_saw(&w, "/echo/p7"),
        "origin log: {:?}",
        w.origin_requests()
    );
    let bad = wait_audit(&w, "unreadable request", |r| {
        r["kind"] == "http" && r["reason"] == "http_unreadable"
    })?;
    ensure!(bad["status"] == 400 && bad["decision"] == "deny", "{bad}");
    Ok(())
}

/// A `ws://` client: upgrade, then bytes echoed through the splice; then an
/// `h2c` upgrade request, which must be refused (501), never forwarded.
const WS_CLIENT: &str = r#"
import socket, sys
host = sys.argv[1]

def head(s):
    h = b""
    while b"\r\n\r\n" not in h:
        c = s.recv(1)
        if not c:
            break
        h += c
    return h.split(b"\r\n")[0].decode()

s = socket.create_connection((host, 80), timeout=60)
s.sendall(("GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n" % host).encode())
print(head(s))
msg = b"ping-through-the-plain-http-proxy"
s.sendall(msg)
got = b""
while len(got) < len(msg):
    c = s.recv(4096)
    if not c:
        break
    got += c
print(got.decode())
s.close()

s = socket.create_connection((host, 80), timeout=60)
s.sendall(("GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n" % host).encode())
print(head(s))
s.close()
"#;

#[test]
#[ignore = "needs root: run via scripts/test"]
fn keep_alive_large_transfers_and_websocket_work_through_the_proxy() -> Result<()> {
    let w = world(None)?;
    // Two requests to the right host on one connection.
    let out = w.guest_ok(
        &format!(
            "curl -sS --max-time 60 -w '%{{http_code}} %{{num_connects}}\\n' \
             -o /dev/null http://{ORIGIN_NAME}/echo/n1 -o /dev/null http://{ORIGIN_NAME}/echo/n2"
        ),
        90,
    )?;
    let lines: Vec<&str> = out.lines().collect();
    ensure!(lines == ["200 1", "200 0"], "keep-alive: {lines:?}");
    ensure!(origin_saw(&w, "/echo/n1") && origin_saw(&w, "/echo/n2"));
    // Served by the proxy: one http record each.
    http_record(&w, "/echo/n1")?;
    http_record(&w, "/echo/n2")?;

    // 64 MiB down, 32 MiB up (with a length and chunked), byte-exact.
    let down: u64 = 64 << 20;
    let got = w.guest_ok(
        &format!("curl -sS --max-time 300 http://{ORIGIN_NAME}/bytes/{down} | sha256sum"),
        320,
    )?;
    let want = sha256_hex(&pattern(down));
    ensure!(got.starts_with(&want), "download sha256 {got} != {want}");
    let rec = http_record(&w, &format!("/bytes/{down}"))?;
    ensure!(rec["bytes_down"] == down, "{rec}");

    let up: u64 = 32 << 20;
    let file = w.dir().join("upload.bin");
    std::fs::write(&file, pattern(up))?;
    let want = format!("{} {up}", sha256_hex(&pattern(up)));
    for chunked in ["", "-H 'Transfer-Encoding: chunked'"] {
        let got = w.guest_ok(
            &format!(
                "curl -sS --max-time 300 {chunked} --data-binary @{} http://{ORIGIN_NAME}/upload",
                file.display()
            ),
            320,
        )?;
        ensure!(got.trim() == want, "upload ({chunked:?}): {got} != {want}");
    }
    // A request's `http` record is written when its response has been
    // sent, so possibly after curl returned: wait (bounded) for both.
    let uploads_in = |w: &World| -> Vec<Value> {
        audit(w)
            .into_iter()
            .filter(|r| r["kind"] == "http" && r["path"] == "/upload")
            .collect()
    };
    let mut uploads = Vec::new();
    let _ = wait_until(
        "both uploads' http records",
        Duration::from_secs(60),
        || {
            uploads = uploads_in(&w);
            uploads.len() >= 2
        },
    );
    ensure!(
        uploads.len() == 2 && uploads.iter().all(|r| r["bytes_up"] == up),
        "{uploads:?}"
    );

    // ws://: 101, then the splice echoes; h2c is refused (501,
    // upgrade_refused) and never reaches the origin.
    let script = w.dir().join("ws_client.py");
    std::fs::write(&script, WS_CLIENT)?;
    let out = w.guest_ok(&format!("python3 {} {ORIGIN_NAME}", script.display()), 150)?;
    let lines: Vec<&str> = out.lines().collect();
    ensure!(
        lines.len() == 3
            && lines[0].starts_with("HTTP/1.1 101")
            && lines[1] == "ping-through-the-plain-http-proxy"
            && lines[2].starts_with("HTTP/1.1 501"),
        "ws client: {lines:?}\n{}",
        w.sidecar_log()
    );
    let ws: Vec<Value> = w
        .origin_requests()
        .into_iter()
        .filter(|r| r["path"] == "/ws")
        .collect();
    ensure!(ws.len() == 1, "origin /ws: {ws:?}");
    ensure!(
        header(&ws[0], "upgrade") == Some("websocket"),
        "upgrade headers at the origin: {ws:?}"
    );
    let refused = wait_audit(&w, "h2c refused", |r| {
        r["kind"] == "http" && r["path"] == "/ws" && r["reason"] == "upgrade_refused"
    })?;
    ensure!(
        refused["status"] == 501 && refused["decision"] == "deny",
        "{refused}"
    );
    let rec = wait_audit(&w, "websocket record", |r| {
        r["kind"] == "http" && r["path"] == "/ws" && r["status"] == 101
    })?;
    ensure!(rec["bytes_up"] == 33 && rec["bytes_down"] == 33, "{rec}");
    Ok(())
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn placeholders_in_later_requests_are_logged_never_substituted() -> Result<()> {
    let secrets = TempDir::new(&format!("pl-{}", sluice_e2e::unique_name()))?;
    std::fs::write(secrets.path().join("tok"), TOK_VALUE)?;
    let w = world(Some(secrets.path()))?;
    let url = |p: &str| format!("http://{ORIGIN_NAME}/echo/{p}");
    // One connection: clean, a placeholder in a header, one in the body.
    let out = w.guest_ok(
        &format!(
            "curl {} --next {} --next {}",
            transfer(&url("clean"), ""),
            transfer(
                &url("in-head"),
                &format!("-H 'X-Api-Key: {TOK_PLACEHOLDER}'")
            ),
            transfer(
                &url("in-body"),
                &format!("--data-binary 'key={TOK_PLACEHOLDER}&x=1'")
            ),
        ),
        300,
    )?;
    let lines: Vec<&str> = out.lines().collect();
    ensure!(
        lines == ["200 1", "200 0", "200 0"],
        "curl (code, connects): {lines:?}"
    );
    // Passed through unchanged.
    let reqs = w.origin_requests();
    let got = |p: &str| reqs.iter().find(|r| r["path"] == format!("/echo/{p}"));
    let head = got("in-head").context("in-head not at the origin")?;
    ensure!(header(head, "x-api-key") == Some(TOK_PLACEHOLDER), "{head}");
    let body = got("in-body").context("in-body not at the origin")?;
    ensure!(
        body["body_len"] == format!("key={TOK_PLACEHOLDER}&x=1").len(),
        "{body}"
    );
    ensure!(
        !serde_json::to_string(&reqs)?.contains(TOK_VALUE),
        "the real value reached the origin over plain HTTP"
    );
    // Logged, by name, per request.
    for (path, place) in [
        ("/echo/in-head", "tok (head)"),
        ("/echo/in-body", "tok (body)"),
    ] {
        let r = wait_audit(&w, &format!("placeholder in {path}"), |r| {
            r["reason"] == "secret_host_mismatch" && r["path"] == path
        })?;
        let detail = r["detail"].as_str().unwrap_or_default();
        ensure!(
            detail.contains(place) && detail.contains("plain HTTP") && r["host"] == ORIGIN_NAME,
            "{r}"
        );
    }
    http_record(&w, "/echo/clean")?;
    ensure!(
        !audit(&w)
            .iter()
            .any(|r| r["reason"] == "secret_host_mismatch" && r["path"] == "/echo/clean"),
        "a clean request was reported"
    );
    ensure!(
        !w.audit_raw()?.contains(TOK_VALUE),
        "the audit holds the real value"
    );
    Ok(())
}

//! End-to-end runtime approval (issue 17, docs/approval.md): a gateway with
//! `unlisted: ask` in the harness's [`World`] (guest namespace, fake
//! internet of real dnsmasq and origin), real `dig` and `curl` in the
//! guest, and a real backend the test runs: a unix socket it answers (one
//! JSON line each way) and a Python `http.server` webhook. The audit log and
//! the questions the backend received are checked.
//! Needs root: run via `scripts/test` (or
//! `cargo test --release -p sluice-e2e --test approval -- --include-ignored`).
//!
//! No timed assertions: every wait polls a condition (the audit log, the
//! questions received, the gateway's counters) under a generous deadline.
//! The one duration in play is the policy's approval `timeout`, the
//! subject of the timeout test.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::net::Ipv4Addr;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use sluice_e2e::{ORIGIN_ADDR, Proc, TempDir, World, unique_name, wait_until};

/// Generous bound on every wait (the machine is shared and slow).
const DEADLINE: Duration = Duration::from_secs(90);

/// A private address no `internal:` opens: an approval must not open it.
const PRIVATE_ADDR: Ipv4Addr = Ipv4Addr::new(10, 9, 9, 9);

/// The policy: `origin.test` listed, `blocked.test` denied, everything
/// else asked about through `BACKEND` (the fake internet's documentation
/// ranges are opened with `internal:`; table entries live ten minutes).
fn policy(backend: &str, extra: &str) -> String {
    format!(
        r#"
version: 1
id: e2e-approval
unlisted: ask
approval:
  backend:
{backend}
{extra}
allow:
  - domain: "origin.test"
    ports: [443]
deny:
  - "blocked.test"
internal:
  - "198.51.100.0/24"
  - "203.0.113.0/24"
dns:
  ttl_min: 600
  ttl_max: 3600
"#
    )
}

/// Names the fake internet resolves, each answered by the backend as its
/// first label says (see [`decide`]).
const NAMES: [&str; 10] = [
    "once.test",
    "deny.test",
    "silent.test",
    "always.test",
    "private.test",
    "held1.test",
    "held2.test",
    "held3.test",
    "blocked.test",
    "hook.test",
];

fn world(policy: &str) -> Result<World> {
    world_from(World::builder().policy(policy))
}

/// The world `b` describes, with [`NAMES`] resolving (`private.test` to
/// [`PRIVATE_ADDR`], the rest to the origin).
fn world_from(mut b: sluice_e2e::WorldBuilder) -> Result<World> {
    for n in NAMES {
        let addr = if n == "private.test" {
            PRIVATE_ADDR
        } else {
            ORIGIN_ADDR
        };
        b = b.dns_record(n, addr);
    }
    b.start()
}

/// What the test's backend answers about `name`: `None` never answers.
fn decide(name: &str) -> Option<&'static str> {
    match name.split('.').next().unwrap_or("") {
        "deny" => Some("deny_once"),
        "silent" => None,
        "always" => Some("allow_always"),
        "private" => Some("allow_sandbox"),
        _ => Some("allow_once"),
    }
}

/// The unix-socket backend: answers each question per [`decide`], holding
/// names starting `held` until [`UnixAnswerer::release`]. Records every
/// question received.
struct UnixAnswerer {
    path: PathBuf,
    questions: Arc<Mutex<Vec<serde_json::Value>>>,
    released: Arc<(Mutex<HashSet<String>>, Condvar)>,
    _dir: TempDir,
}

impl UnixAnswerer {
    fn start() -> Result<Self> {
        let dir = TempDir::new(&format!("{}-ask", unique_name()))?;
        let path = dir.path().join("ask.sock");
        let listener = UnixListener::bind(&path)?;
        let questions = Arc::new(Mutex::new(Vec::new()));
        let released = Arc::new((Mutex::new(HashSet::new()), Condvar::new()));
        let (q, r) = (Arc::clone(&questions), Arc::clone(&released));
        // Detached: it ends with the test process.
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let (q, r) = (Arc::clone(&q), Arc::clone(&r));
                std::thread::spawn(move || answer(conn, &q, &r));
            }
        });
        Ok(Self {
            path,
            questions,
            released,
            _dir: dir,
        })
    }

    fn questions(&self) -> Vec<serde_json::Value> {
        self.questions.lock().map(|q| q.clone()).unwrap_or_default()
    }

    fn asked(&self, name: &str) -> usize {
        self.questions()
            .iter()
            .filter(|q| q["name"] == name)
            .count()
    }

    fn release(&self, name: &str) {
        let (set, cv) = &*self.released;
        if let Ok(mut s) = set.lock() {
            s.insert(name.to_owned());
        }
        cv.notify_all();
    }

    fn backend_yaml(&self) -> String {
        format!("    unix: {}", self.path.display())
    }
}

/// One connection: read the question line, answer it (or not).
fn answer(
    conn: UnixStream,
    questions: &Mutex<Vec<serde_json::Value>>,
    released: &(Mutex<HashSet<String>>, Condvar),
) {
    let mut reader = BufReader::new(match conn.try_clone() {
        Ok(c) => c,
        Err(_) => return,
    });
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let Ok(q) = serde_json::from_str::<serde_json::Value>(&line) else {
        return;
    };
    let name = q["name"].as_str().unwrap_or("").to_owned();
    if let Ok(mut all) = questions.lock() {
        all.push(q);
    }
    if name.starts_with("held") {
        let (set, cv) = released;
        let Ok(mut s) = set.lock() else { return };
        while !s.contains(&name) {
            s = match cv.wait(s) {
                Ok(s) => s,
                Err(_) => return,
            };
        }
    }
    match decide(&name) {
        Some(d) => {
            let mut w = &conn;
            let _ = writeln!(w, r#"{{"decision":"{d}","by":"e2e"}}"#);
        }
        // Never answers: wait for the gateway to give up and close.
        None => {
            let mut rest = String::new();
            let _ = reader.read_line(&mut rest);
        }
    }
}

/// `dig` for `name` in the guest: its status line and answer section.
fn dig(w: &World, name: &str) -> Result<String> {
    let out = w.guest_sh(&format!("dig +time=60 +tries=1 {name} A"), 120)?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn status_of(dig: &str) -> &str {
    dig.split("status: ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .unwrap_or("none")
}

/// The `approval` record about `name`.
fn approval_record(w: &World, name: &str) -> Result<serde_json::Value> {
    w.wait_audit(&format!("the approval record of {name}"), DEADLINE, |l| {
        l["kind"] == "approval" && l["approval"]["name"] == name
    })
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn unix_backend_allows_once_denies_and_times_out_and_never_asks_what_it_must_not() -> Result<()> {
    let ask = UnixAnswerer::start()?;
    let mut w = world(&policy(&ask.backend_yaml(), "  timeout: 3"))?;

    // allow once: the answer is forwarded, TLS on 443 works, 80 is not open.
    let text = dig(&w, "once.test")?;
    ensure!(status_of(&text) == "NOERROR", "once.test: {text}");
    ensure!(text.contains(&ORIGIN_ADDR.to_string()), "once.test: {text}");
    let q = ask
        .questions()
        .into_iter()
        .find(|q| q["name"] == "once.test")
        .context("no question about once.test")?;
    ensure!(
        q["version"] == 1
            && q["policy"] == "e2e-approval"
            && q["qtype"] == "A"
            && q["tcp_ports"] == serde_json::json!([443])
            && q["sandbox"].is_string(),
        "question: {q}"
    );
    let rec = approval_record(&w, "once.test")?;
    ensure!(
        rec["decision"] == "allow"
            && rec["reason"] == "approval_allowed"
            && rec["approval"]["decision"] == "allow_once"
            && rec["approval"]["by"] == "unix: e2e"
            && rec["approval"]["lasts"] == "dns_ttl"
            && rec["approval"]["tcp_ports"] == serde_json::json!([443]),
        "approval record: {rec}"
    );
    let ca = w.ca_pem();
    let ca = ca.display();
    let body = w.guest_ok(
        &format!("curl -sS --max-time 60 --cacert {ca} https://once.test/echo/approved"),
        90,
    )?;
    ensure!(body.contains("approved"), "curl over 443: {body}");
    let plain = w.guest_sh("curl -sS --max-time 60 http://once.test/echo/plain", 90)?;
    ensure!(
        !plain.status.success(),
        "port 80 opened by an approval of 443"
    );
    // A second query within the decision's life asks nothing more.
    ensure!(status_of(&dig(&w, "once.test")?) == "NOERROR");
    ensure!(
        ask.asked("once.test") == 1,
        "asked twice: {:?}",
        ask.questions()
    );

    // deny once: REFUSED; the resolver's retry within the window asks nothing.
    let text = dig(&w, "deny.test")?;
    ensure!(status_of(&text) == "REFUSED", "deny.test: {text}");
    let rec = approval_record(&w, "deny.test")?;
    ensure!(
        rec["decision"] == "deny"
            && rec["reason"] == "approval_denied"
            && rec["approval"]["decision"] == "deny_once",
        "deny record: {rec}"
    );
    ensure!(
        !w.dns_log().contains("deny.test"),
        "a denied name went upstream"
    );

    // No answer within the policy's timeout: REFUSED, decided by `timeout`.
    let text = dig(&w, "silent.test")?;
    ensure!(status_of(&text) == "REFUSED", "silent.test: {text}");
    let rec = approval_record(&w, "silent.test")?;
    ensure!(
        rec["approval"]["by"] == "timeout" && rec["decision"] == "deny",
        "timeout record: {rec}"
    );

    // An approved name whose answer is private is still refused.
    let text = dig(&w, "private.test")?;
    ensure!(status_of(&text) == "REFUSED", "private.test: {text}");
    ensure!(ask.asked("private.test") == 1);
    w.wait_audit("private_answer", DEADLINE, |l| {
        l["kind"] == "dns" && l["qname"] == "private.test" && l["reason"] == "private_answer"
    })?;

    // A `deny:` name, a public suffix and an IP literal never ask.
    let text = dig(&w, "blocked.test")?;
    ensure!(status_of(&text) == "REFUSED", "blocked.test: {text}");
    let lit = w.guest_sh(
        &format!("curl -sS --max-time 60 --cacert {ca} https://{ORIGIN_ADDR}/echo/lit"),
        90,
    )?;
    ensure!(!lit.status.success(), "an IP literal was reached");
    let _ = dig(&w, "test")?;
    for never in ["blocked.test", "test", &ORIGIN_ADDR.to_string()] {
        ensure!(
            ask.asked(never) == 0,
            "{never} was asked: {:?}",
            ask.questions()
        );
    }
    w.check_alive()?;
    Ok(())
}

/// The gateway's counters, logged on SIGUSR1 (JSON log lines).
fn counter(w: &World, name: &str) -> Result<u64> {
    let pid = w.sidecar_pid().context("no sidecar")?;
    // SAFETY: kill has no memory effects; pid is our own unreaped child.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::kill(i32::try_from(pid)?, libc::SIGUSR1) };
    ensure!(rc == 0, "kill(SIGUSR1) failed");
    let log = std::fs::read_to_string(w.dir().join("sidecar.log"))?;
    let key = format!("\"{name}\":");
    Ok(log
        .lines()
        .filter_map(|l| l.split(&key).nth(1))
        .filter_map(|v| v.split([',', '}']).next()?.trim().parse().ok())
        .max()
        .unwrap_or(0))
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn identical_queries_wait_on_one_question_and_overflow_is_refused_and_counted() -> Result<()> {
    let ask = UnixAnswerer::start()?;
    let w = world(&policy(
        &ask.backend_yaml(),
        "  timeout: 120\n  max_pending: 2",
    ))?;
    std::thread::scope(|s| -> Result<()> {
        let first = s.spawn(|| dig(&w, "held1.test"));
        wait_until("the question about held1.test", DEADLINE, || {
            ask.asked("held1.test") == 1
        })?;
        let before = counter(&w, "dns_queries")?;
        let second = s.spawn(|| dig(&w, "held1.test"));
        // The second query has reached the gateway (and is held).
        wait_until("the second query", DEADLINE, || {
            counter(&w, "dns_queries").is_ok_and(|n| n > before)
        })?;
        let third = s.spawn(|| dig(&w, "held2.test"));
        wait_until("the question about held2.test", DEADLINE, || {
            ask.asked("held2.test") == 1
        })?;
        // Two questions pending: a third name is refused without asking.
        let text = dig(&w, "held3.test")?;
        ensure!(status_of(&text) == "REFUSED", "held3.test: {text}");
        w.wait_audit("approval_limited", DEADLINE, |l| {
            l["kind"] == "dns" && l["qname"] == "held3.test" && l["reason"] == "approval_limited"
        })?;
        ensure!(ask.asked("held3.test") == 0, "the overflow was asked");
        ask.release("held1.test");
        ask.release("held2.test");
        for (what, h) in [("first", first), ("second", second), ("third", third)] {
            let text = h
                .join()
                .map_err(|_| anyhow::anyhow!("dig thread panicked"))??;
            ensure!(status_of(&text) == "NOERROR", "{what}: {text}");
        }
        Ok(())
    })?;
    ensure!(
        ask.asked("held1.test") == 1,
        "identical queries asked more than once: {:?}",
        ask.questions()
    );
    wait_until("the approval_limited counter", DEADLINE, || {
        counter(&w, "approval_limited").is_ok_and(|n| n >= 1)
    })
    .with_context(|| w.sidecar_log())?;
    Ok(())
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn always_writes_a_valid_overlay_that_the_reload_picks_up() -> Result<()> {
    let ask = UnixAnswerer::start()?;
    let w = world(&policy(&ask.backend_yaml(), "  always: true"))?;
    let text = dig(&w, "always.test")?;
    ensure!(status_of(&text) == "NOERROR", "always.test: {text}");
    let rec = approval_record(&w, "always.test")?;
    ensure!(
        rec["approval"]["decision"] == "allow_always" && rec["approval"]["lasts"] == "always",
        "always record: {rec}"
    );
    let policy_path = w.dir().join("policy.yaml");
    let overlay = w.dir().join("policy.approved.yaml");
    let text = std::fs::read_to_string(&overlay).context("the overlay file")?;
    ensure!(text.contains("\"always.test\""), "overlay: {text}");
    // Valid: the policy loads with it, and lists the name.
    let loaded = sluice_policy::load_file(&policy_path, &Default::default())
        .map_err(|e| anyhow::anyhow!("policy with overlay: {e}"))?;
    ensure!(loaded.check_name("always.test").is_allowed());
    // The gateway reloads on the overlay's change alone.
    w.wait_audit("the reload after the overlay", DEADLINE, |l| {
        l["kind"] == "policy_reload"
            && l["reason"] == "reload_applied"
            && l["detail"]
                .as_str()
                .is_some_and(|d| d.contains("file_changed"))
    })?;
    // From now on the policy itself allows it: a rule, not an approval.
    let text = dig(&w, "always.test")?;
    ensure!(status_of(&text) == "NOERROR");
    w.wait_audit("the name answered by the overlay's rule", DEADLINE, |l| {
        l["kind"] == "dns"
            && l["qname"] == "always.test"
            && l["reason"] == "dns_answered"
            && l["rule"].is_object()
    })?;
    ensure!(ask.asked("always.test") == 1);
    Ok(())
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn a_backend_that_is_down_denies() -> Result<()> {
    let dir = TempDir::new(&format!("{}-down", unique_name()))?;
    let gone = dir.path().join("nobody.sock");
    let w = world(&policy(&format!("    unix: {}", gone.display()), ""))?;
    let text = dig(&w, "once.test")?;
    ensure!(status_of(&text) == "REFUSED", "once.test: {text}");
    let rec = approval_record(&w, "once.test")?;
    ensure!(
        rec["decision"] == "deny" && rec["approval"]["by"] == "unix: backend_error",
        "record: {rec}"
    );
    ensure!(!w.dns_log().contains("once.test"), "the name went upstream");
    Ok(())
}

/// The webhook: Python's `http.server` on 127.0.0.1 in the world's host
/// namespace (the gateway's), logging each request's `authorization` header and body as a
/// JSON line and answering `allow_once`.
const WEBHOOK: &str = r#"
import http.server, json, sys
log, portfile, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        with open(log, "a") as f:
            f.write(json.dumps({"path": self.path,
                                "host": self.headers.get("host"),
                                "authorization": self.headers.get("authorization"),
                                "content_type": self.headers.get("content-type"),
                                "client": dict(x[0] for x in (self.connection.getpeercert() or {}).get("subject", ())).get("commonName") if hasattr(self.connection, "getpeercert") else None,
                                "question": json.loads(body)}) + "\n")
        answer = json.dumps({"decision": "allow_once", "by": "hook"}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)
    def log_message(self, *a):
        pass
s = http.server.HTTPServer(("127.0.0.1", port), H)
if len(sys.argv) > 4:
    # Mutual TLS: CERT FILE, KEY FILE, and the CA a client certificate
    # must chain to (a handshake without one, or with another, fails).
    import ssl
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(sys.argv[4], sys.argv[5])
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(sys.argv[6])
    s.socket = ctx.wrap_socket(s.socket, server_side=True)
with open(portfile + ".tmp", "w") as f:
    f.write(str(s.server_address[1]))
import os; os.rename(portfile + ".tmp", portfile)
s.serve_forever()
"#;

/// [`WEBHOOK`] on 127.0.0.1:`port` in the world's host namespace, logging
/// to `{tag}.jsonl` in `dir`; `tls` (certificate, key, client CA) makes it
/// serve mutual TLS. Returns once it listens: the server (stopped when
/// dropped) and its log.
fn start_webhook(
    w: &World,
    dir: &std::path::Path,
    tag: &str,
    port: u16,
    tls: &[&std::path::Path],
) -> Result<(Proc, PathBuf)> {
    let script = dir.join("hook.py");
    std::fs::write(&script, WEBHOOK)?;
    let log = dir.join(format!("{tag}.jsonl"));
    let portfile = dir.join(format!("{tag}.port"));
    let hook = Proc::spawn(
        "webhook",
        w.host
            .cmd("python3")
            .arg(&script)
            .arg(&log)
            .arg(&portfile)
            .arg(port.to_string())
            .args(tls),
        &dir.join(format!("{tag}.log")),
    )?;
    wait_until("the webhook's port", DEADLINE, || portfile.exists())?;
    Ok((hook, log))
}

/// The requests a webhook logged (none while its log does not exist).
fn requests(log: &std::path::Path) -> Result<Vec<serde_json::Value>> {
    match std::fs::read_to_string(log) {
        Ok(t) => Ok(t
            .lines()
            .map(serde_json::from_str)
            .collect::<Result<_, _>>()?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

/// The guest asks for `hook.test`: it resolves, and the audit says the
/// webhook allowed it once.
fn the_webhook_allows_hook_test(w: &World) -> Result<()> {
    let text = dig(w, "hook.test")?;
    let rec = approval_record(w, "hook.test")?;
    ensure!(status_of(&text) == "NOERROR", "hook.test: {text}\n{rec}");
    ensure!(
        rec["approval"]["by"] == "webhook: hook" && rec["approval"]["decision"] == "allow_once",
        "record: {rec}"
    );
    Ok(())
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn webhook_backend_posts_the_question_with_its_bearer_token() -> Result<()> {
    let dir = TempDir::new(&format!("{}-hook", unique_name()))?;
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret-token\n")?;
    // The gateway runs in the world's host namespace, fresh: the port is free.
    let port = 18080;
    let backend = format!(
        "    webhook:\n      url: http://127.0.0.1:{port}/ask\n      bearer_token_file: {}",
        token.display()
    );
    let w = world(&policy(&backend, ""))?;
    let (_hook, log) = start_webhook(&w, dir.path(), "hook", port, &[])?;
    the_webhook_allows_hook_test(&w)?;
    let seen = requests(&log)?;
    ensure!(seen.len() == 1, "webhook requests: {seen:?}");
    let r = &seen[0];
    ensure!(
        r["path"] == "/ask"
            && r["authorization"] == "Bearer s3cret-token"
            && r["content_type"] == "application/json"
            && r["question"]["name"] == "hook.test"
            && r["question"]["policy"] == "e2e-approval"
            && r["question"]["qtype"] == "A"
            && r["question"]["tcp_ports"] == serde_json::json!([443])
            && r["question"]["sandbox"].is_string(),
        "webhook request: {r}"
    );
    let ca = w.ca_pem();
    let body = w.guest_ok(
        &format!(
            "curl -sS --max-time 60 --cacert {} https://hook.test/echo/hooked",
            ca.display()
        ),
        90,
    )?;
    ensure!(body.contains("hooked"), "curl: {body}");
    Ok(())
}

/// A pinned webhook (review s10 #4): the gateway is given the webhook's
/// address as `sluice run` gives it (`--approval-webhook-name`,
/// `--approval-webhook-addr`) and connects there, though the URL's host,
/// `hook.invalid`, resolves nowhere (RFC 6761); the request still names
/// that host in `Host`.
#[test]
#[ignore = "needs root: run via scripts/test"]
fn a_pinned_webhook_is_reached_at_its_address_not_by_resolving_its_name() -> Result<()> {
    let dir = TempDir::new(&format!("{}-pin", unique_name()))?;
    let port = 18081;
    let backend = format!("    webhook:\n      url: http://hook.invalid:{port}/ask");
    let w = world_from(
        World::builder()
            .policy(&policy(&backend, ""))
            .sidecar_arg("--approval-webhook-name")
            .sidecar_arg("hook.invalid")
            .sidecar_arg("--approval-webhook-addr")
            .sidecar_arg(&format!("127.0.0.1:{port}")),
    )?;
    let (_hook, log) = start_webhook(&w, dir.path(), "hook", port, &[])?;
    the_webhook_allows_hook_test(&w)?;
    let seen = requests(&log)?;
    ensure!(
        seen.len() == 1 && seen[0]["host"] == format!("hook.invalid:{port}"),
        "webhook requests: {seen:?}"
    );
    Ok(())
}

/// A CA (written as `{tag}-ca.pem`) and the leaves it signs, for the
/// mutual TLS webhook.
struct Pki {
    dir: PathBuf,
    tag: String,
    ca: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

impl Pki {
    fn new(dir: &std::path::Path, tag: &str) -> Result<Self> {
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new())?;
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(rcgen::DnType::CommonName, format!("{tag} CA"));
        p.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let ca = rcgen::CertifiedIssuer::self_signed(p, rcgen::KeyPair::generate()?)?;
        std::fs::write(dir.join(format!("{tag}-ca.pem")), ca.pem())?;
        Ok(Self {
            dir: dir.to_path_buf(),
            tag: tag.to_owned(),
            ca,
        })
    }

    fn ca_path(&self) -> PathBuf {
        self.dir.join(format!("{}-ca.pem", self.tag))
    }

    /// A leaf for `name` (its SAN and common name): its certificate and
    /// key files.
    fn leaf(&self, name: &str) -> Result<(PathBuf, PathBuf)> {
        let key = rcgen::KeyPair::generate()?;
        let mut p = rcgen::CertificateParams::new(vec![name.to_owned()])?;
        p.distinguished_name.push(rcgen::DnType::CommonName, name);
        let cert = p.signed_by(&key, &self.ca)?;
        let (c, k) = (
            self.dir.join(format!("{}-{name}.pem", self.tag)),
            self.dir.join(format!("{}-{name}.key", self.tag)),
        );
        std::fs::write(&c, cert.pem())?;
        std::fs::write(&k, key.serialize_pem())?;
        Ok((c, k))
    }
}

/// The webhook over mutual TLS, end to end: Python's `ssl` server on
/// loopback requires a client certificate from the client CA. The
/// gateway presents the one its policy names and the answer comes back
/// (the server saw the client's name); the same gateway against a server
/// that trusts another CA (a wrong certificate), and a gateway whose policy
/// names no client certificate (a missing one), are denied, the audit
/// record saying `webhook: backend_error` with the handshake's failure.
#[test]
#[ignore = "needs root: run via scripts/test"]
fn webhook_backend_over_mutual_tls_and_a_wrong_or_missing_client_cert_denies() -> Result<()> {
    let dir = TempDir::new(&format!("{}-mtls", unique_name()))?;
    let server_pki = Pki::new(dir.path(), "server")?;
    let client_pki = Pki::new(dir.path(), "client")?;
    let other_pki = Pki::new(dir.path(), "other")?;
    let (server_cert, server_key) = server_pki.leaf("127.0.0.1")?;
    let (client_cert, client_key) = client_pki.leaf("sluice-gateway")?;
    let port = 18443;
    let url = format!("https://127.0.0.1:{port}/ask");
    // One server at a time in the world's host namespace, trusting
    // `client_ca` for client certificates.
    let serve = |w: &World, tag: &str, client_ca: &std::path::Path| {
        start_webhook(
            w,
            dir.path(),
            tag,
            port,
            &[&server_cert, &server_key, client_ca],
        )
    };
    let denied = |w: &World, name: &str| -> Result<()> {
        let text = dig(w, name)?;
        let rec = approval_record(w, name)?;
        ensure!(status_of(&text) == "REFUSED", "{name}: {text}\n{rec}");
        ensure!(
            rec["decision"] == "deny"
                && rec["approval"]["by"] == "webhook: backend_error"
                && rec["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "record: {rec}"
        );
        Ok(())
    };

    let backend = format!(
        "    webhook:\n      url: {url}\n      ca: {}\n      client_cert: {}\n      client_key: {}",
        server_pki.ca_path().display(),
        client_cert.display(),
        client_key.display()
    );
    let w = world(&policy(&backend, ""))?;
    // The right client certificate: the question is answered.
    let (mut hook, log) = serve(&w, "right", &client_pki.ca_path())?;
    the_webhook_allows_hook_test(&w)?;
    let seen = requests(&log)?;
    ensure!(
        seen.len() == 1
            && seen[0]["client"] == "sluice-gateway"
            && seen[0]["question"]["name"] == "hook.test",
        "webhook requests: {seen:?}"
    );
    hook.signal_and_wait(libc::SIGTERM, DEADLINE)?;
    // A server that trusts another CA: the gateway's certificate is wrong.
    let (_hook, log) = serve(&w, "wrong", &other_pki.ca_path())?;
    denied(&w, "once.test")?;
    ensure!(requests(&log)?.is_empty(), "a request got through");
    drop(w);

    // No client certificate at all.
    let backend = format!(
        "    webhook:\n      url: {url}\n      ca: {}",
        server_pki.ca_path().display()
    );
    let w = world(&policy(&backend, ""))?;
    let (_hook, log) = serve(&w, "missing", &client_pki.ca_path())?;
    denied(&w, "hook.test")?;
    ensure!(requests(&log)?.is_empty(), "a request got through");
    Ok(())
}

/// A tmux server of the test's own (`tmux -L NAME`), killed on drop: a
/// real pty for the terminal backend.
struct Tmux {
    server: String,
}

impl Tmux {
    fn start(command: &str) -> Result<Self> {
        let server = format!("{}-tmux", unique_name());
        let t = Self { server };
        t.run(&["new-session", "-d", "-x", "200", "-y", "50", command])?;
        Ok(t)
    }

    fn run(&self, args: &[&str]) -> Result<String> {
        let out = std::process::Command::new("tmux")
            .args(["-L", &self.server])
            .args(args)
            .output()
            .context("running tmux (scripts/install-deps installs it)")?;
        ensure!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-J", "-S", "-200"])
            .unwrap_or_default()
    }

    fn keys(&self, keys: &str) -> Result<()> {
        self.run(&["send-keys", keys, "Enter"]).map(|_| ())
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

/// Whether the last question shown as `line` on `screen` settled: its
/// `choice> ` is shown, and keys typed now answer it.
fn question_settled(screen: &str, line: &str) -> bool {
    screen
        .rfind(line)
        .is_some_and(|at| screen[at..].contains("choice> "))
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn terminal_backend_prompts_on_a_real_pty_and_takes_the_key() -> Result<()> {
    let dir = TempDir::new(&format!("{}-tty", unique_name()))?;
    let socket = dir.path().join("ask.sock");
    let prompt = sluice_e2e::bin_path("sluice-ask-prompt")?;
    let tmux = Tmux::start(&format!("{} {}", prompt.display(), socket.display()))?;
    wait_until("the prompt's socket", DEADLINE, || socket.exists())
        .with_context(|| tmux.screen())?;
    let w = world_from(
        World::builder()
            .policy(&policy("    terminal", "  timeout: 120"))
            .sidecar_arg("--approval-socket")
            .sidecar_arg(&socket.display().to_string()),
    )?;
    std::thread::scope(|s| -> Result<()> {
        for (name, key, want, decision) in [
            ("once.test", "o", "NOERROR", "allow_once"),
            ("deny.test", "n", "REFUSED", "deny_sandbox"),
        ] {
            let asked = s.spawn(|| dig(&w, name));
            // The prompt names the exact host and the ports it would open.
            let line = format!("wants to reach {name} (TCP 443)");
            // Keys count from `choice> `: what comes before it is discarded.
            wait_until("the prompt", DEADLINE, || {
                question_settled(&tmux.screen(), &line)
            })
            .with_context(|| tmux.screen())?;
            tmux.keys(key)?;
            let text = asked
                .join()
                .map_err(|_| anyhow::anyhow!("dig thread panicked"))??;
            ensure!(status_of(&text) == want, "{name}: {text}");
            let rec = approval_record(&w, name)?;
            ensure!(
                rec["approval"]["decision"] == decision
                    && rec["approval"]["by"]
                        .as_str()
                        .is_some_and(|b| b.starts_with("terminal")),
                "record: {rec}"
            );
        }
        Ok(())
    })?;
    // deny for this sandbox: asked no more.
    let text = dig(&w, "deny.test")?;
    ensure!(status_of(&text) == "REFUSED");
    ensure!(
        tmux.screen().matches("wants to reach deny.test").count() == 1,
        "asked again: {}",
        tmux.screen()
    );
    Ok(())
}

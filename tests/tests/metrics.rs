//! End-to-end Prometheus metrics (issue 15): the gateway started with
//! `--metrics`, known traffic made from the namespace guest (DNS allowed and
//! refused, TCP allowed and denied, a UDP datagram denied, plain HTTP, TLS
//! with a secret substituted, an ICMP echo dropped, a rejected reload), the
//! endpoint scraped with curl and parsed with a real Prometheus text parser
//! (Debian's python3-prometheus-client, `scripts/install-deps`); every
//! counter checked against the step that moved it and against the audit
//! log. And the guest cannot reach the endpoint, even with no policy.
//!
//! Needs root: run via `scripts/test` (or
//! `cargo test --release -p sluice-e2e --test metrics -- --include-ignored`).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;
use sluice_e2e::{
    ECHO_PORT, HOST_VETH_ADDR, ORIGIN_ADDR, ORIGIN_NAME, ORIGIN2_ADDR, ORIGIN2_NAME, TempDir,
    World, wait_until,
};

const TOK_PLACEHOLDER: &str = "sk-sluice-placeholder-metrics";
const TOK_VALUE: &str = "REAL-metrics-value-0123456789";

/// Generous bound on every wait (the machine is shared and slow).
const DEADLINE: Duration = Duration::from_secs(90);

/// The parser: one JSON array per sample, `[name, labels, value, type]`.
/// Debian's python3 (where `scripts/install-deps` puts the package), not
/// whatever `python3` comes first on the PATH.
const PARSER: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
for fam in text_string_to_metric_families(sys.stdin.read()):
    for s in fam.samples:
        print(json.dumps([s.name, s.labels, s.value, fam.type]))
"#;
const PYTHON: &str = "/usr/bin/python3";

/// `origin.test` on 80 (plain HTTP), 443 (intercepted: the secret is bound
/// to it) and the echo port; nothing else.
fn policy(secret_dir: &Path, id_suffix: &str) -> String {
    format!(
        r#"
version: 1
id: e2e-metrics{id_suffix}
label: "metrics test"
allow:
  - domain: "{ORIGIN_NAME}"
    ports: [80, 443, {ECHO_PORT}]
internal:
  - "198.51.100.0/24"
  - "203.0.113.0/24"
secrets:
  - name: tok
    placeholder: {TOK_PLACEHOLDER}
    file: {}/tok
    hosts: ["{ORIGIN_NAME}"]
dns:
  ttl_min: 600
  ttl_max: 3600
"#,
        secret_dir.display()
    )
}

/// One scrape, parsed.
#[derive(Debug)]
struct Scrape(Vec<(String, BTreeMap<String, String>, f64, String)>);

impl Scrape {
    /// The sum of the samples named `name` whose labels include `labels`.
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.0
            .iter()
            .filter(|(n, l, _, _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|(_, _, v, _)| v)
            .sum()
    }

    /// The samples named `name`.
    fn samples(
        &self,
        name: &str,
    ) -> impl Iterator<Item = &(String, BTreeMap<String, String>, f64, String)> {
        self.0.iter().filter(move |s| s.0 == name)
    }

    /// The family type the parser gave samples named `name`.
    fn type_of(&self, name: &str) -> Option<&str> {
        self.samples(name).next().map(|s| s.3.as_str())
    }
}

/// Parses exposition `text` with the Prometheus client's text parser.
fn parse(text: &str) -> Result<Scrape> {
    let mut child = Command::new(PYTHON)
        .arg("-c")
        .arg(PARSER)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running /usr/bin/python3 (the Prometheus text parser)")?;
    child
        .stdin
        .take()
        .context("parser stdin")?
        .write_all(text.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "the Prometheus parser refused the exposition (is python3-prometheus-client \
             installed? scripts/install-deps): {}\n--- exposition ---\n{text}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut samples = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let (name, labels, value, ty): (String, BTreeMap<String, String>, f64, String) =
            serde_json::from_str(line).with_context(|| format!("parser line {line}"))?;
        samples.push((name, labels, value, ty));
    }
    ensure!(!samples.is_empty(), "no samples in: {text}");
    Ok(Scrape(samples))
}

/// Scrapes `url` (curl, in the host namespace, with `curl_args` such as
/// `--unix-socket PATH`) and parses it.
fn scrape(w: &World, curl_args: &str, url: &str) -> Result<Scrape> {
    let text = w
        .host_ok(
            &format!("curl -sS --fail --max-time 30 {curl_args} {url}"),
            60,
        )
        .context("scraping /metrics")?;
    parse(&text)
}

/// The audit records of `kind`.
fn records(w: &World, kind: &str) -> Result<Vec<Value>> {
    Ok(w.audit()?
        .into_iter()
        .filter(|r| r["kind"] == kind)
        .collect())
}

/// Asserts `after - before` of counter `name{labels}` is `want`.
fn delta(
    before: &Scrape,
    after: &Scrape,
    name: &str,
    labels: &[(&str, &str)],
    want: f64,
) -> Result<()> {
    let got = after.sum(name, labels) - before.sum(name, labels);
    ensure!(
        (got - want).abs() < 0.5,
        "{name}{labels:?}: moved by {got}, want {want}"
    );
    Ok(())
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn every_counter_matches_the_traffic_made() -> Result<()> {
    let secrets = TempDir::new(&format!("mm-{}", sluice_e2e::unique_name()))?;
    std::fs::write(secrets.path().join("tok"), TOK_VALUE)?;
    let w = World::builder()
        .policy(&policy(secrets.path(), ""))
        .sidecar_arg("--ca-out")
        .sidecar_arg("{dir}/sandbox-ca.pem")
        .sidecar_arg("--upstream-ca")
        .sidecar_arg("{dir}/ca.pem")
        .sidecar_arg("--metrics")
        .sidecar_arg("unix:{dir}/metrics.sock")
        .start()?;
    let sock = w.dir().join("metrics.sock");
    let via = format!("--unix-socket {}", sock.display());
    let url = "http://localhost/metrics";
    let s0 = scrape(&w, &via, url)?;

    // The exposition's shape: counters are counters, the info is a gauge.
    for c in [
        "sluice_audit_lines_written_total",
        "sluice_audit_write_errors_total",
    ] {
        ensure!(s0.type_of(c) == Some("counter"), "{c}: {:?}", s0.type_of(c));
    }
    // The policy in force, with the version the audit names.
    let started = records(&w, "gateway")?;
    let version = started
        .first()
        .and_then(|r| r["policy"]["version"].as_str())
        .context("no gateway record")?
        .to_owned();
    ensure!(
        s0.sum(
            "sluice_policy_info",
            &[
                ("id", "e2e-metrics"),
                ("version", &version),
                ("label", "metrics test")
            ]
        ) == 1.0,
        "policy info: {:?}",
        s0.samples("sluice_policy_info").collect::<Vec<_>>()
    );
    ensure!(
        s0.sum("sluice_process_resident_memory_bytes", &[]) > 1e6,
        "rss"
    );
    ensure!(s0.sum("sluice_process_open_fds", &[]) >= 3.0, "fds");

    // 1. DNS: one answered, one refused.
    let out = w.guest_ok(&format!("dig +time=20 +tries=1 {ORIGIN_NAME} A"), 60)?;
    ensure!(out.contains("status: NOERROR"), "{out}");
    let out = w.guest_ok(&format!("dig +time=20 +tries=1 {ORIGIN2_NAME} A"), 60)?;
    ensure!(out.contains("status: REFUSED"), "{out}");
    let s1 = scrape(&w, &via, url)?;
    delta(&s0, &s1, "sluice_dns_queries_total", &[], 2.0)?;
    delta(
        &s0,
        &s1,
        "sluice_dns_queries_total",
        &[("decision", "allow"), ("reason", "dns_answered")],
        1.0,
    )?;
    delta(
        &s0,
        &s1,
        "sluice_dns_queries_total",
        &[("decision", "deny"), ("reason", "not_allowlisted")],
        1.0,
    )?;

    // 2. An allowed raw TCP flow (spliced, not inspected): 5000 bytes echoed.
    let out = w.guest_ok(
        &format!("head -c 5000 /dev/zero | nc -N {ORIGIN_ADDR} {ECHO_PORT} | wc -c"),
        60,
    )?;
    ensure!(out.trim() == "5000", "echo returned {out}");
    w.wait_audit("the echo flow's close", DEADLINE, |r| {
        r["kind"] == "flow_close" && r["dst"]["port"] == ECHO_PORT
    })?;
    let s2 = scrape(&w, &via, url)?;
    delta(
        &s1,
        &s2,
        "sluice_flows_opened_total",
        &[("transport", "tcp"), ("decision", "allow")],
        1.0,
    )?;
    delta(
        &s1,
        &s2,
        "sluice_flows_closed_total",
        &[("transport", "tcp"), ("reason", "closed")],
        1.0,
    )?;
    delta(
        &s1,
        &s2,
        "sluice_flow_bytes_total",
        &[("transport", "tcp"), ("direction", "up")],
        5000.0,
    )?;
    delta(
        &s1,
        &s2,
        "sluice_flow_bytes_total",
        &[("transport", "tcp"), ("direction", "down")],
        5000.0,
    )?;
    delta(&s1, &s2, "sluice_inspections_total", &[], 0.0)?;

    // 3. Denied: TCP to an address no allowed name resolved to; one UDP
    //    datagram to a port no rule lists; one ICMP echo to the origin.
    let out = w.guest_sh(
        &format!("curl -sS --connect-timeout 20 http://{ORIGIN2_ADDR}/"),
        60,
    )?;
    ensure!(!out.status.success(), "denied TCP connected");
    w.guest_sh(&format!("echo x | nc -u -w1 {ORIGIN_ADDR} 5999"), 30)?;
    // One echo request (python3's raw socket: no ping in the test's deps).
    let ping = w.guest_sh(
        &format!(
            "python3 -c \"import socket,struct; m=struct.pack('!BBHHH',8,0,0xf7fd,1,1); \
             socket.socket(socket.AF_INET,socket.SOCK_RAW,socket.IPPROTO_ICMP).sendto(m,('{ORIGIN_ADDR}',0))\""
        ),
        30,
    )?;
    w.wait_audit("the dropped ICMP echo", DEADLINE, |r| {
        r["reason"] == "icmp_blocked"
    })
    .with_context(|| format!("ping: {ping:?}"))?;
    let denied_tcp = w.wait_audit("the denied TCP flow", DEADLINE, |r| {
        r["kind"] == "connection"
            && r["decision"] == "deny"
            && r["dst"]["ip"] == ORIGIN2_ADDR.to_string()
    })?;
    let denied_udp = w.wait_audit("the denied datagram", DEADLINE, |r| {
        r["kind"] == "connection" && r["decision"] == "deny" && r["dst"]["port"] == 5999
    })?;
    let s3 = scrape(&w, &via, url)?;
    let tcp_reason = denied_tcp["reason"].as_str().context("reason")?;
    let udp_reason = denied_udp["reason"].as_str().context("reason")?;
    delta(
        &s2,
        &s3,
        "sluice_flows_opened_total",
        &[
            ("transport", "tcp"),
            ("decision", "deny"),
            ("reason", tcp_reason),
        ],
        1.0,
    )?;
    delta(
        &s2,
        &s3,
        "sluice_flows_opened_total",
        &[
            ("transport", "udp"),
            ("decision", "deny"),
            ("reason", udp_reason),
        ],
        1.0,
    )?;
    delta(
        &s2,
        &s3,
        "sluice_flows_opened_total",
        &[("decision", "allow")],
        0.0,
    )?;
    delta(
        &s2,
        &s3,
        "sluice_frames_dropped_total",
        &[("reason", "icmp")],
        1.0,
    )?;

    // 4. Plain HTTP (the plain-HTTP proxy checks the Host) and HTTPS with
    //    the secret substituted (the interception proxy).
    w.guest_ok(
        &format!("curl -sS --max-time 60 http://{ORIGIN_NAME}/echo/plain"),
        90,
    )?;
    let ca = w.dir().join("sandbox-ca.pem");
    let out = w.guest_ok(
        &format!(
            "curl -sS --max-time 60 --cacert {} -H 'Authorization: Bearer {TOK_PLACEHOLDER}' \
             https://{ORIGIN_NAME}/echo/tls",
            ca.display()
        ),
        90,
    )?;
    ensure!(!out.contains(TOK_VALUE), "the guest saw the value: {out}");
    let got = w
        .origin_requests()
        .into_iter()
        .find(|r| r["path"] == "/echo/tls")
        .context("the origin got no /echo/tls")?;
    ensure!(got.to_string().contains(TOK_VALUE), "origin got {got}");
    for path in ["/echo/plain", "/echo/tls"] {
        w.wait_audit("the http record", DEADLINE, |r| {
            r["kind"] == "http" && r["path"] == path
        })?;
    }
    wait_until("every flow closed", DEADLINE, || {
        scrape(&w, &via, url).is_ok_and(|s| s.sum("sluice_active_flows", &[]) == 0.0)
    })
    .with_context(|| w.sidecar_log())?;
    let s4 = scrape(&w, &via, url)?;
    delta(
        &s3,
        &s4,
        "sluice_interceptions_total",
        &[("proxy", "http")],
        1.0,
    )?;
    delta(
        &s3,
        &s4,
        "sluice_interceptions_total",
        &[("proxy", "tls")],
        1.0,
    )?;
    delta(
        &s3,
        &s4,
        "sluice_inspections_total",
        &[("field", "host"), ("decision", "allow")],
        1.0,
    )?;
    delta(
        &s3,
        &s4,
        "sluice_inspections_total",
        &[("field", "sni"), ("decision", "allow")],
        1.0,
    )?;
    delta(
        &s3,
        &s4,
        "sluice_http_requests_total",
        &[("decision", "allow")],
        2.0,
    )?;
    delta(
        &s3,
        &s4,
        "sluice_secrets_substituted_total",
        &[("secret", "tok")],
        1.0,
    )?;
    ensure!(
        !s4.0
            .iter()
            .any(|s| s.1.values().any(|v| v.contains(TOK_VALUE))),
        "a secret value in a label"
    );

    // 5. A rejected reload: the counter moves, the policy in force stays.
    std::fs::write(
        w.dir().join("policy.yaml"),
        "version: 1\nid: x\ncolour: blue\n",
    )?;
    w.wait_audit("reload_rejected", DEADLINE, |r| {
        r["reason"] == "reload_rejected"
    })?;
    let s5 = scrape(&w, &via, url)?;
    delta(
        &s4,
        &s5,
        "sluice_reloads_total",
        &[("result", "rejected")],
        1.0,
    )?;
    delta(
        &s4,
        &s5,
        "sluice_reloads_total",
        &[("result", "applied")],
        0.0,
    )?;
    ensure!(
        s5.sum(
            "sluice_policy_info",
            &[("id", "e2e-metrics"), ("version", &version)]
        ) == 1.0
    );
    // An applied one: the info metric names the new policy, alone.
    std::fs::write(w.dir().join("policy.yaml"), policy(secrets.path(), "-b"))?;
    w.wait_audit("reload_applied", DEADLINE, |r| {
        r["reason"] == "reload_applied"
    })?;
    let s6 = scrape(&w, &via, url)?;
    delta(
        &s5,
        &s6,
        "sluice_reloads_total",
        &[("result", "applied")],
        1.0,
    )?;
    let info: Vec<_> = s6.samples("sluice_policy_info").collect();
    ensure!(
        info.len() == 1 && info[0].1.get("id").map(String::as_str) == Some("e2e-metrics-b"),
        "policy info after reload: {info:?}"
    );

    // 6. The whole run against the audit log: nothing was suppressed, so
    //    every record is a line, and each counter equals its records.
    let audit = w.audit()?;
    ensure!(s6.sum("sluice_audit_records_suppressed_total", &[]) == 0.0);
    ensure!(
        s6.sum("sluice_audit_lines_written_total", &[]) == audit.len() as f64,
        "audit lines: metric {} file {}",
        s6.sum("sluice_audit_lines_written_total", &[]),
        audit.len()
    );
    let count = |pred: &dyn Fn(&Value) -> bool| audit.iter().filter(|r| pred(r)).count() as f64;
    for (name, kind, keys) in [
        (
            "sluice_flows_opened_total",
            "connection",
            &["transport", "decision", "reason"][..],
        ),
        (
            "sluice_flows_closed_total",
            "flow_close",
            &["transport", "reason"][..],
        ),
        (
            "sluice_dns_queries_total",
            "dns",
            &["decision", "reason"][..],
        ),
        (
            "sluice_http_requests_total",
            "http",
            &["decision", "reason"][..],
        ),
    ] {
        for (_, labels, value, _) in s6.samples(name) {
            let want = count(&|r: &Value| {
                r["kind"] == kind
                    && keys
                        .iter()
                        .all(|k| r[*k].as_str() == labels.get(*k).map(String::as_str))
            });
            ensure!(
                *value == want,
                "{name}{labels:?} = {value}, audit has {want}"
            );
        }
        let total = count(&|r: &Value| {
            r["kind"] == kind && (kind != "connection" || r["transport"].is_string())
        });
        ensure!(
            s6.sum(name, &[]) == total,
            "{name}: {} vs audit {total}",
            s6.sum(name, &[])
        );
    }
    for (direction, field) in [("up", "bytes_up"), ("down", "bytes_down")] {
        let want: u64 = audit
            .iter()
            .filter(|r| r["kind"] == "flow_close")
            .filter_map(|r| r[field].as_u64())
            .sum();
        ensure!(
            s6.sum("sluice_flow_bytes_total", &[("direction", direction)]) == want as f64,
            "bytes {direction}: audit {want}"
        );
    }
    // Unknown paths and methods are refused.
    let out = w.host_ok(
        &format!("curl -s -o /dev/null -w '%{{http_code}}' {via} http://localhost/other"),
        30,
    )?;
    ensure!(out == "404", "GET /other: {out}");
    Ok(())
}

/// Sends one TCP SYN in a raw Ethernet frame out of the interface named in
/// argv[1] (python3, AF_PACKET): from argv[2] to argv[3]:argv[4], the
/// interface's own MAC as source (another would be dropped as spoofed).
const SEND_SYN: &str = r#"
import socket, struct, sys
dev, src, dst, dport = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
mac = bytes.fromhex(open("/sys/class/net/%s/address" % dev).read().strip().replace(":", ""))
def csum(b):
    if len(b) % 2:
        b += bytes(1)
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while s >> 16:
        s = (s & 0xffff) + (s >> 16)
    return (~s) & 0xffff
sa, da = socket.inet_aton(src), socket.inet_aton(dst)
tcp = struct.pack("!HHIIBBHHH", 40123, dport, 1, 0, 5 << 4, 0x02, 64240, 0, 0)
pseudo = sa + da + struct.pack("!BBH", 0, 6, len(tcp))
tcp = tcp[:16] + struct.pack("!H", csum(pseudo + tcp)) + tcp[18:]
ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 1, 0x4000, 64, 6, 0, sa, da)
ip = ip[:10] + struct.pack("!H", csum(ip)) + ip[12:]
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((dev, 0))
s.send(b"\xff" * 6 + mac + b"\x08\x00" + ip + tcp)
"#;

/// The TCP address the gateway logged for its metrics endpoint.
fn logged_metrics_addr(w: &World) -> Result<String> {
    let log = std::fs::read_to_string(w.dir().join("sidecar.log"))?;
    for line in log.lines() {
        if let Ok(v) = serde_json::from_str::<Value>(line)
            && let Some(a) = v["fields"]["metrics"].as_str()
        {
            return Ok(a.to_owned());
        }
    }
    bail!("no metrics address in the log\n{}", w.sidecar_log())
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn the_guest_cannot_reach_the_metrics_endpoint() -> Result<()> {
    // No policy: only the platform deny set stands between the guest and
    // every address, and the endpoint listens on all of the host's.
    let w = World::builder()
        .sidecar_arg("--metrics")
        .sidecar_arg("0.0.0.0:0")
        .start()?;
    let addr = logged_metrics_addr(&w)?;
    let port: u16 = addr
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .with_context(|| format!("logged address {addr}"))?;
    ensure!(port != 0, "{addr}");

    // The endpoint is there for the host, on each address.
    let targets = [
        "127.0.0.1".to_owned(),
        HOST_VETH_ADDR.to_string(),
        "10.0.2.2".to_owned(),
    ];
    for host in &targets[..2] {
        scrape(&w, "", &format!("http://{host}:{port}/metrics"))?;
    }
    // The guest reaches the fake internet ...
    w.guest_ok(
        &format!("curl -sS --max-time 60 http://{ORIGIN_ADDR}/echo/x"),
        90,
    )?;
    // ... but not the endpoint, by the host's address or the gateway's ...
    for host in &targets[1..] {
        let out = w.guest_sh(
            &format!("curl -sS --connect-timeout 20 --max-time 30 http://{host}:{port}/metrics"),
            60,
        )?;
        ensure!(
            !out.status.success() && !String::from_utf8_lossy(&out.stdout).contains("sluice_"),
            "the guest scraped {host}:{port}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    // ... nor by loopback: the guest's own stack answers 127.0.0.1, so the
    // SYN is written as a raw frame to the gateway (as a hostile guest
    // kernel would send it).
    let guest_ip = w.lease().context("no lease")?.ip;
    w.guest_ok(
        &format!(
            "python3 -c '{SEND_SYN}' {} {guest_ip} 127.0.0.1 {port}",
            sluice_e2e::GUEST_TAP
        ),
        30,
    )?;
    for host in &targets {
        let rec = w.wait_audit("the denial", DEADLINE, |r| {
            r["kind"] == "connection" && r["dst"]["ip"] == host.as_str() && r["dst"]["port"] == port
        })?;
        ensure!(
            rec["decision"] == "deny" && rec["reason"] == "platform_denied",
            "{host}: {rec}"
        );
    }
    let s = scrape(&w, "", &format!("http://127.0.0.1:{port}/metrics"))?;
    ensure!(
        s.sum(
            "sluice_flows_opened_total",
            &[("decision", "deny"), ("reason", "platform_denied")]
        ) >= 3.0,
        "denials not counted"
    );
    Ok(())
}

//! `sluice-enforce-bench`: the cost of enforcement (`benches/enforce.sh`).
//!
//! Runs the same gateway through the same harness twice, one after the
//! other: once allowing everything (no `--policy`: the platform deny set only,
//! no DNS filtering, no inspection) and once with a realistic 1,000-rule
//! policy ([`rules_policy`]) under which the benchmark's own traffic is
//! allowed by one of the rules (so the allowed path is measured, with DNS
//! filtering, table cross-validation and ClientHello / Host inspection). For
//! each it measures:
//!
//! - bulk throughput: iperf3 up and down (raw TCP port 5201, decided at the
//!   SYN) and a 256 MiB plain-HTTP download (inspected: Host read first);
//! - connection setup: TCP connect + first byte from the banner port (p50,
//!   p99, via `sluice-bench connrate`) and HTTPS connect + TLS handshake
//!   (`curl -w %{time_appconnect}`, p50, p99; inspected: the gateway reads
//!   the ClientHello before it connects upstream);
//! - DNS: sequential A queries for an allowed name (`sluice-bench dnsqps`),
//!   reported as queries/s and mean latency.
//!
//! Prints the JSON of both runs and a markdown table with the ratio /
//! difference, and the load average before and after. One run each on a
//! shared machine: read ratios, not absolutes.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde_json::{Value, json};
use sluice_e2e::{BANNER_PORT, ORIGIN_ADDR, ORIGIN_NAME, World, bin_path};

/// Command line.
#[derive(Parser, Debug)]
#[command(about = "Cost of enforcement: allow-all vs a 1,000-rule policy, same gateway")]
struct Args {
    /// Seconds per iperf3 run.
    #[arg(long, default_value_t = 10)]
    secs: u32,
    /// Connections for the TCP connect test.
    #[arg(long, default_value_t = 1000)]
    conns: u32,
    /// HTTPS handshakes for the TLS setup test.
    #[arg(long, default_value_t = 200)]
    tls: u32,
    /// DNS queries.
    #[arg(long, default_value_t = 3000)]
    queries: u32,
    /// Rules in the policy.
    #[arg(long, default_value_t = 1000)]
    rules: usize,
    /// Also write the policy used here.
    #[arg(long)]
    write_policy: Option<std::path::PathBuf>,
}

fn main() -> Result<()> {
    let a = Args::parse();
    let policy = rules_policy(a.rules);
    if let Some(p) = &a.write_policy {
        std::fs::write(p, &policy)?;
    }
    let load_before = loadavg();
    let base = run(None, &a).context("allow-all run")?;
    let enforced = run(Some(&policy), &a).context("policy run")?;
    let load_after = loadavg();
    let all = json!({
        "allow_all": base, "policy": enforced, "rules": a.rules,
        "load_before": load_before, "load_after": load_after,
    });
    println!("{all}");
    println!();
    print!("{}", table(&all));
    Ok(())
}

/// A realistic policy of `n` rules: exact names, `*.` and `**.` wildcards
/// (some on extra ports), a few CIDR rules and deny rules, in the shapes an
/// agent sandbox uses (package registries, APIs, CDNs); the benchmark's
/// origin is one exact rule in the middle.
fn rules_policy(n: usize) -> String {
    let mut y = String::from("version: 1\nid: bench-1000\nallow:\n");
    let tlds = ["com", "net", "org", "io", "dev"];
    for i in 0..n.saturating_sub(1) {
        if i == n / 2 {
            let _ = writeln!(
                y,
                "  - domain: \"{ORIGIN_NAME}\"\n    ports: [80, 443, {BANNER_PORT}, 5201]"
            );
        }
        let t = tlds[i % tlds.len()];
        let _ = match i % 10 {
            0..=5 => writeln!(y, "  - domain: \"api{i}.service{i}.{t}\""),
            6 => writeln!(y, "  - domain: \"*.cdn{i}.example{i}.{t}\""),
            7 => writeln!(
                y,
                "  - domain: \"**.registry{i}.{t}\"\n    ports: [443, 80]"
            ),
            8 => writeln!(
                y,
                "  - domain: \"db{i}.internal{i}.{t}\"\n    ports: [5432, 6379]"
            ),
            _ => writeln!(
                y,
                "  - cidr: \"100.{}.{}.0/24\"\n    ports: [443]",
                64 + (i / 250) % 64,
                i % 250
            ),
        };
    }
    y.push_str("deny:\n  - \"evil.example.com\"\n  - \"*.tracker.example.net\"\n");
    y.push_str("internal:\n  - \"198.51.100.0/24\"\n  - \"203.0.113.0/24\"\n");
    // dnsmasq answers with TTL 0: keep the table entry for the whole run.
    y.push_str("dns:\n  ttl_min: 3600\n  ttl_max: 3600\n");
    y
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Runs `sluice-bench ARGS` in the guest and parses its JSON line.
fn guest_bench(w: &World, args: &str, secs: u32) -> Result<Value> {
    let bench = bin_path("sluice-bench")?;
    let out = w.guest_ok(&format!("{} {args}", bench.display()), secs)?;
    serde_json::from_str(out.trim()).with_context(|| format!("bench output {out}"))
}

/// iperf3 from the guest to the origin by name; Gbit/s received.
fn iperf(w: &World, secs: u32, reverse: bool) -> Result<f64> {
    let out = w.guest_ok(
        &format!(
            "iperf3 -c {ORIGIN_NAME} -t {secs} {} -J",
            if reverse { "-R" } else { "" }
        ),
        secs + 60,
    )?;
    let v: Value = serde_json::from_str(&out).context("iperf3 JSON")?;
    let bps = v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .context("no sum_received in iperf3 output")?;
    Ok(bps / 1e9)
}

/// Nearest-rank percentile of a sorted sample.
fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    // The first index at or past p of the way through (nearest rank).
    (0..=last)
        .find(|&i| i as f64 >= p * last as f64 - 0.5)
        .and_then(|i| sorted.get(i).copied())
}

fn run(policy: Option<&str>, a: &Args) -> Result<Value> {
    let mut b = World::builder().iperf();
    if let Some(p) = policy {
        b = b.policy(p);
    }
    let w = b.start()?;
    let dns = w
        .lease()
        .and_then(|l| l.dns.first().copied())
        .context("no DNS server in the lease")?;
    // Resolve through the gateway first (fills its table), and let iperf3 up.
    w.guest_ok(&format!("dig +short {ORIGIN_NAME}"), 30)?;
    std::thread::sleep(Duration::from_millis(300));

    let up = iperf(&w, a.secs, false)?;
    let down = iperf(&w, a.secs, true)?;
    let n: u64 = 256 << 20;
    let http = w.guest_ok(
        &format!(
            "curl -sS -o /dev/null --max-time 300 -w '%{{speed_download}}' http://{ORIGIN_NAME}/bytes/{n}"
        ),
        320,
    )?;
    let http_gbps = http.trim().parse::<f64>().context("curl speed")? * 8.0 / 1e9;

    // Connects by address: the policy's TTL floor keeps the entry the dig
    // above made for the whole run.
    let cr = guest_bench(
        &w,
        &format!(
            "connrate --addr {ORIGIN_ADDR}:{BANNER_PORT} --count {}",
            a.conns
        ),
        900,
    );
    let cr = match cr {
        Ok(v) => v,
        Err(e) => bail!("connrate: {e:#}"),
    };
    let ca = w.ca_pem();
    let tls = w.guest_ok(
        &format!(
            "for i in $(seq {}); do curl -sS -o /dev/null --cacert {} -w '%{{time_connect}} %{{time_appconnect}}\\n' https://{ORIGIN_NAME}/echo/x || echo fail; done",
            a.tls,
            ca.display()
        ),
        900,
    )?;
    let mut handshake: Vec<f64> = Vec::new();
    let mut tls_failed = 0u32;
    for l in tls.lines() {
        let mut it = l.split_whitespace().filter_map(|x| x.parse::<f64>().ok());
        match (it.next(), it.next()) {
            (Some(_), Some(app)) => handshake.push(app * 1e6),
            _ => tls_failed += 1,
        }
    }
    handshake.sort_by(f64::total_cmp);
    let dq = guest_bench(
        &w,
        &format!(
            "dnsqps --server {dns}:53 --name {ORIGIN_NAME} --count {}",
            a.queries
        ),
        900,
    )?;
    let qps = dq["qps"].as_f64().unwrap_or(f64::NAN);
    Ok(json!({
        "policy": policy.is_some(),
        "up_gbps": up, "down_gbps": down, "http_down_gbps": http_gbps,
        "conn_p50_us": cr["p50_us"], "conn_p99_us": cr["p99_us"], "conn_rate": cr["rate"],
        "conn_failed": cr["failed"],
        "tls_p50_us": percentile(&handshake, 0.5), "tls_p99_us": percentile(&handshake, 0.99),
        "tls_failed": tls_failed,
        "dns_qps": qps, "dns_mean_us": 1e6 / qps, "dns_failed": dq["failed"],
    }))
}

fn table(all: &Value) -> String {
    let rows = [
        ("up_gbps", "iperf3 up, raw TCP (Gbit/s)"),
        ("down_gbps", "iperf3 down, raw TCP (Gbit/s)"),
        (
            "http_down_gbps",
            "256 MiB HTTP download, inspected (Gbit/s)",
        ),
        ("conn_p50_us", "TCP connect + first byte p50 (us)"),
        ("conn_p99_us", "TCP connect + first byte p99 (us)"),
        ("tls_p50_us", "HTTPS connect + TLS handshake p50 (us)"),
        ("tls_p99_us", "HTTPS connect + TLS handshake p99 (us)"),
        ("dns_qps", "DNS A queries/s (forwarded)"),
        ("dns_mean_us", "DNS query mean latency (us)"),
    ];
    let mut t = format!(
        "| metric | allow-all (no policy) | {}-rule policy | policy / allow-all | added |\n|---|---|---|---|---|\n",
        all["rules"]
    );
    for (k, label) in rows {
        let a = all["allow_all"][k].as_f64();
        let p = all["policy"][k].as_f64();
        let f = |v: Option<f64>| match v {
            Some(x) if x >= 100.0 => format!("{x:.0}"),
            Some(x) => format!("{x:.2}"),
            None => "n/a".into(),
        };
        let ratio = match (a, p) {
            (Some(a), Some(p)) if a != 0.0 => format!("{:.2}", p / a),
            _ => "n/a".into(),
        };
        let added = match (a, p) {
            (Some(a), Some(p)) if k.ends_with("_us") => format!("{:+.0} us", p - a),
            _ => String::new(),
        };
        let _ = writeln!(t, "| {label} | {} | {} | {ratio} | {added} |", f(a), f(p));
    }
    let _ = writeln!(
        t,
        "\nload average before: {}, after: {}; failures: allow-all conn {} tls {} dns {}, policy conn {} tls {} dns {}",
        all["load_before"],
        all["load_after"],
        all["allow_all"]["conn_failed"],
        all["allow_all"]["tls_failed"],
        all["allow_all"]["dns_failed"],
        all["policy"]["conn_failed"],
        all["policy"]["tls_failed"],
        all["policy"]["dns_failed"],
    );
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generated_policy_compiles_with_the_requested_rule_count() {
        let y = rules_policy(1000);
        let allow = y.split("deny:").next().unwrap_or_default();
        assert_eq!(
            allow.lines().filter(|l| l.starts_with("  - ")).count(),
            1000
        );
        let p = sluice_policy::from_yaml_str(&y, "bench.yaml", &Default::default())
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(p.check_name(ORIGIN_NAME).is_allowed());
        assert!(!p.check_name("evil.example.com").is_allowed());
        assert!(p.check_name("x.cdn6.example6.net").is_allowed());
    }

    #[test]
    fn percentiles_pick_nearest_rank() {
        let s: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&s, 0.5), Some(50.0));
        assert_eq!(percentile(&s, 0.99), Some(99.0));
        assert_eq!(percentile(&[], 0.5), None);
    }
}

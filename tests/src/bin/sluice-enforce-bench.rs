//! `sluice-enforce-bench`: the cost of enforcement (`benches/enforce.sh`).
//!
//! Runs the same gateway through the same harness twice, one after the
//! other: once allowing everything (no `--policy`: the platform deny set only,
//! no DNS filtering, no inspection) and once with a realistic 1,000-rule
//! policy (`sluice_e2e::bench::rules_policy`) under which the benchmark's own traffic is
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
use sluice_e2e::bench::{guest_bench, iperf, load_average, percentile, rules_policy, table_cell};
use sluice_e2e::{BANNER_PORT, ORIGIN_ADDR, ORIGIN_NAME, World};

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
    let load_before = load_average();
    let base = run(None, &a).context("allow-all run")?;
    let enforced = run(Some(&policy), &a).context("policy run")?;
    let load_after = load_average();
    let all = json!({
        "allow_all": base, "policy": enforced, "rules": a.rules,
        "load_before": load_before, "load_after": load_after,
    });
    println!("{all}");
    println!();
    print!("{}", table(&all));
    Ok(())
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

    let up = iperf(&w, ORIGIN_NAME, a.secs, 1, false)?;
    let down = iperf(&w, ORIGIN_NAME, a.secs, 1, true)?;
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
        let ratio = match (a, p) {
            (Some(a), Some(p)) if a != 0.0 => format!("{:.2}", p / a),
            _ => "n/a".into(),
        };
        let added = match (a, p) {
            (Some(a), Some(p)) if k.ends_with("_us") => format!("{:+.0} us", p - a),
            _ => String::new(),
        };
        let _ = writeln!(
            t,
            "| {label} | {} | {} | {ratio} | {added} |",
            table_cell(a),
            table_cell(p)
        );
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

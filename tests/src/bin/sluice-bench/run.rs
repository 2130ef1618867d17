//! `run`: one sidecar's datapath figures at one MTU as one JSON line
//! (iperf3 up and down, connect rate and latency, cached DNS queries/s,
//! RSS idle and with open flows, start-up time); and `table`, the markdown
//! table of `docs/benchmarks.md` made from those lines, with ratios to
//! passt.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{Value, json};
use sluice_e2e::bench::{guest_bench, iperf, load_average_1min, table_cell};
use sluice_e2e::{BANNER_PORT, ECHO_PORT, ORIGIN_ADDR, ORIGIN_NAME, World, bin_path};

use crate::parse_sidecar;

/// The fake DNS's record TTL in `run` (seconds): long enough that every
/// repeat of the measured name is a cache hit where there is a cache.
const RUN_DNS_TTL: u32 = 300;

/// Arguments of `run`.
#[derive(clap::Args, Debug)]
pub(super) struct RunArgs {
    /// `gateway` or `passt`.
    #[arg(long)]
    sidecar: String,
    /// MTU the sidecar advertises.
    #[arg(long)]
    mtu: u32,
    /// Seconds per iperf3 run.
    #[arg(long, default_value_t = 10)]
    secs: u32,
    /// Connections for the connection-rate test.
    #[arg(long, default_value_t = 2000)]
    conns: u32,
    /// Queries for the DNS test.
    #[arg(long, default_value_t = 5000)]
    queries: u32,
    /// Flows held open for the RSS-under-load figure.
    #[arg(long, default_value_t = 1000)]
    flows: u32,
    /// TCP congestion control in every namespace of the world (e.g.
    /// `cubic`, Debian's default); without it the namespaces inherit the
    /// host's. Printed in the line either way.
    #[arg(long)]
    cc: Option<String>,
    /// Extra argument for the sidecar (repeatable), e.g. `--flow-buffer-kib=256`.
    #[arg(long, allow_hyphen_values = true)]
    sidecar_arg: Vec<String>,
}

/// `run`: see the module docs.
pub(super) fn run(a: &RunArgs) -> Result<Value> {
    let s = parse_sidecar(&a.sidecar)?;
    let RunArgs {
        mtu,
        secs,
        conns,
        queries,
        flows,
        ..
    } = *a;
    let load_start = load_average_1min();
    // The DNS figure is of cached answers (issue 16): with a positive TTL
    // the gateway answers repeats from its cache; passt has none and
    // forwards each to dnsmasq.
    let (mut b, cc) = World::builder()
        .sidecar(s)
        .mtu(mtu)
        .dns_ttl(RUN_DNS_TTL)
        .iperf()
        .congestion_or_host(a.cc.as_deref());
    for x in &a.sidecar_arg {
        b = b.sidecar_arg(x);
    }
    let mut w = b.start()?;
    let startup_ms = w.sidecar_startup().as_secs_f64() * 1e3;
    let rss_idle_kb = w.sidecar().and_then(|p| p.rss_kb());
    // Let iperf3 come up (it was started with the world).
    std::thread::sleep(Duration::from_millis(300));
    let up1 = iperf(&w, &ORIGIN_ADDR.to_string(), secs, 1, false)?;
    let up4 = iperf(&w, &ORIGIN_ADDR.to_string(), secs, 4, false)?;
    let down1 = iperf(&w, &ORIGIN_ADDR.to_string(), secs, 1, true)?;
    let down4 = iperf(&w, &ORIGIN_ADDR.to_string(), secs, 4, true)?;
    let cr = guest_bench(
        &w,
        &format!("connrate --addr {ORIGIN_ADDR}:{BANNER_PORT} --count {conns}"),
        600,
    )?;
    let dns_server = w
        .lease()
        .and_then(|l| l.dns.first().copied())
        .context("no DNS server in the lease")?;
    // Warm the cache, then measure.
    guest_bench(
        &w,
        &format!("dnsqps --server {dns_server}:53 --name {ORIGIN_NAME} --count 5"),
        60,
    )?;
    let dq = guest_bench(
        &w,
        &format!("dnsqps --server {dns_server}:53 --name {ORIGIN_NAME} --count {queries}"),
        600,
    )?;

    // RSS with `flows` open flows.
    let bench = bin_path("sluice-bench")?;
    let mut holder = w
        .guest
        .cmd("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -n 8192 2>/dev/null; exec {} hold --addr {ORIGIN_ADDR}:{ECHO_PORT} --count {flows}",
            bench.display()
        ))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("spawning the flow holder")?;
    let mut line = String::new();
    if let Some(out) = holder.stdout.take() {
        BufReader::new(out).read_line(&mut line)?;
    }
    let rss_flows_kb = if line.starts_with("ready") {
        w.sidecar().and_then(|p| p.rss_kb())
    } else {
        None
    };
    drop(holder.stdin.take());
    let _ = holder.kill();
    let _ = holder.wait();

    Ok(json!({
        "sidecar": s.name(), "mtu": mtu, "cc": cc,
        "up1_gbps": up1, "up4_gbps": up4, "down1_gbps": down1, "down4_gbps": down4,
        "conn_rate": cr["rate"], "conn_p50_us": cr["p50_us"], "conn_p99_us": cr["p99_us"],
        "conn_failed": cr["failed"],
        "dns_qps": dq["qps"], "dns_failed": dq["failed"], "dns_ttl": RUN_DNS_TTL,
        "rss_idle_mb": rss_idle_kb.map(|k| k as f64 / 1024.0),
        "rss_flows_mb": rss_flows_kb.map(|k| k as f64 / 1024.0),
        "flows": flows, "flows_ready": line.trim(),
        "startup_ms": startup_ms,
        "sidecar_args": a.sidecar_arg,
        "load_start": load_start,
        "load_end": load_average_1min(),
    }))
}

/// `table`: prints the markdown table of the `run` lines in `file`.
pub(super) fn table(file: &PathBuf) -> Result<()> {
    let text = std::fs::read_to_string(file)?;
    let mut rows: BTreeMap<(u64, String), Value> = BTreeMap::new();
    for l in text.lines().filter(|l| l.starts_with('{')) {
        let v: Value = serde_json::from_str(l)?;
        let mtu = v["mtu"].as_u64().unwrap_or(0);
        let sc = v["sidecar"].as_str().unwrap_or("?").to_string();
        rows.insert((mtu, sc), v);
    }
    let metrics = [
        ("up1_gbps", "iperf3 guest->server, 1 stream (Gbit/s)"),
        ("up4_gbps", "iperf3 guest->server, 4 streams (Gbit/s)"),
        ("down1_gbps", "iperf3 server->guest, 1 stream (Gbit/s)"),
        ("down4_gbps", "iperf3 server->guest, 4 streams (Gbit/s)"),
        ("conn_rate", "TCP connect + first byte (conn/s)"),
        ("conn_p50_us", "connect + first byte p50 (us)"),
        ("conn_p99_us", "connect + first byte p99 (us)"),
        ("dns_qps", "DNS queries/s, cached name (UDP)"),
        ("rss_idle_mb", "RSS idle (MB)"),
        ("rss_flows_mb", "RSS with 1,000 open flows (MB)"),
        ("startup_ms", "start-up to socket ready (ms)"),
        ("load_start", "load average (1 min) at start of run"),
        ("load_end", "load average (1 min) at end of run"),
    ];
    let mtus: Vec<u64> = {
        let mut m: Vec<u64> = rows.keys().map(|k| k.0).collect();
        m.dedup();
        m
    };
    let mut out = String::from("| metric |");
    let mut sep = String::from("|---|");
    for m in &mtus {
        out.push_str(&format!(" passt {m} | sluice {m} | ratio {m} |"));
        sep.push_str("---:|---:|---:|");
    }
    println!("{out}\n{sep}");
    for (key, label) in metrics {
        let mut line = format!("| {label} |");
        for m in &mtus {
            let p = rows
                .get(&(*m, "passt".into()))
                .map(|v| v[key].clone())
                .unwrap_or(Value::Null);
            let g = rows
                .get(&(*m, "sluice-gateway".into()))
                .map(|v| v[key].clone())
                .unwrap_or(Value::Null);
            let ratio = match (g.as_f64(), p.as_f64()) {
                (Some(g), Some(p)) if p > 0.0 => format!("{:.2}", g / p),
                _ => "n/a".into(),
            };
            line.push_str(&format!(
                " {} | {} | {} |",
                table_cell(p.as_f64()),
                table_cell(g.as_f64()),
                ratio
            ));
        }
        println!("{line}");
    }
    Ok(())
}

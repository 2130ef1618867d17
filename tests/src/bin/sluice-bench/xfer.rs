//! `xfer`: the profiling driver. One world, fixed-size iperf3 transfers
//! (and optionally sequential connects and DNS queries), one JSON line per
//! phase with the throughput and the CPU the sidecar, the bridge and the
//! machine spent per GB or per operation; optionally under `perf record`.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{Value, json};
use sluice_e2e::bench::guest_bench;
use sluice_e2e::{BANNER_PORT, ORIGIN_ADDR, ORIGIN_NAME, World};

use crate::parse_sidecar;
use sluice_e2e::cpu::{bridge_pid, measured};

/// Arguments of `xfer`.
#[derive(clap::Args, Debug)]
pub(super) struct XferArgs {
    /// `gateway` or `passt`.
    #[arg(long, default_value = "gateway")]
    sidecar: String,
    /// MTU the sidecar advertises.
    #[arg(long, default_value_t = 65520)]
    mtu: u32,
    /// Bytes per transfer (iperf3 `-n`, suffixes K/M/G).
    #[arg(long, default_value = "2G")]
    bytes: String,
    /// Parallel streams per transfer (comma-separated list: one phase each;
    /// 0 skips the transfers).
    #[arg(long, default_value = "1,4", value_delimiter = ',')]
    streams: Vec<u32>,
    /// Server -> guest (iperf3 `-R`), the download direction.
    #[arg(long)]
    reverse: bool,
    /// Transfers per stream count.
    #[arg(long, default_value_t = 1)]
    rounds: u32,
    /// Sequential connect + first byte after the transfers (0: skip).
    #[arg(long, default_value_t = 0)]
    conns: u32,
    /// Sequential DNS queries after the transfers (0: skip).
    #[arg(long, default_value_t = 0)]
    queries: u32,
    /// TTL of the fake internet's DNS records: 0 (the default) makes every
    /// query an upstream round trip; a positive TTL lets the gateway answer
    /// repeats from its cache (passt, which has none, forwards each).
    #[arg(long, default_value_t = 0)]
    dns_ttl: u32,
    /// TCP congestion control in every namespace of the world (e.g.
    /// `cubic`, Debian's default); without it the namespaces inherit the
    /// host's. Printed with every figure either way.
    #[arg(long)]
    cc: Option<String>,
    /// Record the sidecar with `perf record -g` during every phase into this file.
    #[arg(long)]
    perf: Option<PathBuf>,
    /// perf's call-graph mode: `fp` (cheap; user frames often lost) or `dwarf`.
    #[arg(long, default_value = "fp")]
    perf_callgraph: String,
    /// Extra argument for the sidecar (repeatable).
    #[arg(long, allow_hyphen_values = true)]
    sidecar_arg: Vec<String>,
}

/// `xfer`: see the module docs.
pub(super) fn xfer(a: &XferArgs) -> Result<()> {
    let s = parse_sidecar(&a.sidecar)?;
    let (mut b, cc) = World::builder()
        .sidecar(s)
        .mtu(a.mtu)
        .dns_ttl(a.dns_ttl)
        .iperf()
        .congestion_or_host(a.cc.as_deref());
    for x in &a.sidecar_arg {
        b = b.sidecar_arg(x);
    }
    let mut w = b.start()?;
    let sidecar = w.sidecar().and_then(|p| p.pid());
    let bridge = bridge_pid(&w);
    std::thread::sleep(Duration::from_millis(300));
    let perf = match &a.perf {
        Some(out) => {
            let pid = sidecar.context("no sidecar pid")?;
            let child = std::process::Command::new("perf")
                .args(["record", "--call-graph", &a.perf_callgraph, "-F", "999"])
                .args(["-p", &pid.to_string(), "-o"])
                .arg(out)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("spawning perf record")?;
            // Let perf attach before the first byte moves.
            std::thread::sleep(Duration::from_millis(500));
            Some(child)
        }
        None => None,
    };
    for &streams in a.streams.iter().filter(|&&n| n > 0) {
        for round in 0..a.rounds {
            let v = measured(sidecar, bridge, || {
                let out = w.guest_ok(
                    &format!(
                        "iperf3 -c {ORIGIN_ADDR} -n {} -P {streams} {} -J",
                        a.bytes,
                        if a.reverse { "-R" } else { "" }
                    ),
                    600,
                )?;
                let v: Value = serde_json::from_str(&out).context("iperf3 JSON")?;
                let r = &v["end"]["sum_received"];
                Ok(json!({
                    "gbps": r["bits_per_second"].as_f64().map(|b| b / 1e9),
                    "bytes": r["bytes"],
                }))
            })?;
            let gb = v["bytes"].as_f64().unwrap_or(0.0) / 1e9;
            let per_gb = |k: &str| v[k].as_f64().map(|c| c / gb.max(1e-9));
            println!(
                "{}",
                json!({
                    "phase": "xfer", "sidecar": s.name(), "mtu": a.mtu, "cc": cc,
                    "streams": streams, "reverse": a.reverse, "round": round,
                    "gbps": v["gbps"], "bytes": v["bytes"], "wall_s": v["wall_s"],
                    "sidecar_cpu_s_per_gb": per_gb("sidecar_cpu_s"),
                    "bridge_cpu_s_per_gb": per_gb("bridge_cpu_s"),
                    "machine_cpu_s_per_gb": per_gb("machine_cpu_s"),
                    "softirq_cpu_s_per_gb": per_gb("softirq_cpu_s"),
                    "sidecar_switches_per_mb": per_gb("sidecar_switches").map(|x| x / 1e3),
                    "sidecar_rss_mb": w.sidecar().and_then(|p| p.rss_kb()).map(|k| k as f64 / 1024.0),
                })
            );
        }
    }
    if a.conns > 0 {
        let v = measured(sidecar, bridge, || {
            guest_bench(
                &w,
                &format!(
                    "connrate --addr {ORIGIN_ADDR}:{BANNER_PORT} --count {}",
                    a.conns
                ),
                600,
            )
        })?;
        let per = |k: &str| v[k].as_f64().map(|c| c / f64::from(a.conns) * 1e6);
        println!(
            "{}",
            json!({
                "phase": "connrate", "sidecar": s.name(), "mtu": a.mtu,
                "rate": v["rate"], "p50_us": v["p50_us"], "p99_us": v["p99_us"],
                "failed": v["failed"],
                "sidecar_cpu_us_per_conn": per("sidecar_cpu_s"),
                "bridge_cpu_us_per_conn": per("bridge_cpu_s"),
                "sidecar_switches_per_conn": per("sidecar_switches").map(|x| x / 1e6),
            })
        );
    }
    if a.queries > 0 {
        let dns_server = w
            .lease()
            .and_then(|l| l.dns.first().copied())
            .context("no DNS server in the lease")?;
        let q =
            |n: u32| format!("dnsqps --server {dns_server}:53 --name {ORIGIN_NAME} --count {n}");
        guest_bench(&w, &q(5), 60)?;
        let v = measured(sidecar, bridge, || guest_bench(&w, &q(a.queries), 600))?;
        let per = |k: &str| v[k].as_f64().map(|c| c / f64::from(a.queries) * 1e6);
        println!(
            "{}",
            json!({
                "phase": "dnsqps", "sidecar": s.name(), "mtu": a.mtu, "dns_ttl": a.dns_ttl,
                "qps": v["qps"], "failed": v["failed"],
                "sidecar_cpu_us_per_query": per("sidecar_cpu_s"),
                "bridge_cpu_us_per_query": per("bridge_cpu_s"),
                "sidecar_switches_per_query": per("sidecar_switches").map(|x| x / 1e6),
            })
        );
    }
    if let Some(mut child) = perf {
        // perf writes its file on SIGINT.
        let _ = std::process::Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status();
        let _ = child.wait();
    }
    w.check_alive()?;
    Ok(())
}

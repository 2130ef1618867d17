//! `dns`: DNS queries/s through worlds whose resolver answers every name of
//! the bench domain with one address, cached and uncached, after filling
//! the gateway's table with each count of names; then the same through a
//! slow upstream (a relay that holds each query).

use std::net::Ipv4Addr;
use std::time::Instant;

use anyhow::{Context, Result};
use serde_json::json;
use sluice_e2e::bench::{guest_bench, load_average_1min};
use sluice_e2e::{ORIGIN_ADDR, ORIGIN_NAME, World};

use crate::parse_sidecar;

/// Arguments of `dns`.
#[derive(clap::Args, Debug)]
pub(super) struct DnsArgs {
    /// `gateway` or `passt`.
    #[arg(long, default_value = "gateway")]
    sidecar: String,
    /// Names resolved to the one address before each pair of cells
    /// (ascending, comma-separated).
    #[arg(long, default_value = "10,100000", value_delimiter = ',')]
    names: Vec<u64>,
    /// Seconds per cell.
    #[arg(long, default_value_t = 3.0)]
    secs: f64,
    /// Delay the slow resolver adds to each query (ms; 0 skips those
    /// cells).
    #[arg(long, default_value_t = 20)]
    delay_ms: u32,
    /// Queries in flight while filling the table.
    #[arg(long, default_value_t = 32)]
    fill_window: u32,
}

/// The domain the `dns` benchmark's resolver answers wholesale.
pub(super) const BENCH_DOMAIN: &str = "bench.test";

/// The gateway's policy for `dns`: the bench domain and the origin allowed,
/// a TTL floor above any cell's length so that an answer stays cached
/// (dnsmasq answers `--address` names with TTL 0).
fn dns_bench_policy() -> String {
    format!(
        "version: 1\nid: dns-bench\nallow:\n  - domains: [\"**.{BENCH_DOMAIN}\", \"{ORIGIN_NAME}\"]\n\
         internal:\n  - 198.51.100.0/24\ndns:\n  ttl_min: 600\n  ttl_max: 3600\n"
    )
}

/// The slow resolver of `dns` in the fake internet: a relay to dnsmasq
/// that holds each query `--delay-ms` first.
const SLOW_RESOLVER: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 55);

/// The relay (python3, one query at a time: the cells are sequential).
const SLOW_RELAY: &str = r#"
import socket, sys, time
delay = float(sys.argv[1]) / 1000
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[2], 53))
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.connect((sys.argv[3], 53))
u.settimeout(2)
while True:
    q, peer = s.recvfrom(4096)
    time.sleep(delay)
    u.send(q)
    try:
        s.sendto(u.recv(4096), peer)
    except socket.timeout:
        pass
"#;

/// `dns`: see the module docs.
pub(super) fn dns_cells(a: &DnsArgs) -> Result<()> {
    let s = parse_sidecar(&a.sidecar)?;
    let world = |upstream: Ipv4Addr| {
        World::builder()
            .sidecar(s)
            .dns_wildcard(BENCH_DOMAIN, ORIGIN_ADDR)
            .policy(&dns_bench_policy())
            .dns_upstream(upstream)
            .start()
    };
    let names = |w: &World, prefix: &str, first: u64, count: u64, window: u32, secs: f64| {
        let server = w
            .lease()
            .and_then(|l| l.dns.first().copied())
            .context("no DNS server in the lease")?;
        guest_bench(
            w,
            &format!(
                "dnsnames --server {server}:53 --prefix {prefix} --first {first} --count {count} --window {window} --secs {secs}"
            ),
            900,
        )
    };
    // Cached: the first names filled, answered before and within their TTL
    // (the gateway's answer cache keeps the first 4,096 answers until they
    // expire, so the latest names of a large fill are not in it). Uncached:
    // names never asked, so every query goes upstream.
    let cells = |w: &World, n: u64, upstream: &str| -> Result<()> {
        let load = load_average_1min();
        let cached = names(w, "f", 0, n.min(10), 1, a.secs)?;
        let uncached = names(w, &format!("u{n}"), 0, u64::MAX / 2, 1, a.secs)?;
        for (mode, v) in [("cached", cached), ("uncached", uncached)] {
            println!(
                "{}",
                json!({
                    "sidecar": s.name(), "names": n, "mode": mode, "upstream": upstream,
                    "qps": v["qps"], "answered": v["answered"], "failed": v["failed"],
                    "load_1min": load,
                })
            );
        }
        Ok(())
    };
    let fill = |w: &World, from: u64, to: u64| -> Result<()> {
        let t = Instant::now();
        let v = names(w, "f", from, to - from, a.fill_window, 0.0)?;
        eprintln!(
            "dns: {} filled {from}..{to} in {:.1} s: {v}",
            s.name(),
            t.elapsed().as_secs_f64()
        );
        Ok(())
    };

    let w = world(sluice_e2e::DNS_ADDR)?;
    let mut filled = 0u64;
    for &n in &a.names {
        if n > filled {
            fill(&w, filled, n)?;
            filled = n;
        }
        cells(&w, n, "as is")?;
    }
    drop(w);

    if a.delay_ms > 0 {
        // A world whose resolver is the relay; the smallest name count.
        let w = world(SLOW_RESOLVER)?;
        let script = w.dir().join("slow-relay.py");
        std::fs::write(&script, SLOW_RELAY)?;
        let mut c = w.inet.cmd("python3");
        c.arg(&script)
            .arg(a.delay_ms.to_string())
            .arg(SLOW_RESOLVER.to_string())
            .arg(sluice_e2e::DNS_ADDR.to_string());
        let _relay = sluice_e2e::Proc::spawn("slow relay", &mut c, &w.dir().join("relay.log"))?;
        w.inet
            .wait_listening("the slow relay", "udp", &format!("{SLOW_RESOLVER}:53"))?;
        let n = a.names.first().copied().unwrap_or(10);
        fill(&w, 0, n)?;
        cells(&w, n, &format!("+{} ms", a.delay_ms))?;
    }
    Ok(())
}

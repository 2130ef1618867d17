//! What the benchmark drivers (`sluice-bench`, `sluice-enforce-bench`,
//! `sluice-dns-bench`) share: the generated policy of the enforcement
//! benchmark, figures (percentiles, the load average, table cells) and the
//! clients they run in a [`World`]'s guest.

use std::fmt::Write as _;

use anyhow::{Context, Result};
use serde_json::Value;

use crate::{BANNER_PORT, ORIGIN_NAME, World, bin_path};

/// A realistic policy of `n` rules: exact names, `*.` and `**.` wildcards
/// (some on extra ports), CIDR rules and two deny rules, in the shapes an
/// agent sandbox uses (package registries, APIs, CDNs). The harness origin
/// ([`ORIGIN_NAME`]) is one exact rule in the middle, on ports 80, 443, the
/// banner port and iperf3's 5201; the fake internet's documentation ranges
/// are `internal:`; the TTL floor is one hour (dnsmasq answers with TTL 0,
/// and a benchmark's connects by address must find the name's entry).
pub fn rules_policy(n: usize) -> String {
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
    y.push_str("dns:\n  ttl_min: 3600\n  ttl_max: 3600\n");
    y
}

/// Nearest-rank percentile `p` (in `[0, 1]`) of an ascending sample; `None`
/// for an empty one.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    // The first index at or past p of the way through (nearest rank).
    (0..=last)
        .find(|&i| i as f64 >= p * last as f64 - 0.5)
        .and_then(|i| sorted.get(i).copied())
}

/// The three load averages of `/proc/loadavg` as written there (`""` when
/// unreadable). Other engineers build on the benchmark machine: every figure
/// is recorded with it.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// The one-minute load average, if readable.
pub fn load_average_1min() -> Option<f64> {
    load_average().split_whitespace().next()?.parse().ok()
}

/// A figure for a markdown table: no decimals from 100 up, two below,
/// `n/a` when missing.
pub fn table_cell(v: Option<f64>) -> String {
    match v {
        Some(x) if x >= 100.0 => format!("{x:.0}"),
        Some(x) => format!("{x:.2}"),
        None => "n/a".into(),
    }
}

/// A recursive DNS query (id `id`, RD set) for the A record of `name`, as
/// the benchmark clients send it. `name` is not validated (the benchmark
/// names are short, well-formed labels).
pub fn dns_a_query(id: u16, name: &str) -> Vec<u8> {
    let mut q = Vec::with_capacity(64);
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.trim_end_matches('.').split('.') {
        q.push(u8::try_from(label.len()).unwrap_or(63));
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

/// Runs `sluice-bench ARGS` (a client subcommand: `connrate`, `dnsqps`,
/// `hold`) in the guest with up to 8,192 open files and parses its JSON line.
pub fn guest_bench(w: &World, args: &str, secs: u32) -> Result<Value> {
    let bench = bin_path("sluice-bench")?;
    let out = w.guest_ok(
        &format!("ulimit -n 8192 2>/dev/null; {} {args}", bench.display()),
        secs,
    )?;
    serde_json::from_str(out.trim()).with_context(|| format!("bench output {out}"))
}

/// iperf3 from the guest to `server` (an address or a name), `streams`
/// parallel streams for `secs` seconds, server to guest when `reverse`;
/// Gbit/s received.
pub fn iperf(w: &World, server: &str, secs: u32, streams: u32, reverse: bool) -> Result<f64> {
    let out = w.guest_ok(
        &format!(
            "iperf3 -c {server} -t {secs} -P {streams} {} -J",
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
        assert_eq!(percentile(&s, 1.0), Some(100.0));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn table_cells() {
        assert_eq!(table_cell(Some(1234.5)), "1234");
        assert_eq!(table_cell(Some(1.234)), "1.23");
        assert_eq!(table_cell(None), "n/a");
    }
}

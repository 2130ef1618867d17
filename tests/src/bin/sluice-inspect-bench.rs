//! `sluice-inspect-bench`: the cost of TLS interception against splicing the
//! same host (`benches/inspect.sh`). Two harness worlds in one run, same
//! origin (`origin.test`), same gateway binary: one whose policy only allows
//! the host (spliced: the guest trusts the origin's CA), one whose policy also
//! lists it under `inspect:` (intercepted: the guest trusts the sandbox CA
//! from `--ca-out`, the gateway trusts the origin through `--upstream-ca`).
//!
//! Per world, from the guest namespace with `sluice-tls-probe` and curl:
//! - TLS handshake latency (TCP connect + handshake, new connection each
//!   time; median and p90 of `--handshakes` runs);
//! - one large download over HTTPS (`--mib` MiB, curl, bytes to /dev/null),
//!   with the CPU seconds per GiB the gateway, the TAP bridge and the whole
//!   machine spent meanwhile (`/proc`, as `sluice-bench xfer` counts them);
//! - requests per second on one kept-alive HTTP/2 connection (`--requests`
//!   sequential GETs of a small response).
//!
//! Prints one markdown table. One run on a shared machine: compare the two
//! columns, do not quote absolutes.
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde_json::json;
use sluice_e2e::cpu::{bridge_pid, measured};
use sluice_e2e::{ORIGIN_NAME, World, bin_path};

/// Command line.
#[derive(Parser, Debug)]
#[command(about = "TLS interception cost: inspected vs spliced, same host")]
struct Args {
    /// New connections timed for the handshake figure.
    #[arg(long, default_value_t = 30)]
    handshakes: u32,
    /// Download size in MiB.
    #[arg(long, default_value_t = 256)]
    mib: u64,
    /// Requests on one kept-alive HTTP/2 connection.
    #[arg(long, default_value_t = 2000)]
    requests: u64,
    /// TCP congestion control in every namespace of both worlds (e.g.
    /// `cubic`, Debian's default); without it they inherit the host's.
    /// Printed in the table's header either way.
    #[arg(long)]
    cc: Option<String>,
    /// Extra argument for the gateway in both worlds (repeatable), e.g.
    /// `--sidecar-arg=--flow-send-buffer-kib=1024`.
    #[arg(long)]
    sidecar_arg: Vec<String>,
}

/// One world's figures.
#[derive(Debug, Default)]
struct Figures {
    handshake_p50_ms: f64,
    handshake_p90_ms: f64,
    download_mbit: f64,
    /// CPU seconds per GiB downloaded: the gateway, the bridge, the machine.
    download_cpu: [Option<f64>; 3],
    h2_rps: f64,
}

fn policy(inspect: bool) -> String {
    let mut p = format!(
        "version: 1\nid: inspect-bench\nallow:\n  - domain: \"{ORIGIN_NAME}\"\n    ports: [443]\ninternal:\n  - \"198.51.100.0/24\"\n  - \"203.0.113.0/24\"\n"
    );
    if inspect {
        p.push_str(&format!("inspect:\n  - \"{ORIGIN_NAME}\"\n"));
    }
    p
}

fn measure(inspect: bool, args: &Args) -> Result<Figures> {
    let (mut b, _) = World::builder()
        .policy(&policy(inspect))
        .congestion_or_host(args.cc.as_deref());
    for a in &args.sidecar_arg {
        b = b.sidecar_arg(a);
    }
    if inspect {
        b = b
            .sidecar_arg("--ca-out")
            .sidecar_arg("{dir}/sandbox-ca.pem")
            .sidecar_arg("--upstream-ca")
            .sidecar_arg("{dir}/ca.pem");
    }
    let mut w = b.start()?;
    let ca = if inspect {
        w.dir().join("sandbox-ca.pem")
    } else {
        w.ca_pem()
    };
    let probe = bin_path("sluice-tls-probe")?;
    let probe_cmd = |extra: &str| {
        format!(
            "{} --connect {ORIGIN_NAME}:443 --cacert {} --alpn h2 --path /small {extra}",
            probe.display(),
            ca.display()
        )
    };
    // Warm up (DNS entry, leaf minted and cached).
    w.guest_ok(&probe_cmd("--count 1"), 60)?;

    let mut hs = Vec::new();
    if args.handshakes == 0 {
        bail!("--handshakes must be at least 1");
    }
    for _ in 0..args.handshakes {
        let out = w.guest_ok(&probe_cmd("--count 1"), 60)?;
        hs.push(reqs_field(&out, 3)? * 1e3);
    }
    hs.sort_by(f64::total_cmp);
    let pick = |pct: usize| hs[(hs.len() - 1) * pct / 100];

    let bytes = args.mib * 1024 * 1024;
    let sidecar = w.sidecar().and_then(|p| p.pid());
    let download = measured(sidecar, bridge_pid(&w), || {
        let out = w.guest_ok(
            &format!(
                "curl -sS --max-time 600 --cacert {} -o /dev/null -w '%{{speed_download}}' https://{ORIGIN_NAME}/bytes/{bytes}",
                ca.display()
            ),
            700,
        )?;
        let speed: f64 = out.trim().parse().context("curl speed")?;
        Ok(json!({ "bytes_per_sec": speed }))
    })?;
    let bytes_per_sec = download["bytes_per_sec"].as_f64().context("curl speed")?;
    let gib = args.mib as f64 / 1024.0;
    let per_gib = |key: &str| download[key].as_f64().map(|s| s / gib);
    let download_cpu = [
        per_gib("sidecar_cpu_s"),
        per_gib("bridge_cpu_s"),
        per_gib("machine_cpu_s"),
    ];

    let out = w.guest_ok(&probe_cmd(&format!("--count {}", args.requests)), 600)?;
    let secs = reqs_field(&out, 2)?;
    Ok(Figures {
        handshake_p50_ms: pick(50),
        handshake_p90_ms: pick(90),
        download_mbit: bytes_per_sec * 8.0 / 1e6,
        download_cpu,
        h2_rps: args.requests as f64 / secs,
    })
}

/// Field `i` of the probe's `REQS n secs handshake_secs` line.
fn reqs_field(out: &str, i: usize) -> Result<f64> {
    let line = out
        .lines()
        .find(|l| l.starts_with("REQS "))
        .with_context(|| format!("no REQS line in {out:?}"))?;
    match line.split_whitespace().nth(i).map(str::parse::<f64>) {
        Some(Ok(v)) => Ok(v),
        _ => bail!("bad REQS line {line:?}"),
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let spliced = measure(false, &args).context("spliced world")?;
    std::thread::sleep(Duration::from_secs(1));
    let inspected = measure(true, &args).context("inspected world")?;
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let (_, cc) = World::builder().congestion_or_host(args.cc.as_deref());
    println!(
        "| measure (origin.test, one run, load {}, {cc}) | spliced | inspected | inspected / spliced |",
        load.split_whitespace().next().unwrap_or("?")
    );
    println!("|---|---|---|---|");
    let row = |name: &str, s: f64, i: f64| {
        println!("| {name} | {s:.2} | {i:.2} | {:.2} |", i / s);
    };
    row(
        "TLS handshake p50 (ms, connect + handshake)",
        spliced.handshake_p50_ms,
        inspected.handshake_p50_ms,
    );
    row(
        "TLS handshake p90 (ms)",
        spliced.handshake_p90_ms,
        inspected.handshake_p90_ms,
    );
    row(
        &format!("download {} MiB (Mbit/s)", args.mib),
        spliced.download_mbit,
        inspected.download_mbit,
    );
    for (i, who) in ["the gateway", "the TAP bridge", "the whole machine"]
        .into_iter()
        .enumerate()
    {
        match (spliced.download_cpu[i], inspected.download_cpu[i]) {
            (Some(s), Some(n)) => row(&format!("CPU s per GiB downloaded, {who}"), s, n),
            _ => println!("| CPU s per GiB downloaded, {who} | - | - | - |"),
        }
    }
    row(
        &format!("HTTP/2 kept-alive req/s ({} GETs)", args.requests),
        spliced.h2_rps,
        inspected.h2_rps,
    );
    Ok(())
}

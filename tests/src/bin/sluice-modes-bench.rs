//! `sluice-modes-bench`: QEMU-level throughput of `sluice run --network
//! stream|dgram|tap` (`benches/network-modes.sh`; run by hand, as root).
//!
//! One harness [`World`] (its fake internet's origin serves `GET
//! /bytes/N` and takes `PUT /upload`, in a namespace of its own on this
//! machine: loopback itself is in the gateway's platform deny set, so a
//! server there could not be reached by any guest). For each round, each
//! mode in turn (the order rotates from round to round, so that a burst of
//! load elsewhere on a shared machine does not always land on the same
//! mode): one `sluice run --network MODE` whose guest downloads N bytes
//! with curl to `/dev/null` and uploads N bytes of zeros from a pipe, over
//! plain HTTP (so the guest's CPU spends nothing on TLS). The guest's curl
//! times each transfer. One JSON line per run on stdout, with the 1-minute
//! load average read just before it; then a markdown table (per mode and
//! direction: median, min and max over the rounds, in Mbit/s).
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use clap::Parser;
use serde_json::{Value, json};
use sluice_e2e::bench::{load_average_1min, percentile, table_cell};
use sluice_e2e::{DNS_ADDR, ORIGIN_NAME, World, bin_path};

/// Command line.
#[derive(Parser, Debug)]
#[command(about = "sluice run --network stream|dgram|tap: guest download and upload throughput")]
struct Args {
    /// Bytes each way.
    #[arg(long, default_value_t = 200_000_000)]
    bytes: u64,
    /// Rounds (each runs every mode once).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// The modes, comma-separated.
    #[arg(long, default_value = "stream,dgram,tap", value_delimiter = ',')]
    modes: Vec<String>,
    /// The static guest agent (`SLUICE_AGENT` of `sluice run`).
    #[arg(long)]
    agent: PathBuf,
    /// Guest memory for `sluice run --memory` (MiB).
    #[arg(long, default_value_t = 512)]
    memory: u32,
}

/// One run's figures.
struct Cell {
    mode: String,
    accelerator: String,
    down_mbps: f64,
    up_mbps: f64,
}

fn main() -> Result<()> {
    let a = Args::parse();
    ensure!(
        a.agent.is_file(),
        "--agent {}: no such file",
        a.agent.display()
    );
    let sluice = bin_path("sluice")?;
    let gateway = bin_path("sluice-gateway")?;
    let world = World::builder().connect_guest(false).start()?;
    let policy = world.dir().join("modes-bench.yaml");
    std::fs::write(
        &policy,
        format!(
            "version: 1\nid: modes-bench\nallow:\n  - domain: {ORIGIN_NAME}\n    ports: [80]\n\
             internal:\n  - \"198.51.100.0/24\"\n  - \"203.0.113.0/24\"\n\
             dns:\n  upstream: [{DNS_ADDR}]\n"
        ),
    )?;
    let mut cells = Vec::new();
    for round in 0..a.rounds {
        let mut order = a.modes.clone();
        order.rotate_left(round % a.modes.len().max(1));
        for mode in order {
            let load = load_average_1min();
            let cell = one_run(&world, &sluice, &gateway, &a, &policy, &mode)
                .with_context(|| format!("round {} mode {mode}", round + 1))?;
            println!(
                "{}",
                json!({
                    "round": round + 1, "mode": mode, "bytes": a.bytes,
                    "accelerator": cell.accelerator,
                    "down_mbps": cell.down_mbps, "up_mbps": cell.up_mbps,
                    "load_1min": load,
                })
            );
            cells.push(cell);
        }
    }
    println!(
        "\n| mode | download Mbit/s median (min-max) | upload Mbit/s median (min-max) |\n|---|---|---|"
    );
    for mode in &a.modes {
        let col = |f: fn(&Cell) -> f64| {
            let mut v: Vec<f64> = cells.iter().filter(|c| &c.mode == mode).map(f).collect();
            v.sort_by(f64::total_cmp);
            let min = v.iter().copied().reduce(f64::min);
            let max = v.iter().copied().reduce(f64::max);
            format!(
                "{} ({}-{})",
                table_cell(percentile(&v, 0.5)),
                table_cell(min),
                table_cell(max)
            )
        };
        println!(
            "| {mode} | {} | {} |",
            col(|c| c.down_mbps),
            col(|c| c.up_mbps)
        );
    }
    Ok(())
}

/// One `sluice run --network mode` with the transfer script.
fn one_run(
    world: &World,
    sluice: &Path,
    gateway: &Path,
    a: &Args,
    policy: &Path,
    mode: &str,
) -> Result<Cell> {
    let n = a.bytes;
    let url = format!("http://{ORIGIN_NAME}");
    // curl's own timing (the guest's monotonic clock), `size time` each.
    let script = format!(
        "d=$(curl -sS -o /dev/null -w '%{{size_download}} %{{time_total}}' {url}/bytes/{n}); echo \"down=$? $d\"; \
         u=$(head -c {n} /dev/zero | curl -sS -o /dev/null -T - -w '%{{size_upload}} %{{time_total}}' {url}/upload); echo \"up=$? $u\""
    );
    let out = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", world.host.name()))
        .arg(sluice)
        .arg("run")
        .arg(format!("--gateway={}", gateway.display()))
        .args([
            "--network",
            mode,
            "--json",
            "--memory",
            &a.memory.to_string(),
        ])
        .arg("--policy")
        .arg(policy)
        .args(["--", "sh", "-c", &script])
        .env("SLUICE_AGENT", &a.agent)
        .output()
        .context("running sluice")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let result: Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("sluice run --json output; stderr: {stderr}"))?;
    ensure!(
        result["network_mode"]["mode"] == mode,
        "the run used another mode: {result}"
    );
    let stdout = result["stdout"].as_str().unwrap_or_default();
    let rate = |tag: &str| -> Result<f64> {
        let line = stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{tag}=")))
            .with_context(|| format!("no {tag}= line: {result}"))?;
        let f: Vec<&str> = line.split_whitespace().collect();
        let [code, size, secs] = f.as_slice() else {
            bail!("{tag}: {line}")
        };
        ensure!(*code == "0", "{tag}: curl failed: {line}; {result}");
        let size: f64 = size.parse()?;
        let secs: f64 = secs.parse()?;
        // The bytes the server had to send or take: a short transfer is a
        // failure, not a figure. An upload from a pipe goes chunked, and
        // curl counts the chunk headers too (well under 1%).
        #[allow(clippy::cast_precision_loss)]
        let want = n as f64;
        ensure!(
            size >= want && size <= want * 1.01 && secs > 0.0,
            "{tag}: {line} (want {n} bytes)"
        );
        Ok(want * 8.0 / secs / 1e6)
    };
    Ok(Cell {
        mode: mode.to_owned(),
        accelerator: result["accelerator"].to_string(),
        down_mbps: rate("down")?,
        up_mbps: rate("up")?,
    })
}

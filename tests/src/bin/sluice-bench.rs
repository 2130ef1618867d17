//! `sluice-bench`: the datapath benchmark driver (`benches/datapath.sh`).
//!
//! - `run --sidecar gateway|passt --mtu M`: builds one harness [`World`]
//!   (same namespaces, bridge and fake internet for both sidecars), measures
//!   and prints one JSON line: iperf3 up/down, 1 and 4 streams; TCP connect +
//!   first byte rate and latency; DNS queries/s for a cached name; RSS idle
//!   and with 1,000 open flows; start-up time to ready (socket bound).
//! - `table FILE`: turns those JSON lines into the markdown table of
//!   `docs/benchmarks.md`, with ratios to passt.
//! - `connrate`, `dnsqps`, `hold`: the clients `run` starts inside the guest
//!   namespace.
//!
//! Every figure is one run on a shared, noisy machine: read ratios, not
//! absolutes.
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use serde_json::{Value, json};
use sluice_e2e::bench::{
    dns_a_query, guest_bench, iperf, load_average_1min, percentile, table_cell,
};
use sluice_e2e::{BANNER_PORT, ECHO_PORT, ORIGIN_ADDR, ORIGIN_NAME, Sidecar, World, bin_path};

/// Command line.
#[derive(Parser, Debug)]
#[command(about = "Datapath benchmark driver: sluice-gateway vs passt through the same harness")]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Measure one sidecar at one MTU; prints one JSON line.
    Run {
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
        /// Extra argument for the sidecar (repeatable), e.g. `--flow-buffer-kib=256`.
        #[arg(long, allow_hyphen_values = true)]
        sidecar_arg: Vec<String>,
    },
    /// Markdown table from `run` JSON lines.
    Table {
        /// File of JSON lines.
        file: PathBuf,
    },
    /// Sequential connect + read one byte + close, N times.
    Connrate {
        /// Banner server address.
        #[arg(long)]
        addr: SocketAddr,
        /// Number of connections.
        #[arg(long)]
        count: u32,
    },
    /// Sequential DNS A queries over UDP, N times.
    Dnsqps {
        /// DNS server.
        #[arg(long)]
        server: SocketAddr,
        /// Name to ask for.
        #[arg(long)]
        name: String,
        /// Number of queries.
        #[arg(long)]
        count: u32,
    },
    /// Opens N connections, prints `ready N`, holds them until stdin closes.
    Hold {
        /// Server address.
        #[arg(long)]
        addr: SocketAddr,
        /// Number of connections.
        #[arg(long)]
        count: u32,
    },
}

fn main() -> Result<()> {
    match Args::parse().cmd {
        Cmd::Run {
            sidecar,
            mtu,
            secs,
            conns,
            queries,
            flows,
            sidecar_arg,
        } => {
            let s = match sidecar.as_str() {
                "gateway" => Sidecar::Gateway,
                "passt" => Sidecar::Passt,
                other => bail!("unknown sidecar {other}"),
            };
            let v = run(s, mtu, secs, conns, queries, flows, &sidecar_arg)?;
            println!("{v}");
            Ok(())
        }
        Cmd::Table { file } => table(&file),
        Cmd::Connrate { addr, count } => connrate(addr, count),
        Cmd::Dnsqps {
            server,
            name,
            count,
        } => dnsqps(server, &name, count),
        Cmd::Hold { addr, count } => hold(addr, count),
    }
}

fn connrate(addr: SocketAddr, count: u32) -> Result<()> {
    let mut lat = Vec::with_capacity(count as usize);
    let mut failed = 0u32;
    let start = Instant::now();
    for _ in 0..count {
        let t = Instant::now();
        let ok = (|| -> Result<()> {
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            let mut b = [0u8; 1];
            s.read_exact(&mut b)?;
            Ok(())
        })();
        match ok {
            Ok(()) => lat.push(t.elapsed().as_secs_f64() * 1e6),
            Err(_) => failed += 1,
        }
    }
    let secs = start.elapsed().as_secs_f64();
    lat.sort_by(f64::total_cmp);
    println!(
        "{}",
        json!({
            "ok": lat.len(), "failed": failed, "rate": lat.len() as f64 / secs,
            "p50_us": percentile(&lat, 0.5), "p99_us": percentile(&lat, 0.99),
        })
    );
    Ok(())
}

fn dnsqps(server: SocketAddr, name: &str, count: u32) -> Result<()> {
    let sock = UdpSocket::bind("0.0.0.0:0")?;
    sock.connect(server)?;
    sock.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut buf = [0u8; 1500];
    let mut ok = 0u32;
    let mut failed = 0u32;
    let start = Instant::now();
    for i in 0..count {
        let id = u16::try_from(i % 65536).unwrap_or(0);
        sock.send(&dns_a_query(id, name))?;
        loop {
            match sock.recv(&mut buf) {
                Ok(n) if n >= 12 && buf[..2] == id.to_be_bytes() => {
                    // RCODE 0 and at least one answer.
                    if buf[3] & 0x0f == 0 && buf[6..8] != [0, 0] {
                        ok += 1;
                    } else {
                        failed += 1;
                    }
                    break;
                }
                Ok(_) => {}
                Err(_) => {
                    failed += 1;
                    break;
                }
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{}",
        json!({"ok": ok, "failed": failed, "qps": f64::from(ok) / secs})
    );
    Ok(())
}

fn hold(addr: SocketAddr, count: u32) -> Result<()> {
    let mut conns = Vec::with_capacity(count as usize);
    for i in 0..count {
        conns.push(
            TcpStream::connect_timeout(&addr, Duration::from_secs(10))
                .with_context(|| format!("connection {i}"))?,
        );
    }
    // Prove each is established end to end: one echo round trip each.
    for c in &mut conns {
        c.set_read_timeout(Some(Duration::from_secs(10)))?;
        c.write_all(b"x")?;
        let mut b = [0u8; 1];
        c.read_exact(&mut b)?;
    }
    println!("ready {}", conns.len());
    std::io::stdout().flush()?;
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    Ok(())
}

fn run(
    s: Sidecar,
    mtu: u32,
    secs: u32,
    conns: u32,
    queries: u32,
    flows: u32,
    sidecar_args: &[String],
) -> Result<Value> {
    let load_start = load_average_1min();
    let mut b = World::builder().sidecar(s).mtu(mtu).iperf();
    for a in sidecar_args {
        b = b.sidecar_arg(a);
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
        "sidecar": s.name(), "mtu": mtu,
        "up1_gbps": up1, "up4_gbps": up4, "down1_gbps": down1, "down4_gbps": down4,
        "conn_rate": cr["rate"], "conn_p50_us": cr["p50_us"], "conn_p99_us": cr["p99_us"],
        "conn_failed": cr["failed"],
        "dns_qps": dq["qps"], "dns_failed": dq["failed"],
        "rss_idle_mb": rss_idle_kb.map(|k| k as f64 / 1024.0),
        "rss_flows_mb": rss_flows_kb.map(|k| k as f64 / 1024.0),
        "flows": flows, "flows_ready": line.trim(),
        "startup_ms": startup_ms,
        "sidecar_args": sidecar_args,
        "load_start": load_start,
        "load_end": load_average_1min(),
    }))
}

fn table(file: &PathBuf) -> Result<()> {
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

//! `sluice-bench`: the datapath benchmark driver (`benches/datapath.sh`).
//!
//! - `run --sidecar gateway|passt --mtu M`: builds one harness [`World`]
//!   (same namespaces, bridge and fake internet for both sidecars), measures
//!   and prints one JSON line: iperf3 up/down, 1 and 4 streams; TCP connect +
//!   first byte rate and latency; DNS queries/s for a cached name; RSS idle
//!   and with 1,000 open flows; start-up time to ready (socket bound).
//! - `table FILE`: turns those JSON lines into the markdown table of
//!   `docs/benchmarks.md`, with ratios to passt.
//! - `xfer --sidecar gateway|passt --mtu M --bytes N`: the profiling driver.
//!   One world, then `--rounds` fixed-size iperf3 transfers (`-n N`, 1 or
//!   `--streams` streams, `-R` with `--reverse`) and optionally sequential
//!   connects and DNS queries; per phase it prints one JSON line with the
//!   throughput and the load-insensitive figures: the sidecar's and the
//!   bridge's CPU seconds (utime + stime from `/proc/<pid>/stat`) per GB or
//!   per operation, and the sidecar's context switches. `--perf FILE`
//!   records the sidecar with `perf record -g` during all phases.
//! - `dns --sidecar gateway|passt`: DNS queries/s through one world whose
//!   resolver (dnsmasq) answers every `*.bench.test` name with one address:
//!   for each `--names` count (the distinct names the guest has resolved to
//!   that address before the cell), sequential queries for names already
//!   answered (cached) and for names never asked (uncached); then, in a
//!   second world whose resolver is a relay to dnsmasq that holds each
//!   query `--delay-ms` (a slow upstream), the same at the smallest count;
//!   one JSON line per cell.
//! - `rss --sidecar gateway|passt --flows 1000,10000,50000`: the sidecar's
//!   RSS idle and while the guest holds each count of established echo
//!   flows (opened in steps, each proven by one echo round trip, then idle
//!   for a few seconds), and whether one more connection still echoes; one
//!   JSON line per count.
//! - `connrate`, `dnsqps`, `dnsnames`, `hold`: the clients `run` and `dns`
//!   start inside the guest namespace.
//!
//! Every figure is one run on a shared, noisy machine: read ratios, not
//! absolutes.
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use serde_json::{Value, json};
use sluice_e2e::bench::{
    dns_a_query, guest_bench, iperf, load_average_1min, percentile, table_cell,
};
use sluice_e2e::hold::{FlowHolder, HARNESS_NOFILE, raise_nofile, widen_guest_ports};
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
    /// RSS idle and with each count of held flows; one JSON line per count.
    Rss {
        /// `gateway` or `passt`.
        #[arg(long, default_value = "gateway")]
        sidecar: String,
        /// Flow counts, ascending (comma-separated).
        #[arg(long, default_value = "1000,10000,50000", value_delimiter = ',')]
        flows: Vec<u32>,
        /// MTU the sidecar advertises.
        #[arg(long, default_value_t = 65520)]
        mtu: u32,
        /// Extra argument for the sidecar (repeatable).
        #[arg(long, allow_hyphen_values = true)]
        sidecar_arg: Vec<String>,
    },
    /// Profiling driver: fixed-size transfers (and optionally connects, DNS
    /// queries) through one world; one JSON line per phase with CPU per GB.
    Xfer(XferArgs),
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
    /// DNS queries/s with many names on one address, cached and uncached,
    /// fast and slow upstream; one JSON line per cell.
    Dns(DnsArgs),
    /// A queries for `{prefix}{i}.bench.test`, `i` cycling over
    /// `first..first+count`, with up to `window` in flight, for `secs`
    /// seconds (0: until `count` were answered); prints one JSON line.
    Dnsnames {
        /// DNS server.
        #[arg(long)]
        server: SocketAddr,
        /// First label's prefix.
        #[arg(long)]
        prefix: String,
        /// First index.
        #[arg(long, default_value_t = 0)]
        first: u64,
        /// Distinct names (indices) to cycle over.
        #[arg(long)]
        count: u64,
        /// Queries in flight.
        #[arg(long, default_value_t = 1)]
        window: u32,
        /// Seconds to run (0: one pass over the names).
        #[arg(long, default_value_t = 0.0)]
        secs: f64,
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

/// Arguments of `dns`.
#[derive(clap::Args, Debug)]
struct DnsArgs {
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

/// The fake DNS's record TTL in `run` (seconds): long enough that every
/// repeat of the measured name is a cache hit where there is a cache.
const RUN_DNS_TTL: u32 = 300;

/// Arguments of `xfer`.
#[derive(clap::Args, Debug)]
struct XferArgs {
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
        Cmd::Rss {
            sidecar,
            flows,
            mtu,
            sidecar_arg,
        } => rss_curve(&sidecar, &flows, mtu, &sidecar_arg),
        Cmd::Xfer(a) => xfer(&a),
        Cmd::Table { file } => table(&file),
        Cmd::Connrate { addr, count } => connrate(addr, count),
        Cmd::Dnsqps {
            server,
            name,
            count,
        } => dnsqps(server, &name, count),
        Cmd::Dns(a) => dns_cells(&a),
        Cmd::Dnsnames {
            server,
            prefix,
            first,
            count,
            window,
            secs,
        } => dnsnames(server, &prefix, first, count, window, secs),
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

/// The domain the `dns` benchmark's resolver answers wholesale.
const BENCH_DOMAIN: &str = "bench.test";

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

fn dns_cells(a: &DnsArgs) -> Result<()> {
    let s = match a.sidecar.as_str() {
        "gateway" => Sidecar::Gateway,
        "passt" => Sidecar::Passt,
        other => bail!("unknown sidecar {other}"),
    };
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

fn dnsnames(
    server: SocketAddr,
    prefix: &str,
    first: u64,
    count: u64,
    window: u32,
    secs: f64,
) -> Result<()> {
    let sock = UdpSocket::bind("0.0.0.0:0")?;
    sock.connect(server)?;
    sock.set_read_timeout(Some(Duration::from_secs(2)))?;
    let count = count.max(1);
    let window = u64::from(window.max(1));
    let mut buf = [0u8; 1500];
    let (mut sent, mut answered, mut failed) = (0u64, 0u64, 0u64);
    let mut in_flight: BTreeMap<u16, ()> = BTreeMap::new();
    let start = Instant::now();
    let more = |sent: u64| {
        if secs > 0.0 {
            start.elapsed().as_secs_f64() < secs
        } else {
            sent < count
        }
    };
    loop {
        while (in_flight.len() as u64) < window && more(sent) {
            let id = (sent & 0xffff) as u16;
            let name = format!("{prefix}{}.{BENCH_DOMAIN}", first + sent % count);
            sock.send(&dns_a_query(id, &name))?;
            in_flight.insert(id, ());
            sent += 1;
        }
        if in_flight.is_empty() {
            break;
        }
        match sock.recv(&mut buf) {
            Ok(n) if n >= 12 => {
                let id = u16::from_be_bytes([buf[0], buf[1]]);
                if in_flight.remove(&id).is_some() {
                    // RCODE 0 and at least one answer.
                    if buf[3] & 0x0f == 0 && buf[6..8] != [0, 0] {
                        answered += 1;
                    } else {
                        failed += 1;
                    }
                }
            }
            Ok(_) => {}
            Err(_) => {
                // Nothing for 2 s: whatever is in flight is lost.
                failed += in_flight.len() as u64;
                in_flight.clear();
            }
        }
    }
    let took = start.elapsed().as_secs_f64();
    println!(
        "{}",
        json!({"answered": answered, "failed": failed, "secs": took, "qps": answered as f64 / took})
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

/// How long held flows sit idle before the RSS is read: the gateway gives
/// an idle flow's send ring back after one to two seconds.
const RSS_SETTLE: Duration = Duration::from_secs(4);

fn rss_curve(sidecar: &str, counts: &[u32], mtu: u32, sidecar_args: &[String]) -> Result<()> {
    let s = match sidecar {
        "gateway" => Sidecar::Gateway,
        "passt" => Sidecar::Passt,
        other => bail!("unknown sidecar {other}"),
    };
    let nofile = raise_nofile(HARNESS_NOFILE)?;
    eprintln!(
        "rss: open-file limit {nofile} (each held flow needs one descriptor in the holder, the sidecar and the origin)"
    );
    let most = counts.iter().copied().max().unwrap_or(0);
    let mut b = World::builder().sidecar(s).mtu(mtu);
    if s == Sidecar::Gateway {
        // Room for every held flow and the probe.
        b = b.sidecar_arg(&format!("--max-flows={}", most + 16));
    }
    for a in sidecar_args {
        b = b.sidecar_arg(a);
    }
    let mut w = b.start()?;
    // The default range (32768-60999) holds ~28,000 flows to one
    // destination; the guest namespace is widened only when a step needs
    // more, so smaller runs see it as every other benchmark does.
    if most > 25_000 {
        widen_guest_ports(&w)?;
    }
    let echo = SocketAddr::from((ORIGIN_ADDR, ECHO_PORT));
    std::thread::sleep(RSS_SETTLE);
    let idle_kb = w.sidecar().and_then(|p| p.rss_kb());
    println!(
        "{}",
        json!({"sidecar": s.name(), "mtu": mtu, "flows": 0,
               "rss_mb": idle_kb.map(|k| k as f64 / 1024.0),
               "load": load_average_1min()})
    );
    let mut holders = Vec::new();
    let mut held = 0u32;
    for &target in counts {
        let step = target.saturating_sub(held);
        let start = Instant::now();
        match FlowHolder::start(&w, echo, step) {
            Ok(h) => {
                held += step;
                holders.push(h);
            }
            Err(e) => {
                println!(
                    "{}",
                    json!({"sidecar": s.name(), "mtu": mtu, "flows": target,
                           "held": held, "error": format!("{e:#}"),
                           "load": load_average_1min()})
                );
                break;
            }
        }
        let open_secs = start.elapsed().as_secs_f64();
        std::thread::sleep(RSS_SETTLE);
        let kb = w.sidecar().and_then(|p| p.rss_kb());
        // One more connection while the flows are held: does it still echo?
        let probe = FlowHolder::start(&w, echo, 1).map(drop);
        println!(
            "{}",
            json!({"sidecar": s.name(), "mtu": mtu, "flows": held,
                   "rss_mb": kb.map(|k| k as f64 / 1024.0),
                   "kb_per_flow": kb.zip(idle_kb).map(|(k, i)| (k.saturating_sub(i)) as f64 / f64::from(held.max(1))),
                   "open_secs": open_secs,
                   "new_connection": match &probe {
                       Ok(()) => "echoed".to_string(),
                       Err(e) => format!("{e:#}"),
                   },
                   "load": load_average_1min()})
        );
        std::io::stdout().flush()?;
    }
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
    // The DNS figure is of cached answers (issue 16): with a positive TTL
    // the gateway answers repeats from its cache; passt has none and
    // forwards each to dnsmasq.
    let mut b = World::builder()
        .sidecar(s)
        .mtu(mtu)
        .dns_ttl(RUN_DNS_TTL)
        .iperf();
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
        "dns_qps": dq["qps"], "dns_failed": dq["failed"], "dns_ttl": RUN_DNS_TTL,
        "rss_idle_mb": rss_idle_kb.map(|k| k as f64 / 1024.0),
        "rss_flows_mb": rss_flows_kb.map(|k| k as f64 / 1024.0),
        "flows": flows, "flows_ready": line.trim(),
        "startup_ms": startup_ms,
        "sidecar_args": sidecar_args,
        "load_start": load_start,
        "load_end": load_average_1min(),
    }))
}

/// CPU seconds (utime + stime) and context switches (voluntary +
/// involuntary) of process `pid` so far.
fn proc_cpu(pid: u32) -> Option<(f64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name (which may hold spaces).
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat(5): 12 and 13 after ')'.
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let switches: u64 = status
        .lines()
        .filter(|l| l.contains("ctxt_switches:"))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum();
    // USER_HZ is 100 on Linux.
    Some((ticks as f64 / 100.0, switches))
}

/// The pid of this world's TAP bridge (the `sluice-tap-bridge` whose
/// command line names the world's socket).
fn bridge_pid(w: &World) -> Option<u32> {
    let sock = w.socket().display().to_string();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let cmd = String::from_utf8_lossy(&cmd);
        (cmd.contains("sluice-tap-bridge") && cmd.contains(&sock)).then_some(pid)
    })
}

/// CPU seconds the whole machine spent busy so far (`/proc/stat`'s first
/// line: user, system, irq, softirq and steal; `nice` is left out, so
/// other work run under `nice` does not count), and in softirq alone.
fn machine_cpu() -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let f: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .map_while(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal
    let busy = f.first()? + f.get(2)? + f.get(5)? + f.get(6)? + f.get(7)?;
    Some((busy as f64 / 100.0, *f.get(6)? as f64 / 100.0))
}

/// Runs `phase` and returns its JSON with the CPU used meanwhile by the
/// sidecar, the bridge and the whole machine added (`*_cpu_s`,
/// `sidecar_switches`).
fn measured(
    sidecar: Option<u32>,
    bridge: Option<u32>,
    phase: impl FnOnce() -> Result<Value>,
) -> Result<Value> {
    let s0 = sidecar.and_then(proc_cpu);
    let b0 = bridge.and_then(proc_cpu);
    let m0 = machine_cpu();
    let t0 = Instant::now();
    let mut v = phase()?;
    let wall = t0.elapsed().as_secs_f64();
    let s1 = sidecar.and_then(proc_cpu);
    let b1 = bridge.and_then(proc_cpu);
    let m1 = machine_cpu();
    v["wall_s"] = json!(wall);
    if let (Some(a), Some(b)) = (m0, m1) {
        v["machine_cpu_s"] = json!(b.0 - a.0);
        v["softirq_cpu_s"] = json!(b.1 - a.1);
    }
    if let (Some(a), Some(b)) = (s0, s1) {
        v["sidecar_cpu_s"] = json!(b.0 - a.0);
        v["sidecar_switches"] = json!(b.1 - a.1);
    }
    if let (Some(a), Some(b)) = (b0, b1) {
        v["bridge_cpu_s"] = json!(b.0 - a.0);
    }
    Ok(v)
}

/// `xfer`: see the module docs.
fn xfer(a: &XferArgs) -> Result<()> {
    let s = match a.sidecar.as_str() {
        "gateway" => Sidecar::Gateway,
        "passt" => Sidecar::Passt,
        other => bail!("unknown sidecar {other}"),
    };
    let mut b = World::builder()
        .sidecar(s)
        .mtu(a.mtu)
        .dns_ttl(a.dns_ttl)
        .iperf();
    if let Some(cc) = &a.cc {
        b = b.congestion(cc);
    }
    let cc = match &a.cc {
        Some(cc) => cc.clone(),
        None => std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into()),
    };
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

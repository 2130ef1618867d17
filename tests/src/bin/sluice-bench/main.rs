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
//!
//! One module per subcommand family: `run` (and its `table`), `rss`,
//! `xfer` (with `cpu`, the CPU accounting it reports), `dns`, and
//! `clients` (what runs in the guest namespace).

mod clients;
mod dns;
mod rss;
mod run;
mod xfer;

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::{Parser, Subcommand};
use sluice_e2e::Sidecar;

use clients::{connrate, dnsnames, dnsqps, hold};
use dns::{DnsArgs, dns_cells};
use rss::rss_curve;
use run::{RunArgs, run, table};
use xfer::{XferArgs, xfer};

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
    Run(RunArgs),
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

fn main() -> Result<()> {
    match Args::parse().cmd {
        Cmd::Run(a) => {
            let v = run(&a)?;
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

/// The sidecar a `--sidecar` value names: `gateway` or `passt`.
fn parse_sidecar(name: &str) -> Result<Sidecar> {
    Ok(match name {
        "gateway" => Sidecar::Gateway,
        "passt" => Sidecar::Passt,
        other => bail!("unknown sidecar {other}"),
    })
}

//! The clients `run`, `rss` and `dns` start inside the guest namespace:
//! sequential connects (`connrate`), sequential DNS queries (`dnsqps`), DNS
//! queries over many names with a window in flight (`dnsnames`), and held
//! echo flows (`hold`). Each prints one JSON line (`hold`: `ready N`).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::json;
use sluice_e2e::bench::{dns_a_query, percentile};

use crate::dns::BENCH_DOMAIN;

/// `connrate`: sequential connect + read one byte + close, `count` times.
pub(super) fn connrate(addr: SocketAddr, count: u32) -> Result<()> {
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

/// `dnsqps`: sequential A queries for `name`, `count` times.
pub(super) fn dnsqps(server: SocketAddr, name: &str, count: u32) -> Result<()> {
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

/// `dnsnames`: A queries for `{prefix}{i}.bench.test`, `i` cycling over
/// `first..first+count`, up to `window` in flight, for `secs` seconds (0:
/// one pass over the names); one JSON line.
pub(super) fn dnsnames(
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

/// `hold`: opens `count` echo flows, proves each, prints `ready N` and
/// holds them until stdin closes.
pub(super) fn hold(addr: SocketAddr, count: u32) -> Result<()> {
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

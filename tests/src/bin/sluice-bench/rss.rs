//! `rss`: the sidecar's resident memory idle and while the guest holds
//! each count of established echo flows, and whether one more connection
//! still echoes at that count.

use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::json;
use sluice_e2e::bench::load_average_1min;
use sluice_e2e::hold::{FlowHolder, HARNESS_NOFILE, raise_nofile, widen_guest_ports};
use sluice_e2e::{ECHO_PORT, ORIGIN_ADDR, Sidecar, World};

use crate::parse_sidecar;

/// How long held flows sit idle before the RSS is read: the gateway gives
/// an idle flow's send ring back after one to two seconds.
const RSS_SETTLE: Duration = Duration::from_secs(4);

/// `rss`: one JSON line idle, then one per count of held flows.
pub(super) fn rss_curve(
    sidecar: &str,
    counts: &[u32],
    mtu: u32,
    sidecar_args: &[String],
) -> Result<()> {
    let s = parse_sidecar(sidecar)?;
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

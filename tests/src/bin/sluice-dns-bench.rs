//! `sluice-dns-bench`: the gateway's work per forwarded DNS query, in one
//! process, for instruction counts (`valgrind --tool=callgrind`; see
//! docs/benchmarks.md, "Enforcement cost").
//!
//! Runs the real [`Datapath`] (smoltcp stack, DNS forwarder, DNS table,
//! audit sink writing to a file) on one end of a unix stream pair, exactly as
//! `sluice-gateway` runs it on the QEMU socket, with either no policy
//! (`--rules 0`: the platform deny set only, as `sluice-gateway` without
//! `--policy`) or the enforcement benchmark's generated policy
//! (`sluice_e2e::bench::rules_policy`). The other end plays the guest: it
//! sends `--queries` sequential A queries for the harness origin's name in
//! Ethernet/IPv4/UDP frames to the gateway's DNS address and waits for each
//! answer. The upstream resolver is a responder on a loopback UDP socket in
//! the same process that answers every A query with one address and TTL 0
//! (as the harness's dnsmasq does), so no namespace, root or network is
//! needed, and the guest and upstream work is the same in both modes.
//!
//! Everything runs on one thread (the gateway's own current-thread tokio
//! runtime), so callgrind's totals are the whole per-query cost. The
//! difference between two query counts, divided by the difference in
//! queries, is the cost of one query (start-up and policy compilation
//! cancel out). Prints one JSON line; its wall-clock figure is not a result.

use std::net::SocketAddrV4;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde_json::json;
use sluice_e2e::bench::{dns_a_query, rules_policy};
use sluice_e2e::{ORIGIN_ADDR, ORIGIN_NAME};
use sluice_gateway::audit::AuditSink;
use sluice_gateway::config::{Config, DEFAULT_MTU, DEFAULT_SUBNET};
use sluice_gateway::datapath::Datapath;
use sluice_gateway::decide::{
    Decider, PlatformDecider, PlatformDenySet, PolicyDecider, host_addresses,
};
use sluice_gateway::frames::TxBatch;
use sluice_gateway::packet;
use sluice_policy::CompileOptions;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UdpSocket, UnixStream};
use tokio::sync::mpsc;

/// The guest's MAC address.
const GUEST_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 1];
/// The guest's DNS client port.
const GUEST_PORT: u16 = 5353;

/// Command line.
#[derive(Parser, Debug)]
#[command(about = "The gateway's per-query DNS work in one process (for callgrind)")]
struct Args {
    /// Sequential A queries to send.
    #[arg(long, default_value_t = 1000)]
    queries: u32,
    /// Rules in the generated policy; 0 runs without a policy (allow-all).
    #[arg(long, default_value_t = 1000)]
    rules: usize,
    /// Audit file (appended); default: a fresh file in a temporary
    /// directory, removed at the end.
    #[arg(long)]
    audit: Option<PathBuf>,
}

fn main() -> Result<()> {
    let a = Args::parse();
    let tmp = std::env::temp_dir().join(format!("td-dnsbench-{}", std::process::id()));
    let audit_path = match &a.audit {
        Some(p) => p.clone(),
        None => {
            std::fs::create_dir_all(&tmp)?;
            tmp.join("audit.jsonl")
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(run(&a, &audit_path));
    if a.audit.is_none() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    let (ok, failed, secs) = result?;
    println!(
        "{}",
        json!({
            "rules": a.rules, "queries": a.queries, "ok": ok, "failed": failed,
            "wall_secs": secs,
        })
    );
    if failed > 0 {
        bail!("{failed} queries got no good answer");
    }
    Ok(())
}

/// Starts the upstream responder and the datapath, then asks the queries;
/// returns (answered, failed, seconds).
async fn run(a: &Args, audit_path: &std::path::Path) -> Result<(u32, u32, f64)> {
    let upstream = UdpSocket::bind("127.0.0.1:0").await?;
    let mut cfg = Config::new(DEFAULT_SUBNET, DEFAULT_MTU)?;
    cfg.dns_upstreams = vec![upstream.local_addr()?];
    tokio::spawn(respond(upstream));

    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(audit_path)
        .with_context(|| format!("opening {}", audit_path.display()))?;
    let mut audit = AuditSink::new(Box::new(file), "dns-bench");
    let deny = PlatformDenySet::new(host_addresses(), cfg.gateway_ip, cfg.subnet.broadcast());
    let decider: Arc<dyn Decider> = if a.rules == 0 {
        Arc::new(PlatformDecider::new(deny))
    } else {
        let mut options = CompileOptions::default();
        options.host_addresses = host_addresses();
        let policy = sluice_policy::from_yaml_str(&rules_policy(a.rules), "bench.yaml", &options)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let policy = Arc::new(policy);
        audit.set_policy(Some(Arc::clone(&policy)));
        Arc::new(PolicyDecider::new(policy, deny))
    };

    let (gw_end, mut guest) = UnixStream::pair()?;
    let (gateway_ip, gateway_mac) = (cfg.gateway_ip, cfg.gateway_mac);
    let guest_addr = SocketAddrV4::new(cfg.guest_ip, GUEST_PORT);
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let mut datapath = Datapath::new(Arc::new(cfg), decider, audit, events_tx);
    let link = sluice_gateway::link::GuestLink::stream(gw_end)?;
    let task = tokio::spawn(async move { datapath.run(&link, &mut events).await });

    let mut frames = FrameBuf::default();
    let (mut ok, mut failed) = (0u32, 0u32);
    let start = Instant::now();
    for i in 0..a.queries {
        let id = u16::try_from(i % 65536).unwrap_or(0);
        let mut tx = TxBatch::default();
        packet::write_udp(
            &mut tx,
            GUEST_MAC,
            gateway_mac,
            guest_addr,
            SocketAddrV4::new(gateway_ip, 53),
            &dns_a_query(id, ORIGIN_NAME),
        );
        guest.write_all(tx.unwritten()).await?;
        match frames.next_answer(&mut guest, id).await? {
            Some(true) => ok += 1,
            _ => failed += 1,
        }
    }
    let secs = start.elapsed().as_secs_f64();
    drop(guest);
    let _ = task.await;
    Ok((ok, failed, secs))
}

/// The guest's receive side: length-prefixed frames from the gateway.
#[derive(Default)]
struct FrameBuf {
    buf: Vec<u8>,
}

impl FrameBuf {
    /// Reads frames until the DNS answer with `id`: `Some(true)` for NOERROR
    /// with at least one answer, `Some(false)` for another answer, `None`
    /// when the gateway closed the stream.
    async fn next_answer(&mut self, guest: &mut UnixStream, id: u16) -> Result<Option<bool>> {
        loop {
            while let Some(frame) = self.take_frame() {
                if let Some(dns) = udp_payload_from_53(&frame)
                    && dns.get(..2) == Some(&id.to_be_bytes()[..])
                {
                    let rcode = dns.get(3).map(|b| b & 0x0f);
                    let answers = dns.get(6..8).map(|b| u16::from_be_bytes([b[0], b[1]]));
                    return Ok(Some(rcode == Some(0) && answers.unwrap_or(0) > 0));
                }
            }
            let mut chunk = [0u8; 4096];
            let n = guest.read(&mut chunk).await?;
            if n == 0 {
                return Ok(None);
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    fn take_frame(&mut self) -> Option<Vec<u8>> {
        let len = u32::from_be_bytes(self.buf.get(..4)?.try_into().ok()?);
        let end = 4 + usize::try_from(len).ok()?;
        let frame = self.buf.get(4..end)?.to_vec();
        self.buf.drain(..end);
        Some(frame)
    }
}

/// The UDP payload of an IPv4 frame from port 53, if it is one.
fn udp_payload_from_53(frame: &[u8]) -> Option<&[u8]> {
    if frame.get(12..14)? != [0x08, 0x00] || *frame.get(23)? != 17 {
        return None;
    }
    let ihl = usize::from(frame.get(14)? & 0x0f) * 4;
    let udp = frame.get(14 + ihl..)?;
    if udp.get(..2)? != 53u16.to_be_bytes() {
        return None;
    }
    udp.get(8..)
}

/// The upstream resolver: answers every A query with [`ORIGIN_ADDR`], TTL 0,
/// and an EDNS OPT record (the shape of the harness dnsmasq's answers).
async fn respond(sock: UdpSocket) {
    let mut buf = vec![0u8; 65535];
    while let Ok((n, peer)) = sock.recv_from(&mut buf).await {
        if let Some(answer) = buf.get(..n).and_then(a_answer) {
            let _ = sock.send_to(&answer, peer).await;
        }
    }
}

/// The answer to an A `query` (one question), or `None` if it is not one.
fn a_answer(query: &[u8]) -> Option<Vec<u8>> {
    // The question: labels up to the root, then type and class.
    let mut at = 12;
    loop {
        let len = usize::from(*query.get(at)?);
        at += 1 + len;
        if len == 0 {
            break;
        }
    }
    let question = query.get(12..at + 4)?;
    if question.get(question.len() - 4..)? != [0, 1, 0, 1] {
        return None;
    }
    let mut r = Vec::with_capacity(64 + question.len());
    r.extend_from_slice(query.get(..2)?);
    r.extend_from_slice(&[0x81, 0x80, 0, 1, 0, 1, 0, 0, 0, 1]);
    r.extend_from_slice(question);
    r.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4]);
    r.extend_from_slice(&ORIGIN_ADDR.octets());
    r.extend_from_slice(&[0, 0, 0x29, 0x04, 0xd0, 0, 0, 0, 0, 0, 0]);
    Some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_responder_answers_a_queries_only() {
        let q = dns_a_query(0x1234, ORIGIN_NAME);
        let r = a_answer(&q).unwrap();
        assert_eq!(&r[..2], &[0x12, 0x34]);
        assert!(r.ends_with(&[0, 0, 0x29, 0x04, 0xd0, 0, 0, 0, 0, 0, 0]));
        assert!(r.windows(4).any(|w| w == ORIGIN_ADDR.octets()));
        let mut aaaa = q.clone();
        let n = aaaa.len();
        aaaa[n - 3] = 28;
        assert_eq!(a_answer(&aaaa), None);
        assert_eq!(a_answer(&q[..10]), None);
    }

    #[test]
    fn both_modes_answer_every_query() {
        for rules in [0, 50] {
            let a = Args {
                queries: 20,
                rules,
                audit: None,
            };
            let dir = std::env::temp_dir()
                .join(format!("td-dnsbench-test-{}-{rules}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let audit = dir.join("audit.jsonl");
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let (ok, failed, _) = rt.block_on(run(&a, &audit)).unwrap();
            assert_eq!((ok, failed), (20, 0), "rules {rules}");
            let log = std::fs::read_to_string(&audit).unwrap();
            let answered = log
                .lines()
                .filter(|l| l.contains("\"dns_answered\""))
                .count();
            assert_eq!(answered, 20, "rules {rules}: {log}");
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

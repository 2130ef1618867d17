//! DNS as the attacker sees it (issue 12, points 1, 4, 5): what leaves the
//! machine is the gateway's choice, spoofed answers are dropped, repeats are
//! answered locally, and many names on one address stay exact.

use std::net::Ipv4Addr;
use std::path::Path;

use anyhow::{Context, Result, ensure};
use sluice_e2e::{DNS_ADDR, ORIGIN_ADDR, ORIGIN2_ADDR, World, wait_until};

use super::{WAIT, dig, expect_flow_deny, tlsprobe, world};

/// One DNS query seen on the wire in the fake internet.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SeenQuery {
    src_port: u16,
    id: u16,
    flags: u16,
    /// The question's name as sent (letter case kept), dotted.
    name: String,
}

/// The DNS queries to `resolver`:53 in a pcap file (link types Ethernet,
/// Linux cooked v1 and v2: what `tcpdump -i any` writes).
fn queries_in_pcap(pcap: &[u8], resolver: Ipv4Addr) -> Result<Vec<SeenQuery>> {
    ensure!(pcap.len() >= 24, "pcap shorter than its header");
    let le = pcap[..4] == [0xd4, 0xc3, 0xb2, 0xa1] || pcap[..4] == [0x4d, 0x3c, 0xb2, 0xa1];
    let u32_at = |b: &[u8], i: usize| -> u32 {
        let w = [b[i], b[i + 1], b[i + 2], b[i + 3]];
        if le {
            u32::from_le_bytes(w)
        } else {
            u32::from_be_bytes(w)
        }
    };
    let link_header = match u32_at(pcap, 20) {
        1 => 14,
        113 => 16,
        276 => 20,
        other => anyhow::bail!("pcap link type {other} not handled"),
    };
    let mut out = Vec::new();
    let mut at = 24;
    while at + 16 <= pcap.len() {
        let len = u32_at(pcap, at + 8) as usize;
        let Some(packet) = pcap.get(at + 16..at + 16 + len) else {
            break;
        };
        at += 16 + len;
        let Some(ip) = packet.get(link_header..) else {
            continue;
        };
        if ip.len() < 20 || ip[0] >> 4 != 4 || ip[9] != 17 {
            continue;
        }
        let ihl = usize::from(ip[0] & 0x0f) * 4;
        if ip[16..20] != resolver.octets() {
            continue;
        }
        let Some(udp) = ip.get(ihl..) else { continue };
        if udp.len() < 8 + 12 || u16::from_be_bytes([udp[2], udp[3]]) != 53 {
            continue;
        }
        let dns = &udp[8..];
        let mut labels = Vec::new();
        let mut i = 12;
        while let Some(&l) = dns.get(i) {
            if l == 0 {
                break;
            }
            let Some(label) = dns.get(i + 1..i + 1 + usize::from(l)) else {
                break;
            };
            labels.push(String::from_utf8_lossy(label).into_owned());
            i += 1 + usize::from(l);
        }
        out.push(SeenQuery {
            src_port: u16::from_be_bytes([udp[0], udp[1]]),
            id: u16::from_be_bytes([dns[0], dns[1]]),
            flags: u16::from_be_bytes([dns[2], dns[3]]),
            name: labels.join("."),
        });
    }
    Ok(out)
}

/// Starts tcpdump on every interface of the fake internet, writing `pcap`.
fn capture(w: &World, pcap: &Path, filter: &str) -> Result<sluice_e2e::Proc> {
    let mut c = w.inet.cmd("tcpdump");
    c.args(["-i", "any", "-U", "-n", "-w"])
        .arg(pcap)
        .arg(filter);
    let log = w.dir().join("inet-tcpdump.log");
    let p = sluice_e2e::Proc::spawn("tcpdump", &mut c, &log)?;
    wait_until("tcpdump to listen", WAIT, || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("listening on")
    })?;
    Ok(p)
}

/// A guest query with a chosen id, source port and header bits: RD clear,
/// CD set (flags 0x0010), for `name` A. Prints the answer's rcode.
fn guest_query_script(name: &str, id: u16, port: u16) -> String {
    format!(
        "python3 -c \"
import socket, struct
q = struct.pack('>HHHHHH', {id}, 0x0010, 1, 0, 0, 0)
for l in '{name}'.split('.'):
    q += bytes([len(l)]) + l.encode()
q += b'\\x00\\x00\\x01\\x00\\x01'
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(('0.0.0.0', {port}))
s.settimeout(20)
s.sendto(q, ('10.0.2.2', 53))
a = s.recv(4096)
print('id', struct.unpack('>H', a[:2])[0], 'rcode', a[3] & 15)
\""
    )
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn upstream_queries_carry_the_gateways_id_port_and_bits_not_the_guests() -> Result<()> {
    let w = world()?;
    let pcap = w.dir().join("upstream-dns.pcap");
    let mut dump = capture(
        &w,
        &pcap,
        &format!("udp and dst host {DNS_ADDR} and dst port 53"),
    )?;
    // Allowed by `*.rebind.test`, unknown upstream (NXDOMAIN): never
    // cached, so both identical queries go upstream.
    let name = "nothing-here.rebind.test";
    for _ in 0..2 {
        let out = w.guest_ok(&guest_query_script(name, 0x4242, 5555), 60)?;
        // The guest gets its own id back.
        ensure!(out.contains("id 16962 rcode 3"), "answer: {out}");
    }
    let seen = || -> Vec<SeenQuery> {
        let bytes = std::fs::read(&pcap).unwrap_or_default();
        queries_in_pcap(&bytes, DNS_ADDR).unwrap_or_default()
    };
    let _ = wait_until("tcpdump to write both queries", WAIT, || seen().len() >= 2);
    let _ = dump.signal_and_wait(libc::SIGINT, std::time::Duration::from_secs(30));
    let bytes = std::fs::read(&pcap).context("pcap")?;
    let seen = queries_in_pcap(&bytes, DNS_ADDR)?;
    ensure!(seen.len() == 2, "expected two upstream queries: {seen:?}");
    for q in &seen {
        ensure!(q.id != 0x4242, "the guest's id went upstream: {q:?}");
        ensure!(q.src_port != 5555, "the guest's port went upstream: {q:?}");
        // RD (0x0100) set by the gateway, CD (0x0010) clear; no other bit.
        ensure!(q.flags == 0x0100, "header bits {:#06x}: {q:?}", q.flags);
        ensure!(q.name.eq_ignore_ascii_case(name), "{q:?}");
    }
    ensure!(
        seen[0].id != seen[1].id && seen[0].src_port != seen[1].src_port,
        "two identical guest queries left with the same id or port: {seen:?}"
    );
    Ok(())
}

/// The test's own resolver in the fake internet.
const FAKE_RESOLVER: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 54);

/// A resolver that answers every A query three times wrongly before the
/// right answer: (1) with the guest's id 0x4242 (what a guest colluding with
/// an off-path spoofer can predict), (2) with the right id from another
/// port, (3) with the right id and the name in lower case; each pointing at
/// `evil`. After 300 ms, the right answer (`good`). Logs each query.
fn spoofing_resolver(w: &World, good: Ipv4Addr, evil: Ipv4Addr) -> Result<sluice_e2e::Proc> {
    let script = format!(
        r#"
import socket, struct, time, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(('{FAKE_RESOLVER}', 53))
other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
other.bind(('{FAKE_RESOLVER}', 5353))
def answer(qid, question, ip):
    h = struct.pack('>HHHHHH', qid, 0x8180, 1, 1, 0, 0)
    rr = b'\xc0\x0c' + struct.pack('>HHIH', 1, 1, 60, 4) + socket.inet_aton(ip)
    return h + question + rr
while True:
    q, peer = s.recvfrom(4096)
    qid = struct.unpack('>H', q[:2])[0]
    i = 12
    while q[i] != 0:
        i += 1 + q[i]
    question = q[12:i + 5]
    print('query', qid, question, flush=True)
    s.sendto(answer(0x4242, question, '{evil}'), peer)
    other.sendto(answer(qid, question, '{evil}'), peer)
    s.sendto(answer(qid, question.lower(), '{evil}'), peer)
    time.sleep(0.3)
    s.sendto(answer(qid, question, '{good}'), peer)
"#
    );
    let path = w.dir().join("spoofer.py");
    std::fs::write(&path, script)?;
    let mut c = w.inet.cmd("python3");
    c.arg(&path);
    let p = sluice_e2e::Proc::spawn("spoofer", &mut c, &w.dir().join("spoofer.log"))?;
    w.inet.wait_listening(
        "the spoofing resolver",
        "udp",
        &format!("{FAKE_RESOLVER}:53"),
    )?;
    Ok(p)
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn spoofed_answers_reach_neither_the_guest_nor_the_table() -> Result<()> {
    let w = World::builder()
        .policy(super::POLICY)
        .dns_upstream(FAKE_RESOLVER)
        .start()?;
    std::fs::write(w.dir().join("tlsprobe.py"), super::TLSPROBE)?;
    let _resolver = spoofing_resolver(&w, ORIGIN_ADDR, ORIGIN2_ADDR)?;
    // Long enough that the random letter case is never all lower case by chance.
    let name = "spoofcheckname.rebind.test";
    let out = w.guest_ok(&guest_query_script(name, 0x4242, 5556), 60)?;
    ensure!(out.contains("id 16962 rcode 0"), "answer: {out}");
    let short = dig(&w, &format!("+short {name} A"))?;
    ensure!(
        short.trim() == ORIGIN_ADDR.to_string(),
        "the guest got {short:?}, not only {ORIGIN_ADDR}\n{}",
        w.sidecar_log()
    );
    // The spoofed address is not in the table: a connection to it under
    // the name is refused, while the right address is reached.
    let (ok, text) = tlsprobe(&w, &format!("craft {ORIGIN_ADDR} 443 --names {name}"))?;
    ensure!(ok, "the right address was not reached: {text}");
    let (ok, text) = tlsprobe(&w, &format!("craft {ORIGIN2_ADDR} 443 --names {name}"))?;
    ensure!(!ok, "the spoofed address was reached: {text}");
    expect_flow_deny(
        &w,
        "connection to the spoofed address",
        &format!("{ORIGIN2_ADDR}:443"),
        &["sni_dns_mismatch", "ip_not_resolved_for_name"],
    )?;
    Ok(())
}

/// Lines of dnsmasq's log recording an A query for `name` (the log is
/// case-folded).
fn upstream_a_queries(w: &World, name: &str) -> usize {
    let needle = format!("query[a] {name} ");
    w.dns_log().lines().filter(|l| l.contains(&needle)).count()
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn a_repeated_query_within_its_ttl_is_answered_by_the_gateway() -> Result<()> {
    let w = world()?;
    let name = sluice_e2e::ORIGIN_NAME;
    let first = dig(&w, &format!("{name} A"))?;
    ensure!(first.contains(&ORIGIN_ADDR.to_string()), "{first}");
    wait_until("dnsmasq to log the query", WAIT, || {
        upstream_a_queries(&w, name) == 1
    })
    .with_context(|| w.dns_log())?;
    std::thread::sleep(std::time::Duration::from_secs(2));
    for _ in 0..3 {
        let again = dig(&w, &format!("{name} A"))?;
        ensure!(again.contains(&ORIGIN_ADDR.to_string()), "{again}");
        // TTLs count down from the policy's floor (600 s).
        ensure!(
            !again.contains("\t600\tIN\tA"),
            "cached answer with a fresh TTL: {again}"
        );
    }
    // dnsmasq logs as it answers; give a stray query time to show up.
    std::thread::sleep(std::time::Duration::from_secs(1));
    let n = upstream_a_queries(&w, name);
    ensure!(
        n == 1,
        "{n} upstream queries for one name within its TTL:\n{}",
        w.dns_log()
    );
    Ok(())
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn many_names_on_one_address_stay_exact() -> Result<()> {
    const NAMES: usize = 400;
    let mut b = World::builder().policy(super::POLICY);
    for i in 0..NAMES {
        b = b.dns_record(&format!("n{i}.rebind.test"), ORIGIN_ADDR);
    }
    let w = b.start()?;
    std::fs::write(w.dir().join("tlsprobe.py"), super::TLSPROBE)?;
    // Resolve them all: bursts of 100 queries from one socket (under the
    // gateway's bound on questions in flight).
    let out = w.guest_ok(
        &format!(
            "python3 -c \"
import socket, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(30)
def q(i):
    m = struct.pack('>HHHHHH', i, 0x0100, 1, 0, 0, 0)
    for l in ('n%d' % i, 'rebind', 'test'):
        m += bytes([len(l)]) + l.encode()
    return m + b'\\x00\\x00\\x01\\x00\\x01'
ok = 0
for start in range(0, {NAMES}, 100):
    for i in range(start, start + 100):
        s.sendto(q(i), ('10.0.2.2', 53))
    for i in range(100):
        a = s.recv(4096)
        ok += (a[3] & 15) == 0 and struct.unpack('>H', a[6:8])[0] == 1
print('answered', ok)
\""
        ),
        120,
    )?;
    ensure!(out.contains(&format!("answered {NAMES}")), "{out}");
    // Every name admits a connection to the address; a name allowed by the
    // same rule but never resolved does not.
    for i in [0, NAMES / 2, NAMES - 1] {
        let (ok, text) = tlsprobe(
            &w,
            &format!("craft {ORIGIN_ADDR} 443 --names n{i}.rebind.test"),
        )?;
        ensure!(ok, "n{i}.rebind.test: {text}");
    }
    let (ok, text) = tlsprobe(
        &w,
        &format!("craft {ORIGIN_ADDR} 443 --names never.rebind.test"),
    )?;
    ensure!(!ok, "an unresolved name reached the address: {text}");
    expect_flow_deny(
        &w,
        "unresolved name",
        &format!("{ORIGIN_ADDR}:443"),
        &["sni_dns_mismatch", "ip_not_resolved_for_name"],
    )?;
    Ok(())
}

//! Beyond TCP (issue 4): UDP and QUIC to allowed hosts denied, IPv6 off
//! (frames dropped and counted, AAAA withheld).

use super::*;

#[test]
#[ignore = "needs root: run via scripts/test"]
fn udp_and_quic_to_allowed_hosts_are_denied() -> Result<()> {
    let w = world()?;
    resolve(&w, ORIGIN_NAME)?;
    // Listeners in the fake internet record whatever arrives.
    let got443 = w.dir().join("udp443.out");
    let got5000 = w.dir().join("udp5000.out");
    let _l1 = listen_udp(&w, 443, &got443)?;
    let _l2 = listen_udp(&w, 5000, &got5000)?;
    // Bound before anything is sent, or a leak would go unnoticed.
    for port in [443, 5000] {
        w.inet
            .wait_listening("a UDP listener", "udp", &format!("{ORIGIN_ADDR}:{port}"))?;
    }
    for port in [443, 5000] {
        w.guest_ok(
            &format!(
                "python3 -c \"import socket; s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); \
                 [s.sendto(b'quic-or-udp', ('{ORIGIN_NAME}', {port})) for _ in range(3)]\""
            ),
            60,
        )?;
    }
    expect_flow_deny(&w, "QUIC", &format!("{ORIGIN_ADDR}:443"), &["quic_blocked"])?;
    expect_flow_deny(&w, "UDP", &format!("{ORIGIN_ADDR}:5000"), &["udp_blocked"])?;
    for f in [&got443, &got5000] {
        let data = std::fs::read(f).unwrap_or_default();
        ensure!(data.is_empty(), "{} received {data:?}", f.display());
    }
    Ok(())
}

/// A UDP listener in the fake internet writing what it receives to `out`.
fn listen_udp(w: &World, port: u16, out: &std::path::Path) -> Result<sluice_e2e::Proc> {
    let mut c = w.inet.cmd("socat");
    c.arg("-u")
        .arg(format!("UDP4-RECV:{port},bind={ORIGIN_ADDR}"))
        .arg(format!("CREATE:{}", out.display()));
    sluice_e2e::Proc::spawn(
        "udp listener",
        &mut c,
        &w.dir().join(format!("udp{port}.log")),
    )
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn ipv6_is_off_frames_dropped_and_aaaa_withheld() -> Result<()> {
    let mut w = world()?;
    let out = dig(&w, &format!("{ORIGIN_NAME} AAAA"))?;
    ensure!(
        out.contains("status: NOERROR") && out.contains("ANSWER: 0"),
        "AAAA: {out}"
    );
    expect_deny(&w, "AAAA withheld", &["dns_type_withheld"], |l| {
        l["qname"] == ORIGIN_NAME
    })?;
    // HTTPS/SVCB (which could carry ECH configurations) likewise.
    let out = dig(&w, &format!("{ORIGIN_NAME} TYPE65"))?;
    ensure!(
        out.contains("status: NOERROR") && out.contains("ANSWER: 0"),
        "HTTPS RR: {out}"
    );
    // An IPv6 frame from the guest is dropped by the gateway, counted and
    // audited. The guest kernel's own IPv6 (router solicitations, MLD) is
    // switched off first so that the frame counted is the test's.
    w.guest_ok(
        &format!(
            "sysctl -qw net.ipv6.conf.{}.disable_ipv6=1",
            sluice_e2e::GUEST_TAP
        ),
        20,
    )?;
    // A stable baseline: two readings in a row that agree (kernel frames
    // sent before the switch may still be on their way).
    let mut before = ipv6_drop_state(&mut w)?;
    wait_until("a stable IPv6 drop count", WAIT, || {
        match ipv6_drop_state(&mut w) {
            Ok(now) if now == before => true,
            Ok(now) => {
                before = now;
                false
            }
            Err(_) => false,
        }
    })
    .with_context(|| format!("last: {before:?}\n{}", w.sidecar_log()))?;
    // One UDP datagram to 2001:db8:2::10 in one raw Ethernet frame, from
    // the guest's MAC (another MAC would be dropped as spoofed instead).
    w.guest_ok(
        &format!("python3 -c '{SEND_V6_FRAME}' {}", sluice_e2e::GUEST_TAP),
        30,
    )?;
    let mut after = before;
    wait_until("the IPv6 frame counted and audited", WAIT, || {
        if let Ok(now) = ipv6_drop_state(&mut w) {
            after = now;
        }
        after.0 > before.0 && after.1 > before.1
    })
    .with_context(|| format!("before {before:?}, after {after:?}\n{}", w.sidecar_log()))?;
    ensure!(
        after.0 == before.0 + 1,
        "one frame sent, {} counted",
        after.0 - before.0
    );
    Ok(())
}

/// Sends one IPv6/UDP frame out of the interface named in argv[1] (python3,
/// AF_PACKET): the interface's own MAC as source, the gateway's address
/// unknown (broadcast destination; the gateway drops IPv6 by EtherType).
const SEND_V6_FRAME: &str = r#"
import socket, sys
dev = sys.argv[1]
mac = bytes.fromhex(open("/sys/class/net/%s/address" % dev).read().strip().replace(":", ""))
src = socket.inet_pton(socket.AF_INET6, "2001:db8:1::2")
dst = socket.inet_pton(socket.AF_INET6, "2001:db8:2::10")
udp = (40000).to_bytes(2, "big") + (53).to_bytes(2, "big") + (12).to_bytes(2, "big") + bytes(2) + b"v6?!"
ip6 = bytes([0x60, 0, 0, 0]) + len(udp).to_bytes(2, "big") + bytes([17, 64]) + src + dst
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((dev, 0))
s.send(b"\xff" * 6 + mac + b"\x86\xdd" + ip6 + udp)
"#;

/// The gateway's IPv6 drop counter (from the `counters` line it logs on
/// SIGUSR1; 0 while the `dropped` list has no `ipv6=`) and the number of
/// `ipv6_blocked` drops in the audit (records, plus those a rate-limit
/// summary reports as suppressed).
fn ipv6_drop_state(w: &mut World) -> Result<(u64, u64)> {
    let log = w.dir().join("sidecar.log");
    let counters_lines = |text: &str| -> Vec<Value> {
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["fields"]["message"] == "counters")
            .collect()
    };
    let seen = counters_lines(&std::fs::read_to_string(&log).unwrap_or_default()).len();
    let pid = w
        .sidecar()
        .and_then(|p| p.pid())
        .context("no sidecar pid")?;
    let st = std::process::Command::new("kill")
        .args(["-USR1", &pid.to_string()])
        .status()?;
    ensure!(st.success(), "kill -USR1 {pid}: {st}");
    let mut last = None;
    wait_until("a counters line after SIGUSR1", WAIT, || {
        let lines = counters_lines(&std::fs::read_to_string(&log).unwrap_or_default());
        if lines.len() > seen {
            last = lines.last().cloned();
        }
        last.is_some()
    })
    .with_context(|| w.sidecar_log())?;
    let last = last.context("no counters line")?;
    let dropped = last["fields"]["dropped"].as_str().unwrap_or_default();
    let counted = dropped
        .split(',')
        .find_map(|kv| kv.strip_prefix("ipv6="))
        .map_or(Ok(0), str::parse::<u64>)
        .with_context(|| format!("counters: {last}"))?;
    let mut audited = 0;
    for r in w.audit()? {
        if r["kind"] == "connection" && r["reason"] == "ipv6_blocked" {
            ensure!(r["decision"] == "deny", "{r}");
            audited += 1;
        }
        for s in r["suppressed"].as_array().into_iter().flatten() {
            if s["reason"] == "ipv6_blocked" {
                audited += s["count"].as_u64().context("suppressed count")?;
            }
        }
    }
    Ok((counted, audited))
}

//! In-process tests of the whole session over a socketpair, with hand-built
//! frames.

use super::*;
use crate::config::DEFAULT_SUBNET;
use crate::decide::{DecideContext, Decision, DenyReason, InspectVerdict};
use crate::packet::tests::{GUEST_MAC, tcp_frame, udp_frame};
use sluice_policy::Reason;
use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol, IpProtocol,
    Ipv4Packet, TcpControl, TcpPacket,
};
use std::net::Ipv4Addr;
use std::sync::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UnixStream};

/// Allows everything except port 9, which the "policy" denies.
struct TestDecider;
impl Decider for TestDecider {
    fn decide_tcp(&self, flow: &FlowKey, _ctx: &DecideContext<'_>) -> Decision {
        if flow.dst.port() == 9 {
            Decision::Deny(Verdict::of(Reason::NotAllowlisted))
        } else {
            Decision::Allow(Verdict::of(Reason::Allowlisted))
        }
    }
    fn decide_udp(&self, _flow: &FlowKey, _ctx: &DecideContext<'_>) -> Decision {
        Decision::Deny(DenyReason::UdpNotAllowed.into())
    }
}

#[derive(Clone, Default)]
struct SharedBuf(Arc<Mutex<Vec<u8>>>);
impl io::Write for SharedBuf {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

struct Guest {
    stream: UnixStream,
    buf: Vec<u8>,
}

impl Guest {
    async fn send(&mut self, frames: &[Vec<u8>]) {
        let mut out = Vec::new();
        for f in frames {
            out.extend_from_slice(&u32::try_from(f.len()).unwrap().to_be_bytes());
            out.extend_from_slice(f);
        }
        self.stream.write_all(&out).await.unwrap();
    }

    /// Next frame from the gateway; a generous bound keeps a broken gateway from hanging the test.
    async fn recv(&mut self) -> Vec<u8> {
        loop {
            if self.buf.len() >= 4 {
                let n = u32::from_be_bytes(self.buf[..4].try_into().unwrap()) as usize;
                if self.buf.len() >= 4 + n {
                    let f = self.buf[4..4 + n].to_vec();
                    self.buf.drain(..4 + n);
                    return f;
                }
            }
            let mut chunk = vec![0u8; 65536];
            let n = tokio::time::timeout(Duration::from_secs(30), self.stream.read(&mut chunk))
                .await
                .expect("gateway sent nothing")
                .unwrap();
            assert!(n > 0, "gateway closed the stream");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Next TCP segment (answering ARP requests for the guest on the way).
    async fn recv_tcp(&mut self) -> (SocketAddrV4, SocketAddrV4, TcpControl, u32, Option<u32>) {
        loop {
            let f = self.recv().await;
            let eth = EthernetFrame::new_checked(&f[..]).unwrap();
            if eth.ethertype() == EthernetProtocol::Arp {
                let arp = ArpPacket::new_checked(eth.payload()).unwrap();
                assert_eq!(arp.operation(), ArpOperation::Request);
                let reply = ArpRepr::EthernetIpv4 {
                    operation: ArpOperation::Reply,
                    source_hardware_addr: EthernetAddress(GUEST_MAC),
                    source_protocol_addr: Ipv4Addr::new(10, 0, 2, 15),
                    target_hardware_addr: eth.src_addr(),
                    target_protocol_addr: Ipv4Addr::from(
                        <[u8; 4]>::try_from(arp.source_protocol_addr()).unwrap(),
                    ),
                };
                let mut buf = vec![0u8; 14 + reply.buffer_len()];
                let mut e = EthernetFrame::new_unchecked(&mut buf[..]);
                e.set_src_addr(EthernetAddress(GUEST_MAC));
                e.set_dst_addr(eth.src_addr());
                e.set_ethertype(EthernetProtocol::Arp);
                reply.emit(&mut ArpPacket::new_unchecked(e.payload_mut()));
                self.send(&[buf]).await;
                continue;
            }
            let ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
            if ip.next_header() != IpProtocol::Tcp {
                continue;
            }
            let tcp = TcpPacket::new_checked(ip.payload()).unwrap();
            let control = if tcp.rst() {
                TcpControl::Rst
            } else if tcp.syn() {
                TcpControl::Syn
            } else if tcp.fin() {
                TcpControl::Fin
            } else {
                TcpControl::None
            };
            let ack = tcp.ack().then(|| tcp.ack_number().0 as u32);
            return (
                SocketAddrV4::new(ip.src_addr(), tcp.src_port()),
                SocketAddrV4::new(ip.dst_addr(), tcp.dst_port()),
                control,
                tcp.seq_number().0 as u32,
                ack,
            );
        }
    }
}

fn start(decider: Arc<dyn Decider>) -> (Guest, SharedBuf, tokio::task::JoinHandle<SessionEnd>) {
    start_cfg(Config::new(DEFAULT_SUBNET, 1500).unwrap(), decider)
}

fn start_cfg(
    cfg: Config,
    decider: Arc<dyn Decider>,
) -> (Guest, SharedBuf, tokio::task::JoinHandle<SessionEnd>) {
    let (gw_end, test_end) = UnixStream::pair().unwrap();
    let cfg = Arc::new(cfg);
    let audit_buf = SharedBuf::default();
    let audit = AuditSink::new(Box::new(audit_buf.clone()), "test");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut dp = Datapath::new(cfg, decider, audit, tx);
    let task = tokio::spawn(async move {
        dp.run(&GuestLink::stream(gw_end).expect("register"), &mut rx)
            .await
    });
    (
        Guest {
            stream: test_end,
            buf: Vec::new(),
        },
        audit_buf,
        task,
    )
}

#[tokio::test]
async fn spoofed_frames_are_audited() {
    let (mut guest, audit, _task) = start(Arc::new(TestDecider));
    let g = Ipv4Addr::new(10, 0, 2, 15);
    let denied = SocketAddrV4::new(Ipv4Addr::new(198, 51, 100, 1), 9);
    // A SYN from an address that is not the guest's, then a denied SYN
    // whose RST shows the first frame was processed.
    guest
        .send(&[
            tcp_frame(
                SocketAddrV4::new(Ipv4Addr::new(10, 0, 2, 99), 1000),
                denied,
                TcpControl::Syn,
                1,
                None,
            ),
            tcp_frame(
                SocketAddrV4::new(g, 1002),
                denied,
                TcpControl::Syn,
                77,
                None,
            ),
        ])
        .await;
    let (_, to, control, _, _) = guest.recv_tcp().await;
    assert_eq!((to.port(), control), (1002, TcpControl::Rst));
    let text = String::from_utf8(audit.0.lock().unwrap().clone()).unwrap();
    let lines = crate::audit::tests::parse_all(&text);
    assert!(
        lines.iter().any(|l| l["kind"] == "connection"
            && l["decision"] == "deny"
            && l["reason"] == "spoofed_source"),
        "{text}"
    );
}

#[tokio::test]
async fn concurrent_syns_are_not_cross_wired_and_denied_syns_get_rst() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (mut guest, audit, task) = start(Arc::new(TestDecider));
    let g = Ipv4Addr::new(10, 0, 2, 15);
    let dst = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
    let (a, b) = (SocketAddrV4::new(g, 1000), SocketAddrV4::new(g, 1001));
    // Two SYNs to the same destination in one write, then a duplicate of the first.
    guest
        .send(&[
            tcp_frame(a, dst, TcpControl::Syn, 100, None),
            tcp_frame(b, dst, TcpControl::Syn, 5000, None),
            tcp_frame(a, dst, TcpControl::Syn, 100, None),
        ])
        .await;
    let mut seen = HashMap::new();
    while seen.len() < 2 {
        let (src, to, control, _seq, ack) = guest.recv_tcp().await;
        assert_eq!(control, TcpControl::Syn, "expected SYN-ACK");
        assert_eq!(src, dst);
        seen.insert(to.port(), ack);
    }
    assert_eq!(
        seen[&1000],
        Some(101),
        "SYN-ACK for port 1000 acknowledges its own SYN"
    );
    assert_eq!(
        seen[&1001],
        Some(5001),
        "SYN-ACK for port 1001 acknowledges its own SYN"
    );
    let (_c1, _) = listener.accept().await.unwrap();
    let (_c2, _) = listener.accept().await.unwrap();

    // A denied destination gets a RST acknowledging the SYN, and an audit line.
    let denied = SocketAddrV4::new(Ipv4Addr::new(198, 51, 100, 1), 9);
    guest
        .send(&[tcp_frame(
            SocketAddrV4::new(g, 1002),
            denied,
            TcpControl::Syn,
            77,
            None,
        )])
        .await;
    let (src, to, control, _, ack) = guest.recv_tcp().await;
    assert_eq!(
        (src, to.port(), control, ack),
        (denied, 1002, TcpControl::Rst, Some(78))
    );
    let text = String::from_utf8(audit.0.lock().unwrap().clone()).unwrap();
    let lines = crate::audit::tests::parse_all(&text);
    assert!(
        lines.iter().any(|l| l["kind"] == "connection"
            && l["reason"] == "not_allowlisted"
            && l["dst"]["port"] == 9),
        "{text}"
    );
    let opens = lines
        .iter()
        .filter(|l| l["kind"] == "connection" && l["decision"] == "allow")
        .count();
    assert_eq!(opens, 2, "{text}");

    // A frame length below 14 ends the session cleanly.
    guest.stream.write_all(&5u32.to_be_bytes()).await.unwrap();
    guest.stream.write_all(&[0u8; 5]).await.unwrap();
    let end = task.await.unwrap();
    assert!(
        matches!(
            end,
            SessionEnd::ProtocolError(FrameError::BadLength { len: 5, .. })
        ),
        "{end:?}"
    );
}

#[tokio::test]
async fn platform_decider_refuses_loopback_and_garbage_is_counted() {
    let deny = crate::decide::PlatformDenySet::new(
        [],
        Ipv4Addr::new(10, 0, 2, 2),
        Ipv4Addr::new(10, 0, 2, 255),
    );
    let (mut guest, audit, task) = start(Arc::new(crate::decide::PlatformDecider::new(deny)));
    let g = SocketAddrV4::new(Ipv4Addr::new(10, 0, 2, 15), 2000);
    // Garbage and IPv6 frames first: dropped, the session goes on.
    let mut v6 = vec![0u8; 60];
    v6[12..14].copy_from_slice(&[0x86, 0xdd]);
    let udp = udp_frame(
        g,
        SocketAddrV4::new(Ipv4Addr::new(198, 51, 100, 2), 443),
        b"quic",
    );
    guest
        .send(&[vec![0u8; 14], v6, vec![0xffu8; 100], udp])
        .await;
    guest
        .send(&[tcp_frame(
            g,
            SocketAddrV4::new(Ipv4Addr::LOCALHOST, 22),
            TcpControl::Syn,
            9,
            None,
        )])
        .await;
    let (_, to, control, _, ack) = guest.recv_tcp().await;
    assert_eq!((to, control, ack), (g, TcpControl::Rst, Some(10)));
    let text = String::from_utf8(audit.0.lock().unwrap().clone()).unwrap();
    crate::audit::tests::parse_all(&text);
    assert!(text.contains(r#""reason":"platform_denied""#), "{text}");
    assert!(text.contains(r#""reason":"udp_blocked""#), "{text}");
    drop(guest);
    assert!(matches!(task.await.unwrap(), SessionEnd::GuestClosed));
}

#[tokio::test]
async fn a_flood_of_denied_syns_is_bounded_in_the_audit_and_later_flows_are_served() {
    const N: u32 = 10_000;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (guest, audit, task) = start(Arc::new(TestDecider));
    let g = Ipv4Addr::new(10, 0, 2, 15);
    let denied = SocketAddrV4::new(Ipv4Addr::new(198, 51, 100, 1), 9);
    let started = Instant::now();
    // 10,000 SYNs to a denied destination, from distinct ports, in
    // batches of 500 frames per write.
    let syns: Vec<Vec<u8>> = (0..N)
        .map(|i| {
            let src = SocketAddrV4::new(g, 10_000 + u16::try_from(i).unwrap());
            tcp_frame(src, denied, TcpControl::Syn, i, None)
        })
        .collect();
    let (mut rd, mut wr) = guest.stream.into_split();
    let writer = tokio::spawn(async move {
        for chunk in syns.chunks(500) {
            let mut out = Vec::new();
            for f in chunk {
                out.extend_from_slice(&u32::try_from(f.len()).unwrap().to_be_bytes());
                out.extend_from_slice(f);
            }
            wr.write_all(&out).await.unwrap();
        }
        wr
    });
    // Every one is answered with a RST (read while writing: the gateway
    // never waits for us).
    let mut resets = 0;
    let mut buf = Vec::new();
    while resets < N {
        let mut chunk = vec![0u8; 65536];
        let n = tokio::time::timeout(Duration::from_secs(60), rd.read(&mut chunk))
            .await
            .expect("gateway stopped answering the flood")
            .unwrap();
        assert!(n > 0, "gateway closed the stream");
        buf.extend_from_slice(&chunk[..n]);
        while buf.len() >= 4 {
            let len = u32::from_be_bytes(buf[..4].try_into().unwrap()) as usize;
            if buf.len() < 4 + len {
                break;
            }
            let f: Vec<u8> = buf.drain(..4 + len).skip(4).collect();
            let eth = EthernetFrame::new_checked(&f[..]).unwrap();
            if eth.ethertype() != EthernetProtocol::Ipv4 {
                continue;
            }
            let ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
            if ip.next_header() == IpProtocol::Tcp
                && TcpPacket::new_checked(ip.payload()).unwrap().rst()
            {
                resets += 1;
            }
        }
    }
    let wr = writer.await.unwrap();
    let mut guest = Guest {
        stream: rd.reunite(wr).unwrap(),
        buf,
    };
    // The datapath is still responsive: an allowed flow is served.
    let dst = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
    guest
        .send(&[tcp_frame(
            SocketAddrV4::new(g, 999),
            dst,
            TcpControl::Syn,
            1,
            None,
        )])
        .await;
    loop {
        let (src, to, control, _, ack) = guest.recv_tcp().await;
        if src == dst && to.port() == 999 {
            assert_eq!(
                (control, ack),
                (TcpControl::Syn, Some(2)),
                "expected SYN-ACK"
            );
            break;
        }
    }
    let (_conn, _) = listener.accept().await.unwrap();
    drop(guest);
    assert!(matches!(task.await.unwrap(), SessionEnd::GuestClosed));
    let elapsed = started.elapsed().as_secs() + 1;

    let text = String::from_utf8(audit.0.lock().unwrap().clone()).unwrap();
    let lines = crate::audit::tests::parse_all(&text);
    let written = lines
        .iter()
        .filter(|l| l["kind"] == "connection" && l["reason"] == "not_allowlisted")
        .count() as u64;
    let suppressed: u64 = lines
        .iter()
        .filter(|l| l["kind"] == "summary")
        .flat_map(|l| l["suppressed"].as_array().unwrap().clone())
        .filter(|s| s["reason"] == "not_allowlisted")
        .map(|s| s["count"].as_u64().unwrap())
        .sum();
    // Bounded: one destination, so at most the per-reason budget for
    // each second the flood lasted (plus the window it started in) ...
    let bound = u64::from(crate::audit::LINES_PER_REASON) * (elapsed + 1);
    assert!(written <= bound, "{written} deny lines in {elapsed} s");
    // ... and nothing lost: the summaries count the rest.
    assert!(suppressed > 0, "no summary of suppressed lines: {text}");
    assert_eq!(written + suppressed, u64::from(N));
    // The whole log likewise: those deny lines, one summary per second,
    // and a handful of others (start, the allowed flow, stop). Relative
    // to how long the flood took, so a slow (loaded, debug) run is not
    // mistaken for a flooded log.
    let all = u64::try_from(lines.len()).unwrap();
    assert!(
        all <= bound + (elapsed + 1) + 10,
        "{all} lines in {elapsed} s"
    );
    // The allowed flow has its connection line after the flood.
    assert!(
        lines.iter().any(|l| l["kind"] == "connection"
            && l["decision"] == "allow"
            && l["dst"]["port"] == port),
        "{text}"
    );
}

#[tokio::test]
async fn dns_over_tcp_connections_count_against_the_flow_limit() {
    let mut cfg = Config::new(DEFAULT_SUBNET, 1500).unwrap();
    cfg.max_flows = 2;
    let (mut guest, audit, task) = start_cfg(cfg, Arc::new(TestDecider));
    let g = Ipv4Addr::new(10, 0, 2, 15);
    let dns = SocketAddrV4::new(Ipv4Addr::new(10, 0, 2, 2), 53);
    // Three connections to the gateway's DNS port; the third is over the limit.
    for (i, port) in [3000u16, 3001, 3002].into_iter().enumerate() {
        let seq = 1000 * u32::try_from(i).unwrap();
        guest
            .send(&[tcp_frame(
                SocketAddrV4::new(g, port),
                dns,
                TcpControl::Syn,
                seq,
                None,
            )])
            .await;
    }
    let mut answers = HashMap::new();
    while answers.len() < 3 {
        let (src, to, control, _, _) = guest.recv_tcp().await;
        assert_eq!(src, dns);
        answers.insert(to.port(), control);
    }
    assert_eq!(answers[&3000], TcpControl::Syn, "SYN-ACK: {answers:?}");
    assert_eq!(answers[&3001], TcpControl::Syn, "SYN-ACK: {answers:?}");
    assert_eq!(
        answers[&3002],
        TcpControl::Rst,
        "over the limit: {answers:?}"
    );
    let text = String::from_utf8(audit.0.lock().unwrap().clone()).unwrap();
    let lines = crate::audit::tests::parse_all(&text);
    let limited: Vec<_> = lines
        .iter()
        .filter(|l| l["reason"] == "flow_limit")
        .collect();
    assert_eq!(
        limited.len(),
        1,
        "exactly one line for the refused flow: {text}"
    );
    assert_eq!(limited[0]["src"]["port"], 3002, "{text}");
    assert_eq!(limited[0]["decision"], "deny", "{text}");
    drop(guest);
    assert!(matches!(task.await.unwrap(), SessionEnd::GuestClosed));
}

#[tokio::test]
async fn upstream_gets_a_rebuilt_query_not_the_guests_bytes() {
    use hickory_proto::op::Message;
    let upstream = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut cfg = Config::new(DEFAULT_SUBNET, 1500).unwrap();
    cfg.dns_upstreams = vec![upstream.local_addr().unwrap()];
    let (mut guest, _audit, _task) = start_cfg(cfg, Arc::new(TestDecider));
    // One question in mixed case ("X", "Origin", "TeSt": the policy sees
    // x.origin.test), an additional record and an EDNS option carrying
    // data; RD clear and CD set.
    let mut q = vec![0x42, 0x42, 0x00, 0x10, 0, 1, 0, 0, 0, 0, 0, 2];
    q.push(1);
    q.extend_from_slice(b"X");
    q.push(6);
    q.extend_from_slice(b"Origin");
    q.push(4);
    q.extend_from_slice(b"TeSt");
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q.extend_from_slice(&[0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4]);
    q.extend_from_slice(b"SEKR");
    q.extend_from_slice(&[0, 0, 41, 0x10, 0, 0, 0, 0, 0, 0, 14, 0xfd, 0xe9, 0, 10]);
    q.extend_from_slice(b"EXFILTRATE");
    assert!(sluice_inspect::dns::parse_query(&q).is_ok());
    let g = SocketAddrV4::new(Ipv4Addr::new(10, 0, 2, 15), 5353);
    let gw = SocketAddrV4::new(Ipv4Addr::new(10, 0, 2, 2), 53);
    guest.send(&[udp_frame(g, gw, &q)]).await;
    let mut buf = vec![0u8; 4096];
    let (n, _) = tokio::time::timeout(Duration::from_secs(30), upstream.recv_from(&mut buf))
        .await
        .expect("nothing forwarded")
        .unwrap();
    let sent = &buf[..n];
    let has = |needle: &[u8]| sent.windows(needle.len()).any(|w| w == needle);
    assert!(!has(b"EXFILTRATE") && !has(b"SEKR"), "{sent:?}");
    let m = Message::from_vec(sent).unwrap();
    // The gateway's header bits, not the guest's.
    assert!(m.metadata.recursion_desired && !m.metadata.checking_disabled);
    assert_eq!(m.queries.len(), 1);
    let name = &m.queries[0].name;
    assert_eq!(name.num_labels(), 3, "{name:?}");
    // The letter case is the gateway's (random), the name the normalised one.
    assert_eq!(name.to_ascii().to_ascii_lowercase(), "x.origin.test.");
    assert!(m.additionals.is_empty(), "{m:?}");
    assert!(
        m.edns
            .as_ref()
            .is_none_or(|e| e.options().as_ref().is_empty()),
        "{m:?}"
    );
}

/// A decider whose policy names `servers` as its `dns.upstream` (`None`:
/// `upstream: system`); swapped by the test as a reload would.
struct UpstreamDecider(Mutex<Option<Vec<SocketAddr>>>);
impl Decider for UpstreamDecider {
    fn decide_tcp(&self, _flow: &FlowKey, _ctx: &DecideContext<'_>) -> Decision {
        Decision::Allow(Verdict::of(Reason::Allowlisted))
    }
    fn decide_udp(&self, _flow: &FlowKey, _ctx: &DecideContext<'_>) -> Decision {
        Decision::Deny(DenyReason::UdpNotAllowed.into())
    }
    fn policy_dns_upstreams(&self) -> Option<Vec<SocketAddr>> {
        self.0.lock().unwrap().clone()
    }
}

#[tokio::test]
async fn queries_follow_the_policys_upstream_list_across_a_swap() {
    let configured = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let first = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let second = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut cfg = Config::new(DEFAULT_SUBNET, 1500).unwrap();
    cfg.dns_upstreams = vec![configured.local_addr().unwrap()];
    cfg.dns_upstreams_from_policy = true;
    let decider = Arc::new(UpstreamDecider(Mutex::new(Some(vec![
        first.local_addr().unwrap(),
    ]))));
    let (mut guest, _audit, _task) = start_cfg(cfg, Arc::clone(&decider) as Arc<dyn Decider>);
    let g = SocketAddrV4::new(Ipv4Addr::new(10, 0, 2, 15), 5353);
    let gw = SocketAddrV4::new(Ipv4Addr::new(10, 0, 2, 2), 53);
    // A distinct name per query (identical questions in flight would
    // share one upstream query).
    let query = |id: u8| {
        let mut q = vec![id, id, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        q.extend_from_slice(b"\x07origin");
        q.push(b'0' + id);
        q.extend_from_slice(b"\x04test\x00\x00\x01\x00\x01");
        q
    };
    // Which of the three sockets gets query `id` (the others get nothing
    // before it: each query goes to the first upstream of the list).
    let mut buf = vec![0u8; 4096];
    let mut expect = async |id: u8, at: &tokio::net::UdpSocket| {
        guest.send(&[udp_frame(g, gw, &query(id))]).await;
        let (n, _) = tokio::time::timeout(Duration::from_secs(30), at.recv_from(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("query {id} not forwarded where expected"))
            .unwrap();
        let m = hickory_proto::op::Message::from_vec(&buf[..n]).unwrap();
        let name = m.queries[0].name.to_ascii().to_ascii_lowercase();
        assert_eq!(name, format!("origin{id}.test."), "{m:?}");
    };
    expect(1, &first).await;
    *decider.0.lock().unwrap() = Some(vec![second.local_addr().unwrap()]);
    expect(2, &second).await;
    *decider.0.lock().unwrap() = None;
    expect(3, &configured).await;
    // Nothing went anywhere else.
    let mut other = [0u8; 512];
    for s in [&first, &second, &configured] {
        assert!(s.try_recv_from(&mut other).is_err());
    }
}

/// Serves A queries from `upstream`: `alias.example.org` is a CNAME to
/// the denied `bad.example.org`, `ok.example.org` a CNAME to
/// `cdn.example.net`; both chains end in a public address.
fn serve_cname_chains(upstream: tokio::net::UdpSocket) {
    use hickory_proto::op::{Message, OpCode};
    use hickory_proto::rr::rdata::{A, CNAME};
    use hickory_proto::rr::{Name, RData, Record};
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        while let Ok((n, peer)) = upstream.recv_from(&mut buf).await {
            let q = Message::from_vec(&buf[..n]).unwrap();
            let qname = q.queries[0].name.clone();
            let target = if qname.to_ascii().to_ascii_lowercase().starts_with("alias.") {
                "bad.example.org."
            } else {
                "cdn.example.net."
            };
            let target = Name::from_ascii(target).unwrap();
            let mut r = Message::response(q.metadata.id, OpCode::Query);
            r.add_queries(q.queries.clone());
            r.add_answer(Record::from_rdata(
                qname,
                60,
                RData::CNAME(CNAME(target.clone())),
            ));
            r.add_answer(Record::from_rdata(
                target,
                60,
                RData::A(A::new(93, 184, 216, 34)),
            ));
            let _ = upstream.send_to(&r.to_vec().unwrap(), peer).await;
        }
    });
}

#[tokio::test]
async fn an_answer_whose_cname_chain_reaches_a_denied_name_is_refused() {
    use hickory_proto::op::{Message, Query, ResponseCode};
    use hickory_proto::rr::{Name, RecordType};
    const POLICY: &str = "version: 1\nid: cname-test\nallow:\n  - domain: \"*.example.org\"\n    ports: [443]\ndeny:\n  - \"bad.example.org\"\n";
    let policy = sluice_policy::from_yaml_str(POLICY, "p.yaml", &Default::default()).unwrap();
    let decider = crate::decide::PolicyDecider::new(
        Arc::new(policy),
        crate::decide::PlatformDenySet::default(),
    );
    let upstream = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut cfg = Config::new(DEFAULT_SUBNET, 1500).unwrap();
    cfg.dns_upstreams = vec![upstream.local_addr().unwrap()];
    serve_cname_chains(upstream);
    let (mut guest, audit, _task) = start_cfg(cfg, Arc::new(decider));
    let g = SocketAddrV4::new(Ipv4Addr::new(10, 0, 2, 15), 5353);
    let gw = SocketAddrV4::new(Ipv4Addr::new(10, 0, 2, 2), 53);
    let mut ask = async |name: &str| {
        let mut m = Message::query();
        m.metadata.id = 7;
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
        guest.send(&[udp_frame(g, gw, &m.to_vec().unwrap())]).await;
        loop {
            let f = guest.recv().await;
            let eth = EthernetFrame::new_checked(&f[..]).unwrap();
            let Ok(ip) = Ipv4Packet::new_checked(eth.payload()) else {
                continue;
            };
            if ip.next_header() == IpProtocol::Udp {
                return Message::from_vec(&ip.payload()[8..]).unwrap();
            }
        }
    };
    let denied = ask("alias.example.org.").await;
    assert_eq!(
        denied.metadata.response_code,
        ResponseCode::Refused,
        "{denied:?}"
    );
    assert!(denied.answers.is_empty(), "{denied:?}");
    // Control: a chain through a name no rule mentions is answered.
    let ok = ask("ok.example.org.").await;
    assert_eq!(ok.metadata.response_code, ResponseCode::NoError, "{ok:?}");
    assert_eq!(ok.answers.len(), 2, "{ok:?}");
    let text = String::from_utf8(audit.0.lock().unwrap().clone()).unwrap();
    let lines = crate::audit::tests::parse_all(&text);
    assert!(
        lines.iter().any(|l| l["kind"] == "dns"
            && l["qname"] == "alias.example.org"
            && l["reason"] == "denylisted"
            && l["rule"]["pattern"] != "*.example.org"),
        "{text}"
    );
}

/// Inspects port-443 flows with sluice-inspect's ClientHello reader and
/// counts how often the bytes were put to it.
#[derive(Default)]
struct CountingInspector {
    calls: std::sync::atomic::AtomicUsize,
}
impl Decider for CountingInspector {
    fn decide_tcp(&self, _flow: &FlowKey, _ctx: &DecideContext<'_>) -> Decision {
        Decision::Inspect {
            max_bytes: 16 * 1024,
            deadline: Duration::from_secs(60),
        }
    }
    fn decide_udp(&self, _flow: &FlowKey, _ctx: &DecideContext<'_>) -> Decision {
        Decision::Deny(DenyReason::UdpNotAllowed.into())
    }
    fn inspect(
        &self,
        _flow: &FlowKey,
        first_bytes: &[u8],
        _ctx: &DecideContext<'_>,
    ) -> InspectVerdict {
        use sluice_inspect::tls::{ClientHelloReader, Progress};
        self.calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match ClientHelloReader::new(16 * 1024).push(first_bytes) {
            Progress::NeedMore => InspectVerdict::NeedMore,
            Progress::Done(_) => InspectVerdict::Allow(Verdict::of(Reason::Allowlisted)),
            Progress::Reject(_) => InspectVerdict::Deny(Verdict::of(Reason::SniUnreadable)),
        }
    }
}

#[tokio::test]
async fn a_split_client_hello_is_parsed_once_per_arrival_and_allowed() {
    use crate::packet::tests::tcp_segment;
    let hello = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../inspect/testdata/tls/curl-https.bin"
    ))
    .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dst = SocketAddrV4::new(Ipv4Addr::LOCALHOST, listener.local_addr().unwrap().port());
    let decider = Arc::new(CountingInspector::default());
    let (mut guest, _audit, _task) = start(decider.clone());
    let g = SocketAddrV4::new(Ipv4Addr::new(10, 0, 2, 15), 1000);
    guest
        .send(&[tcp_frame(g, dst, TcpControl::Syn, 999, None)])
        .await;
    let (_, _, control, their_seq, ack) = guest.recv_tcp().await;
    assert_eq!((control, ack), (TcpControl::Syn, Some(1000)), "SYN-ACK");
    let ack = Some(their_seq.wrapping_add(1));
    let bare_ack = tcp_segment(g, dst, TcpControl::None, 1000, ack, &[]);
    guest.send(std::slice::from_ref(&bare_ack)).await;
    // Three segments; between them, frames without data (repeated ACKs),
    // each sent on its own so the datapath turns its loop for it.
    let cuts = [0, 5, hello.len() / 2, hello.len()];
    let mut seq = 1000u32;
    for part in cuts.windows(2) {
        let bytes = &hello[part[0]..part[1]];
        guest
            .send(&[tcp_segment(g, dst, TcpControl::Psh, seq, ack, bytes)])
            .await;
        seq += u32::try_from(bytes.len()).unwrap();
        let again = tcp_segment(g, dst, TcpControl::None, seq, ack, &[]);
        for _ in 0..4 {
            tokio::time::sleep(Duration::from_millis(5)).await;
            guest.send(std::slice::from_ref(&again)).await;
        }
    }
    // The decision was taken: the gateway connected and replayed the hello.
    let (mut host, _) = tokio::time::timeout(Duration::from_secs(30), listener.accept())
        .await
        .expect("the split hello was never allowed")
        .unwrap();
    let mut got = vec![0u8; hello.len()];
    tokio::time::timeout(Duration::from_secs(30), host.read_exact(&mut got))
        .await
        .expect("the hello was not replayed")
        .unwrap();
    assert_eq!(got, hello);
    // Once per arrival of new bytes at most, not once per loop turn.
    let calls = decider.calls.load(std::sync::atomic::Ordering::Relaxed);
    assert!((1..=3).contains(&calls), "inspected {calls} times");
}

/// What the page-release hook of [`idle_send_rings_are_given_back_once_drained`] was given.
static RELEASED: Mutex<Vec<usize>> = Mutex::new(Vec::new());

fn record_release(buf: &mut [u8]) {
    RELEASED.lock().unwrap().push(buf.len());
}

#[tokio::test]
async fn idle_send_rings_are_given_back_once_drained() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dst = SocketAddrV4::new(Ipv4Addr::LOCALHOST, listener.local_addr().unwrap().port());
    let mut cfg = Config::new(DEFAULT_SUBNET, 1500).unwrap();
    cfg.flow_buffer = 128 * 1024;
    cfg.flow_send_buffer = 128 * 1024;
    cfg.release_pages = record_release;
    let (mut guest, _audit, _task) = start_cfg(cfg, Arc::new(TestDecider));
    let a = SocketAddrV4::new(Ipv4Addr::new(10, 0, 2, 15), 1000);
    guest
        .send(&[tcp_frame(a, dst, TcpControl::Syn, 100, None)])
        .await;
    let (_, _, control, isn, _) = guest.recv_tcp().await;
    assert_eq!(control, TcpControl::Syn);
    guest
        .send(&[tcp_frame(
            a,
            dst,
            TcpControl::None,
            101,
            Some(isn.wrapping_add(1)),
        )])
        .await;
    let (mut host, _) = listener.accept().await.unwrap();
    host.write_all(b"hi").await.unwrap();
    let (_, _, _, seq, _) = guest.recv_tcp().await;
    assert_eq!(seq, isn.wrapping_add(1), "the host's bytes");
    // Unacknowledged: the ring holds them, nothing is given back (two sweeps).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(RELEASED.lock().unwrap().is_empty());
    guest
        .send(&[tcp_frame(
            a,
            dst,
            TcpControl::None,
            101,
            Some(seq.wrapping_add(2)),
        )])
        .await;
    // Drained and idle: the whole ring is given back within two sweeps.
    for _ in 0..100 {
        if !RELEASED.lock().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(*RELEASED.lock().unwrap(), vec![128 * 1024]);
    // Once only while nothing more arrives.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(RELEASED.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_parked_flow_comes_back_for_its_host_and_for_its_guest() {
    use crate::packet::tests::tcp_segment;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dst = SocketAddrV4::new(Ipv4Addr::LOCALHOST, listener.local_addr().unwrap().port());
    let (mut guest, _audit, _task) = start(Arc::new(TestDecider));
    let a = SocketAddrV4::new(Ipv4Addr::new(10, 0, 2, 15), 1001);
    guest
        .send(&[tcp_frame(a, dst, TcpControl::Syn, 100, None)])
        .await;
    let (_, _, control, isn, _) = guest.recv_tcp().await;
    assert_eq!(control, TcpControl::Syn);
    let ack = Some(isn.wrapping_add(1));
    guest
        .send(&[tcp_frame(a, dst, TcpControl::None, 101, ack)])
        .await;
    let (mut host, _) = listener.accept().await.unwrap();
    // Quiet for more than two sweeps: the flow is parked (its socket out
    // of smoltcp's set). A segment smoltcp found no socket for would be
    // answered with a RST; a host write nobody waits for would never come.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    host.write_all(b"down").await.unwrap();
    let (_, _, control, seq, _) = guest.recv_tcp().await;
    assert_eq!(control, TcpControl::None, "the host's bytes, not a reset");
    assert_eq!(seq, isn.wrapping_add(1));
    let ack = Some(seq.wrapping_add(4));
    guest
        .send(&[tcp_segment(a, dst, TcpControl::None, 101, ack, &[])])
        .await;
    // Parked again, then the guest speaks first.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    guest
        .send(&[tcp_segment(a, dst, TcpControl::Psh, 101, ack, b"up")])
        .await;
    let mut got = [0u8; 2];
    tokio::time::timeout(Duration::from_secs(30), host.read_exact(&mut got))
        .await
        .expect("the guest's bytes reached the host")
        .unwrap();
    assert_eq!(&got, b"up");
    let (_, _, control, _, acked) = guest.recv_tcp().await;
    assert_ne!(control, TcpControl::Rst);
    assert_eq!(acked, Some(103), "the guest's bytes acknowledged");
}

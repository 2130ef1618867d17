use super::*;

/// A UDP/IPv4 frame with a correct checksum, and the same frame as a
/// sender leaving the checksum to offload writes it (pseudo-header sum
/// in the field) behind a NEEDS_CSUM header.
fn udp_frame() -> (Vec<u8>, Vec<u8>) {
    let payload = b"hello, offload!";
    let mut f = vec![0u8; 14 + 20 + 8];
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip = &mut f[14..34];
    ip[0] = 0x45;
    let total = u16::try_from(20 + 8 + payload.len()).expect("small");
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&[10, 0, 2, 15]);
    ip[16..20].copy_from_slice(&[198, 51, 100, 10]);
    let ip_sum = !internet_sum(&f[14..34]);
    f[24..26].copy_from_slice(&ip_sum.to_be_bytes());
    let udp_len = u16::try_from(8 + payload.len()).expect("small");
    f[34..36].copy_from_slice(&40000u16.to_be_bytes());
    f[36..38].copy_from_slice(&53u16.to_be_bytes());
    f[38..40].copy_from_slice(&udp_len.to_be_bytes());
    f.extend_from_slice(payload);
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&[10, 0, 2, 15, 198, 51, 100, 10, 0, 17]);
    pseudo.extend_from_slice(&udp_len.to_be_bytes());
    let partial = internet_sum(&pseudo);
    let mut whole = pseudo.clone();
    whole.extend_from_slice(&f[34..]);
    let full = !internet_sum(&whole);
    let mut complete = f.clone();
    complete[40..42].copy_from_slice(&full.to_be_bytes());
    let mut offloaded = vec![0u8; VNET_HDR_LEN];
    offloaded[0] = VNET_F_NEEDS_CSUM;
    offloaded[6..8].copy_from_slice(&34u16.to_le_bytes());
    offloaded[8..10].copy_from_slice(&6u16.to_le_bytes());
    let mut body = f;
    body[40..42].copy_from_slice(&partial.to_be_bytes());
    offloaded.extend_from_slice(&body);
    (complete, offloaded)
}

#[test]
fn an_offloaded_checksum_is_completed() {
    let (complete, mut offloaded) = udp_frame();
    assert_eq!(complete_vnet_frame(&mut offloaded), Some(&complete[..]));
}

#[test]
fn a_frame_without_offload_passes_unchanged() {
    let (complete, _) = udp_frame();
    let mut packet = VNET_HDR_NONE.to_vec();
    packet.extend_from_slice(&complete);
    assert_eq!(complete_vnet_frame(&mut packet), Some(&complete[..]));
}

#[test]
fn short_packets_and_bad_checksum_positions_are_refused() {
    for len in 0..VNET_HDR_LEN + MIN_FRAME {
        assert_eq!(complete_vnet_frame(&mut vec![0; len]), None, "len {len}");
    }
    let (_, mut offloaded) = udp_frame();
    offloaded[6..8].copy_from_slice(&u16::MAX.to_le_bytes());
    assert_eq!(complete_vnet_frame(&mut offloaded), None);
    let (_, mut offloaded) = udp_frame();
    offloaded[8..10].copy_from_slice(&u16::MAX.to_le_bytes());
    assert_eq!(complete_vnet_frame(&mut offloaded), None);
}

#[test]
fn only_errors_that_mean_the_link_is_gone_end_a_session() {
    for errno in [
        libc::ENETDOWN,
        libc::ENODEV,
        libc::ENXIO,
        libc::EBADF,
        libc::ENOTSOCK,
    ] {
        assert!(link_gone(&io::Error::from_raw_os_error(errno)), "{errno}");
    }
    // What one packet can cause: EINVAL (a GSO type the virtio-net
    // header cannot carry), EMSGSIZE, a transient shortage.
    for errno in [libc::EINVAL, libc::EMSGSIZE, libc::ENOBUFS, libc::ENOMEM] {
        assert!(!link_gone(&io::Error::from_raw_os_error(errno)), "{errno}");
    }
    assert!(!link_gone(&io::Error::other("no errno")));
}

#[test]
fn datagram_transmit_sends_each_frame_once_and_keeps_a_blocked_one() {
    let mut tx = TxBatch::default();
    tx.push(&[1u8; 20]);
    tx.push(&[2u8; 30]);
    tx.push(&[3u8; 40]);
    let mut sent = Vec::new();
    transmit_frames(&mut tx, |f| {
        if f[0] == 3 {
            return Sent::Blocked;
        }
        sent.push(f.to_vec());
        Sent::Done
    });
    assert_eq!(sent, vec![vec![1u8; 20], vec![2u8; 30]]);
    assert_eq!(tx.unwritten()[4..], [3u8; 40]);
}

#[tokio::test]
async fn a_bound_datagram_link_takes_frames_only_from_the_allowed_uids() {
    let dir = std::env::temp_dir().join(format!("sluice-link-uid-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let me = rustix::process::geteuid().as_raw();
    let other = if me == 4242 { 4243 } else { 4242 };
    for (allowed, taken) in [(vec![other], false), (vec![other, me], true)] {
        let ours = dir.join("gw.sock");
        let theirs = dir.join("vm.sock");
        let _ = std::fs::remove_file(&ours);
        let _ = std::fs::remove_file(&theirs);
        let link = GuestLink::dgram_bound(UnixDatagram::bind(&ours).expect("bind"), allowed)
            .expect("passcred");
        let vm = UnixDatagram::bind(&theirs).expect("bind peer");
        vm.send_to(&[7u8; 64], &ours).await.expect("frame");
        let mut rx = link.rx(1514);
        let mut frames = Vec::new();
        // The datagram is queued before `receive`: one call reads it.
        std::future::poll_fn(|cx| {
            if link.poll_read_ready(cx) {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
        .await;
        link.receive(&mut rx, |f| frames.push(f.to_vec()))
            .expect("receive");
        assert_eq!(!frames.is_empty(), taken, "uid {me}: {frames:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_datagram_longer_than_any_frame_is_dropped_and_counted_not_cut() {
    let (ours, vm) = std::os::unix::net::UnixDatagram::pair().expect("pair");
    ours.set_nonblocking(true).expect("nonblocking");
    let link = GuestLink::dgram(UnixDatagram::from_std(ours).expect("tokio")).expect("register");
    vm.send(&vec![5u8; DATAGRAM_BUF + 100]).expect("oversized");
    vm.send(&[6u8; 60]).expect("frame");
    let mut rx = link.rx(1514);
    let mut frames = Vec::new();
    let mut dropped_total = 0;
    while frames.is_empty() {
        if let Received::Frames { dropped, .. } = link
            .receive(&mut rx, |f| frames.push(f.to_vec()))
            .expect("receive")
        {
            dropped_total += dropped;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(
        frames,
        vec![vec![6u8; 60]],
        "only the whole frame is handed on"
    );
    assert_eq!(dropped_total, 1, "the cut datagram is counted");
}

#[tokio::test]
async fn a_bound_datagram_link_learns_its_peer_skips_the_vfkit_magic_and_replies() {
    let dir = std::env::temp_dir().join(format!("sluice-link-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let ours = dir.join("gw.sock");
    let theirs = dir.join("vm.sock");
    let link = GuestLink::dgram(UnixDatagram::bind(&ours).expect("bind")).expect("register");
    let vm = UnixDatagram::bind(&theirs).expect("bind peer");
    let mut tx = TxBatch::default();
    tx.push(&[9u8; 60]);
    link.transmit(&mut tx)
        .expect("no peer yet: dropped, not an error");
    assert_eq!(tx.queued(), 0);
    vm.send_to(VFKIT_MAGIC, &ours).await.expect("magic");
    vm.send_to(&[7u8; 64], &ours).await.expect("frame");
    let mut rx = link.rx(1514);
    let mut frames = Vec::new();
    while frames.is_empty() {
        link.receive(&mut rx, |f| frames.push(f.to_vec()))
            .expect("receive");
        tokio::task::yield_now().await;
    }
    assert_eq!(frames, vec![vec![7u8; 64]]);
    tx.push(&[8u8; 70]);
    link.transmit(&mut tx).expect("send");
    let mut back = [0u8; 100];
    let n = vm.recv(&mut back).await.expect("reply");
    assert_eq!(&back[..n], &[8u8; 70]);
    let _ = std::fs::remove_dir_all(&dir);
}

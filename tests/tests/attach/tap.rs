//! What a VMM's TAP can write: a frame the packet socket cannot read is
//! dropped and counted while the gateway serves on, and a successor's
//! floor outlives its predecessor's end (the test plays the guest's
//! virtio-net driver, so it chooses every header).

use super::*;

/// `struct virtio_net_hdr` flags and GSO types (`<linux/virtio_net.h>`).
const VNET_F_NEEDS_CSUM: u8 = 1;
const VNET_GSO_UDP: u8 = 3;

/// Creates the TAP `name` in the namespace at `netns` and opens it as a VMM
/// does (`IFF_TAP | IFF_NO_PI | IFF_VNET_HDR`): the test plays the guest's
/// virtio-net driver, writing whatever header it likes. Not persistent:
/// the TAP goes when the returned file closes.
fn open_tap(netns: &str, name: &str) -> Result<std::fs::File> {
    use std::os::fd::AsRawFd as _;
    let (netns, name) = (netns.to_owned(), name.to_owned());
    // On a thread of its own: setns moves only the calling thread, and the
    // TAP lives in the namespace the opener was in.
    std::thread::spawn(move || -> Result<std::fs::File> {
        let ns = std::fs::File::open(&netns).with_context(|| netns.clone())?;
        // SAFETY: setns only changes this thread's namespace; `ns` is open.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
        ensure!(rc == 0, "setns: {}", std::io::Error::last_os_error());
        let tun = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/net/tun")
            .context("opening /dev/net/tun")?;
        // SAFETY: ifreq is plain data; all-zero is a valid value.
        #[allow(unsafe_code)]
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
            *d = libc::c_char::try_from(s).context("interface name")?;
        }
        req.ifr_ifru.ifru_flags =
            libc::c_short::try_from(libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR)
                .context("TAP flags")?;
        // SAFETY: TUNSETIFF reads and writes `req`, a valid ifreq that
        // outlives the call.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::ioctl(tun.as_raw_fd(), libc::TUNSETIFF, &raw mut req) };
        ensure!(rc == 0, "TUNSETIFF: {}", std::io::Error::last_os_error());
        Ok(tun)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the TAP thread panicked"))?
}

/// An Ethernet + IPv4 + UDP frame from `src` (MAC, IP, port) to `dst`,
/// with a correct IP header checksum and no UDP checksum.
fn udp_frame(
    src: ([u8; 6], [u8; 4], u16),
    dst: ([u8; 6], [u8; 4], u16),
    payload: &[u8],
) -> Vec<u8> {
    let mut f = Vec::with_capacity(42 + payload.len());
    f.extend_from_slice(&dst.0);
    f.extend_from_slice(&src.0);
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    let total = u16::try_from(28 + payload.len()).unwrap_or(u16::MAX);
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&src.1);
    ip[16..20].copy_from_slice(&dst.1);
    let mut sum: u32 = ip
        .chunks_exact(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let sum = !u16::try_from(sum).unwrap_or(u16::MAX);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&src.2.to_be_bytes());
    f.extend_from_slice(&dst.2.to_be_bytes());
    f.extend_from_slice(&(total - 20).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(payload);
    f
}

/// A DHCPDISCOVER from `mac` (BOOTP with the DHCP cookie and option 53).
fn dhcp_discover(mac: [u8; 6]) -> Vec<u8> {
    let mut bootp = vec![0u8; 236];
    bootp[0] = 1; // BOOTREQUEST
    bootp[1] = 1; // Ethernet
    bootp[2] = 6;
    bootp[4..8].copy_from_slice(&0x5eed_0001u32.to_be_bytes());
    bootp[28..34].copy_from_slice(&mac);
    bootp.extend_from_slice(&[99, 130, 83, 99, 53, 1, 1, 255]);
    udp_frame((mac, [0; 4], 68), ([0xff; 6], [255; 4], 67), &bootp)
}

/// Reads frames (behind their virtio-net header) from `tap` until one is
/// a UDP datagram from port 67 to port 68 (the gateway's DHCP answer).
fn wait_dhcp_answer(tap: &mut std::fs::File, deadline: Duration) -> Result<()> {
    use std::io::Read as _;
    use std::os::fd::AsRawFd as _;
    let start = std::time::Instant::now();
    let mut buf = vec![0u8; 70_000];
    while start.elapsed() < deadline {
        let mut pfd = libc::pollfd {
            fd: tap.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, which outlives the call.
        #[allow(unsafe_code)]
        let ready = unsafe { libc::poll(&raw mut pfd, 1, 1000) };
        if ready <= 0 {
            continue;
        }
        let n = tap.read(&mut buf).context("reading the TAP")?;
        let frame = buf.get(10..n).unwrap_or_default();
        let ipv4_udp = frame.get(12..14) == Some(&[8, 0]) && frame.get(23) == Some(&17);
        if ipv4_udp && frame.get(34..38) == Some(&[0, 67, 0, 68]) {
            return Ok(());
        }
    }
    anyhow::bail!("no DHCP answer on the TAP within {deadline:?}")
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn a_frame_the_packet_socket_cannot_read_is_dropped_and_counted_and_the_gateway_serves_on()
-> Result<()> {
    sluice_e2e::require_root()?;
    let base = unique_name();
    let host = Netns::new(&format!("{base}h"))?;
    let ns = Netns::new(&format!("{base}v"))?;
    let path = format!("/run/netns/{}", ns.name());
    let mut tap = open_tap(&path, "sltap")?;
    let log = std::env::temp_dir().join(format!("{base}-ufo.log"));
    let mut c = host.cmd(bin_path("sluice-gateway")?);
    c.args(["--attach", "sltap", "--netns", &path]).args([
        "--mtu",
        "1500",
        "--dns-upstream",
        "192.0.2.53",
    ]);
    let mut gw = Proc::spawn("gateway", &mut c, &log)?;
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_until("the gateway", Duration::from_secs(60), || {
        read_log().contains("ready: serving the guest") || gw.check_alive().is_err()
    })?;
    gw.check_alive().with_context(read_log)?;

    // A UDP segmentation-offload frame: the TAP takes it, the gateway's
    // packet socket cannot put it behind a virtio-net header (EINVAL).
    let mac = [0x02, 0, 0, 0, 0, 0x15];
    let big = udp_frame(
        (mac, [10, 0, 2, 15], 40000),
        ([0x02, 0, 0, 0, 0, 0x02], [198, 51, 100, 10], 9),
        &[b'x'; 500],
    );
    let mut ufo = vec![VNET_F_NEEDS_CSUM, VNET_GSO_UDP];
    ufo.extend_from_slice(&42u16.to_le_bytes()); // hdr_len
    ufo.extend_from_slice(&100u16.to_le_bytes()); // gso_size
    ufo.extend_from_slice(&34u16.to_le_bytes()); // csum_start
    ufo.extend_from_slice(&6u16.to_le_bytes()); // csum_offset
    ufo.extend_from_slice(&big);
    for _ in 0..3 {
        std::io::Write::write_all(&mut tap, &ufo).context("writing the UFO frame")?;
    }
    // The next guest frame is served: a DHCPDISCOVER gets its answer.
    let mut discover = vec![0u8; 10];
    discover.extend_from_slice(&dhcp_discover(mac));
    std::io::Write::write_all(&mut tap, &discover).context("writing the DHCPDISCOVER")?;
    wait_dhcp_answer(&mut tap, Duration::from_secs(60)).with_context(read_log)?;
    gw.check_alive().with_context(read_log)?;

    // Counted: the counters line (SIGUSR1) shows the three drops.
    let pid = i32::try_from(gw.pid().context("gateway pid")?)?;
    // SAFETY: kill has no memory effects; pid is our own unreaped child.
    #[allow(unsafe_code)]
    unsafe {
        libc::kill(pid, libc::SIGUSR1);
    }
    wait_until("the counters line", Duration::from_secs(60), || {
        read_log().contains("malformed=3")
    })
    .with_context(read_log)?;

    // The interface going away (the VMM closes its TAP) ends the session:
    // the gateway exits 0 and, the interface gone, removes its floor:
    // nothing is left.
    drop(tap);
    wait_until("the gateway to exit", Duration::from_secs(60), || {
        gw.check_alive().is_err()
    })
    .with_context(read_log)?;
    let st = gw.signal_and_wait(0, Duration::from_secs(10))?;
    ensure!(st.code() == Some(0), "exit {st}\n{}", read_log());
    let t = tables(&ns)?;
    ensure!(!t.contains("sluice_floor"), "left behind: {t}");
    ensure!(
        read_log().contains("interface is gone, and so is its floor"),
        "{}",
        read_log()
    );
    let _ = std::fs::remove_file(&log);
    Ok(())
}

/// Starts a gateway attached to `iface` in the namespace at `netns`
/// (from `host`), logging to `log`, and waits until it serves.
fn start_attached(host: &Netns, iface: &str, netns: &str, log: &std::path::Path) -> Result<Proc> {
    let mut c = host.cmd(bin_path("sluice-gateway")?);
    c.args(["--attach", iface, "--netns", netns]).args([
        "--mtu",
        "1500",
        "--dns-upstream",
        "192.0.2.53",
    ]);
    let mut gw = Proc::spawn("gateway", &mut c, log)?;
    let read_log = || std::fs::read_to_string(log).unwrap_or_default();
    wait_until("the gateway", Duration::from_secs(60), || {
        read_log().contains("ready: serving the guest") || gw.check_alive().is_err()
    })?;
    gw.check_alive().with_context(read_log)?;
    Ok(gw)
}

/// The VM namespace's address in the ARP probe: outside the gateway's
/// subnet, so only the namespace's kernel could answer for it.
const KERNEL_ADDR: [u8; 4] = [192, 168, 77, 1];

/// Whether the namespace's kernel answers an ARP request for
/// [`KERNEL_ADDR`] written into `tap` (as the guest), within `tries`
/// requests a second apart.
fn kernel_answers_arp(tap: &mut std::fs::File, tries: u32) -> Result<bool> {
    use std::io::Read as _;
    use std::os::fd::AsRawFd as _;
    let mac = [0x02, 0, 0, 0, 0, 0x15];
    let mut request = vec![0u8; 10]; // a virtio-net header: no offload
    request.extend_from_slice(&[0xff; 6]);
    request.extend_from_slice(&mac);
    request.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
    request.extend_from_slice(&mac);
    request.extend_from_slice(&[192, 168, 77, 2]);
    request.extend_from_slice(&[0; 6]);
    request.extend_from_slice(&KERNEL_ADDR);
    let mut buf = vec![0u8; 70_000];
    for _ in 0..tries {
        std::io::Write::write_all(tap, &request).context("writing an ARP request")?;
        let sent = std::time::Instant::now();
        while sent.elapsed() < Duration::from_secs(1) {
            let mut pfd = libc::pollfd {
                fd: tap.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd, which outlives the call.
            #[allow(unsafe_code)]
            let ready = unsafe { libc::poll(&raw mut pfd, 1, 200) };
            if ready <= 0 {
                continue;
            }
            let n = tap.read(&mut buf).context("reading the TAP")?;
            let frame = buf.get(10..n).unwrap_or_default();
            let reply = frame.get(12..14) == Some(&[8, 6]) && frame.get(20..22) == Some(&[0, 2]);
            if reply && frame.get(28..32) == Some(&KERNEL_ADDR[..]) {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn a_successors_floor_outlives_its_predecessor_and_a_tap_is_refused_after_the_end() -> Result<()> {
    sluice_e2e::require_root()?;
    let base = unique_name();
    let host = Netns::new(&format!("{base}h"))?;
    let ns = Netns::new(&format!("{base}v"))?;
    let path = format!("/run/netns/{}", ns.name());
    let log1 = std::env::temp_dir().join(format!("{base}-first.log"));
    let log2 = std::env::temp_dir().join(format!("{base}-second.log"));
    // The first gateway serves a VMM's TAP; it is stopped (as a loaded
    // machine may leave it) while the VMM restarts: its TAP goes and a new
    // one of the same name comes, served by a second gateway.
    let tap1 = open_tap(&path, "sltap")?;
    let mut first = start_attached(&host, "sltap", &path, &log1)?;
    let first_pid = i32::try_from(first.pid().context("first pid")?)?;
    // SAFETY: kill has no memory effects; the pid is our own unreaped child.
    #[allow(unsafe_code)]
    unsafe {
        libc::kill(first_pid, libc::SIGSTOP);
    }
    drop(tap1);
    wait_until("the first TAP to go", Duration::from_secs(60), || {
        ns.sh("ip link show sltap", 30)
            .is_ok_and(|o| !o.status.success())
    })?;
    let mut tap = open_tap(&path, "sltap")?;
    let mut second = start_attached(&host, "sltap", &path, &log2)?;
    // The first gateway goes on, finds its interface gone and ends: its
    // keeper deletes its own floor, and not the second's.
    // SAFETY: as above.
    #[allow(unsafe_code)]
    unsafe {
        libc::kill(first_pid, libc::SIGCONT);
    }
    wait_until("the first gateway to end", Duration::from_secs(60), || {
        first.check_alive().is_err()
    })?;
    let st = first.signal_and_wait(0, Duration::from_secs(10))?;
    let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap_or_default();
    ensure!(st.code() == Some(0), "first exit {st}\n{}", read(&log1));
    ensure!(
        read(&log1).contains("interface is gone, and so is its floor"),
        "{}",
        read(&log1)
    );
    second.check_alive().with_context(|| read(&log2))?;
    let t = tables(&ns)?;
    ensure!(
        t.matches(&floor_table("sltap")).count() == 2,
        "the second gateway's floor (two tables) should remain: {t}"
    );
    // The kernel check: the VM namespace has an address the guest asks
    // for; behind the second floor its kernel never hears the question.
    ns.ip(&[
        "addr",
        "add",
        &format!(
            "{}.{}.{}.{}/24",
            KERNEL_ADDR[0], KERNEL_ADDR[1], KERNEL_ADDR[2], KERNEL_ADDR[3]
        ),
        "dev",
        "sltap",
    ])?;
    ensure!(
        !kernel_answers_arp(&mut tap, 3)?,
        "the namespace's kernel answered the guest behind the second floor"
    );

    // The second ends normally while the VMM holds its TAP: the TAP is
    // down, so the VMM's writes are refused...
    let st = second.signal_and_wait(libc::SIGTERM, Duration::from_secs(60))?;
    ensure!(st.code() == Some(0), "second exit {st}\n{}", read(&log2));
    let refused = std::io::Write::write(&mut tap, &[0u8; 60]);
    ensure!(
        refused
            .as_ref()
            .is_err_and(|e| e.raw_os_error() == Some(libc::EIO)),
        "a write to the TAP after the end: {refused:?}"
    );
    // ...and, set up again by someone else, its frames meet the kept floor.
    ns.ip(&["link", "set", "sltap", "up"])?;
    ensure!(
        !kernel_answers_arp(&mut tap, 3)?,
        "the namespace's kernel answered the guest after the end"
    );
    // Control: with no floor the kernel answers the same request.
    delete_floors(&ns, "sltap")?;
    ensure!(
        kernel_answers_arp(&mut tap, 30)?,
        "with the TAP up and no floor the kernel should answer"
    );
    let _ = std::fs::remove_file(&log1);
    let _ = std::fs::remove_file(&log2);
    Ok(())
}

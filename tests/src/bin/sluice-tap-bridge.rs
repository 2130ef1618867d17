//! `sluice-tap-bridge`: joins a TAP device to a QEMU stream socket.
//!
//! Runs inside the namespace that plays the guest. It attaches to an existing
//! TAP device (`IFF_TAP | IFF_NO_PI`), connects to the sidecar's unix socket
//! (sluice-gateway or passt, both speak QEMU's stream protocol: a 4-byte
//! big-endian length, then the Ethernet frame) and pumps frames both ways
//! until either side closes.
//!
//! It sits in the measured path of every benchmark, so it is built for speed:
//! one thread per direction, fixed buffers allocated once, and on the TAP to
//! socket side every frame the TAP has queued is gathered into one `send`.
//! On the socket to TAP side one `recv` reads as many frames as are queued and
//! each is written to the TAP (the TAP takes one frame per `write`).
//!
//! With `--dgram` it speaks the datagram transport instead (QEMU's
//! `-netdev dgram`, vfkit): it binds its own socket at `--local` and sends
//! one frame per datagram to `--socket`, first the `VFKT` handshake
//! datagram when `--vfkit-handshake` is given; it runs until killed.
//!
//! Exit status: 0 when the socket peer closes, 1 on any error (a protocol
//! error such as a frame length below 14 or above 65535 included).
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;

/// Largest Ethernet frame the stream protocol carries (passt's limit).
const MAX_FRAME: usize = 65535;
/// Smallest frame: an Ethernet header.
const MIN_FRAME: usize = 14;
/// Size of the gather and scatter buffers: many frames per syscall.
const BUF_SIZE: usize = 1 << 20;

/// Command line.
#[derive(Parser, Debug)]
#[command(about = "Bridge a TAP device to a QEMU stream socket (length-prefixed Ethernet frames)")]
struct Args {
    /// Name of the existing TAP device to attach to.
    #[arg(long)]
    tap: String,
    /// Unix socket path of the sidecar to connect to.
    #[arg(long)]
    socket: PathBuf,
    /// Seconds to keep retrying the connect while the socket does not exist yet.
    #[arg(long, default_value_t = 10)]
    connect_timeout: u64,
    /// Datagram transport: bind this path and exchange one frame per datagram with `--socket`.
    #[arg(long)]
    dgram: Option<PathBuf>,
    /// With `--dgram`: send vfkit's `VFKT` handshake datagram first.
    #[arg(long)]
    vfkit_handshake: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let tap = open_tap(&args.tap).with_context(|| format!("attaching to TAP {}", args.tap))?;
    if let Some(local) = &args.dgram {
        return dgram_bridge(&tap, local, &args.socket, args.vfkit_handshake);
    }
    let sock = connect(&args.socket, Duration::from_secs(args.connect_timeout))
        .with_context(|| format!("connecting to {}", args.socket.display()))?;

    let tap_rx = tap.try_clone().context("duplicating the TAP fd")?;
    let sock_tx = sock.try_clone().context("duplicating the socket")?;
    let up = thread::Builder::new()
        .name("tap-to-sock".into())
        .spawn(move || tap_to_socket(&tap_rx, sock_tx))
        .context("spawning the TAP reader")?;

    let res = socket_to_tap(sock, &tap);
    match res {
        // The peer closed: that is the normal end; the other thread dies
        // with the process.
        Ok(()) => Ok(()),
        Err(e) => {
            if up.is_finished()
                && let Ok(Err(e2)) = up.join()
            {
                eprintln!("sluice-tap-bridge: tap to socket: {e2:#}");
            }
            Err(e)
        }
    }
}

/// Attaches to the TAP device `name` (it must exist; the harness creates it).
fn open_tap(name: &str) -> Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/net/tun")
        .context("opening /dev/net/tun")?;
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ {
        bail!("TAP name {name:?} must be 1 to 15 bytes");
    }
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    req.ifr_ifru.ifru_flags =
        libc::c_short::try_from(libc::IFF_TAP | libc::IFF_NO_PI).context("TAP flags")?;
    // SAFETY: the fd is open and valid for the call, and `req` is a properly
    // initialised ifreq that outlives the call, as TUNSETIFF expects.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut req) };
    if rc < 0 {
        return Err(io::Error::last_os_error()).context("TUNSETIFF");
    }
    Ok(file)
}

/// Connects to `path`, retrying while it does not exist or refuses, until
/// `timeout`.
fn connect(path: &PathBuf, timeout: Duration) -> Result<UnixStream> {
    let start = Instant::now();
    loop {
        match UnixStream::connect(path) {
            Ok(s) => return Ok(s),
            Err(e)
                if start.elapsed() < timeout
                    && matches!(
                        e.kind(),
                        io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
                    ) =>
            {
                thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Sets or clears `O_NONBLOCK` on `fd`.
fn set_nonblocking(fd: RawFd, on: bool) -> io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL on an fd we own have no memory effects.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    let flags = if on {
        flags | libc::O_NONBLOCK
    } else {
        flags & !libc::O_NONBLOCK
    };
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Waits until `fd` is readable.
fn wait_readable(fd: RawFd) -> io::Result<()> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: `pfd` is a valid pollfd array of length 1 for the call.
        let rc = unsafe { libc::poll(&mut pfd, 1, -1) };
        if rc >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// TAP to socket: gathers every queued frame, each behind its length, into
/// one buffer and sends it with one write.
fn tap_to_socket(tap: &File, mut sock: UnixStream) -> Result<()> {
    let fd = tap.as_raw_fd();
    set_nonblocking(fd, true).context("TAP O_NONBLOCK")?;
    let mut buf = vec![0u8; BUF_SIZE];
    loop {
        let mut used = 0;
        while BUF_SIZE - used >= MAX_FRAME + 4 {
            let (hdr, rest) = buf[used..].split_at_mut(4);
            match (&*tap).read(&mut rest[..MAX_FRAME]) {
                Ok(0) => bail!("TAP closed"),
                Ok(n) => {
                    let len = u32::try_from(n).context("frame length")?;
                    hdr.copy_from_slice(&len.to_be_bytes());
                    used += 4 + n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if used > 0 {
                        break;
                    }
                    wait_readable(fd).context("polling the TAP")?;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e).context("reading the TAP"),
            }
        }
        sock.write_all(&buf[..used]).context("writing the socket")?;
    }
}

/// Socket to TAP: reads as much as is queued, then writes each complete frame
/// to the TAP; a partial frame stays at the front of the buffer.
fn socket_to_tap(mut sock: UnixStream, tap: &File) -> Result<()> {
    let mut buf = vec![0u8; BUF_SIZE];
    let mut have = 0;
    loop {
        let n = match sock.read(&mut buf[have..]) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return Ok(()),
            Err(e) => return Err(e).context("reading the socket"),
        };
        have += n;
        let mut off = 0;
        while have - off >= 4 {
            let mut len_bytes = [0u8; 4];
            len_bytes.copy_from_slice(&buf[off..off + 4]);
            let len = usize::try_from(u32::from_be_bytes(len_bytes)).context("frame length")?;
            if !(MIN_FRAME..=MAX_FRAME).contains(&len) {
                bail!("protocol error: frame length {len}");
            }
            if have - off < 4 + len {
                break;
            }
            write_frame(tap, &buf[off + 4..off + 4 + len])?;
            off += 4 + len;
        }
        buf.copy_within(off..have, 0);
        have -= off;
    }
}

/// Writes one frame to the TAP, waiting if the (nonblocking) TAP pushes back.
fn write_frame(tap: &File, frame: &[u8]) -> Result<()> {
    loop {
        match (&*tap).write(frame) {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                thread::sleep(Duration::from_micros(50));
            }
            Err(e) => return Err(e).context("writing the TAP"),
        }
    }
}

/// The datagram transport: one frame per datagram both ways, until killed.
fn dgram_bridge(tap: &File, local: &PathBuf, peer: &PathBuf, handshake: bool) -> Result<()> {
    let _ = std::fs::remove_file(local);
    let sock = UnixDatagram::bind(local).with_context(|| format!("binding {}", local.display()))?;
    if handshake {
        sock.send_to(b"VFKT", peer)
            .with_context(|| format!("sending the handshake to {}", peer.display()))?;
    }
    let sock_rx = sock.try_clone().context("duplicating the socket")?;
    let tap_tx = tap.try_clone().context("duplicating the TAP fd")?;
    let down = thread::Builder::new()
        .name("sock-to-tap".into())
        .spawn(move || -> Result<()> {
            let mut buf = vec![0u8; MAX_FRAME + 1];
            loop {
                let n = sock_rx.recv(&mut buf).context("reading the socket")?;
                if (MIN_FRAME..=MAX_FRAME).contains(&n) {
                    write_frame(&tap_tx, &buf[..n])?;
                }
            }
        })
        .context("spawning the socket reader")?;
    let mut buf = vec![0u8; MAX_FRAME];
    loop {
        if down.is_finished() {
            return match down.join() {
                Ok(r) => r,
                Err(_) => bail!("the socket reader panicked"),
            };
        }
        let n = match (&*tap).read(&mut buf) {
            Ok(0) => bail!("TAP closed"),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).context("reading the TAP"),
        };
        match sock.send_to(&buf[..n], peer) {
            Ok(_) => {}
            // No listener (yet, or any more): the frame is lost, as on a cable.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
                ) => {}
            Err(e) => return Err(e).context("writing the socket"),
        }
    }
}

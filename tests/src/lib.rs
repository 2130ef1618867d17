//! The end-to-end harness: network namespaces that act as the guest and as a
//! fake internet, driven by real clients.
//!
//! A [`World`] is three namespaces, all created per test with unique names
//! (`slh<pid>x<n>`) and removed in `Drop` (also after a panic):
//!
//! ```text
//!  guest netns                 host netns                      inet netns ("fake internet")
//!  TAP slht <- sluice-tap-bridge --unix socket--> sidecar      lo: 198.51.100.10 origin (80, 443, 7 echo, 9 banner)
//!  DHCP from the sidecar                    veth 192.0.2.1 <-> 192.0.2.2   198.51.100.53 dnsmasq
//!  curl, dig, nc, iperf3 ...                default via 192.0.2.2      203.0.113.10 origin, 5201 iperf3
//!                                                                      203.0.113.99 nothing listens (RST)
//! ```
//!
//! The sidecar (sluice-gateway or passt, see [`Sidecar`]) runs in the host
//! namespace, so the root namespace is never touched. The guest is configured
//! by the sidecar's own DHCP (busybox udhcpc), and `/etc/netns/<guest>/resolv.conf`
//! is written from the answer, so clients run with `ip netns exec` use the
//! DNS server the sidecar advertised.
//!
//! Everything here needs root; tests that use it are `#[ignore]`d and run via
//! `scripts/test`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};

pub mod bench;
pub mod cpu;
pub mod hold;
mod host;
mod world_start;

pub use host::{Netns, Proc, STARTUP_WAIT, TempDir, run_ok};

/// Address of the host namespace's end of the veth to the fake internet.
pub const HOST_VETH_ADDR: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
/// Address of the fake internet's end of the veth (the host's default route).
pub const INET_VETH_ADDR: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);
/// The main origin: HTTP 80, HTTPS 443, TCP echo 7, banner 9, iperf3 5201.
pub const ORIGIN_ADDR: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
/// A second origin address (same services), for tests that need two.
pub const ORIGIN2_ADDR: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 10);
/// The fake internet's DNS server (dnsmasq).
pub const DNS_ADDR: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 53);
/// An address in the fake internet where nothing listens: connects get RST.
pub const REFUSING_ADDR: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 99);
/// The name dnsmasq resolves to [`ORIGIN_ADDR`].
pub const ORIGIN_NAME: &str = "origin.test";
/// The name dnsmasq resolves to [`ORIGIN2_ADDR`].
pub const ORIGIN2_NAME: &str = "other.test";
/// TCP port of the origin's echo service.
pub const ECHO_PORT: u16 = 7;
/// TCP port of the origin's banner service (writes one byte, then closes).
pub const BANNER_PORT: u16 = 9;
/// The guest's TAP device name (inside its own namespace); with
/// [`Transport::Attach`] the guest's end of the veth.
pub const GUEST_TAP: &str = "slht";
/// With [`Transport::Attach`]: the VM namespace's end of the veth, which
/// the gateway attaches to.
pub const VM_IFACE: &str = "slhv";

/// How the guest's frames reach the gateway (passt always uses the stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// QEMU's stream socket: the TAP bridge connects to `--socket`.
    Stream,
    /// One frame per datagram: the TAP bridge binds its own socket, sends
    /// vfkit's handshake, then frames to the gateway's `--dgram` path.
    Dgram,
    /// `--attach`: the guest's veth end faces one in a "VM" namespace the
    /// gateway attaches to (with its nftables floor); no bridge.
    Attach,
}

impl Transport {
    /// The transport named by `SLUICE_E2E_TRANSPORT` (`stream`, `dgram`,
    /// `attach`; default `stream`): the same suites run over each.
    ///
    /// # Errors
    /// Any other value.
    pub fn from_env() -> Result<Self> {
        match std::env::var("SLUICE_E2E_TRANSPORT").as_deref() {
            Err(_) | Ok("" | "stream") => Ok(Self::Stream),
            Ok("dgram") => Ok(Self::Dgram),
            Ok("attach") => Ok(Self::Attach),
            Ok(other) => bail!("SLUICE_E2E_TRANSPORT={other}: expected stream, dgram or attach"),
        }
    }
}

/// Byte `i` of the deterministic pattern the origin serves at `/bytes/N`.
pub fn pattern_byte(i: u64) -> u8 {
    // Not a multiple of any power of two: a dropped or duplicated segment
    // changes the checksum.
    let v = (i % 251) ^ ((i >> 16) % 7);
    u8::try_from(v & 0xff).unwrap_or(0)
}

/// The first `n` pattern bytes.
pub fn pattern(n: u64) -> Vec<u8> {
    (0..n).map(pattern_byte).collect()
}

/// Lower-case hex sha256 of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest as _;
    let d = sha2::Sha256::digest(data);
    let mut s = String::with_capacity(64);
    for b in d {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// True when the process runs as root (the harness needs it).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    #[allow(unsafe_code)]
    let uid = unsafe { libc::geteuid() };
    uid == 0
}

/// Fails with a clear message when not root.
pub fn require_root() -> Result<()> {
    if !is_root() {
        bail!("this test needs root (network namespaces): run it via scripts/test as root");
    }
    Ok(())
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A unique short name: `slh<pid>x<n>` (at most 14 bytes, fits IFNAMSIZ with
/// a one-letter suffix).
pub fn unique_name() -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("slh{}x{}", std::process::id() % 1_000_000, n)
}

/// Path of a binary of this workspace: `$SLUICE_BIN_<NAME>` if set, else next
/// to the running test executable's profile directory (`target/<profile>/`).
pub fn bin_path(name: &str) -> Result<PathBuf> {
    let var = format!("SLUICE_BIN_{}", name.replace('-', "_").to_uppercase());
    if let Ok(p) = std::env::var(&var) {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().context("current_exe")?;
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let p = dir.join(name);
    if p.exists() {
        return Ok(p);
    }
    bail!(
        "{} not found; build it (cargo build --release --workspace --bins) or set {var}",
        p.display()
    )
}

/// Waits until `cond` holds, polling, up to `deadline`. Not a timing
/// assertion: the bound only stops a hung test, so give it room (tens of
/// seconds) for a loaded machine.
pub fn wait_until(what: &str, deadline: Duration, mut cond: impl FnMut() -> bool) -> Result<()> {
    let start = Instant::now();
    while !cond() {
        if start.elapsed() > deadline {
            bail!("timed out waiting for {what} (gave up after {deadline:?})");
        }
        thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// Parses an audit log's text strictly: each complete line (up to the last
/// newline) must be a schema-1 record (`sluice_policy::audit::AuditRecord`)
/// and is returned as JSON; the first line that is not fails the whole read
/// with its number and text. Text after the last newline is a line still
/// being written and is left out.
pub fn parse_audit(text: &str) -> Result<Vec<serde_json::Value>> {
    let complete = text.rfind('\n').map_or("", |i| &text[..=i]);
    complete
        .lines()
        .enumerate()
        .map(|(i, line)| {
            sluice_policy::audit::AuditRecord::from_json(line).with_context(|| {
                format!("audit line {} is not a schema-1 record: {line}", i + 1)
            })?;
            serde_json::from_str(line)
                .with_context(|| format!("audit line {} is not JSON: {line}", i + 1))
        })
        .collect()
}

/// Which sidecar serves the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sidecar {
    /// `sluice-gateway` (release build of this workspace): the product.
    Gateway,
    /// Debian's passt: the reference the harness is validated against.
    Passt,
}

impl Sidecar {
    /// Short name, as used in benchmark tables.
    pub fn name(self) -> &'static str {
        match self {
            Self::Gateway => "sluice-gateway",
            Self::Passt => "passt",
        }
    }
}

/// A port to publish from the host namespace into the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Publish {
    /// Port on 127.0.0.1 in the host namespace.
    pub host_port: u16,
    /// Port in the guest.
    pub guest_port: u16,
    /// UDP rather than TCP.
    pub udp: bool,
}

/// How to build a [`World`].
#[derive(Debug, Clone)]
pub struct WorldBuilder {
    sidecar: Sidecar,
    mtu: u32,
    publish: Vec<Publish>,
    records: Vec<(String, Ipv4Addr)>,
    wildcards: Vec<(String, Ipv4Addr)>,
    policy: Option<String>,
    extra_args: Vec<String>,
    env: Vec<(String, String)>,
    iperf: bool,
    connect_guest: bool,
    dns_upstream: Ipv4Addr,
    dns_ttl: u32,
    congestion: Option<String>,
    transport: Option<Transport>,
}

impl Default for WorldBuilder {
    fn default() -> Self {
        Self {
            sidecar: Sidecar::Gateway,
            mtu: 65520,
            publish: Vec::new(),
            records: vec![
                (ORIGIN_NAME.to_string(), ORIGIN_ADDR),
                (ORIGIN2_NAME.to_string(), ORIGIN2_ADDR),
            ],
            wildcards: Vec::new(),
            policy: None,
            extra_args: Vec::new(),
            env: Vec::new(),
            iperf: false,
            connect_guest: true,
            dns_upstream: DNS_ADDR,
            dns_ttl: 0,
            congestion: None,
            transport: None,
        }
    }
}

impl WorldBuilder {
    /// The sidecar to run (default: the gateway).
    pub fn sidecar(mut self, s: Sidecar) -> Self {
        self.sidecar = s;
        self
    }
    /// The MTU the sidecar advertises (default 65520).
    pub fn mtu(mut self, mtu: u32) -> Self {
        self.mtu = mtu;
        self
    }
    /// Publishes 127.0.0.1:`host_port` (host namespace) to guest `guest_port`.
    pub fn publish(mut self, p: Publish) -> Self {
        self.publish.push(p);
        self
    }
    /// The resolver the sidecar is given (the gateway's `--dns-upstream`,
    /// passt's `-D`; default [`DNS_ADDR`], dnsmasq). Another address is
    /// added to the fake internet, where the test runs its own resolver.
    pub fn dns_upstream(mut self, addr: Ipv4Addr) -> Self {
        self.dns_upstream = addr;
        self
    }

    /// The TTL the fake internet's DNS gives its records (dnsmasq
    /// `--local-ttl`; default 0, so nothing is cached anywhere and every
    /// query reaches dnsmasq). Benchmarks of cached answers raise it.
    pub fn dns_ttl(mut self, secs: u32) -> Self {
        self.dns_ttl = secs;
        self
    }

    /// The TCP congestion control every namespace of the world uses
    /// (`net.ipv4.tcp_congestion_control`; default: what new namespaces
    /// inherit from the host). Benchmarks set it: on these hosts BBR's
    /// pacing costs the senders (the origin, the guest's kernel, the
    /// sidecar's host sockets) more CPU per byte than the sidecars under
    /// test differ by.
    pub fn congestion(mut self, algorithm: &str) -> Self {
        self.congestion = Some(algorithm.to_string());
        self
    }

    /// [`Self::congestion`] when `cc` names one, and the name of the
    /// algorithm in effect in the world (the host's, which the namespaces
    /// inherit, when `cc` is `None`) for the benchmarks' figures.
    pub fn congestion_or_host(self, cc: Option<&str>) -> (Self, String) {
        match cc {
            Some(cc) => (self.congestion(cc), cc.to_owned()),
            None => {
                let host = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
                    .map(|s| s.trim().to_owned())
                    .unwrap_or_else(|_| "unknown".into());
                (self, host)
            }
        }
    }

    /// Adds an A record to the fake internet's DNS (the origin's certificate
    /// is valid for every such name).
    pub fn dns_record(mut self, name: &str, addr: Ipv4Addr) -> Self {
        self.records.push((name.to_string(), addr));
        self
    }
    /// Makes the fake internet's DNS answer every name under `domain` (and
    /// `domain` itself) with `addr` (dnsmasq `--address`; TTL 0). The
    /// origin's certificate does not cover these names.
    pub fn dns_wildcard(mut self, domain: &str, addr: Ipv4Addr) -> Self {
        self.wildcards.push((domain.to_string(), addr));
        self
    }
    /// Gives the gateway this policy (YAML text), via `--policy`.
    pub fn policy(mut self, yaml: &str) -> Self {
        self.policy = Some(yaml.to_string());
        self
    }
    /// Extra sidecar arguments; `{dir}` is replaced by the world's directory.
    pub fn sidecar_arg(mut self, a: &str) -> Self {
        self.extra_args.push(a.to_string());
        self
    }
    /// Sets an environment variable of the gateway's process (a policy's
    /// `env:` secret); the gateway otherwise inherits the test's environment.
    pub fn sidecar_env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_string(), value.to_string()));
        self
    }
    /// Also runs an iperf3 server on the origin addresses (port 5201).
    pub fn iperf(mut self) -> Self {
        self.iperf = true;
        self
    }
    /// The gateway's transport (default: [`Transport::from_env`]).
    pub fn transport(mut self, t: Transport) -> Self {
        self.transport = Some(t);
        self
    }
    /// Whether to connect and configure the guest at start (default yes).
    pub fn connect_guest(mut self, yes: bool) -> Self {
        self.connect_guest = yes;
        self
    }
    /// Builds the namespaces, starts the services and the sidecar, and (by
    /// default) connects the guest and runs DHCP.
    pub fn start(self) -> Result<World> {
        World::start(self)
    }
}

/// What the guest learnt from the sidecar's DHCP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The guest's address.
    pub ip: Ipv4Addr,
    /// Prefix length from the subnet mask.
    pub prefix: u8,
    /// The default router.
    pub router: Option<Ipv4Addr>,
    /// DNS servers.
    pub dns: Vec<Ipv4Addr>,
    /// MTU (option 26), if offered.
    pub mtu: Option<u32>,
    /// Lease time in seconds, if offered.
    pub lease_secs: Option<u64>,
    /// The DHCP server identifier.
    pub server_id: Option<Ipv4Addr>,
}

impl Lease {
    fn from_env(env: &HashMap<String, String>) -> Result<Self> {
        let ip = env
            .get("ip")
            .ok_or_else(|| anyhow!("no ip in lease"))?
            .parse()?;
        let mask: Ipv4Addr = env
            .get("subnet")
            .ok_or_else(|| anyhow!("no subnet in lease"))?
            .parse()?;
        let prefix = u8::try_from(u32::from(mask).count_ones()).context("prefix")?;
        let parse_list = |k: &str| -> Vec<Ipv4Addr> {
            env.get(k)
                .map(|v| {
                    v.split_whitespace()
                        .filter_map(|a| a.parse().ok())
                        .collect()
                })
                .unwrap_or_default()
        };
        Ok(Self {
            ip,
            prefix,
            router: parse_list("router").first().copied(),
            dns: parse_list("dns"),
            mtu: env.get("mtu").and_then(|v| v.parse().ok()),
            lease_secs: env.get("lease").and_then(|v| v.parse().ok()),
            server_id: env.get("serverid").and_then(|v| v.parse().ok()),
        })
    }
}

/// The guest's connection to the sidecar: the bridge process.
#[derive(Debug)]
struct GuestLink {
    bridge: Proc,
}

/// A complete test world. Fields drop in order: processes, then namespaces,
/// then the temporary directory.
#[derive(Debug)]
pub struct World {
    link: Option<GuestLink>,
    sidecar: Option<Proc>,
    _services: Vec<Proc>,
    lease: Option<Lease>,
    /// The guest namespace (TAP + bridge; run clients here).
    pub guest: Netns,
    /// The host namespace (the sidecar runs here).
    pub host: Netns,
    /// The fake internet namespace (origins, DNS, iperf3).
    pub inet: Netns,
    /// With [`Transport::Attach`]: the VM namespace holding [`VM_IFACE`].
    pub vm: Option<Netns>,
    transport: Transport,
    dir: TempDir,
    sidecar_kind: Sidecar,
    mtu: u32,
    socket: PathBuf,
    sidecar_startup: Duration,
    builder: WorldBuilder,
}

impl World {
    /// A builder with the defaults (gateway, MTU 65520).
    pub fn builder() -> WorldBuilder {
        WorldBuilder::default()
    }

    /// The DHCP lease the guest holds.
    pub fn lease(&self) -> Option<&Lease> {
        self.lease.as_ref()
    }

    /// How the guest's frames reach the sidecar.
    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// Which sidecar runs.
    pub fn sidecar_kind(&self) -> Sidecar {
        self.sidecar_kind
    }

    /// The MTU the sidecar was told to advertise.
    pub fn mtu(&self) -> u32 {
        self.mtu
    }

    /// The sidecar's socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The per-world temporary directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The test CA (PEM) that signed the origin's certificate.
    pub fn ca_pem(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The gateway's audit log path. Read it with [`World::audit`] (records)
    /// or [`World::audit_raw`] (negative checks), not by hand.
    pub fn audit_path(&self) -> PathBuf {
        self.dir.path().join("audit.jsonl")
    }

    /// The gateway's audit records, strictly ([`parse_audit`]): every
    /// complete line must be a schema-1 record, or this is an error naming
    /// the line (a test fails on it, never skips it). A last line without
    /// its newline is still being written and is left out. The file must
    /// exist (the gateway creates it before it listens).
    pub fn audit(&self) -> Result<Vec<serde_json::Value>> {
        parse_audit(&self.audit_raw()?)
    }

    /// The audit log's raw text, every byte as written (a line being written
    /// included, nothing parsed or filtered): for negative checks such as
    /// "no secret value in any line".
    pub fn audit_raw(&self) -> Result<String> {
        let path = self.audit_path();
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
    }

    /// Waits (bounded by `deadline`, polling) for an audit record matching
    /// `pred` and returns it. A line that does not parse fails at once; on
    /// timeout the error shows the records seen and the sidecar log.
    pub fn wait_audit(
        &self,
        what: &str,
        deadline: Duration,
        mut pred: impl FnMut(&serde_json::Value) -> bool,
    ) -> Result<serde_json::Value> {
        let start = Instant::now();
        loop {
            let records = self.audit()?;
            if let Some(r) = records.iter().find(|r| pred(r)) {
                return Ok(r.clone());
            }
            if start.elapsed() > deadline {
                bail!(
                    "timed out waiting for the audit record: {what} (gave up after {deadline:?})\n\
                     audit: {records:#?}\n{}",
                    self.sidecar_log()
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Everything dnsmasq logged (queries that reached the fake upstream),
    /// in lower case: the gateway sends every name in a random letter case
    /// of its own ("0x20", docs/gateway.md), so only the case-folded name
    /// can be searched for.
    pub fn dns_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("dns-queries.log"))
            .unwrap_or_default()
            .to_ascii_lowercase()
    }

    /// The origin's request log (one JSON value per request).
    pub fn origin_requests(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.dir.path().join("origin-requests.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The sidecar's log, for error context.
    pub fn sidecar_log(&self) -> String {
        let s = std::fs::read_to_string(self.dir.path().join("sidecar.log")).unwrap_or_default();
        let tail: Vec<&str> = s.lines().rev().take(40).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        format!("--- sidecar log (tail) ---\n{}", tail.join("\n"))
    }

    /// The sidecar's process id (for signals from a shared borrow).
    pub fn sidecar_pid(&self) -> Option<u32> {
        self.sidecar.as_ref().and_then(Proc::pid)
    }

    /// The sidecar process (for signals, RSS).
    pub fn sidecar(&mut self) -> Option<&mut Proc> {
        self.sidecar.as_mut()
    }

    /// Time from spawning the sidecar until its socket existed.
    pub fn sidecar_startup(&self) -> Duration {
        self.sidecar_startup
    }

    /// Fails if the sidecar or the bridge died.
    pub fn check_alive(&mut self) -> Result<()> {
        let log = self.sidecar_log();
        if let Some(p) = self.sidecar.as_mut() {
            p.check_alive().context(log)?;
        }
        if let Some(l) = self.link.as_mut() {
            l.bridge.check_alive()?;
        }
        Ok(())
    }

    /// Runs `script` with `sh -c` in the guest (deadline `secs`), returning the
    /// output whatever the status.
    pub fn guest_sh(&self, script: &str, secs: u32) -> Result<Output> {
        self.guest.sh(script, secs)
    }

    /// Runs `script` in the host namespace, where the sidecar runs (its
    /// published ports, its metrics endpoint), and requires success;
    /// returns stdout.
    pub fn host_ok(&self, script: &str, secs: u32) -> Result<String> {
        self.host.sh_ok(script, secs)
    }

    /// Runs `script` in the guest and requires success; returns stdout.
    pub fn guest_ok(&self, script: &str, secs: u32) -> Result<String> {
        self.guest
            .sh_ok(script, secs)
            .with_context(|| self.sidecar_log())
    }

    /// Spawns a long-running process in the guest namespace, killed when the
    /// returned [`Proc`] drops; output goes to `<dir>/<what>.log`.
    pub fn guest_spawn(&self, what: &str, args: &[&str]) -> Result<Proc> {
        let Some((prog, rest)) = args.split_first() else {
            bail!("empty command");
        };
        let mut c = self.guest.cmd(prog);
        c.args(rest);
        Proc::spawn(what, &mut c, &self.dir.path().join(format!("{what}.log")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_from_udhcpc_env() -> Result<()> {
        let env: HashMap<String, String> = [
            ("ip", "10.0.2.15"),
            ("subnet", "255.255.255.0"),
            ("router", "10.0.2.2"),
            ("dns", "10.0.2.2 10.0.2.3"),
            ("mtu", "1500"),
            ("lease", "3600"),
            ("serverid", "10.0.2.2"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let l = Lease::from_env(&env)?;
        assert_eq!(l.ip, Ipv4Addr::new(10, 0, 2, 15));
        assert_eq!(l.prefix, 24);
        assert_eq!(l.router, Some(Ipv4Addr::new(10, 0, 2, 2)));
        assert_eq!(l.dns.len(), 2);
        assert_eq!(l.mtu, Some(1500));
        assert_eq!(l.lease_secs, Some(3600));
        Ok(())
    }

    #[test]
    fn lease_without_address_is_an_error() {
        let env = HashMap::from([("subnet".to_string(), "255.255.255.0".to_string())]);
        assert!(Lease::from_env(&env).is_err());
    }

    #[test]
    fn pattern_is_not_periodic_in_powers_of_two() {
        let p = pattern(1 << 17);
        assert_ne!(p[..4096], p[4096..8192]);
        assert_ne!(p[..65536], p[65536..]);
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    const GOOD: &str = r#"{"schema":1,"ts":"1970-01-01T00:00:00.000Z","sandbox":"vm","kind":"dns","decision":"deny","reason":"not_allowlisted","policy":{"id":"a","version":"b"}}"#;

    #[test]
    fn audit_reader_returns_complete_records_and_leaves_out_a_partial_line() -> Result<()> {
        assert!(parse_audit("")?.is_empty());
        let recs = parse_audit(&format!("{GOOD}\n{GOOD}\n{{\"schema\":1,"))?;
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[0]["reason"], "not_allowlisted");
        Ok(())
    }

    #[test]
    fn audit_reader_fails_on_a_line_that_does_not_parse() {
        for bad in [
            "not json".to_owned(),
            r#"{"ok":true}"#.to_owned(),
            GOOD.replace("not_allowlisted", "because"),
        ] {
            let err = parse_audit(&format!("{GOOD}\n{bad}\n{GOOD}\n")).unwrap_err();
            assert!(format!("{err:#}").contains("audit line 2"), "{err:#}");
        }
    }

    #[test]
    fn unique_names_fit_interface_names() {
        let a = unique_name();
        let b = unique_name();
        assert_ne!(a, b);
        assert!(a.len() + 1 < libc::IFNAMSIZ, "{a}");
    }
}

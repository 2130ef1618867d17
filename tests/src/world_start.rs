//! How a [`World`] comes up: its namespaces, the fake internet's servers,
//! the sidecar under test, the guest's link to it and the guest's DHCP
//! lease. The accessors and the ways to run things in a world are in the
//! crate root.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::host::read_log;
use super::{
    BANNER_PORT, DNS_ADDR, ECHO_PORT, GUEST_TAP, GuestLink, HOST_VETH_ADDR, INET_VETH_ADDR, Lease,
    Netns, ORIGIN_ADDR, ORIGIN2_ADDR, Proc, REFUSING_ADDR, STARTUP_WAIT, Sidecar, TempDir,
    Transport, VM_IFACE, World, WorldBuilder, bin_path, require_root, run_ok, unique_name,
    wait_until,
};

impl World {
    pub(crate) fn start(b: WorldBuilder) -> Result<Self> {
        require_root()?;
        let transport = match (b.sidecar, b.transport) {
            (Sidecar::Passt, _) => Transport::Stream,
            (Sidecar::Gateway, Some(t)) => t,
            (Sidecar::Gateway, None) => Transport::from_env()?,
        };
        let base = unique_name();
        let dir = TempDir::new(&format!("{base}-dir"))?;
        let inet = Netns::new(&format!("{base}i"))?;
        let host = Netns::new(&format!("{base}h"))?;
        let guest = Netns::new(&format!("{base}g"))?;
        if let Some(cc) = &b.congestion {
            for ns in [&inet, &host, &guest] {
                let st = ns
                    .cmd("sysctl")
                    .args(["-qw", &format!("net.ipv4.tcp_congestion_control={cc}")])
                    .status()
                    .context("running sysctl")?;
                if !st.success() {
                    bail!("congestion control {cc:?} cannot be set in {}", ns.name());
                }
            }
        }

        // veth host <-> inet.
        let vh = format!("{base}a");
        let vi = format!("{base}b");
        host.ip(&["link", "add", &vh, "type", "veth", "peer", "name", &vi])?;
        host.ip(&["link", "set", &vi, "netns", inet.name()])?;
        host.ip(&["addr", "add", &format!("{HOST_VETH_ADDR}/24"), "dev", &vh])?;
        host.ip(&["link", "set", &vh, "up"])?;
        host.ip(&[
            "route",
            "add",
            "default",
            "via",
            &INET_VETH_ADDR.to_string(),
        ])?;
        inet.ip(&["addr", "add", &format!("{INET_VETH_ADDR}/24"), "dev", &vi])?;
        inet.ip(&["link", "set", &vi, "up"])?;
        for a in [ORIGIN_ADDR, ORIGIN2_ADDR, DNS_ADDR, REFUSING_ADDR] {
            inet.ip(&["addr", "add", &format!("{a}/32"), "dev", "lo"])?;
        }
        if b.dns_upstream != DNS_ADDR {
            let a = b.dns_upstream;
            inet.ip(&["addr", "add", &format!("{a}/32"), "dev", "lo"])?;
        }
        inet.ip(&[
            "route",
            "add",
            "default",
            "via",
            &HOST_VETH_ADDR.to_string(),
        ])?;

        let mut services = Vec::new();
        let d = dir.path();

        // dnsmasq.
        let mut dns = inet.cmd("dnsmasq");
        dns.args([
            "--keep-in-foreground",
            "--conf-file=/dev/null",
            "--no-resolv",
            "--no-hosts",
            "--bind-interfaces",
            "--user=root",
            "--pid-file=",
            "--log-queries",
            // Authoritative for .test: unknown names get NXDOMAIN.
            "--local=/test/",
        ])
        .arg(format!("--listen-address={DNS_ADDR}"))
        .arg(format!("--local-ttl={}", b.dns_ttl))
        .arg(format!(
            "--log-facility={}",
            d.join("dns-queries.log").display()
        ));
        for (name, addr) in &b.records {
            dns.arg(format!("--host-record={name},{addr}"));
        }
        for (domain, addr) in &b.wildcards {
            dns.arg(format!("--address=/{domain}/{addr}"));
        }
        services.push(Proc::spawn("dnsmasq", &mut dns, &d.join("dnsmasq.out"))?);

        // The origin.
        let ready = d.join("origin.ready");
        let mut o = inet.cmd(bin_path("sluice-test-origin")?);
        o.args(["--http", "0.0.0.0:80", "--https", "0.0.0.0:443"])
            .args(["--echo", &format!("0.0.0.0:{ECHO_PORT}")])
            .args(["--banner", &format!("0.0.0.0:{BANNER_PORT}")])
            .arg("--ca-out")
            .arg(d.join("ca.pem"))
            .arg("--log")
            .arg(d.join("origin-requests.jsonl"))
            .arg("--ready")
            .arg(&ready);
        for (name, _) in &b.records {
            o.args(["--name", name]);
        }
        for a in [ORIGIN_ADDR, ORIGIN2_ADDR] {
            o.args(["--name", &a.to_string()]);
        }
        let mut origin = Proc::spawn("origin", &mut o, &d.join("origin.out"))?;
        wait_until("the origin", STARTUP_WAIT, || {
            ready.exists() || origin.check_alive().is_err()
        })?;
        origin.check_alive()?;
        services.push(origin);

        if b.iperf {
            let mut c = inet.cmd("iperf3");
            c.args(["-s", "-p", "5201"]);
            services.push(Proc::spawn("iperf3", &mut c, &d.join("iperf3.out"))?);
        }

        // passt drops privileges before binding its socket: give it a
        // world-writable directory of its own.
        let sock_dir = d.join("sock");
        std::fs::create_dir_all(&sock_dir)?;
        std::fs::set_permissions(
            &sock_dir,
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )?;
        let socket = sock_dir.join("sidecar.sock");
        let vm = if transport == Transport::Attach {
            let vm = Netns::new(&format!("{base}v"))?;
            let mtu = b.mtu.min(65520).to_string();
            guest.ip(&[
                "link",
                "add",
                GUEST_TAP,
                "mtu",
                &mtu,
                "type",
                "veth",
                "peer",
                "name",
                VM_IFACE,
                "mtu",
                &mtu,
                "netns",
                vm.name(),
            ])?;
            guest.ip(&["link", "set", GUEST_TAP, "up"])?;
            Some(vm)
        } else {
            None
        };
        let mut w = Self {
            link: None,
            sidecar: None,
            _services: services,
            lease: None,
            guest,
            host,
            inet,
            vm,
            transport,
            sidecar_kind: b.sidecar,
            mtu: b.mtu,
            socket,
            sidecar_startup: Duration::ZERO,
            dir,
            builder: b,
        };
        w.start_sidecar()?;
        // dnsmasq must answer the first query: a query forwarded before it
        // listens gets an ICMP unreachable and the guest a SERVFAIL.
        let dns = format!("{DNS_ADDR}:53");
        w.inet
            .wait_listening("dnsmasq (UDP)", "udp", &dns)
            .with_context(|| read_log(&w.dir.path().join("dnsmasq.out")))?;
        w.inet
            .wait_listening("dnsmasq (TCP)", "tcp", &dns)
            .with_context(|| read_log(&w.dir.path().join("dnsmasq.out")))?;
        if w.builder.connect_guest {
            w.connect_guest()?;
        }
        Ok(w)
    }

    /// Starts the sidecar in the host namespace and waits for its socket.
    fn start_sidecar(&mut self) -> Result<()> {
        let d = self.dir.path().to_path_buf();
        let mut c;
        match self.sidecar_kind {
            Sidecar::Gateway => {
                c = self.host.cmd(bin_path("sluice-gateway")?);
                match (self.transport, &self.vm) {
                    (Transport::Attach, Some(vm)) => {
                        c.args(["--attach", VM_IFACE, "--netns"])
                            .arg(Path::new("/run/netns").join(vm.name()));
                    }
                    (Transport::Dgram, _) => {
                        c.arg("--dgram").arg(&self.socket);
                    }
                    _ => {
                        c.arg("--socket").arg(&self.socket);
                    }
                }
                c.args(["--mtu", &self.mtu.to_string()])
                    .args(["--dns-upstream", &self.builder.dns_upstream.to_string()])
                    .args(["--log-format", "json"])
                    .arg("--audit")
                    .arg(d.join("audit.jsonl"));
                if let Some(p) = &self.builder.policy {
                    let path = d.join("policy.yaml");
                    std::fs::write(&path, p)?;
                    c.arg("--policy").arg(path);
                }
                for p in &self.builder.publish {
                    c.arg("--publish").arg(format!(
                        "127.0.0.1:{}:{}/{}",
                        p.host_port,
                        p.guest_port,
                        if p.udp { "udp" } else { "tcp" }
                    ));
                }
                c.envs(self.builder.env.iter().map(|(k, v)| (k, v)));
                c.env(
                    "RUST_LOG",
                    std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
                );
            }
            Sidecar::Passt => {
                c = self.host.cmd("passt");
                c.args(["-f", "-q", "-4", "--no-map-gw"])
                    .arg("--socket")
                    .arg(&self.socket)
                    .args(["-m", &self.mtu.to_string()])
                    .args(["-a", "10.0.2.15", "-n", "24", "-g", "10.0.2.2"])
                    .args(["-D", &self.builder.dns_upstream.to_string()]);
                let mut any_tcp = false;
                let mut any_udp = false;
                for p in &self.builder.publish {
                    let flag = if p.udp { "-u" } else { "-t" };
                    any_udp |= p.udp;
                    any_tcp |= !p.udp;
                    c.args([flag, &format!("127.0.0.1/{}:{}", p.host_port, p.guest_port)]);
                }
                if !any_tcp {
                    c.args(["-t", "none"]);
                }
                if !any_udp {
                    c.args(["-u", "none"]);
                }
            }
        }
        // `{dir}` in an extra argument is this world's directory (e.g. the
        // origin's CA at `{dir}/ca.pem`).
        let dir_text = d.display().to_string();
        c.args(
            self.builder
                .extra_args
                .iter()
                .map(|a| a.replace("{dir}", &dir_text)),
        );
        let _ = std::fs::remove_file(&self.socket);
        let start = Instant::now();
        let mut p = Proc::spawn("sidecar", &mut c, &d.join("sidecar.log"))?;
        let sock = self.socket.clone();
        let log = d.join("sidecar.log");
        let attach = self.transport == Transport::Attach;
        wait_until("the sidecar's socket", STARTUP_WAIT, || {
            let ready = if attach {
                read_log(&log).contains("ready: serving the guest")
            } else {
                sock.exists()
            };
            ready || p.check_alive().is_err()
        })
        .with_context(|| self.sidecar_log())?;
        self.sidecar_startup = start.elapsed();
        p.check_alive().with_context(|| self.sidecar_log())?;
        self.sidecar = Some(p);
        Ok(())
    }

    /// (Re)connects the guest: a fresh TAP and bridge, then DHCP. With
    /// [`Transport::Attach`] the veth stays (made at start): DHCP only.
    pub fn connect_guest(&mut self) -> Result<()> {
        self.link = None;
        if self.transport == Transport::Attach {
            return self.dhcp();
        }
        let _ = self.guest.ip(&["link", "del", GUEST_TAP]);
        self.guest
            .ip(&["tuntap", "add", "dev", GUEST_TAP, "mode", "tap"])?;
        self.guest.ip(&[
            "link",
            "set",
            GUEST_TAP,
            "mtu",
            &self.mtu.min(65520).to_string(),
        ])?;
        self.guest.ip(&["link", "set", GUEST_TAP, "up"])?;
        let d = self.dir.path().to_path_buf();
        let mut c = self.guest.cmd(bin_path("sluice-tap-bridge")?);
        c.args(["--tap", GUEST_TAP])
            .arg("--socket")
            .arg(&self.socket);
        if self.transport == Transport::Dgram {
            c.arg("--dgram")
                .arg(d.join("sock").join("guest.sock"))
                .arg("--vfkit-handshake");
        }
        let mut bridge = Proc::spawn("tap bridge", &mut c, &d.join("bridge.log"))?;
        // The TAP has carrier once the bridge holds it open; frames sent
        // before that are dropped by the kernel.
        let guest = &self.guest;
        let mut link = String::new();
        wait_until(
            "the TAP's carrier (the bridge attached)",
            STARTUP_WAIT,
            || {
                link = guest
                    .sh(&format!("ip link show {GUEST_TAP}"), 30)
                    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                    .unwrap_or_default();
                link.contains("LOWER_UP") || bridge.check_alive().is_err()
            },
        )
        .with_context(|| format!("{link}\n{}", read_log(&d.join("bridge.log"))))?;
        bridge
            .check_alive()
            .with_context(|| read_log(&d.join("bridge.log")))?;
        self.link = Some(GuestLink { bridge });
        self.dhcp()
    }

    /// Disconnects the guest (kills the bridge: the sidecar sees EOF).
    pub fn disconnect_guest(&mut self) {
        self.link = None;
        self.lease = None;
    }

    /// Runs udhcpc on the TAP and applies the lease.
    fn dhcp(&mut self) -> Result<()> {
        let d = self.dir.path();
        let script = d.join("udhcpc.sh");
        let env_out = d.join("lease.env");
        let _ = std::fs::remove_file(&env_out);
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\ncase \"$1\" in bound|renew) env > {}.tmp && mv {0}.tmp {0};; esac\nexit 0\n",
                env_out.display()
            ),
        )?;
        run_ok(Command::new("chmod").arg("755").arg(&script))?;
        // Up to 60 discovers a second apart: the bridge may still be
        // connecting to the sidecar on a loaded machine (a lost discover
        // costs one retry, not the test).
        let out = self.guest.sh(
            &format!(
                "busybox udhcpc -i {GUEST_TAP} -f -q -n -t 60 -T 1 -O mtu -s {}",
                script.display()
            ),
            90,
        )?;
        if !out.status.success() || !env_out.exists() {
            bail!(
                "DHCP failed ({}): {}\n{}\n--- bridge log ---\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr),
                self.sidecar_log(),
                read_log(&d.join("bridge.log"))
            );
        }
        let env: HashMap<String, String> = std::fs::read_to_string(&env_out)?
            .lines()
            .filter_map(|l| {
                l.split_once('=')
                    .map(|(k, v)| (k.to_string(), v.to_string()))
            })
            .collect();
        let lease = Lease::from_env(&env)?;
        self.guest.ip(&["addr", "flush", "dev", GUEST_TAP])?;
        self.guest.ip(&[
            "addr",
            "add",
            &format!("{}/{}", lease.ip, lease.prefix),
            "dev",
            GUEST_TAP,
        ])?;
        if let Some(mtu) = lease.mtu {
            self.guest
                .ip(&["link", "set", GUEST_TAP, "mtu", &mtu.to_string()])?;
        }
        if let Some(r) = lease.router {
            let _ = self.guest.ip(&["route", "del", "default"]);
            self.guest
                .ip(&["route", "add", "default", "via", &r.to_string()])?;
        }
        let etc = self.guest.etc_dir();
        std::fs::create_dir_all(&etc)?;
        let mut resolv = String::new();
        for s in &lease.dns {
            let _ = writeln!(resolv, "nameserver {s}");
        }
        std::fs::write(etc.join("resolv.conf"), resolv)?;
        self.lease = Some(lease);
        Ok(())
    }
}

//! `sluice-gateway --attach` end to end (issue 13): the guest's veth end in
//! its namespace faces one in a "VM" namespace, the gateway (in the host
//! namespace) attaches to that with a packet socket behind its nftables
//! floor. Real udhcpc, dig and curl; the fake internet's dnsmasq and origin.
//!
//! The datapath suites run over this transport too
//! (`SLUICE_E2E_TRANSPORT=attach`, docs/testing.md); this file holds what
//! only `--attach` has: a policy decided the same way, the floor's life
//! (present while serving; after SIGTERM the link down AND the floor kept
//! while the interface exists, so setting the link up again still reaches
//! nothing; gone with the interface; kept after SIGKILL and then biting),
//! and bad input. Needs root: run via `scripts/test` (or
//! `cargo test --release -p sluice-e2e --test attach -- --include-ignored`).

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use attach_support::{delete_floors, ended_with_the_floor_put_back, floor_table, tables, vm};
use sluice_e2e::{
    Netns, ORIGIN_ADDR, ORIGIN_NAME, ORIGIN2_NAME, Proc, REFUSING_ADDR, Transport, VM_IFACE, World,
    bin_path, unique_name, wait_until,
};

mod attach_support;

/// Allows only `origin.test` on 80; the fake internet lives in
/// documentation ranges, which answers may use only when `internal:` lists them.
const POLICY: &str = r#"
version: 1
id: e2e-attach
allow:
  - domain: "origin.test"
    ports: [80]
internal:
  - "198.51.100.0/24"
  - "203.0.113.0/24"
"#;

#[test]
#[ignore = "needs root: run via scripts/test"]
fn attach_serves_dhcp_dns_and_policy_and_ends_fail_closed_on_sigterm() -> Result<()> {
    let mut w = World::builder()
        .transport(Transport::Attach)
        .policy(POLICY)
        .start()?;
    let lease = w.lease().context("no DHCP lease")?.clone();
    ensure!(lease.ip.octets()[3] == 15, "lease: {lease:?}");
    ensure!(
        tables(vm(&w)?)?.contains(&floor_table(VM_IFACE)),
        "no floor while serving: {}",
        tables(vm(&w)?)?
    );
    // The VM namespace's kernel has no address on the interface to speak
    // from: no IPv6 link-local either.
    let v6 = vm(&w)?.sh_ok(&format!("ip -6 addr show dev {VM_IFACE}"), 30)?;
    ensure!(v6.trim().is_empty(), "an IPv6 address on {VM_IFACE}: {v6}");

    // DNS: the allowed name resolves, the other is refused.
    let a = w.guest_ok(&format!("dig +short +time=20 +tries=1 {ORIGIN_NAME} A"), 60)?;
    ensure!(a.trim() == ORIGIN_ADDR.to_string(), "allowed name: {a}");
    let out = w.guest_sh(&format!("dig +time=20 +tries=1 {ORIGIN2_NAME} A"), 60)?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(text.contains("status: REFUSED"), "denied name: {text}");

    // An allowed flow, and a denied one (an address nothing resolved).
    let body = w
        .guest_ok(&format!("curl -sS --max-time 60 http://{ORIGIN_NAME}/"), 90)
        .with_context(|| w.sidecar_log())?;
    ensure!(body.contains("hello"), "allowed fetch: {body}");
    let denied = w.guest_sh(
        &format!("curl -sS --connect-timeout 60 http://{REFUSING_ADDR}/"),
        90,
    )?;
    ensure!(!denied.status.success(), "a denied flow went through");
    let audit = w.audit()?;
    ensure!(
        audit.iter().any(|l| l["kind"] == "connection"
            && l["decision"] == "deny"
            && l["dst"]["ip"] == REFUSING_ADDR.to_string()),
        "no deny record: {audit:?}"
    );

    let gateway = lease.router.context("no router")?;
    let st = w
        .sidecar()
        .context("no sidecar")?
        .signal_and_wait(libc::SIGTERM, Duration::from_secs(60))?;
    ensure!(st.code() == Some(0), "exit {st}\n{}", w.sidecar_log());
    ensure!(
        w.sidecar_log()
            .contains("its floor stays on it (fail closed)"),
        "no fail-closed exit line: {}",
        w.sidecar_log()
    );
    // The end was fail-closed: the interface is down AND, as it still
    // exists, the floor stays on it. The guest, which outlives the gateway,
    // reaches nothing through the VM namespace's kernel even where that
    // namespace has an address (and routes) for it, and even when
    // something with CAP_NET_ADMIN there sets the link up again.
    let vm = vm(&w)?;
    let left = tables(vm)?;
    ensure!(
        left.contains(&floor_table(VM_IFACE)),
        "the floor went while {VM_IFACE} exists: {left}"
    );
    let link = vm.sh_ok(&format!("ip -o link show dev {VM_IFACE}"), 30)?;
    ensure!(
        link.contains("state DOWN"),
        "{VM_IFACE} after the end: {link}"
    );
    vm.ip(&["addr", "add", &format!("{gateway}/24"), "dev", VM_IFACE])?;
    let ping = format!("ip neigh flush all; busybox ping -c 3 -w 10 {gateway}");
    let out = w.guest_sh(&ping, 30)?;
    ensure!(
        !out.status.success(),
        "the namespace's kernel answered the guest after a normal end: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    vm.ip(&["link", "set", VM_IFACE, "up"])?;
    let out = w.guest_sh(&ping, 30)?;
    ensure!(
        !out.status.success(),
        "the namespace's kernel answered the guest once the link was set up again: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    // Control: with the link up and the kept floor deleted by hand the
    // same ping is answered, so the checks above can fail.
    delete_floors(vm, VM_IFACE)?;
    w.guest_ok(&ping, 30)
        .context("with the link up and no floor the kernel should answer")?;
    Ok(())
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn after_sigkill_the_floor_stays_and_the_kernel_answers_the_guest_nothing() -> Result<()> {
    let mut w = World::builder().transport(Transport::Attach).start()?;
    w.guest_ok(&format!("curl -sS --max-time 60 http://{ORIGIN_NAME}/"), 90)?;
    let gateway = w.lease().and_then(|l| l.router).context("no router")?;
    w.sidecar()
        .context("no sidecar")?
        .signal_and_wait(libc::SIGKILL, Duration::from_secs(60))?;
    let vm = vm(&w)?;
    // The keeper saw the gateway go without asking: the floor stays.
    wait_until("the floor keeper to exit", Duration::from_secs(60), || {
        !keeper_alive(&w)
    })?;
    ensure!(
        tables(vm)?.contains(&floor_table(VM_IFACE)),
        "the floor went with the gateway: {}",
        tables(vm)?
    );
    // Give the VM namespace's kernel the gateway's address: without the
    // floor it would answer the guest's ping; with it, it answers nothing.
    vm.ip(&["addr", "add", &format!("{gateway}/24"), "dev", VM_IFACE])?;
    // The guest still maps the address to the gateway's MAC: forget it.
    let ping = format!("ip neigh flush all; busybox ping -c 3 -w 10 {gateway}");
    let out = w.guest_sh(&ping, 30)?;
    ensure!(
        !out.status.success(),
        "the kernel answered behind the floor: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    // Control: the same ping with the floor removed is answered, so the
    // check above can fail.
    delete_floors(vm, VM_IFACE)?;
    w.guest_ok(&ping, 30)
        .context("without the floor the kernel should answer")?;
    Ok(())
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn a_floor_deleted_while_serving_ends_the_gateway_fail_closed() -> Result<()> {
    let mut w = World::builder().transport(Transport::Attach).start()?;
    w.guest_ok(&format!("curl -sS --max-time 60 http://{ORIGIN_NAME}/"), 90)?;
    let gateway = w.lease().and_then(|l| l.router).context("no router")?;
    // Someone with CAP_NET_ADMIN in the VM namespace deletes the floor
    // while the gateway serves: the keeper's next check finds it gone,
    // sets the interface down and ends the gateway, which exits with the
    // reason in one line.
    delete_floors(vm(&w)?, VM_IFACE)?;
    ended_with_the_floor_put_back(&mut w)?;
    // Fail closed: the interface is down, the floor is back, and the
    // guest reaches nothing through the namespace's kernel, even with
    // the link set up again.
    let vm = vm(&w)?;
    ensure!(
        tables(vm)?.contains(&floor_table(VM_IFACE)),
        "no floor after the end: {}",
        tables(vm)?
    );
    let link = vm.sh_ok(&format!("ip -o link show dev {VM_IFACE}"), 30)?;
    ensure!(link.contains("state DOWN"), "{VM_IFACE}: {link}");
    vm.ip(&["addr", "add", &format!("{gateway}/24"), "dev", VM_IFACE])?;
    vm.ip(&["link", "set", VM_IFACE, "up"])?;
    let ping = format!("ip neigh flush all; busybox ping -c 3 -w 10 {gateway}");
    let out = w.guest_sh(&ping, 30)?;
    ensure!(
        !out.status.success(),
        "the namespace's kernel answered the guest: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    // Control: with no floor, the same ping is answered.
    delete_floors(vm, VM_IFACE)?;
    w.guest_ok(&ping, 30)
        .context("with the link up and no floor the kernel should answer")?;
    Ok(())
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn the_floor_keeper_holds_no_secret_the_gateway_holds() -> Result<()> {
    // A value found nowhere but in the gateway's environment (an `env:`
    // secret) and, once loaded, in its secret store.
    let value = format!("kp-{}-{}-s3cr3t", unique_name(), std::process::id());
    let policy = format!(
        r#"
version: 1
id: e2e-attach-keeper
allow:
  - domain: "{ORIGIN_NAME}"
    ports: [80, 443]
internal:
  - "198.51.100.0/24"
  - "203.0.113.0/24"
inspect:
  - "{ORIGIN_NAME}"
secrets:
  - name: tok
    placeholder: sluice-ph-keeper-token
    env: SLUICE_E2E_KEEPER_SECRET
    hosts: ["{ORIGIN_NAME}"]
"#
    );
    let mut w = World::builder()
        .transport(Transport::Attach)
        .policy(&policy)
        .sidecar_env("SLUICE_E2E_KEEPER_SECRET", &value)
        .start()?;
    let gateway = w.sidecar_pid().context("no gateway pid")?;
    let kids = Command::new("pgrep")
        .args(["-P", &gateway.to_string()])
        .output()
        .context("pgrep")?;
    let kids = String::from_utf8_lossy(&kids.stdout).into_owned();
    let keeper: u32 = match kids.split_whitespace().collect::<Vec<_>>().as_slice() {
        [one] => one.parse()?,
        other => anyhow::bail!("want one keeper child of the gateway, found {other:?}"),
    };
    // Control: the scan finds the value where it is (the gateway loaded it).
    ensure!(
        memory_holds(gateway, value.as_bytes())?,
        "the scan does not find the secret in the gateway itself"
    );
    ensure!(
        !memory_holds(keeper, value.as_bytes())?,
        "the unjailed floor keeper (pid {keeper}) holds the secret value"
    );
    let env = std::fs::read(format!("/proc/{keeper}/environ"))?;
    ensure!(
        env.iter().all(|b| *b == 0),
        "the keeper's environment is not empty: {}",
        String::from_utf8_lossy(&env)
    );
    // With its environment gone the keeper still finds `ip`: a normal end
    // sets the interface down (the gateway did too; the keeper's `ip` runs
    // on an interface already down, and fails the exit if not found) and
    // keeps the floor on it.
    let st = w
        .sidecar()
        .context("no sidecar")?
        .signal_and_wait(libc::SIGTERM, Duration::from_secs(60))?;
    ensure!(st.code() == Some(0), "exit {st}\n{}", w.sidecar_log());
    let left = tables(vm(&w)?)?;
    ensure!(left.contains(&floor_table(VM_IFACE)), "left: {left}");
    Ok(())
}

/// Whether `needle` is anywhere in the readable memory of process `pid`
/// (its mappings, read through `/proc/PID/mem`; root reads any process).
fn memory_holds(pid: u32, needle: &[u8]) -> Result<bool> {
    use std::os::unix::fs::FileExt as _;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let mem = std::fs::File::open(format!("/proc/{pid}/mem"))?;
    let mut scanned = 0usize;
    for line in maps.lines() {
        let mut cols = line.split_whitespace();
        let (Some(range), Some(perms)) = (cols.next(), cols.next()) else {
            continue;
        };
        let Some((start, end)) = range.split_once('-') else {
            continue;
        };
        let (start, end) = (
            u64::from_str_radix(start, 16)?,
            u64::from_str_radix(end, 16)?,
        );
        let len = usize::try_from(end - start)?;
        // Unreadable (guards) and the kernel's own pages are skipped.
        if !perms.starts_with('r') || line.ends_with("[vvar]") || line.ends_with("[vsyscall]") {
            continue;
        }
        let mut buf = vec![0u8; len];
        if mem.read_exact_at(&mut buf, start).is_err() {
            continue;
        }
        scanned += len;
        if buf.windows(needle.len()).any(|w| w == needle) {
            return Ok(true);
        }
    }
    ensure!(scanned > 0, "nothing of process {pid} could be read");
    Ok(false)
}

/// Whether a process other than the test's still holds the world's
/// floor (the keeper forked by the gateway: a child of no one here).
fn keeper_alive(w: &World) -> bool {
    let pattern = format!("--attach {VM_IFACE}");
    let dir = w.dir().display().to_string();
    Command::new("pgrep")
        .args(["-f", &format!("{pattern}.*{dir}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs the gateway with `--attach iface --netns netns` and returns its exit
/// code and the lines of stderr that start with `Error`.
fn attach_once(
    host: &Netns,
    iface: &str,
    netns: &str,
    mtu: u16,
) -> Result<(Option<i32>, Vec<String>)> {
    let out = host
        .cmd(bin_path("sluice-gateway")?)
        .args(["--attach", iface, "--netns", netns])
        .args(["--mtu", &mtu.to_string(), "--dns-upstream", "192.0.2.53"])
        .output()
        .context("running sluice-gateway")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let errors = stderr
        .lines()
        .filter(|l| l.starts_with("Error"))
        .map(str::to_owned)
        .collect();
    Ok((out.status.code(), errors))
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn bad_input_fails_with_one_line_and_leaves_nothing_behind() -> Result<()> {
    sluice_e2e::require_root()?;
    let base = unique_name();
    let host = Netns::new(&format!("{base}h"))?;
    let ns = Netns::new(&format!("{base}v"))?;
    let path = format!("/run/netns/{}", ns.name());
    ns.ip(&["tuntap", "add", "dev", "sltun", "mode", "tun"])?;
    ns.ip(&["link", "add", "x0", "type", "veth", "peer", "name", "x1"])?;
    ns.ip(&["link", "set", "x1", "mtu", "1500"])?;
    // Something that sees the guest's frames before the floor: a clsact
    // qdisc (where a tc mirred redirect would hang), a bridge master.
    ns.ip(&["link", "add", "x2", "type", "veth", "peer", "name", "x3"])?;
    ns.sh_ok("tc qdisc add dev x2 clsact", 30)?;
    ns.ip(&["link", "add", "slbr", "type", "bridge"])?;
    ns.ip(&["link", "set", "x3", "master", "slbr"])?;
    // An nftables chain of someone else's on the ingress hook before the
    // floor's (where a `fwd` or `dup` would carry the frames past it).
    ns.ip(&["link", "add", "x8", "type", "veth", "peer", "name", "x9"])?;
    ns.sh_ok(
        "printf 'table netdev other {\\n chain c { type filter hook ingress device \"x8\" priority -600; policy accept; }\\n}\\n' | nft -f -",
        30,
    )?;

    let cases: [(&str, &str, u16, &str); 8] = [
        ("x2", path.as_str(), 1500, "`clsact` qdisc"),
        (
            "x8",
            path.as_str(),
            1500,
            "nftables ingress chain `netdev other c`",
        ),
        ("x3", path.as_str(), 1500, "a master (`slbr`"),
        ("nope", path.as_str(), 1500, "no interface `nope`"),
        ("lo", path.as_str(), 1500, "not a layer-2"),
        ("sltun", path.as_str(), 1500, "not a layer-2"),
        ("x1", path.as_str(), 65520, "exceeds the MTU 1500"),
        ("x1", "/etc/hostname", 1500, "not a network namespace"),
    ];
    for (iface, netns, mtu, want) in cases {
        let (code, errors) = attach_once(&host, iface, netns, mtu)?;
        ensure!(code == Some(1), "{iface} in {netns}: exit {code:?}");
        ensure!(
            errors.len() == 1 && errors[0].contains(want),
            "{iface} in {netns}: want one error line with `{want}`, got {errors:?}"
        );
        let t = tables(&ns)?;
        ensure!(!t.contains("sluice_floor"), "{iface}: left {t}");
    }
    // No `nft` to be found (masked by an empty bind mount in a mount
    // namespace of the gateway's own): one line that says so, nothing left.
    let out = host
        .cmd("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount --bind /dev/null /usr/sbin/nft && exec "$0" "$@""#)
        .arg(bin_path("sluice-gateway")?)
        .args(["--attach", "x1", "--netns", &path, "--mtu", "1500"])
        .args(["--dns-upstream", "192.0.2.53"])
        .output()
        .context("running sluice-gateway without nft")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("Error")).collect();
    ensure!(out.status.code() == Some(1), "without nft: {stderr}");
    ensure!(
        errors.len() == 1 && errors[0].contains("install the nftables package"),
        "without nft: want one line naming the missing nft, got {errors:?}"
    );
    let t = tables(&ns)?;
    ensure!(!t.contains("sluice_floor"), "without nft: left {t}");
    // Control: with the foreign chain gone, x8 passes that check and
    // fails only at the next one (the MTU).
    ns.sh_ok("nft delete table netdev other", 30)?;
    let (code, errors) = attach_once(&host, "x8", &path, 65520)?;
    ensure!(
        code == Some(1) && errors.len() == 1 && errors[0].contains("exceeds the MTU"),
        "x8 without the foreign chain: exit {code:?}, {errors:?}"
    );

    // Already attached: a first gateway serves x0; a second is refused and
    // leaves the first's floor and service alone.
    let log = std::env::temp_dir().join(format!("{base}-first.log"));
    let mut c = host.cmd(bin_path("sluice-gateway")?);
    c.args(["--attach", "x0", "--netns", &path]).args([
        "--mtu",
        "1500",
        "--dns-upstream",
        "192.0.2.53",
    ]);
    let mut first = Proc::spawn("first gateway", &mut c, &log)?;
    wait_until("the first gateway", Duration::from_secs(60), || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("ready: serving the guest"))
            || first.check_alive().is_err()
    })?;
    first.check_alive()?;
    let (code, errors) = attach_once(&host, "x0", &path, 1500)?;
    ensure!(code == Some(1), "second attach: exit {code:?}");
    ensure!(
        errors.len() == 1 && errors[0].contains("already attached"),
        "second attach: {errors:?}"
    );
    first.check_alive()?;
    ensure!(
        tables(&ns)?.contains(&floor_table("x0")),
        "the first floor went"
    );
    let st = first.signal_and_wait(libc::SIGTERM, Duration::from_secs(60))?;
    ensure!(st.code() == Some(0), "first gateway exit {st}");
    // The first gateway's end keeps its floor on x0, which still exists.
    let t = tables(&ns)?;
    ensure!(
        t.contains(&floor_table("x0")),
        "after the first gateway: {t}"
    );
    let _ = std::fs::remove_file(&log);
    Ok(())
}

/// Whether the running kernel has tcx (Linux 6.6 and later), read from
/// `/proc/sys/kernel/osrelease`.
fn kernel_has_tcx() -> Result<bool> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")?;
    let mut nums = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let (major, minor) = (nums.next().unwrap_or(0), nums.next().unwrap_or(0));
    Ok((major, minor) >= (6, 6))
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn an_interface_with_a_tcx_program_is_refused() -> Result<()> {
    sluice_e2e::require_root()?;
    if !kernel_has_tcx()?
        && sluice_test_skip::may_skip("tcx", "the kernel is older than 6.6: it has no tcx")
    {
        return Ok(());
    }
    let base = unique_name();
    let host = Netns::new(&format!("{base}h"))?;
    let ns = Netns::new(&format!("{base}v"))?;
    let path = format!("/run/netns/{}", ns.name());
    // tcx programs (kernel 6.6 and later: attached through bpf links, no
    // qdisc, not listed by iproute2), one on each hook.
    ns.ip(&["link", "add", "x4", "type", "veth", "peer", "name", "x5"])?;
    ns.ip(&["link", "add", "x6", "type", "veth", "peer", "name", "x7"])?;
    let tcx_in = tcx::attach(&path, "x4", tcx::INGRESS)?;
    let tcx_out = tcx::attach(&path, "x6", tcx::EGRESS)?;
    for (iface, want) in [
        ("x4", "1 tcx ingress program"),
        ("x6", "1 tcx egress program"),
    ] {
        let (code, errors) = attach_once(&host, iface, &path, 1500)?;
        ensure!(code == Some(1), "{iface}: exit {code:?}");
        ensure!(
            errors.len() == 1 && errors[0].contains(want),
            "{iface}: want one error line with `{want}`, got {errors:?}"
        );
        let t = tables(&ns)?;
        ensure!(!t.contains("sluice_floor"), "{iface}: left {t}");
    }
    // Control: with the programs detached, the same interfaces pass the
    // check and fail only at the next one (the MTU).
    drop((tcx_in, tcx_out));
    for iface in ["x4", "x6"] {
        let (code, errors) = attach_once(&host, iface, &path, 65520)?;
        ensure!(
            code == Some(1) && errors.len() == 1 && errors[0].contains("exceeds the MTU"),
            "{iface} without its tcx program: exit {code:?}, {errors:?}"
        );
    }
    Ok(())
}

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

/// A real tcx program on a real interface, through the `bpf(2)` syscall
/// (no bpftool or compiler needed): a two-instruction classifier
/// (`r0 = TC_ACT_OK; exit`) loaded as `BPF_PROG_TYPE_SCHED_CLS` and
/// attached with `BPF_LINK_CREATE` to the tcx hook, as Cilium and other
/// tcx users do. The link (and the program with it) goes when its
/// descriptor closes.
mod tcx {
    use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};

    use anyhow::{Context as _, Result, ensure};

    /// `<linux/bpf.h>` `enum bpf_attach_type`.
    pub(super) const INGRESS: u32 = 46;
    pub(super) const EGRESS: u32 = 47;
    const BPF_PROG_LOAD: libc::c_long = 5;
    const BPF_LINK_CREATE: libc::c_long = 28;
    const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;

    /// The start of `union bpf_attr` for `BPF_PROG_LOAD`.
    #[repr(C)]
    #[derive(Default)]
    struct ProgLoad {
        prog_type: u32,
        insn_cnt: u32,
        insns: u64,
        license: u64,
        log_level: u32,
        log_size: u32,
        log_buf: u64,
        kern_version: u32,
        prog_flags: u32,
        prog_name: [u8; 16],
        prog_ifindex: u32,
        expected_attach_type: u32,
    }

    /// `union bpf_attr` for `BPF_LINK_CREATE` with its `tcx` member.
    #[repr(C)]
    #[derive(Default)]
    struct LinkCreate {
        prog_fd: u32,
        target_ifindex: u32,
        attach_type: u32,
        flags: u32,
        relative_fd: u32,
        _pad: u32,
        expected_revision: u64,
    }

    fn bpf<T>(cmd: libc::c_long, attr: &mut T, what: &str) -> Result<OwnedFd> {
        let size = u32::try_from(size_of::<T>())?;
        // SAFETY: `attr` is a repr(C) mirror of the start of `union
        // bpf_attr` for `cmd`, `size` bytes long, alive across the call;
        // the pointers it holds (instructions, license) point at data that
        // outlives the call.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, std::ptr::from_mut(attr), size) };
        ensure!(rc >= 0, "{what}: {}", std::io::Error::last_os_error());
        let fd = i32::try_from(rc)?;
        // SAFETY: the kernel returned a new descriptor that nothing else owns.
        #[allow(unsafe_code)]
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Attaches the program to `iface` in the namespace at `netns` on the
    /// tcx hook `attach_type`; the link lives as long as the returned fd.
    pub(super) fn attach(netns: &str, iface: &str, attach_type: u32) -> Result<OwnedFd> {
        let (netns, iface) = (netns.to_owned(), iface.to_owned());
        std::thread::spawn(move || -> Result<OwnedFd> {
            let ns = std::fs::File::open(&netns).with_context(|| netns.clone())?;
            // SAFETY: setns only changes this thread's namespace; `ns` is open.
            #[allow(unsafe_code)]
            let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            ensure!(rc == 0, "setns: {}", std::io::Error::last_os_error());
            let name = std::ffi::CString::new(iface.clone())?;
            // SAFETY: `name` is a NUL-terminated string alive across the call.
            #[allow(unsafe_code)]
            let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
            ensure!(index != 0, "no interface {iface}");
            // r0 = 0 (TC_ACT_OK); exit.
            let insns: [u64; 2] = [0xb7, 0x95];
            let license = b"GPL\0";
            let mut load = ProgLoad {
                prog_type: BPF_PROG_TYPE_SCHED_CLS,
                insn_cnt: 2,
                insns: insns.as_ptr() as u64,
                license: license.as_ptr() as u64,
                ..ProgLoad::default()
            };
            let prog = bpf(BPF_PROG_LOAD, &mut load, "loading a tc classifier")?;
            let mut link = LinkCreate {
                prog_fd: u32::try_from(prog.as_raw_fd())?,
                target_ifindex: index,
                attach_type,
                ..LinkCreate::default()
            };
            bpf(BPF_LINK_CREATE, &mut link, "attaching it to a tcx hook")
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the tcx thread panicked"))?
    }
}

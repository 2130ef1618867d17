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
//! and bad input. What a VMM's TAP writes is in `attach/tap.rs`, the tcx
//! refusal in `attach/tcx.rs` (modules of this test binary). Needs root:
//! run via `scripts/test` (or
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
#[path = "attach/tap.rs"]
mod tap;
#[path = "attach/tcx.rs"]
mod tcx;

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
    floor_kept_and_link_down(vm)?;
    let ping = kernel_ping(vm, gateway)?;
    unanswered(&w, &ping, "after a normal end")?;
    vm.ip(&["link", "set", VM_IFACE, "up"])?;
    unanswered(&w, &ping, "once the link was set up again")?;
    answered_without_the_floor(&w, vm, &ping)
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
    // Without the floor the VM namespace's kernel, given the gateway's
    // address, would answer the guest's ping; with it, it answers nothing.
    let ping = kernel_ping(vm, gateway)?;
    unanswered(&w, &ping, "behind the floor the gateway left")?;
    answered_without_the_floor(&w, vm, &ping)
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
    floor_kept_and_link_down(vm)?;
    let ping = kernel_ping(vm, gateway)?;
    vm.ip(&["link", "set", VM_IFACE, "up"])?;
    unanswered(&w, &ping, "with the link set up after the end")?;
    answered_without_the_floor(&w, vm, &ping)
}

/// After a fail-closed end the floor is still on the VM's interface and
/// the link is down.
fn floor_kept_and_link_down(vm: &Netns) -> Result<()> {
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
    Ok(())
}

/// Gives the VM namespace's kernel the gateway's address and returns the
/// guest's ping of it. The guest still maps that address to the gateway's
/// MAC, so the ping forgets its neighbours first.
fn kernel_ping(vm: &Netns, gateway: impl std::fmt::Display) -> Result<String> {
    vm.ip(&["addr", "add", &format!("{gateway}/24"), "dev", VM_IFACE])?;
    Ok(format!(
        "ip neigh flush all; busybox ping -c 3 -w 10 {gateway}"
    ))
}

/// The guest's `ping` gets no answer; `when` completes the failure.
fn unanswered(w: &World, ping: &str, when: &str) -> Result<()> {
    let out = w.guest_sh(ping, 30)?;
    ensure!(
        !out.status.success(),
        "the namespace's kernel answered the guest {when}: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    Ok(())
}

/// The control that shows [`unanswered`] can fail: with the floor deleted
/// by hand, the same ping is answered.
fn answered_without_the_floor(w: &World, vm: &Netns, ping: &str) -> Result<()> {
    delete_floors(vm, VM_IFACE)?;
    w.guest_ok(ping, 30)
        .context("with no floor the kernel should answer")?;
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

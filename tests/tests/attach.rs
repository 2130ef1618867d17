//! `sluice-gateway --attach` end to end (issue 13): the guest's veth end in
//! its namespace faces one in a "VM" namespace, the gateway (in the host
//! namespace) attaches to that with a packet socket behind its nftables
//! floor. Real udhcpc, dig and curl; the fake internet's dnsmasq and origin.
//!
//! The datapath suites run over this transport too
//! (`SLUICE_E2E_TRANSPORT=attach`, docs/testing.md); this file holds what
//! only `--attach` has: a policy decided the same way, the floor's life
//! (present while serving, gone after SIGTERM, kept after SIGKILL and then
//! biting), and bad input. Needs root: run via `scripts/test` (or
//! `cargo test --release -p sluice-e2e --test attach -- --include-ignored`).

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use sluice_e2e::{
    Netns, ORIGIN_ADDR, ORIGIN_NAME, ORIGIN2_NAME, Proc, REFUSING_ADDR, Transport, VM_IFACE, World,
    bin_path, unique_name, wait_until,
};

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

/// The floor's table for [`VM_IFACE`] (as the floor crate names it).
fn floor_table(iface: &str) -> String {
    sluice_floor::ingress::table_name(iface)
}

/// `nft list tables` inside `ns`.
fn tables(ns: &Netns) -> Result<String> {
    ns.sh_ok("nft list tables", 30)
}

fn vm(w: &World) -> Result<&Netns> {
    w.vm.as_ref().context("an attach world has a VM namespace")
}

#[test]
#[ignore = "needs root: run via scripts/test"]
fn attach_serves_dhcp_dns_and_policy_and_removes_its_floor_on_sigterm() -> Result<()> {
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

    let st = w
        .sidecar()
        .context("no sidecar")?
        .signal_and_wait(libc::SIGTERM, Duration::from_secs(60))?;
    ensure!(st.code() == Some(0), "exit {st}\n{}", w.sidecar_log());
    let left = tables(vm(&w)?)?;
    ensure!(
        !left.contains(&floor_table(VM_IFACE)),
        "the floor outlived a SIGTERM: {left}"
    );
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
    vm.sh_ok(
        &format!(
            "nft delete table netdev {0}; nft delete table inet {0}",
            floor_table(VM_IFACE)
        ),
        30,
    )?;
    w.guest_ok(&ping, 30)
        .context("without the floor the kernel should answer")?;
    Ok(())
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

    let cases: [(&str, &str, u16, &str); 5] = [
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
    let t = tables(&ns)?;
    ensure!(!t.contains("sluice_floor"), "after the first gateway: {t}");
    let _ = std::fs::remove_file(&log);
    Ok(())
}

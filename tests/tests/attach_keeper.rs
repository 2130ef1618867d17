//! The floor keeper's checks while an `--attach` gateway serves, beyond
//! nftables: what attach refuses at install (a `clsact` qdisc, whose tc
//! ingress runs before the floor's netdev hook) added to the interface
//! afterwards ends the gateway fail closed, as a deleted floor does
//! (`tests/tests/attach.rs`); and the end's acts on the interface, which
//! never touch another interface that took its index once it was gone,
//! and find the interface by index after a rename;
//! a floor that stops holding is put back by the keeper at once, not at
//! the gateway's end; a keeper that dies ends the gateway fail closed.
//! Needs root: run via `scripts/test` (or
//! `cargo test --release -p sluice-e2e --test attach_keeper --
//! --include-ignored`).

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use attach_support::{
    ended_by_itself_with, ended_with_the_floor_put_back, floor_table, one_error, tables, vm,
};
use sluice_e2e::{ORIGIN_NAME, Transport, VM_IFACE, World, wait_until};

mod attach_support;

#[test]
#[ignore = "needs root: run via scripts/test"]
fn a_clsact_qdisc_added_while_serving_ends_the_gateway_fail_closed() -> Result<()> {
    let mut w = serving()?;
    // Kata's `tcfilter` model, or the CNI bandwidth plugin, adding its
    // qdisc to the interface while the gateway serves: a `mirred`
    // redirect there would carry the guest's frames past the floor.
    vm(&w)?.sh_ok(&format!("tc qdisc add dev {VM_IFACE} clsact"), 30)?;
    ended_by_itself_with(
        &mut w,
        &[
            "the floor stopped holding while the gateway served",
            "`clsact` qdisc",
            "only the link being down holds them",
        ],
        &["fail closed"],
    )?;
    // Fail closed: the interface is down and the floor is on it.
    let vm = vm(&w)?;
    ensure!(
        tables(vm)?.contains(&floor_table(VM_IFACE)),
        "no floor after the end: {}",
        tables(vm)?
    );
    let link = vm.sh_ok(&format!("ip -o link show dev {VM_IFACE}"), 30)?;
    ensure!(link.contains("state DOWN"), "{VM_IFACE}: {link}");
    Ok(())
}

/// A `clsact` qdisc added just before the gateway's end (before the
/// keeper's next check can see it): the end still finds it, and the
/// gateway exits 1 saying the link being down is all that holds, never
/// that the floor is back and the end fail closed.
#[test]
#[ignore = "needs root: run via scripts/test"]
fn a_bypass_added_just_before_the_end_is_reported_by_the_end() -> Result<()> {
    let mut w = serving()?;
    vm(&w)?.sh_ok(&format!("tc qdisc add dev {VM_IFACE} clsact"), 30)?;
    let st = w
        .sidecar()
        .context("no sidecar")?
        .signal_and_wait(libc::SIGTERM, Duration::from_secs(60))?;
    one_error(
        &w,
        st,
        &["`clsact` qdisc", "only the link being down holds them"],
        &["fail closed"],
    )?;
    let log = w.sidecar_log();
    ensure!(
        !log.contains("its floor stays on it (fail closed)"),
        "the end claimed fail closed with a bypass there: {log}"
    );
    let link = vm(&w)?.sh_ok(&format!("ip -o link show dev {VM_IFACE}"), 30)?;
    ensure!(link.contains("state DOWN"), "{VM_IFACE}: {link}");
    Ok(())
}

/// An attached world whose guest has already reached the origin once.
fn serving() -> Result<World> {
    let w = World::builder().transport(Transport::Attach).start()?;
    w.guest_ok(&format!("curl -sS --max-time 60 http://{ORIGIN_NAME}/"), 90)?;
    Ok(w)
}

/// The gateway's process id and its floor keeper's.
fn gateway_and_keeper(w: &World) -> Result<(u32, u32)> {
    let gateway = w.sidecar_pid().context("no gateway")?;
    Ok((gateway, keeper_of(gateway)?))
}

/// The floor keeper: the gateway's child.
fn keeper_of(gateway: u32) -> Result<u32> {
    let children = std::process::Command::new("pgrep")
        .args(["-P", &gateway.to_string()])
        .output()
        .context("running pgrep")?;
    String::from_utf8_lossy(&children.stdout)
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .context("no floor keeper (a child of the gateway)")
}

/// The name of the floor's table on `iface` in `ns` (one gateway's).
fn floor_name(ns: &sluice_e2e::Netns, iface: &str) -> Result<String> {
    let listed = tables(ns)?;
    listed
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .find(|name| name.starts_with(&floor_table(iface)))
        .map(str::to_owned)
        .with_context(|| format!("no floor on {iface}: {listed}"))
}

/// Whether both tables of the floor `name` are in `ns`.
fn floor_there(ns: &sluice_e2e::Netns, name: &str) -> bool {
    tables(ns).is_ok_and(|t| {
        t.contains(&format!("table netdev {name}")) && t.contains(&format!("table inet {name}"))
    })
}

/// The floor deleted by hand while the gateway serves: the keeper puts it
/// back at once, and again when it is deleted again, without waiting for
/// the gateway's end (stopped here, so that it cannot come), then the
/// gateway, let go, exits 1 with the reason in one line.
#[test]
#[ignore = "needs root: run via scripts/test"]
fn a_deleted_floor_is_put_back_by_the_keeper_before_the_gateways_end() -> Result<()> {
    let mut w = serving()?;
    let gateway = w.sidecar_pid().context("no gateway")?;
    let ns = vm(&w)?;
    let name = floor_name(ns, VM_IFACE)?;
    signal(&[gateway], "STOP")?;
    let tampered = (|| -> Result<()> {
        for round in 0..2 {
            ns.sh_ok(
                &format!("nft delete table netdev {name}; nft delete table inet {name}"),
                30,
            )?;
            ensure!(!floor_there(ns, &name), "round {round}: not deleted");
            wait_until(
                "the keeper to put the floor back",
                Duration::from_secs(30),
                || floor_there(ns, &name),
            )?;
            let link = ns.sh_ok(&format!("ip -o link show dev {VM_IFACE}"), 30)?;
            ensure!(link.contains("state DOWN"), "round {round}: {link}");
        }
        Ok(())
    })();
    signal(&[gateway], "CONT")?;
    tampered?;
    ended_with_the_floor_put_back(&mut w)?;
    ensure!(floor_there(vm(&w)?, &name), "no floor after the end");
    Ok(())
}

/// The keeper killed (SIGKILL, as the OOM killer would) while the gateway
/// serves: nothing would check the floor any more, so the gateway ends
/// the session fail closed, the interface down, the floor as it was, and
/// exits 1 with one line that says why.
#[test]
#[ignore = "needs root: run via scripts/test"]
fn a_killed_keeper_ends_the_gateway_fail_closed() -> Result<()> {
    let mut w = serving()?;
    let (_, keeper) = gateway_and_keeper(&w)?;
    let name = floor_name(vm(&w)?, VM_IFACE)?;
    signal(&[keeper], "KILL")?;
    ended_by_itself_with(
        &mut w,
        &[
            "the floor keeper died while the gateway served",
            "the interface was set down",
        ],
        &[],
    )?;
    let ns = vm(&w)?;
    ensure!(
        floor_there(ns, &name),
        "no floor after the end: {}",
        tables(ns)?
    );
    let link = ns.sh_ok(&format!("ip -o link show dev {VM_IFACE}"), 30)?;
    ensure!(link.contains("state DOWN"), "{VM_IFACE}: {link}");
    Ok(())
}

/// Sends `sig` (`STOP`, `CONT`, `KILL`) to `pids`.
fn signal(pids: &[u32], sig: &str) -> Result<()> {
    let st = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .args(pids.iter().map(u32::to_string))
        .status()
        .context("running kill")?;
    ensure!(st.success(), "kill -{sig} {pids:?}: {st}");
    Ok(())
}

/// The interface goes and another takes its index before the gateway or
/// its keeper looks (both stopped meanwhile): the end sets nothing down
/// and installs no floor on the newcomer, and removes the floor.
#[test]
#[ignore = "needs root: run via scripts/test"]
fn an_interface_given_the_index_of_the_gone_one_is_left_alone() -> Result<()> {
    let mut w = serving()?;
    let (gateway, keeper) = gateway_and_keeper(&w)?;
    let ns = vm(&w)?;
    let index = ns
        .sh_ok(&format!("cat /sys/class/net/{VM_IFACE}/ifindex"), 30)?
        .trim()
        .to_owned();
    // In the world's own VM namespace: no other test's.
    let other = "swap0".to_owned();
    signal(&[gateway, keeper], "STOP")?;
    let swapped = ns.sh_ok(
        &format!(
            "ip link del {VM_IFACE} && ip link add {other} index {index} type veth peer name {other}p && ip link set {other} up && ip link set {other}p up"
        ),
        30,
    );
    signal(&[keeper, gateway], "CONT")?;
    swapped?;
    let sidecar = w.sidecar().context("no sidecar")?;
    wait_until("the gateway to end", Duration::from_secs(60), || {
        sidecar.check_alive().is_err()
    })?;
    let log = w.sidecar_log();
    let ns = vm(&w)?;
    let link = ns.sh_ok(&format!("ip -o link show dev {other}"), 30)?;
    ensure!(
        link.contains(",UP") || link.contains("<UP"),
        "the newcomer was set down: {link}\n{log}"
    );
    let left = tables(ns)?;
    ensure!(
        !left.contains(&floor_table(VM_IFACE)) && !left.contains(&floor_table(&other)),
        "a floor after the end: {left}\n{log}"
    );
    Ok(())
}

/// The interface is renamed while the gateway and its keeper are stopped:
/// the end sets it down under its new name (by index, never by a name
/// looked up and resolved again).
#[test]
#[ignore = "needs root: run via scripts/test"]
fn a_renamed_interface_is_set_down_by_the_end() -> Result<()> {
    let mut w = serving()?;
    let (gateway, keeper) = gateway_and_keeper(&w)?;
    // In the world's own VM namespace: no other test's.
    let renamed = "moved0";
    signal(&[gateway, keeper], "STOP")?;
    let moved = vm(&w)?.sh_ok(
        &format!(
            "ip link set {VM_IFACE} down && ip link set {VM_IFACE} name {renamed} && ip link set {renamed} up"
        ),
        30,
    );
    signal(&[keeper, gateway], "CONT")?;
    moved?;
    let up = vm(&w)?.sh_ok(&format!("ip -o link show dev {renamed}"), 30)?;
    ensure!(up.contains(",UP") || up.contains("<UP"), "not up: {up}");
    let sidecar = w.sidecar().context("no sidecar")?;
    // The keeper may see the rename first and end the gateway itself;
    // either way it has ended and been reaped after this.
    if sidecar.check_alive().is_ok() {
        sidecar.signal_and_wait(libc::SIGTERM, Duration::from_secs(60))?;
    }
    let log = w.sidecar_log();
    let link = vm(&w)?.sh_ok(&format!("ip -o link show dev {renamed}"), 30)?;
    ensure!(
        link.contains("state DOWN") && !link.contains(",UP") && !link.contains("<UP"),
        "{renamed} is up after the end: {link}\n{log}"
    );
    Ok(())
}

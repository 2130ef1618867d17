//! What the `--attach` end-to-end tests share: the floor's tables in the
//! VM namespace, and that namespace.

#![allow(
    dead_code,
    reason = "each test binary uses its own part of these helpers"
)]

use anyhow::{Context, Result, ensure};
use sluice_e2e::{Netns, World};

/// The start of the name of every floor table on `iface` (each gateway's
/// floor is a table of its own instance's: the floor crate's names).
pub(crate) fn floor_table(iface: &str) -> String {
    sluice_floor::ingress::table_prefix(iface)
}

/// Deletes every floor table on `iface` in `ns`, as an operator would.
pub(crate) fn delete_floors(ns: &Netns, iface: &str) -> Result<()> {
    ns.sh_ok(
        &format!(
            "nft list tables | while read -r _ family name; do case $name in {}*) nft delete table $family $name;; esac; done",
            floor_table(iface)
        ),
        30,
    )?;
    let left = tables(ns)?;
    ensure!(!left.contains(&floor_table(iface)), "left: {left}");
    Ok(())
}

/// `nft list tables` inside `ns`.
pub(crate) fn tables(ns: &Netns) -> Result<String> {
    ns.sh_ok("nft list tables", 30)
}

/// The world's VM namespace (an attach world has one).
pub(crate) fn vm(w: &World) -> Result<&Netns> {
    w.vm.as_ref().context("an attach world has a VM namespace")
}

/// Waits (at most a minute) for the gateway of `w` to end by itself, then
/// checks [`one_error`].
pub(crate) fn ended_by_itself_with(w: &mut World, has: &[&str], lacks: &[&str]) -> Result<()> {
    let sidecar = w.sidecar().context("no sidecar")?;
    sluice_e2e::wait_until(
        "the gateway to end",
        std::time::Duration::from_secs(60),
        || sidecar.check_alive().is_err(),
    )?;
    let st = sidecar.signal_and_wait(0, std::time::Duration::from_secs(10))?;
    one_error(w, st, has, lacks)
}

/// The gateway of `w` exited with status 1 (`st`) and its log has exactly
/// one `Error` line, which contains every string of `has` and none of
/// `lacks`.
pub(crate) fn one_error(
    w: &World,
    st: std::process::ExitStatus,
    has: &[&str],
    lacks: &[&str],
) -> Result<()> {
    let log = w.sidecar_log();
    ensure!(st.code() == Some(1), "exit {st}\n{log}");
    let errors: Vec<&str> = log.lines().filter(|l| l.starts_with("Error")).collect();
    ensure!(
        errors.len() == 1
            && has.iter().all(|s| errors[0].contains(s))
            && !lacks.iter().any(|s| errors[0].contains(s)),
        "want one error line with {has:?} and without {lacks:?}: {log}"
    );
    Ok(())
}

/// The gateway ended by itself after its keeper found the floor gone
/// while it served, and put it back.
pub(crate) fn ended_with_the_floor_put_back(w: &mut World) -> Result<()> {
    ended_by_itself_with(
        w,
        &[
            "the floor stopped holding while the gateway served",
            "its floor is back on it",
        ],
        &[],
    )
}

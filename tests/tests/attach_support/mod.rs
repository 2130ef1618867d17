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

//! Floors left behind, as each kernel leaves them, and the next install
//! that deletes them. Real `nft`, namespaces and veths the test creates.
//! Needs root; without it the test fails unless `SLUICE_TEST_MAY_SKIP`
//! names `root`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers: a panic is a failed test"
)]

use sluice_floor::ingress::Ended;

mod support;

use support::{install, is_root, nft_script, pair};

/// A kernel older than 6.16 deletes a netdev chain with its only device:
/// a floor kept on a TAP that was deleted after its gateway ended leaves
/// an empty netdev table and the inet table with its forward drop. The
/// next install deletes that pair, and leaves alone a pair someone
/// altered (a rule in the forward chain, a chain of their own).
#[test]
fn the_next_floor_deletes_what_an_older_kernel_leaves_of_a_floor() {
    if !is_root() && sluice_test_skip::may_skip("root", "nft and namespaces need root") {
        return;
    }
    let (g, _p) = pair("ol");
    let forward = "chain no_forward { type filter hook forward priority -500; policy drop; }";
    let left = "sluice_floor_gone0_1f_18ec0000";
    let ruled = "sluice_floor_gone1_1f_18ec0001";
    let extra = "sluice_floor_gone2_1f_18ec0002";
    let not_ours = "sluice_floor_gone3";
    nft_script(
        &g,
        &format!(
            "table netdev {left} {{\n}}\ntable inet {left} {{\n {forward}\n}}\n\
             table netdev {ruled} {{\n}}\ntable inet {ruled} {{\n {forward}\n}}\n\
             add rule inet {ruled} no_forward counter\n\
             table netdev {extra} {{\n}}\ntable inet {extra} {{\n {forward}\n chain mine {{ }}\n}}\n\
             table netdev {not_ours} {{\n}}\ntable inet {not_ours} {{\n {forward}\n}}\n"
        ),
        false,
    );
    let floor = install(&g.path(), "g0");
    let tables = g.tables();
    assert!(!tables.contains(left), "{tables}");
    for kept in [ruled, extra, not_ours] {
        assert_eq!(tables.matches(kept).count(), 2, "{kept}: {tables}");
    }
    assert!(tables.contains(floor.table()), "{tables}");
    floor.check().unwrap();
    assert_eq!(floor.remove().unwrap(), Ended::Kept);
}

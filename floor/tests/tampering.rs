//! The ingress floor's check against what the namespace's ruleset can be
//! made to say: names that desynchronise nft's text listing, a floor
//! deleted and forged by a table's name, a dormant floor table. Real
//! `nft`, namespaces and veths the test creates. Needs root; without it
//! the test fails unless `SLUICE_TEST_MAY_SKIP` names `root`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers: a panic is a failed test"
)]

use sluice_floor::FloorError;
use sluice_floor::ingress::{Ended, Foreign, IngressFloor};

mod support;

use support::{delete_by_hand, install, is_root, kernel_answers, nft_script, ok, pair};

/// An interface may be named `a}`: nft's text listing prints a device list
/// hooked on it and on `g0` as `devices = { a}, g0 }`, which a reader of
/// the text stops reading at `a`. The chain is still seen on `g0`.
#[test]
fn a_chain_on_an_interface_named_with_a_brace_is_still_seen() {
    if !is_root() && sluice_test_skip::may_skip("root", "nft and namespaces need root") {
        return;
    }
    let (g, _p) = pair("br");
    ok(&[
        "ip", "-n", &g.0, "link", "add", "a}", "type", "veth", "peer", "name", "a1",
    ]);
    nft_script(
        &g,
        "table netdev ahead {\n chain c { type filter hook ingress devices = { \"a}\", g0 } priority -600; policy accept; }\n}\n",
        false,
    );
    let e = IngressFloor::install(Some(&g.path()), "g0", Foreign::Refuse).unwrap_err();
    assert!(matches!(e, FloorError::Bypass { .. }), "{e}");
    assert!(e.to_string().contains("netdev ahead c"), "{e}");
    assert!(!g.tables().contains("sluice_floor"), "{}", g.tables());
}

/// The text listing prints a table's name as it is, newlines included: a
/// name can print a copy of a floor. With the floor's tables deleted and
/// such a table made, the check fails.
#[test]
fn a_deleted_floor_never_verifies_whatever_a_tables_name_prints() {
    if !is_root() && sluice_test_skip::may_skip("root", "nft and namespaces need root") {
        return;
    }
    let (g, _p) = pair("fg");
    let floor = install(&g.path(), "g0");
    floor.check().unwrap();
    let t = floor.table().to_owned();
    delete_by_hand(&g, &t);
    // Two names (of at most 256 bytes each) print a copy of both tables.
    let netdev = format!(
        "x\n}}\ntable netdev {t} {{\n\tchain guest_in {{\n\t\ttype filter hook ingress device \"g0\" priority -500; policy drop;\n\t}}\n}}\ntable netdev y"
    );
    let inet = format!(
        "z\n}}\ntable inet {t} {{\n\tchain no_forward {{\n\t\ttype filter hook forward priority -500; policy drop;\n\t}}\n}}\ntable netdev w"
    );
    let add = serde_json::json!({"nftables": [
        {"add": {"table": {"family": "netdev", "name": netdev}}},
        {"add": {"table": {"family": "netdev", "name": inet}}},
    ]});
    nft_script(&g, &add.to_string(), true);
    // The forgery is there to be read in the text listing.
    let text =
        String::from_utf8(g.exec(&["nft", "list", "ruleset"]).output().unwrap().stdout).unwrap();
    assert!(text.contains(&format!("table netdev {t} {{")), "{text}");
    assert!(text.contains(&format!("table inet {t} {{")), "{text}");
    let e = floor.check().unwrap_err();
    assert!(matches!(e, FloorError::Verify { .. }), "{e}");
    assert!(
        e.to_string().contains(&format!("no table netdev {t}")),
        "{e}"
    );
    std::mem::forget(floor);
}

/// `flags dormant` unhooks every chain of a table and leaves them listed
/// as they were: the kernel answers the guest again. The check fails;
/// the floor's end puts it back awake.
#[test]
fn a_dormant_floor_table_fails_the_check_and_the_end_wakes_the_floor() {
    if !is_root() && sluice_test_skip::may_skip("root", "nft and namespaces need root") {
        return;
    }
    let (g, p) = pair("dm");
    let floor = install(&g.path(), "g0");
    assert!(!kernel_answers(&p, "10.99.0.1"), "the floor should hold");
    let t = floor.table().to_owned();
    let dormant = |family: &str| {
        ok(&[
            "ip",
            "netns",
            "exec",
            &g.0,
            "nft",
            "add",
            "table",
            family,
            &t,
            "{ flags dormant; }",
        ]);
    };
    dormant("netdev");
    assert!(
        kernel_answers(&p, "10.99.0.1"),
        "a dormant floor table should unhook the floor"
    );
    let e = floor.check().unwrap_err();
    assert!(matches!(e, FloorError::Verify { .. }), "{e}");
    assert!(e.to_string().contains("dormant"), "{e}");
    // The end (kept: the interface exists) puts the floor back awake.
    assert_eq!(floor.remove().unwrap(), Ended::Kept);
    ok(&["ip", "-n", &g.0, "link", "set", "g0", "up"]);
    assert!(
        !kernel_answers(&p, "10.99.0.1"),
        "the floor should hold again"
    );
    let tables = String::from_utf8(
        g.exec(&["nft", "list", "table", "netdev", &t])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert!(!tables.contains("dormant"), "{tables}");
    // The inet table made dormant opens forwarding: the check fails too.
    let floor = install(&g.path(), "g0");
    let t = floor.table().to_owned();
    ok(&[
        "ip",
        "netns",
        "exec",
        &g.0,
        "nft",
        "add",
        "table",
        "inet",
        &t,
        "{ flags dormant; }",
    ]);
    let e = floor.check().unwrap_err();
    assert!(e.to_string().contains(&format!("table inet {t}")), "{e}");
    std::mem::forget(floor);
}

/// The end sets the interface down by its index over rtnetlink, with no
/// tool, and puts the floor back whatever happened to it: with iproute2's
/// `ip` hidden from the thread that ends the floor (a mount namespace of
/// its own, `/dev/null` bound over every `ip` the floor could look for),
/// a floor deleted by hand is back and the interface down.
#[test]
fn the_end_needs_no_ip_and_puts_a_deleted_floor_back_with_the_link_down() {
    if !is_root() && sluice_test_skip::may_skip("root", "nft and namespaces need root") {
        return;
    }
    let (g, p) = pair("ni");
    let floor = install(&g.path(), "g0");
    let t = floor.table().to_owned();
    delete_by_hand(&g, &t);
    assert!(
        kernel_answers(&p, "10.99.0.1"),
        "without its floor the kernel should answer (the control)"
    );
    let ended = std::thread::spawn(move || {
        use rustix::mount::{MountPropagationFlags, mount_bind, mount_change};
        // This thread's own mount namespace: the test's other threads,
        // and every other process, still see `ip`.
        #[allow(unsafe_code, reason = "unshare(2) of the mount namespace only")]
        // SAFETY: NEWNS alone leaves the descriptor table shared (the
        // unsafety of `unshare_unsafe` is CLONE_FILES's), so every
        // descriptor this process owns stays valid.
        unsafe {
            rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS).unwrap();
        }
        mount_change(
            "/",
            MountPropagationFlags::REC | MountPropagationFlags::PRIVATE,
        )
        .unwrap();
        let dirs = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"];
        for dir in dirs {
            let ip = std::path::Path::new(dir).join("ip");
            if ip.is_file() {
                mount_bind("/dev/null", &ip).unwrap();
            }
        }
        for dir in dirs {
            let ip = std::path::Path::new(dir).join("ip");
            assert!(!ip.is_file(), "{} still there", ip.display());
        }
        floor.remove()
    })
    .join()
    .unwrap();
    assert_eq!(ended.unwrap(), Ended::Kept);
    let link = String::from_utf8(
        g.exec(&["ip", "-o", "link", "show", "dev", "g0"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert!(link.contains("state DOWN"), "{link}");
    let tables = g.tables();
    for family in ["netdev", "inet"] {
        assert!(tables.contains(&format!("table {family} {t}")), "{tables}");
    }
    ok(&["ip", "-n", &g.0, "link", "set", "g0", "up"]);
    assert!(
        !kernel_answers(&p, "10.99.0.1"),
        "the floor should hold again"
    );
}

/// The interface renamed to a name nft could read as more than it
/// (`g*`, a wildcard on newer kernels): the floor is never applied on
/// that name. Putting it back and the end set the link down, leave the
/// floor's tables as they were and say so.
#[test]
fn a_floor_is_never_hooked_on_a_wildcard_name_the_interface_was_given() {
    if !is_root() && sluice_test_skip::may_skip("root", "nft and namespaces need root") {
        return;
    }
    let (g, _p) = pair("wc");
    let floor = install(&g.path(), "g0");
    let t = floor.table().to_owned();
    let listed = || {
        String::from_utf8(
            g.exec(&["nft", "list", "table", "netdev", &t])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap()
    };
    let before = listed();
    ok(&["ip", "-n", &g.0, "link", "set", "g0", "name", "g*"]);
    ok(&["ip", "-n", &g.0, "link", "set", "g*", "up"]);
    let e = floor.restore().unwrap_err();
    assert!(matches!(e, FloorError::UnsafeName { .. }), "{e}");
    assert!(
        e.to_string().contains("`g*`") && e.to_string().contains("it was set down"),
        "{e}"
    );
    let link = String::from_utf8(
        g.exec(&["ip", "-o", "link", "show", "dev", "g*"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert!(link.contains("state DOWN"), "{link}");
    assert_eq!(listed(), before, "the tables should be as they were");
    let e = floor.remove().unwrap_err();
    assert!(matches!(e, FloorError::UnsafeName { .. }), "{e}");
    assert_eq!(listed(), before, "the tables should be as they were");
}

//! The floors against the real kernel: namespaces, a veth pair and `nft`,
//! all created by the test and removed after. Needs root; without it the
//! test fails unless `SLUICE_TEST_MAY_SKIP` names `root`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers: a panic is a failed test"
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sluice_floor::FloorError;
use sluice_floor::egress::{
    EgressFloor, EgressSpec, Owner, Removal, always_denied, non_public, remove_table,
};
use sluice_floor::ingress::{Ended, Foreign, IngressFloor, table_prefix};

mod support;

use support::{Netns, PY, delete_by_hand, install, is_root, kernel_answers, ok, pair, run};

const PACKET_READER: &str = r#"
import socket
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
s.bind(("g0", 0))
s.settimeout(8)
print("ready", flush=True)
n = 0
try:
    while n < 3:
        s.recv(65535)
        n += 1
except socket.timeout:
    pass
print(n)
"#;

#[test]
fn the_ingress_floor_silences_the_kernel_while_a_packet_socket_reads_every_frame() {
    if !is_root() && sluice_test_skip::may_skip("root", "nft and namespaces need root") {
        return;
    }
    let (g, p) = pair("in");
    assert!(
        (0..5).any(|_| kernel_answers(&p, "10.99.0.1")),
        "the kernel answers before the floor"
    );

    let floor = install(&g.path(), "g0");
    assert!(g.tables().contains(floor.table()));
    floor.check().unwrap();
    // A packet socket in the namespace still sees the guest's frames.
    let mut reader = g
        .exec(&[PY, "-c", PACKET_READER])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(reader.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    assert!(
        !kernel_answers(&p, "10.99.0.1"),
        "the kernel answered through the floor"
    );
    line.clear();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    let _ = reader.wait();
    let frames: u32 = line.trim().parse().unwrap();
    assert!(frames >= 1, "the packet socket read {frames} frames");

    // A second instance gets tables of its own beside the first's.
    let again = install(&g.path(), "g0");
    assert_ne!(floor.table(), again.table());
    assert_eq!(
        g.tables().matches(&table_prefix("g0")).count(),
        4,
        "{}",
        g.tables()
    );
    // The first, never having served, goes with its own tables only.
    drop(floor);
    assert_eq!(
        g.tables().matches(&table_prefix("g0")).count(),
        2,
        "{}",
        g.tables()
    );
    again.check().unwrap();
    let table = again.table().to_owned();
    // The end of a gateway on a live interface is fail closed: the link is
    // cut AND the floor stays on it.
    assert_eq!(again.remove().unwrap(), Ended::Kept);
    assert!(g.tables().contains(&table), "{}", g.tables());
    assert!(link_of(&g, "g0").contains("state DOWN"));
    assert!(
        !kernel_answers(&p, "10.99.0.1"),
        "the kernel answered after the gateway's end"
    );
    // Something with CAP_NET_ADMIN in the namespace (a VMM run as root, a
    // network manager) sets the link up again: still nothing reaches the
    // kernel.
    ok(&["ip", "-n", &g.0, "link", "set", "g0", "up"]);
    assert!(
        !kernel_answers(&p, "10.99.0.1"),
        "the kernel answered with the link set up again after the end"
    );
    // Control: the same probe, with the kept floor deleted by hand, is
    // answered (so the probe above could have failed).
    delete_by_hand(&g, &table);
    assert!(
        (0..5).any(|_| kernel_answers(&p, "10.99.0.1")),
        "the kernel answers with the link up and no floor"
    );
    // An interface gone by the end (the VM went first) takes the floor
    // with it: nothing is left.
    let floor = install(&g.path(), "g0");
    assert!(g.tables().contains(floor.table()), "{}", g.tables());
    ok(&["ip", "-n", &g.0, "link", "del", "g0"]);
    assert_eq!(floor.remove().unwrap(), Ended::Removed);
    assert!(!g.tables().contains("sluice_floor"), "{}", g.tables());
}

/// `ip -o link show IFACE` in `ns`.
fn link_of(ns: &Netns, iface: &str) -> String {
    String::from_utf8(run(&["ip", "-n", &ns.0, "-o", "link", "show", iface]).stdout).unwrap()
}

/// `nft list ruleset` in `ns`.
fn ruleset_of(ns: &Netns) -> String {
    String::from_utf8(
        ns.exec(&["nft", "list", "ruleset"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
}

#[test]
fn the_ingress_floor_acts_only_in_the_namespace_it_was_installed_in_even_once_unnamed() {
    if !is_root() && sluice_test_skip::may_skip("root", "nft and namespaces need root") {
        return;
    }
    let (g, _p) = pair("id");
    let other = Netns::new("idx");
    ok(&[
        "ip", "-n", &other.0, "link", "add", "g0", "type", "veth", "peer", "name", "g1",
    ]);
    ok(&["ip", "-n", &other.0, "link", "set", "g0", "up"]);
    // A path that names g's namespace now and other's later (as a
    // /run/netns name deleted and made again would).
    let link = std::env::temp_dir().join(format!("sfl-id-{}", std::process::id()));
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(g.path(), &link).unwrap();
    let floor = install(&link, "g0");
    let table = floor.table().to_owned();
    std::fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink(other.path(), &link).unwrap();
    other_floor_free(&other);
    // Checked where it was installed, whatever the path names now.
    floor.check().unwrap();
    // The namespace loses its name too (`ip netns del`): the floor's
    // descriptor still holds it, and the removal acts there, truthfully:
    // the interface exists, so it is set down and kept floored.
    let g_inode = std::fs::metadata(g.path()).map(|m| std::os::unix::fs::MetadataExt::ino(&m));
    ok(&["ip", "netns", "del", &g.0]);
    assert!(!g.path().exists());
    let fd = floor.netns_fd().unwrap();
    let held = format!(
        "/proc/{}/fd/{}",
        std::process::id(),
        std::os::fd::AsRawFd::as_raw_fd(&fd)
    );
    assert_eq!(
        std::fs::metadata(&held)
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
            .ok(),
        g_inode.ok()
    );
    let kept = Command::new("nsenter")
        .arg(format!("--net={held}"))
        .args(["sh", "-c", "nft list tables; ip -o link show g0"])
        .output()
        .unwrap();
    let before = String::from_utf8_lossy(&kept.stdout).into_owned();
    assert!(
        before.contains(&table) && before.contains(",UP"),
        "{before}"
    );
    let held_path = PathBuf::from(&held);
    let result = floor_remove_keeping(floor, &held_path);
    let _ = std::fs::remove_file(&link);
    assert_eq!(result.0, Ended::Kept);
    assert!(result.1.contains(&table), "{}", result.1);
    assert!(result.1.contains("state DOWN"), "{}", result.1);
    // Nothing was touched in the namespace the path names now.
    other_floor_free(&other);
    let up = link_of(&other, "g0");
    assert!(up.contains(",UP"), "{up}");
}

/// Removes `floor` while a descriptor of its namespace (opened from
/// `held`, a `/proc/PID/fd` path of the floor's own) is kept, and returns
/// the outcome and what that namespace then lists (its tables, `g0`).
fn floor_remove_keeping(floor: IngressFloor, held: &Path) -> (Ended, String) {
    let keep = std::fs::File::open(held).unwrap();
    let ended = floor.remove().unwrap();
    let path = format!(
        "/proc/{}/fd/{}",
        std::process::id(),
        std::os::fd::AsRawFd::as_raw_fd(&keep)
    );
    let out = Command::new("nsenter")
        .arg(format!("--net={path}"))
        .args(["sh", "-c", "nft list tables; ip -o link show g0"])
        .output()
        .unwrap();
    (ended, String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn a_successors_floor_survives_the_end_of_the_floor_before_it() {
    if !is_root() && sluice_test_skip::may_skip("root", "nft and namespaces need root") {
        return;
    }
    let (g, p) = pair("sc");
    // The first gateway's floor; its interface goes (the VMM restarted),
    // and a new one of the same name comes, with a floor of a second
    // gateway's, before the first's keeper ends.
    let first = install(&g.path(), "g0");
    ok(&["ip", "-n", &g.0, "link", "del", "g0"]);
    ok(&[
        "ip", "link", "add", "g0", "netns", &g.0, "type", "veth", "peer", "name", "p0", "netns",
        &p.0,
    ]);
    ok(&["ip", "-n", &g.0, "addr", "add", "10.99.0.1/24", "dev", "g0"]);
    ok(&["ip", "-n", &p.0, "addr", "add", "10.99.0.2/24", "dev", "p0"]);
    ok(&["ip", "-n", &p.0, "link", "set", "p0", "up"]);
    let second = install(&g.path(), "g0");
    ok(&["ip", "-n", &g.0, "link", "set", "g0", "up"]);
    // The first ends: its interface is gone, so its own tables go, and
    // only them.
    let first_table = first.table().to_owned();
    assert_eq!(first.remove().unwrap(), Ended::Removed);
    let tables = g.tables();
    assert!(!tables.contains(&first_table), "{tables}");
    assert!(tables.contains(second.table()), "{tables}");
    second.check().unwrap();
    assert!(
        !kernel_answers(&p, "10.99.0.1"),
        "the kernel answered the guest behind the second floor"
    );
    // Control: without the second floor the kernel answers.
    let table = second.table().to_owned();
    std::mem::forget(second);
    delete_by_hand(&g, &table);
    assert!(
        (0..5).any(|_| kernel_answers(&p, "10.99.0.1")),
        "the kernel answers with no floor"
    );
}

#[test]
fn the_next_floor_deletes_the_tables_of_one_whose_interface_went_after_its_end() {
    if !is_root() && sluice_test_skip::may_skip("root", "nft and namespaces need root") {
        return;
    }
    let (g, _p) = pair("or");
    ok(&[
        "ip", "-n", &g.0, "link", "add", "h0", "type", "veth", "peer", "name", "h1",
    ]);
    ok(&[
        "ip", "-n", &g.0, "link", "add", "k0", "type", "veth", "peer", "name", "k1",
    ]);
    // Two gateways ended normally: their interfaces exist, their floors
    // are kept. Then one interface goes (the VMM closed its TAP), with
    // nobody left to delete its floor.
    let gone = install(&g.path(), "h0");
    let gone_table = gone.table().to_owned();
    assert_eq!(gone.remove().unwrap(), Ended::Kept);
    let kept = install(&g.path(), "k0");
    let kept_table = kept.table().to_owned();
    assert_eq!(kept.remove().unwrap(), Ended::Kept);
    ok(&["ip", "-n", &g.0, "link", "del", "h0"]);
    assert!(g.tables().contains(&gone_table), "{}", g.tables());
    // The next floor installed in the namespace deletes the orphan, and
    // only it: the kept floor of a live interface stays.
    let next = install(&g.path(), "g0");
    let tables = g.tables();
    assert!(!tables.contains(&gone_table), "{tables}");
    assert!(tables.contains(&kept_table), "{tables}");
    assert!(tables.contains(next.table()), "{tables}");
    assert_eq!(tables.matches("sluice_floor").count(), 4, "{tables}");
}

#[test]
fn a_renamed_interface_is_still_the_floors_and_its_floor_follows_the_name() {
    if !is_root() && sluice_test_skip::may_skip("root", "nft and namespaces need root") {
        return;
    }
    let (g, p) = pair("rn");
    let floor = install(&g.path(), "g0");
    ok(&["ip", "-n", &g.0, "link", "set", "g0", "down"]);
    ok(&["ip", "-n", &g.0, "link", "set", "g0", "name", "g9"]);
    ok(&["ip", "-n", &g.0, "link", "set", "g9", "up"]);
    // The kernel unhooks a netdev chain from an interface renamed away
    // from its device name: the check says so.
    let e = floor.check().unwrap_err();
    assert!(e.to_string().contains("renamed to `g9`"), "{e}");
    // The end finds the interface by its index, not gone: down, and the
    // floor put back on its new name.
    assert_eq!(floor.remove().unwrap(), Ended::Kept);
    assert!(link_of(&g, "g9").contains("state DOWN"));
    assert!(
        ruleset_of(&g).contains("device \"g9\""),
        "{}",
        ruleset_of(&g)
    );
    ok(&["ip", "-n", &g.0, "link", "set", "g9", "up"]);
    assert!(
        !kernel_answers(&p, "10.99.0.1"),
        "the kernel answered the renamed interface after the end"
    );
}

#[test]
fn a_foreign_chain_before_the_floor_is_refused_and_the_check_sees_one_added_later() {
    if !is_root() && sluice_test_skip::may_skip("root", "nft and namespaces need root") {
        return;
    }
    let (g, _p) = pair("fb");
    let nft = |script: &str| {
        let mut c = g
            .exec(&["nft", "-f", "-"])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(&mut c.stdin.take().unwrap(), script.as_bytes()).unwrap();
        assert!(c.wait().unwrap().success(), "{script}");
    };
    // An ingress chain before the floor's, which could `fwd` the guest's
    // frames elsewhere.
    nft(
        "table netdev tap_dup {\n chain c { type filter hook ingress device \"g0\" priority -600; policy accept; }\n}\n",
    );
    let e = IngressFloor::install(Some(&g.path()), "g0", Foreign::Refuse).unwrap_err();
    assert!(matches!(e, FloorError::Bypass { .. }), "{e}");
    assert!(e.to_string().contains("netdev tap_dup c"), "{e}");
    assert!(!e.to_string().contains('\n'));
    assert!(!g.tables().contains("sluice_floor"), "{}", g.tables());
    // Allowed when asked (--allow-missing-isolation nftables).
    drop(IngressFloor::install(Some(&g.path()), "g0", Foreign::Allow).unwrap());
    ok(&[
        "ip", "netns", "exec", &g.0, "nft", "delete", "table", "netdev", "tap_dup",
    ]);
    // One after the floor's never sees a frame: no bypass.
    nft(
        "table netdev late {\n chain c { type filter hook ingress device \"g0\" priority -400; policy accept; }\n}\n",
    );
    let floor = install(&g.path(), "g0");
    floor.check().unwrap();
    // An egress chain on the interface, added while the floor holds.
    nft(
        "table netdev out {\n chain c { type filter hook egress device \"g0\" priority 0; policy accept; }\n}\n",
    );
    let e = floor.check().unwrap_err();
    assert!(e.to_string().contains("egress chain `netdev out c`"), "{e}");
    ok(&[
        "ip", "netns", "exec", &g.0, "nft", "delete", "table", "netdev", "out",
    ]);
    floor.check().unwrap();
    // A rule slipped into the floor's own chain opens it.
    let table = floor.table().to_owned();
    ok(&[
        "ip", "netns", "exec", &g.0, "nft", "add", "rule", "netdev", &table, "guest_in", "accept",
    ]);
    let e = floor.check().unwrap_err();
    assert!(matches!(e, FloorError::Verify { .. }), "{e}");
    // The floor's tables deleted by someone else.
    delete_by_hand(&g, &table);
    let e = floor.check().unwrap_err();
    assert!(matches!(e, FloorError::Verify { .. }), "{e}");
    std::mem::forget(floor);
}

/// `ns` holds no floor table.
fn other_floor_free(ns: &Netns) {
    assert!(!ns.tables().contains("sluice_floor"), "{}", ns.tables());
}

#[test]
fn bad_interfaces_and_namespaces_are_one_line_errors_and_leave_nothing() {
    if !is_root() && sluice_test_skip::may_skip("root", "nft and namespaces need root") {
        return;
    }
    let g = Netns::new("bad");
    let e = IngressFloor::install(Some(&g.path()), "nosuch0", Foreign::Refuse).unwrap_err();
    assert!(matches!(e, FloorError::NoInterface { .. }), "{e}");
    assert!(!e.to_string().contains('\n'));
    assert!(!g.tables().contains("sluice"), "{}", g.tables());
    let e =
        IngressFloor::install(Some(Path::new("/etc/hostname")), "lo", Foreign::Refuse).unwrap_err();
    assert!(e.to_string().contains("not a network namespace"), "{e}");
    let e = IngressFloor::install(Some(Path::new("/nonexistent/ns")), "lo", Foreign::Refuse)
        .unwrap_err();
    assert!(matches!(e, FloorError::Netns { .. }), "{e}");
    for name in ["", "a/b", "waytoolonginterfacename", "x y"] {
        assert!(
            matches!(
                IngressFloor::install(Some(&g.path()), name, Foreign::Refuse),
                Err(FloorError::Invalid(_))
            ),
            "{name:?}"
        );
    }
}

/// Whether `uid` can open a TCP connection to 127.0.0.1:`port` in `ns`.
fn connects_as(ns: &Netns, uid: u32, port: u16) -> bool {
    connects_as_ids(ns, uid, uid, port)
}

/// Whether `uid`/`gid` can open a TCP connection to 127.0.0.1:`port` in
/// `ns`. A floor's drop fails the connect at once (EPERM), so the timeout
/// only bounds a broken test.
fn connects_as_ids(ns: &Netns, uid: u32, gid: u32, port: u16) -> bool {
    connects_to_as(ns, uid, gid, "127.0.0.1", port)
}

/// Whether `uid`/`gid` can open a TCP connection to `addr`:`port` from
/// `ns` (a refusal while the server starts is retried).
fn connects_to_as(ns: &Netns, uid: u32, gid: u32, addr: &str, port: u16) -> bool {
    let code = format!(
        "import socket,time\nfor i in range(50):\n    try:\n        s=socket.socket(); s.settimeout(10); s.connect(('{addr}',{port})); break\n    except ConnectionRefusedError: time.sleep(0.1)\nelse:\n    raise SystemExit(1)\n"
    );
    let uid = uid.to_string();
    let gid = gid.to_string();
    ns.exec(&[
        "setpriv",
        "--reuid",
        &uid,
        "--regid",
        &gid,
        "--clear-groups",
        PY,
        "-c",
        &code,
    ])
    .stderr(Stdio::null())
    .status()
    .unwrap()
    .success()
}

/// Starts a TCP server on 127.0.0.1:`port` in `ns` that accepts and
/// closes every connection; it is killed when the guard drops.
fn listen(ns: &Netns, port: u16) -> Kill {
    listen_on(ns, "127.0.0.1", port)
}

/// Starts a TCP server on `addr`:`port` in `ns` that accepts and closes
/// every connection; it is killed when the guard drops.
fn listen_on(ns: &Netns, addr: &str, port: u16) -> Kill {
    let mut server = ns
        .exec(&[
            PY,
            "-c",
            &format!(
                "import socket,time\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\ns.bind(('{addr}',{port}))\ns.listen(64)\nprint('ready',flush=True)\nwhile True:\n    c,_=s.accept(); c.close()\n"
            ),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = server.stdout.take().unwrap();
    let guard = Kill(server);
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    guard
}

/// Whether `uid`/`gid` can send a UDP datagram to `addr`:`port` from `ns`
/// (a floor's drop fails the send at once, EPERM).
fn sends_udp_as(ns: &Netns, uid: u32, gid: u32, addr: &str, port: u16) -> bool {
    let code = format!(
        "import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\ns.sendto(b'x',('{addr}',{port}))\n"
    );
    let (uid, gid) = (uid.to_string(), gid.to_string());
    ns.exec(&[
        "setpriv",
        "--reuid",
        &uid,
        "--regid",
        &gid,
        "--clear-groups",
        PY,
        "-c",
        &code,
    ])
    .stderr(Stdio::null())
    .status()
    .unwrap()
    .success()
}

#[test]
fn a_tcp_only_opening_accepts_tcp_to_that_port_and_never_udp() {
    if !is_root() && sluice_test_skip::may_skip("root", "nft and namespaces need root") {
        return;
    }
    let ns = Netns::new("tcponly");
    let (hook, other) = (18_443u16, 18_082u16);
    let _hook = listen(&ns, hook);
    let _other = listen(&ns, other);
    let (uid, gid) = (64_995, 1_895_825_998);
    let floor = EgressFloor::install(
        Some(&ns.path()),
        &EgressSpec {
            tcp_only: vec![format!("127.0.0.1:{hook}").parse().unwrap()],
            ..spec(Owner::Gid(gid))
        },
    )
    .unwrap();
    assert!(
        connects_as_ids(&ns, uid, gid, hook),
        "the webhook's TCP port was stopped"
    );
    assert!(
        !connects_as_ids(&ns, uid, gid, other),
        "another loopback port was opened"
    );
    assert!(
        !sends_udp_as(&ns, uid, gid, "127.0.0.1", hook),
        "UDP to the webhook's address and port was opened"
    );
    // The same datagram from another gid is not the floor's: it leaves.
    assert!(sends_udp_as(&ns, uid, 64_994, "127.0.0.1", hook));
    // The namespace, and the table in it, go when `ns` drops.
    let table = floor.hand_off();
    assert!(ns.tables().contains(&table), "{}", ns.tables());
}

fn spec(owner: Owner) -> EgressSpec {
    EgressSpec {
        owner,
        reply_ports: vec![],
        resolvers: vec![],
        tcp_only: vec![],
        deny_first: always_denied(),
        allow: vec![],
        deny: non_public(),
    }
}

/// Whether a server running with `gid` on 127.0.0.1:`port` in `ns` gets
/// its greeting to a client (of another gid) that connected to it: the
/// server's bytes are replies on a connection it did not open.
fn replies_as(ns: &Netns, gid: u32, port: u16) -> bool {
    let server = format!(
        "import socket\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\ns.bind(('127.0.0.1',{port}))\ns.listen(1)\nprint('ready',flush=True)\ns.settimeout(10)\nc,_=s.accept()\nc.sendall(b'hello')\nc.close()\n"
    );
    let gid = gid.to_string();
    let mut child = ns
        .exec(&[
            "setpriv",
            "--reuid",
            "64990",
            "--regid",
            &gid,
            "--clear-groups",
            PY,
            "-c",
            &server,
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let _guard = Kill(child);
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    let client = format!(
        "import socket\ns=socket.create_connection(('127.0.0.1',{port}),timeout=3)\nassert s.recv(5)==b'hello'\n"
    );
    ns.exec(&[PY, "-c", &client])
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success()
}

#[test]
fn the_egress_floor_stops_a_rogue_process_under_the_gateways_uid_only() {
    if !is_root() && sluice_test_skip::may_skip("root", "nft and namespaces need root") {
        return;
    }
    let ns = Netns::new("e");
    let port = 18_080u16;
    let _server = listen(&ns, port);

    let (gateway_uid, other_uid) = (64_999, 64_998);
    assert!(
        connects_as(&ns, gateway_uid, port),
        "reachable before the floor"
    );
    let spec = spec(Owner::Uid(gateway_uid));
    let floor = EgressFloor::install(Some(&ns.path()), &spec).unwrap();
    floor.check().unwrap();
    assert!(
        !connects_as(&ns, gateway_uid, port),
        "the gateway's uid reached loopback"
    );
    assert!(
        connects_as(&ns, other_uid, port),
        "another uid was stopped too"
    );
    floor.remove().unwrap();

    // A private network the policy names is let through (one across a
    // veth: an address in the floor's own namespace is local, and local
    // is never opened).
    let (g, p) = pair("lo");
    let private = 18_086u16;
    let _peer = listen_on(&p, "10.99.0.2", private);
    let reaches_peer = || connects_to_as(&g, gateway_uid, 64_999, "10.99.0.2", private);
    let floor = EgressFloor::install(Some(&g.path()), &spec).unwrap();
    assert!(!reaches_peer(), "a private network not named was reached");
    floor.remove().unwrap();
    let spec = EgressSpec {
        allow: vec!["10.99.0.0/24".parse().unwrap()],
        ..spec
    };
    let floor = EgressFloor::install(Some(&g.path()), &spec).unwrap();
    assert!(reaches_peer(), "an allowed network was stopped");
    floor.remove().unwrap();
    assert!(!ns.tables().contains("sluice"), "{}", ns.tables());
    assert!(!g.tables().contains("sluice"), "{}", g.tables());
}

/// The floor `sluice run` installs: keyed on a gid of the gateway's own
/// (any uid holding it is stopped, the same uid with another gid is not),
/// the resolver reachable on port 53 only, the host's addresses dropped
/// even inside a network the policy names, and removal by table name from
/// another owner (the jail's supervisor).
#[test]
fn a_gid_floor_lets_the_resolver_through_on_53_and_holds_the_host_addresses() {
    if !is_root() && sluice_test_skip::may_skip("root", "nft and namespaces need root") {
        return;
    }
    let ns = Netns::new("gid");
    let (dns, other) = (53u16, 18_081u16);
    let _dns = listen(&ns, dns);
    let _other = listen(&ns, other);
    let (uid, gateway_gid, other_gid) = (64_997, 1_895_825_999, 64_996);
    let floor = EgressFloor::install(
        Some(&ns.path()),
        &EgressSpec {
            resolvers: vec!["127.0.0.1:53".parse().unwrap()],
            ..spec(Owner::Gid(gateway_gid))
        },
    )
    .unwrap();
    assert!(
        connects_as_ids(&ns, uid, gateway_gid, dns),
        "the resolver's port 53 was stopped"
    );
    assert!(
        !connects_as_ids(&ns, uid, gateway_gid, other),
        "the gateway's gid reached another loopback port"
    );
    assert!(
        connects_as_ids(&ns, uid, other_gid, other),
        "the same uid with another gid was stopped"
    );
    let table = floor.hand_off();
    assert!(ns.tables().contains(&table), "{}", ns.tables());

    // The host's own addresses are dropped before a policy network opens
    // the range around them.
    let floor = EgressFloor::install(
        Some(&ns.path()),
        &EgressSpec {
            deny_first: vec!["127.0.0.1/32".parse().unwrap()],
            allow: vec!["127.0.0.0/8".parse().unwrap()],
            ..spec(Owner::Gid(gateway_gid))
        },
    )
    .unwrap();
    assert!(
        !connects_as_ids(&ns, uid, gateway_gid, other),
        "a host address was opened by a policy network"
    );
    let table = floor.hand_off();
    // A removal prepared ahead (as the jail's supervisor does, before it
    // can no longer fork): `nft` starts in the namespace now, deletes later.
    let path = ns.path();
    let removal = std::thread::scope(|s| {
        s.spawn(|| {
            let f = std::fs::File::open(&path).unwrap();
            rustix::thread::move_into_link_name_space(
                std::os::fd::AsFd::as_fd(&f),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .unwrap();
            Removal::prepare(&table, |_| {}).unwrap()
        })
        .join()
        .unwrap()
    });
    assert!(ns.tables().contains(&table), "removed before run");
    removal.run().unwrap();
    assert!(!ns.tables().contains(&table), "{}", ns.tables());
    // By name, for a table already gone: no error. Not ours: refused.
    remove_table(Some(&ns.path()), &table).unwrap();
    assert!(remove_table(Some(&ns.path()), "filter").is_err());
    assert!(Removal::prepare("filter", |_| {}).is_err());
    assert!(!ns.tables().contains("sluice"), "{}", ns.tables());
    assert!(connects_as_ids(&ns, uid, gateway_gid, other));
}

/// What no policy opens stays shut however broad the policy's networks are,
/// and so does any address the kernel routes as local (here the
/// namespace's own veth address, listed nowhere).
#[test]
fn a_policy_network_never_opens_loopback_or_a_local_address() {
    if !is_root() && sluice_test_skip::may_skip("root", "nft and namespaces need root") {
        return;
    }
    let (g, _p) = pair("up");
    let port = 18_082u16;
    let _server = listen_on(&g, "0.0.0.0", port);
    let (uid, gid) = (64_995, 1_895_825_998);
    let connects_to = |addr: &str| connects_to_as(&g, uid, gid, addr, port);
    assert!(
        connects_to("10.99.0.1"),
        "the local address before the floor"
    );
    let floor = EgressFloor::install(
        Some(&g.path()),
        &EgressSpec {
            allow: vec!["0.0.0.0/0".parse().unwrap(), "::/0".parse().unwrap()],
            ..spec(Owner::Gid(gid))
        },
    )
    .unwrap();
    floor.check().unwrap();
    assert!(
        !connects_to("127.0.0.1"),
        "a policy network opened loopback"
    );
    assert!(
        !connects_to("10.99.0.1"),
        "a policy network opened the namespace's own address"
    );
    floor.remove().unwrap();
}

/// Replies leave only from the ports the gateway listens on, and the
/// floor judges a socket by the credentials it was created with: a
/// listener made under the gateway's gid and handed to a process of
/// another gid, turned back into a client (`shutdown`, `connect`), is
/// still the gateway's.
#[test]
fn replies_leave_only_from_listening_ports_and_an_inherited_socket_stays_the_gateways() {
    if !is_root() && sluice_test_skip::may_skip("root", "nft and namespaces need root") {
        return;
    }
    let ns = Netns::new("rep");
    let (published, other) = (18_083u16, 18_084u16);
    let gid = 1_895_825_997;
    assert!(replies_as(&ns, gid, other), "replies before the floor");
    let floor = EgressFloor::install(
        Some(&ns.path()),
        &EgressSpec {
            reply_ports: vec![published],
            ..spec(Owner::Gid(gid))
        },
    )
    .unwrap();
    assert!(
        replies_as(&ns, gid, published),
        "a published port's replies were dropped"
    );
    assert!(
        !replies_as(&ns, gid, other),
        "replies left from a port not listed"
    );

    let target = 18_085u16;
    let _server = listen(&ns, target);
    let path = ns.path();
    let make = |as_gateway: bool| {
        std::thread::scope(|s| {
            s.spawn(|| {
                let f = std::fs::File::open(&path).unwrap();
                rustix::thread::move_into_link_name_space(
                    std::os::fd::AsFd::as_fd(&f),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )
                .unwrap();
                if as_gateway {
                    rustix::thread::set_thread_gid(rustix::process::Gid::from_raw(gid)).unwrap();
                }
                std::net::TcpListener::bind("127.0.0.1:0").unwrap()
            })
            .join()
            .unwrap()
        })
    };
    // This thread (gid 0, another namespace) turns each listener into a
    // client of the loopback server in the floor's namespace.
    let reconnects = |l: std::net::TcpListener| {
        use rustix::net::{Shutdown, SocketAddrAny, connect, shutdown};
        shutdown(&l, Shutdown::Read).unwrap();
        // SO_SNDTIMEO bounds a blocking connect whose SYN is dropped.
        let s = std::net::TcpStream::from(std::os::fd::OwnedFd::from(l));
        s.set_write_timeout(Some(std::time::Duration::from_secs(3)))
            .unwrap();
        let to = SocketAddrAny::from(std::net::SocketAddr::from(([127, 0, 0, 1], target)));
        connect(&s, &to).is_ok()
    };
    assert!(
        reconnects(make(false)),
        "a socket of another gid was stopped"
    );
    assert!(
        !reconnects(make(true)),
        "a socket created under the gateway's gid escaped the floor in another process"
    );
    floor.remove().unwrap();
}

/// Kills the child on drop, so a failed assertion leaves no server behind.
struct Kill(std::process::Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

//! What the floor's tests share: namespaces they create (named after the
//! test and its pid, deleted on drop), a veth pair between two of them,
//! and running tools.

#![allow(
    dead_code,
    reason = "each test binary uses its own part of these helpers"
)]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers: a panic is a failed test"
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sluice_floor::ingress::{Foreign, IngressFloor};

pub(crate) fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

pub(crate) fn run(args: &[&str]) -> std::process::Output {
    Command::new(args[0]).args(&args[1..]).output().unwrap()
}

pub(crate) fn ok(args: &[&str]) {
    let out = run(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A named network namespace, deleted on drop.
pub(crate) struct Netns(pub(crate) String);

impl Netns {
    pub(crate) fn new(tag: &str) -> Self {
        let name = format!("sfl-{tag}-{}", std::process::id());
        let _ = run(&["ip", "netns", "del", &name]);
        ok(&["ip", "netns", "add", &name]);
        ok(&["ip", "-n", &name, "link", "set", "lo", "up"]);
        Self(name)
    }

    pub(crate) fn path(&self) -> PathBuf {
        Path::new("/run/netns").join(&self.0)
    }

    pub(crate) fn exec(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.0]).args(args);
        c
    }

    pub(crate) fn tables(&self) -> String {
        String::from_utf8(
            self.exec(&["nft", "list", "tables"])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = run(&["ip", "netns", "del", &self.0]);
    }
}

/// Whether the kernel behind `to` answers at all: a TCP connect to a closed
/// port is refused when it does (ARP answered, then RST) and times out when
/// nothing answers.
pub(crate) fn kernel_answers(from: &Netns, to: &str) -> bool {
    let code = format!(
        "import socket,sys\ns=socket.socket()\ns.settimeout(1.5)\ntry:\n    s.connect(('{to}',9))\nexcept ConnectionRefusedError:\n    sys.exit(0)\nexcept OSError:\n    sys.exit(1)\n"
    );
    from.exec(&[PY, "-c", &code])
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success()
}

/// The system's python (the tests run it as other uids, which cannot read
/// a per-user install).
pub(crate) const PY: &str = "/usr/bin/python3";

/// Two namespaces joined by a veth (`g0` 10.99.0.1, `p0` 10.99.0.2),
/// named after `tag` so tests running at once never share one.
pub(crate) fn pair(tag: &str) -> (Netns, Netns) {
    let g = Netns::new(&format!("{tag}g"));
    let p = Netns::new(&format!("{tag}p"));
    ok(&[
        "ip", "link", "add", "g0", "netns", &g.0, "type", "veth", "peer", "name", "p0", "netns",
        &p.0,
    ]);
    ok(&["ip", "-n", &g.0, "addr", "add", "10.99.0.1/24", "dev", "g0"]);
    ok(&["ip", "-n", &p.0, "addr", "add", "10.99.0.2/24", "dev", "p0"]);
    ok(&["ip", "-n", &g.0, "link", "set", "g0", "up"]);
    ok(&["ip", "-n", &p.0, "link", "set", "p0", "up"]);
    (g, p)
}

/// Installs the floor on `iface` in the namespace at `path`, refusing
/// foreign bypasses.
pub(crate) fn install(path: &Path, iface: &str) -> IngressFloor {
    IngressFloor::install(Some(path), iface, Foreign::Refuse).unwrap()
}

/// Deletes the floor table `table` of both families in `ns`, as an
/// operator would.
pub(crate) fn delete_by_hand(ns: &Netns, table: &str) {
    for family in ["netdev", "inet"] {
        ok(&[
            "ip", "netns", "exec", &ns.0, "nft", "delete", "table", family, table,
        ]);
    }
}

/// Runs the nft script `script` (`nft -f -`) in `ns`, or JSON
/// (`nft -j -f -`) with `json`.
pub(crate) fn nft_script(ns: &Netns, script: &str, json: bool) {
    let args: &[&str] = if json {
        &["nft", "-j", "-f", "-"]
    } else {
        &["nft", "-f", "-"]
    };
    let mut c = ns.exec(args).stdin(Stdio::piped()).spawn().unwrap();
    std::io::Write::write_all(&mut c.stdin.take().unwrap(), script.as_bytes()).unwrap();
    assert!(c.wait().unwrap().success(), "{script}");
}

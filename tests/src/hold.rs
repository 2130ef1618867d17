//! Many concurrent flows from a [`World`]'s guest: the open-file limits and
//! the guest's port range they need, and [`FlowHolder`], the
//! `sluice-bench hold` client that opens them, proves each with one echo
//! round trip, and keeps them open while the sidecar's memory is read.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, ChildStdout, Stdio};

use anyhow::{Context, Result, bail};

use crate::{World, bin_path, run_ok};

/// Descriptors every process of the harness should be able to open for
/// 50,000 flows on each side (guest holder, sidecar, origin); see
/// [`raise_nofile`] for hosts that cap the hard limit lower.
pub const HARNESS_NOFILE: u64 = 131_072;

/// Raises this process's open-file limit (soft and hard) to `limit`, or
/// when the hard limit cannot be raised (no `CAP_SYS_RESOURCE`) the soft
/// limit to the hard one; returns the soft limit now in force. The
/// namespaces' processes started after it inherit it.
pub fn raise_nofile(limit: u64) -> Result<u64> {
    let pid = std::process::id().to_string();
    let read = |which: &str| -> Result<u64> {
        let out = run_ok(std::process::Command::new("prlimit").args([
            "--pid",
            &pid,
            "--nofile",
            &format!("--output={which}"),
            "--noheadings",
        ]))?;
        let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        text.parse()
            .with_context(|| format!("prlimit {which}: {text:?}"))
    };
    let hard = read("HARD")?;
    let set = |n: u64| {
        run_ok(std::process::Command::new("prlimit").args([
            "--pid",
            &pid,
            &format!("--nofile={n}:{n}"),
        ]))
    };
    if set(limit.max(hard)).is_err() {
        set(hard)?;
    }
    read("SOFT")
}

/// Widens the guest namespace's ephemeral port range (a per-namespace
/// setting; the host's stays as it is) so that one destination can take
/// tens of thousands of flows.
pub fn widen_guest_ports(w: &World) -> Result<()> {
    w.guest_ok("sysctl -qw net.ipv4.ip_local_port_range='1024 65535'", 10)?;
    Ok(())
}

/// `sluice-bench hold` running in the guest: `count` flows to one address,
/// each proven by an echo round trip, open until this is dropped.
#[derive(Debug)]
pub struct FlowHolder {
    child: Child,
    /// The flows it holds.
    pub count: u32,
}

impl FlowHolder {
    /// Opens `count` flows from the guest to `addr` (an echo service) and
    /// returns once every one has echoed; fails with the holder's own
    /// error (a refused or failed connect) when it stops before.
    pub fn start(w: &World, addr: SocketAddr, count: u32) -> Result<Self> {
        let bench = bin_path("sluice-bench")?;
        let mut child = w
            .guest
            .cmd(bench)
            .args(["hold", "--addr", &addr.to_string(), "--count"])
            .arg(count.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("spawning sluice-bench hold in the guest")?;
        let line = first_line(child.stdout.take());
        if line.trim() == format!("ready {count}") {
            return Ok(Self { child, count });
        }
        let _ = child.kill();
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        let _ = child.wait();
        // The holder's own error, without a backtrace.
        let err = err.split("Stack backtrace").next().unwrap_or_default();
        bail!(
            "holding {count} flows to {addr}: {}{}",
            line.trim(),
            err.trim()
        )
    }
}

fn first_line(out: Option<ChildStdout>) -> String {
    let mut line = String::new();
    if let Some(out) = out {
        let _ = BufReader::new(out).read_line(&mut line);
    }
    line
}

impl Drop for FlowHolder {
    fn drop(&mut self) {
        // Closing stdin ends the holder, which closes its flows.
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

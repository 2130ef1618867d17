//! CPU accounting from `/proc` for the benchmark drivers (`sluice-bench`,
//! `sluice-inspect-bench`): a process's CPU seconds and context switches,
//! the whole machine's busy and softirq seconds, the TAP bridge's pid, and
//! a phase run with what each of them spent meanwhile.

use std::time::Instant;

use crate::World;
use anyhow::Result;
use serde_json::{Value, json};

/// CPU seconds (utime + stime) and context switches (voluntary +
/// involuntary) of process `pid` so far.
fn proc_cpu(pid: u32) -> Option<(f64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name (which may hold spaces).
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat(5): 12 and 13 after ')'.
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let switches: u64 = status
        .lines()
        .filter(|l| l.contains("ctxt_switches:"))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum();
    // USER_HZ is 100 on Linux.
    Some((ticks as f64 / 100.0, switches))
}

/// The pid of this world's TAP bridge (the `sluice-tap-bridge` whose
/// command line names the world's socket).
pub fn bridge_pid(w: &World) -> Option<u32> {
    let sock = w.socket().display().to_string();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let cmd = String::from_utf8_lossy(&cmd);
        (cmd.contains("sluice-tap-bridge") && cmd.contains(&sock)).then_some(pid)
    })
}

/// CPU seconds the whole machine spent busy so far (`/proc/stat`'s first
/// line: user, system, irq, softirq and steal; `nice` is left out, so
/// other work run under `nice` does not count), and in softirq alone.
fn machine_cpu() -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let f: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .map_while(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal
    let busy = f.first()? + f.get(2)? + f.get(5)? + f.get(6)? + f.get(7)?;
    Some((busy as f64 / 100.0, *f.get(6)? as f64 / 100.0))
}

/// Runs `phase` and returns its JSON with the CPU used meanwhile by the
/// sidecar, the bridge and the whole machine added (`*_cpu_s`,
/// `sidecar_switches`).
pub fn measured(
    sidecar: Option<u32>,
    bridge: Option<u32>,
    phase: impl FnOnce() -> Result<Value>,
) -> Result<Value> {
    let s0 = sidecar.and_then(proc_cpu);
    let b0 = bridge.and_then(proc_cpu);
    let m0 = machine_cpu();
    let t0 = Instant::now();
    let mut v = phase()?;
    let wall = t0.elapsed().as_secs_f64();
    let s1 = sidecar.and_then(proc_cpu);
    let b1 = bridge.and_then(proc_cpu);
    let m1 = machine_cpu();
    v["wall_s"] = json!(wall);
    if let (Some(a), Some(b)) = (m0, m1) {
        v["machine_cpu_s"] = json!(b.0 - a.0);
        v["softirq_cpu_s"] = json!(b.1 - a.1);
    }
    if let (Some(a), Some(b)) = (s0, s1) {
        v["sidecar_cpu_s"] = json!(b.0 - a.0);
        v["sidecar_switches"] = json!(b.1 - a.1);
    }
    if let (Some(a), Some(b)) = (b0, b1) {
        v["bridge_cpu_s"] = json!(b.0 - a.0);
    }
    Ok(v)
}

//! `sluice doctor`: what this host gives a sluice VM, and why.

use crate::image;
use crate::qemu;

/// The isolation layers `sluice run` is meant to apply around QEMU and the
/// gateway. None is applied yet: the jail (`crate::jail`) is written in
/// parallel; until it is wired in, each is reported as not implemented.
const LAYERS: [&str; 11] = [
    "mount namespace + pivot_root",
    "pid namespace",
    "ipc namespace",
    "uts namespace",
    "network namespace",
    "unprivileged uid, no capabilities",
    "no_new_privs",
    "rlimits",
    "seccomp filter",
    "landlock",
    "cgroup limits",
];

/// The isolation layers as a JSON object for `sluice run --json`:
/// layer name to status.
pub(crate) fn layers_summary() -> serde_json::Value {
    let mut m = serde_json::Map::new();
    for l in LAYERS {
        m.insert(l.to_owned(), "not implemented".into());
    }
    m.insert("qemu -sandbox (QEMU's own seccomp)".to_owned(), "on".into());
    m.insert("PDEATHSIG + process group".to_owned(), "on".into());
    serde_json::Value::Object(m)
}

/// Prints the report; returns the process exit status (0 when a VM can
/// boot here: QEMU, a kernel and an agent were found).
pub fn main() -> i32 {
    let mut ok = true;
    let accel = qemu::choose_accel();
    println!("accelerator: {} ({})", accel.name, accel.reason);
    match qemu::find_qemu() {
        Some(q) => println!(
            "qemu: {} ({})",
            q.display(),
            qemu::qemu_version(&q).unwrap_or_else(|| "does not run".into())
        ),
        None => {
            ok = false;
            println!("qemu: not found (install qemu-system-x86)");
        }
    }
    match image::default_kernel() {
        Ok((k, v)) => println!("kernel: {} (modules /lib/modules/{v})", k.display()),
        Err(e) => {
            ok = false;
            println!("kernel: {e}");
        }
    }
    match image::find_agent(
        std::env::var_os("SLUICE_AGENT")
            .map(std::path::PathBuf::from)
            .as_deref(),
    ) {
        Ok(a) => println!("guest agent: {}", a.display()),
        Err(e) => {
            ok = false;
            println!("guest agent: {e}");
        }
    }
    let cache = image::default_cache_dir();
    let entries = std::fs::read_dir(&cache)
        .map(|d| {
            d.flatten()
                .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                .count()
        })
        .unwrap_or(0);
    println!("image cache: {} ({entries} image(s))", cache.display());
    println!("isolation layers:");
    println!("  qemu -sandbox (QEMU's own seccomp): on");
    println!("  PDEATHSIG + process group: on");
    for l in LAYERS {
        println!("  {l}: NOT IMPLEMENTED (the jail is not wired in yet)");
    }
    if ok { 0 } else { 1 }
}

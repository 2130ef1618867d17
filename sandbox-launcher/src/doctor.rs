//! `sluice doctor`: what this host gives a sluice VM, and why.

use std::fmt::Write as _;

use crate::image;
use crate::jail;
use crate::qemu;

/// The isolation layers as a JSON object for `sluice run --json`: what
/// `sluice run` applies today (QEMU's own `-sandbox` and the death signal /
/// process group), and, under `jail_available`, what the jail
/// (`crate::jail::probe_layers`) could apply on this host. `sluice run` does
/// not spawn QEMU through the jail yet: those layers are not active.
pub(crate) fn layers_summary() -> serde_json::Value {
    let probe: serde_json::Map<String, serde_json::Value> = jail::probe_layers()
        .into_iter()
        .map(|l| {
            (
                l.name,
                serde_json::json!({"available": l.available, "reason": l.reason}),
            )
        })
        .collect();
    serde_json::json!({
        "active": ["qemu-sandbox", "death-signal", "process-group"],
        "jail_active": false,
        "jail_available": probe,
    })
}

/// Prints the report; returns the process exit status (0 when a VM can
/// boot here: QEMU, a kernel and an agent were found).
pub fn main() -> i32 {
    // Collected and written once: a closed stdout (`sluice doctor | head`)
    // is not an error worth a panic.
    let mut out = String::new();
    // Writing to a String cannot fail.
    macro_rules! say {
        ($($t:tt)*) => {{
            let _ = writeln!(out, $($t)*);
        }};
    }
    let mut ok = true;
    let accel = qemu::choose_accel();
    say!("accelerator: {} ({})", accel.name, accel.reason);
    match qemu::find_qemu() {
        Some(q) => say!(
            "qemu: {} ({})",
            q.display(),
            qemu::qemu_version(&q).unwrap_or_else(|| "does not run".into())
        ),
        None => {
            ok = false;
            say!("qemu: not found (install qemu-system-x86)");
        }
    }
    match image::default_kernel() {
        Ok((k, v)) => say!("kernel: {} (modules /lib/modules/{v})", k.display()),
        Err(e) => {
            ok = false;
            say!("kernel: {e}");
        }
    }
    match image::find_agent(
        std::env::var_os("SLUICE_AGENT")
            .map(std::path::PathBuf::from)
            .as_deref(),
    ) {
        Ok(a) => say!("guest agent: {}", a.display()),
        Err(e) => {
            ok = false;
            say!("guest agent: {e}");
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
    say!("image cache: {} ({entries} image(s))", cache.display());
    say!("isolation layers applied by `sluice run` today:");
    say!("  qemu-sandbox (QEMU's own seccomp, -sandbox on,...): on");
    say!("  death-signal + process group (QEMU, gateway): on");
    say!("jail layers (NOT yet applied by `sluice run`; what this host could apply):");
    for l in jail::probe_layers() {
        let state = if l.available {
            "available"
        } else {
            "unavailable"
        };
        say!("  {}: {state} ({})", l.name, l.reason);
    }
    let _ = std::io::Write::write_all(&mut std::io::stdout(), out.as_bytes());
    if ok { 0 } else { 1 }
}

//! `sluice doctor`: what this host gives a sluice VM, and why.

use std::fmt::Write as _;

use crate::image;
use crate::jail;
use crate::qemu;

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
    if let Some(shared) = image::shared_cache_dir() {
        say!(
            "  also read (never written): {} (root's cache, where readable)",
            shared.display()
        );
    }
    let (uid, gid) = jail::default_ids();
    if jail::is_rootless() {
        say!(
            "running as: uid {uid} (rootless: each jail is a user namespace mapping only \
             uid {uid} and gid {gid}; the program runs as them with no capabilities)"
        );
    } else {
        say!("running as: root (each jail drops to uid {uid}/gid {gid})");
    }
    say!("run dirs: {}", jail::default_runtime_dir().display());
    let modes: Vec<String> = crate::network_mode::PREFERENCE
        .iter()
        .map(|m| match m.unavailable() {
            None => m.name().to_owned(),
            Some(why) => format!("{} unavailable ({why})", m.name()),
        })
        .collect();
    match crate::network_mode::choose_quietly() {
        Some(default) => say!(
            "network modes (--network): {}; default {}",
            modes.join(", "),
            default.name()
        ),
        None => say!("network modes (--network): {}", modes.join(", ")),
    }
    say!("isolation: `sluice run` jails QEMU and the gateway with these layers;");
    say!("  an unavailable one makes it fail unless --allow-missing-isolation NAME is given");
    let mut all_on = true;
    for l in jail::probe_layers() {
        // As root no user namespace is made: its "off" is not a gap.
        let needed = l.name != "user-ns" || jail::is_rootless();
        let state = match (l.available, needed) {
            (true, _) => "on",
            (false, true) => "OFF",
            (false, false) => "off",
        };
        all_on &= l.available || !needed;
        // The gateway needs the host network: it never gets a new netns.
        let note = if l.name == "net-ns" {
            " [QEMU only: the gateway keeps the host network]"
        } else {
            ""
        };
        say!("  {}: {state} ({}){note}", l.name, l.reason);
    }
    say!("  qemu-sandbox (QEMU's own -sandbox on,...): on");
    say!(
        "  gateway-self-restrict (seccomp: no exec/fork; Landlock: no writes, reads only its policy's and secret files' directories): on"
    );
    let (floor, why) = crate::egress_floor::probe();
    let state = match (floor, jail::is_rootless()) {
        (true, _) => "on",
        (false, true) => "off",
        (false, false) => "OFF",
    };
    all_on &= floor || jail::is_rootless();
    say!("  nftables (the gateway's egress floor): {state} ({why})");
    say!("jail_active: {all_on}");
    let _ = std::io::Write::write_all(&mut std::io::stdout(), out.as_bytes());
    if ok { 0 } else { 1 }
}

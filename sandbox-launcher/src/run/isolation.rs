//! The isolation of a run: refusing one whose jails would miss a layer the
//! user did not allow to be missing, and the summary of what was applied
//! that `--json` reports.

use std::collections::BTreeSet;

use anyhow::bail;

use super::Children;
use crate::jail::{self, CgroupLimits, JailSpec, Layer};
use crate::spawn::Sidecar;

/// Refuses, in one line, a run whose jails would miss a layer the user did
/// not allow to be missing: every such layer with its reason, and the
/// `--allow-missing-isolation` flags that accept running without them.
pub(super) fn check_isolation(allow_missing: &BTreeSet<Layer>) -> anyhow::Result<()> {
    // QEMU's jail asks for every layer (the gateway's for all but net-ns).
    let mut spec = JailSpec::new("sluice-check", "/bin/true");
    spec.cgroup = CgroupLimits {
        memory_bytes: Some(1),
        pids: Some(1),
        cpu_millis: Some(1),
    };
    spec.allow_missing.clone_from(allow_missing);
    let missing = jail::missing_layers(&spec);
    if missing.is_empty() {
        return Ok(());
    }
    // Without a user namespace a rootless jail has no namespace at all:
    // allowing layers one by one would not help; the sysctl line does.
    if let Some(userns) = missing.iter().find(|m| m.name == Layer::UserNs.name()) {
        bail!("cannot build the jails without root: {}", userns.reason);
    }
    // Several layers often share a reason (all cgroups, all namespaces).
    let mut by_reason: Vec<(&str, Vec<&str>)> = Vec::new();
    for m in &missing {
        match by_reason.iter_mut().find(|(r, _)| *r == m.reason) {
            Some((_, names)) => names.push(&m.name),
            None => by_reason.push((&m.reason, vec![&m.name])),
        }
    }
    let reasons: Vec<String> = by_reason
        .iter()
        .map(|(reason, names)| format!("{}: {reason}", names.join(", ")))
        .collect();
    let flags: Vec<String> = missing
        .iter()
        .map(|m| format!("--allow-missing-isolation {}", m.name))
        .collect();
    let who = if jail::is_rootless() {
        "or run as root"
    } else {
        "or fix the host (`sluice doctor`)"
    };
    bail!(
        "cannot isolate the VM here: {} unavailable ({}); to run without, pass {} ({who})",
        missing
            .iter()
            .map(|m| m.name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        reasons.join("; "),
        flags.join(" ")
    )
}

/// The isolation actually applied, for `--json`: every jail layer of QEMU
/// and of the gateway (on/off and why), QEMU's own `-sandbox`, and the
/// gateway's self-restriction. `jail_active` is true when every process the
/// launcher started runs jailed.
pub(super) fn isolation_summary(
    children: &Children,
    egress_floor: Option<&str>,
) -> serde_json::Value {
    let layers = |s: Option<&Sidecar>| -> serde_json::Value {
        s.map_or(serde_json::Value::Null, |s| {
            s.layers()
                .iter()
                .map(|l| {
                    (
                        l.name.clone(),
                        serde_json::json!({"on": l.available, "reason": l.reason}),
                    )
                })
                .collect::<serde_json::Map<_, _>>()
                .into()
        })
    };
    serde_json::json!({
        "jail_active": children.qemu.is_some(),
        "qemu_pid": children.qemu.as_ref().map(Sidecar::pid),
        "gateway_pid": children.gateway.as_ref().map(Sidecar::pid),
        "qemu": layers(children.qemu.as_ref()),
        "gateway": layers(children.gateway.as_ref()),
        "qemu_sandbox": "on: -sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
        "gateway_egress_floor": egress_floor.unwrap_or("off: no gateway (--no-network)"),
        "gateway_self_restrict": if children.gateway.is_some() {
            "on: seccomp (no exec, no new processes) and Landlock (no writes; reads only the policy's and the secret files' directories), before its threads start"
        } else {
            "off: no gateway (--no-network)"
        },
    })
}

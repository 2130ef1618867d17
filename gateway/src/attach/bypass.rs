//! What would see an attached interface's frames before the floor does:
//! an XDP program, a `clsact` or `ingress` qdisc, a tcx program, a master
//! (a bridge or a bond); asked of the kernel through iproute2's JSON and
//! `BPF_PROG_QUERY`, at attach and by the floor keeper's checks.

use std::path::Path;

use anyhow::{Context as _, anyhow, bail};

/// Where `ip` and `tc` are looked for (absolute paths only: the gateway's
/// `PATH` is not trusted to name them).
const TOOL_DIRS: [&str; 4] = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"];

/// Runs the iproute2 tool `name` with `args` in the calling thread's
/// namespace and parses its JSON output.
fn iproute2_json(name: &str, args: &[&str]) -> anyhow::Result<serde_json::Value> {
    let tool = TOOL_DIRS
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| anyhow!("`{name}` (iproute2) not found in {}", TOOL_DIRS.join(", ")))?;
    // Killed when hung (a failed run: the keeper's check asks again).
    let out = sluice_floor::run::output_within(
        std::process::Command::new(&tool).args(args),
        b"",
        sluice_floor::run::DEADLINE,
    )
    .with_context(|| format!("running {}", tool.display()))?;
    if !out.status.success() {
        bail!(
            "{} {}: {}",
            tool.display(),
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    // `tc` prints nothing at all for a device without qdiscs on some versions.
    if out.stdout.iter().all(u8::is_ascii_whitespace) {
        return Ok(serde_json::Value::Array(Vec::new()));
    }
    serde_json::from_slice(&out.stdout)
        .with_context(|| format!("parsing the JSON of {} {}", tool.display(), args.join(" ")))
}

/// What on `iface` (index `index`, in the calling thread's namespace)
/// would see the guest's frames before the floor's netdev ingress hook, or
/// the gateway's before the guest, if anything: an XDP program (runs in the
/// driver, before everything), a `clsact` or `ingress` qdisc (tc ingress
/// runs before netfilter's netdev ingress: a `mirred` redirect, as Kata's
/// default `tcfilter` model installs, would carry the frames past the
/// floor), a tcx program (the qdisc-less tc of kernel 6.6 and later,
/// attached through a bpf link: iproute2 lists none, so the kernel is
/// asked, [`tcx_programs`]), or a master (a bridge or bond takes the frames
/// in its rx handler). The rest is read from `ip -d -j link show` and
/// `tc -j qdisc show`.
pub(crate) fn bypasses(iface: &str, index: u32) -> anyhow::Result<Option<String>> {
    let link = iproute2_json("ip", &["-d", "-j", "link", "show", "dev", iface])?;
    let qdiscs = iproute2_json("tc", &["-j", "qdisc", "show", "dev", iface])?;
    if let Some(found) = bypass_in(&link, &qdiscs) {
        return Ok(Some(found));
    }
    for (attach_type, hook) in [(BPF_TCX_INGRESS, "ingress"), (BPF_TCX_EGRESS, "egress")] {
        let n = tcx_programs(index, attach_type)
            .with_context(|| format!("asking the kernel for tcx {hook} programs"))?;
        if n > 0 {
            return Ok(Some(format!(
                "{n} tcx {hook} program(s) attached (bpf links)"
            )));
        }
    }
    Ok(None)
}

/// `<linux/bpf.h>`: the `bpf(2)` command and the tcx attach types.
const BPF_PROG_QUERY: libc::c_int = 16;
const BPF_TCX_INGRESS: u32 = 46;
const BPF_TCX_EGRESS: u32 = 47;

/// The `query` member of `union bpf_attr` (`<linux/bpf.h>`, kernel 6.6).
#[repr(C)]
#[derive(Default)]
struct BpfProgQuery {
    target_ifindex: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    prog_cnt: u32,
    _pad: u32,
    prog_attach_flags: u64,
    link_ids: u64,
    link_attach_flags: u64,
    revision: u64,
}

/// How many tcx programs of `attach_type` interface `index` (in the
/// calling thread's namespace: the kernel resolves the index in the
/// caller's) carries: `bpf(BPF_PROG_QUERY)` with no id buffer, which
/// answers the count alone. A kernel older than 6.6 has no tcx and refuses
/// the attach type (`EINVAL`), one without `bpf(2)` has no programs
/// (`ENOSYS`): none. Any other refusal (`EPERM` under a seccomp filter or
/// without `CAP_NET_ADMIN`) is an error: what cannot be checked is not
/// assumed absent.
fn tcx_programs(index: u32, attach_type: u32) -> std::io::Result<u32> {
    let mut attr = BpfProgQuery {
        target_ifindex: index,
        attach_type,
        ..BpfProgQuery::default()
    };
    let size = u32::try_from(size_of::<BpfProgQuery>()).unwrap_or(u32::MAX);
    // SAFETY: BPF_PROG_QUERY reads `size` bytes of `attr`, a repr(C)
    // mirror of the kernel's `query` member that lives across the call,
    // and writes only its `prog_cnt`, `attach_flags` and `revision` (no id
    // buffers are given: their pointers are null and the count zero).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_QUERY,
            (&raw mut attr).cast::<libc::c_void>(),
            size,
        )
    };
    if rc == 0 {
        return Ok(attr.prog_cnt);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EINVAL | libc::ENOSYS) => Ok(0),
        _ => Err(e),
    }
}

/// [`bypasses`] on the tools' parsed output.
fn bypass_in(link: &serde_json::Value, qdiscs: &serde_json::Value) -> Option<String> {
    let entry = link.as_array().and_then(|a| a.first());
    if let Some(e) = entry {
        if e.get("xdp").is_some() {
            return Some("an XDP program attached".to_owned());
        }
        if let Some(master) = e.get("master").and_then(serde_json::Value::as_str) {
            return Some(format!("a master (`{master}`: a bridge or bond)"));
        }
    }
    qdiscs.as_array()?.iter().find_map(|q| {
        let kind = q.get("kind").and_then(serde_json::Value::as_str)?;
        matches!(kind, "clsact" | "ingress").then(|| format!("a `{kind}` qdisc (tc ingress)"))
    })
}

#[cfg(test)]
mod tests {
    use super::bypass_in;
    use serde_json::json;

    #[test]
    fn xdp_a_master_and_ingress_qdiscs_are_bypasses() {
        let plain = json!([{"ifname": "tap0", "flags": ["UP"]}]);
        let root_only = json!([{"kind": "noqueue", "handle": "0:", "root": true}]);
        assert_eq!(bypass_in(&plain, &root_only), None);
        assert_eq!(bypass_in(&plain, &json!([])), None);
        let xdp = json!([{"ifname": "tap0", "xdp": {"mode": 2, "prog": {"id": 7}}}]);
        assert!(bypass_in(&xdp, &root_only).is_some_and(|w| w.contains("XDP")));
        let enslaved = json!([{"ifname": "tap0", "master": "br0"}]);
        assert!(bypass_in(&enslaved, &root_only).is_some_and(|w| w.contains("br0")));
        for kind in ["clsact", "ingress"] {
            let q = json!([{"kind": "noqueue", "root": true}, {"kind": kind, "handle": "ffff:"}]);
            assert!(
                bypass_in(&plain, &q).is_some_and(|w| w.contains(kind)),
                "{kind}"
            );
        }
    }
}

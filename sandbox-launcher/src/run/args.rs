//! The options of `sluice run`, as clap parses them.

use std::path::PathBuf;

use sluice_gateway::args::AuditFormat;
use sluice_gateway::config::PublishSpec;
use sluice_gateway::metrics::MetricsAddr;

use super::gateway::parse_metrics_addr;
use crate::jail::Layer;
use crate::network_mode::NetworkMode;

/// Options of `sluice run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Policy file for the gateway (default: the embedded default policy).
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// Allow this domain (repeatable): a small inline policy, instead of --policy.
    #[arg(long = "allow-domain", value_name = "NAME", conflicts_with = "policy")]
    pub allow_domain: Vec<String>,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 256, value_name = "MIB")]
    pub memory: u32,
    /// Guest vCPUs.
    #[arg(long, default_value_t = 1)]
    pub cpus: u32,
    /// Kill the VM after this many seconds (from QEMU start) and exit 124.
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<f64>,
    /// Environment variable for the command (repeatable).
    #[arg(long = "env", short = 'e', value_name = "NAME=VALUE")]
    pub env: Vec<String>,
    /// Working directory of the command in the guest.
    #[arg(long, short = 'w', value_name = "DIR")]
    pub workdir: Option<String>,
    /// Copy a host file into the guest before the command (repeatable).
    #[arg(long = "copy-in", value_name = "HOST:GUEST")]
    pub copy_in: Vec<String>,
    /// Copy a guest file out after the command (repeatable).
    #[arg(long = "copy-out", value_name = "GUEST:HOST")]
    pub copy_out: Vec<String>,
    /// Publish a guest port on the host: [HOST_ADDR:]HOST_PORT:GUEST_PORT[/tcp|/udp]
    /// (passed to the gateway; repeatable).
    #[arg(long, value_name = "SPEC")]
    pub publish: Vec<PublishSpec>,
    /// Trust this PEM CA bundle (besides the system roots) for the upstream
    /// leg of intercepted TLS (repeatable; e.g. a private registry's CA).
    /// Copied into the run dir and passed as the gateway's `--upstream-ca`.
    #[arg(long = "upstream-ca", value_name = "PEM")]
    pub upstream_ca: Vec<PathBuf>,
    /// Serve the gateway's Prometheus metrics at `/metrics` on `[HOST:]PORT` (TCP; the
    /// host defaults to 127.0.0.1; port 0 picks one) or `unix:PATH`. Bound here, outside
    /// the gateway's jail, and passed in; the address is printed on stderr.
    #[arg(long, value_name = "ADDR", value_parser = parse_metrics_addr)]
    pub metrics: Option<MetricsAddr>,
    /// Write the gateway's audit log to this file (default: summarised only).
    #[arg(long, value_name = "PATH")]
    pub audit: Option<PathBuf>,
    /// The audit's format (`--audit` file and `--debug` lines): schema1 or ocsf (the
    /// gateway's `--audit-format`).
    #[arg(long, value_enum, default_value = "schema1")]
    pub audit_format: AuditFormat,
    /// Print one JSON result (exit code, timings, output, audit summary) on
    /// stdout instead of streaming the command's output.
    #[arg(long)]
    pub json: bool,
    /// Stream the guest console and the gateway's log to stderr.
    #[arg(long)]
    pub debug: bool,
    /// Ask on this terminal before allowing a name the policy does not
    /// list (a policy with `unlisted: ask`, docs/approval.md): the gateway
    /// holds the DNS query and this prompt decides. With no terminal, or
    /// with --json, every question is denied and the summary says so.
    #[arg(long, conflicts_with = "no_network")]
    pub ask: bool,
    /// The static guest agent binary.
    #[arg(long, env = "SLUICE_AGENT", value_name = "PATH")]
    pub agent: Option<PathBuf>,
    /// The sluice-gateway binary (default: next to this executable).
    #[arg(long, env = "SLUICE_GATEWAY", value_name = "PATH")]
    pub gateway: Option<PathBuf>,
    /// How the guest's link reaches the gateway: stream, dgram or tap (root only).
    /// Default: the fastest this host can give (docs/launcher.md "Network modes").
    #[arg(long, value_enum, value_name = "MODE")]
    pub network: Option<NetworkMode>,
    /// Boot without a gateway: the guest's network link has nobody on it.
    #[arg(long, conflicts_with_all = ["network", "policy", "allow_domain", "publish", "audit", "gateway", "upstream_ca", "metrics"])]
    pub no_network: bool,
    /// Run without this isolation layer where this host cannot apply it
    /// (repeatable; names as `sluice doctor` prints them, e.g. `landlock`,
    /// `cgroup-memory`). Without it, an unavailable layer is an error.
    #[arg(long = "allow-missing-isolation", value_name = "LAYER", value_parser = parse_layer)]
    pub allow_missing_isolation: Vec<Layer>,
    /// A root filesystem directory to boot instead of the default userland.
    #[arg(long, value_name = "DIR")]
    pub rootfs: Option<PathBuf>,
    /// The kernel image (default: the newest /boot/vmlinuz-*).
    #[arg(long, value_name = "VMLINUZ")]
    pub kernel: Option<PathBuf>,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

fn parse_layer(name: &str) -> Result<Layer, String> {
    // The jail's layers, and the launcher's own nftables floor.
    let all = || Layer::ALL.into_iter().chain([Layer::Nftables]);
    all().find(|l| l.name() == name).ok_or_else(|| {
        let names: Vec<&str> = all().map(Layer::name).collect();
        format!("unknown layer {name:?}; one of {}", names.join(", "))
    })
}

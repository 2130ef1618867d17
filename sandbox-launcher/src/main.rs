//! `sluice` binary: wiring only.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// Run untrusted commands in a micro-VM whose only network is a filtering gateway.
#[derive(Debug, Parser)]
#[command(name = "sluice", version)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant, reason = "parsed once at start-up")]
enum Cmd {
    /// Boot a fresh VM and run COMMAND in it.
    Run(Box<sluice_launcher::run::RunArgs>),
    /// Manage the guest image.
    Image {
        #[command(subcommand)]
        command: ImageCmd,
    },
    /// Report the accelerator, QEMU, image cache and isolation layers.
    Doctor,
    /// Validate a policy file, or explain its verdict for a name.
    Policy {
        #[command(subcommand)]
        command: sluice_launcher::policy_cmd::PolicyCmd,
    },
    /// Read, follow and filter gateway audit logs (schema-1 or OCSF).
    Audit(sluice_launcher::audit_cmd::AuditArgs),
}

#[derive(Debug, Subcommand)]
enum ImageCmd {
    /// Build (or find in the cache) the guest image and print its directory.
    Build {
        /// The static guest agent binary.
        #[arg(long, env = "SLUICE_AGENT")]
        agent: Option<PathBuf>,
        /// The kernel image (default: the newest /boot/vmlinuz-*).
        #[arg(long)]
        kernel: Option<PathBuf>,
        /// A root filesystem directory to pack instead of the default userland.
        #[arg(long)]
        rootfs: Option<PathBuf>,
    },
}

fn main() {
    // `sluice __jail-exec`: this binary is also the jail's helper.
    sluice_launcher::jail::helper_main_if_requested();
    // `sluice __tap-netns`: and the rootless `--network tap` helper.
    sluice_launcher::network_mode::tap_helper_main_if_requested();
    let cli = Cli::parse();
    let code = match cli.command {
        Cmd::Run(args) => sluice_launcher::run::main(*args),
        Cmd::Image {
            command:
                ImageCmd::Build {
                    agent,
                    kernel,
                    rootfs,
                },
        } => sluice_launcher::image_build_main(agent.as_deref(), kernel, rootfs),
        Cmd::Doctor => sluice_launcher::doctor::main(),
        Cmd::Policy { command } => sluice_launcher::policy_cmd::main(command),
        Cmd::Audit(args) => sluice_launcher::audit_cmd::main(args),
    };
    std::process::exit(code);
}

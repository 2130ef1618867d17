//! sluice-launcher: the `sluice` command. Boots a micro-VM whose only network
//! is a `sluice-gateway`, runs one command in it through the guest agent, and
//! manages policies.
//!
//! Modules: [`image`] (the guest image and its cache), `gateway_inputs`
//! (the policy, secrets and CA files as the gateway's jail sees them), `qemu` (accelerator
//! choice and the QEMU command line), `phases` (where a run's time goes),
//! [`network_mode`] (`--network`: how the
//! guest's link reaches the gateway), `spawn` (children that never outlive
//! the launcher), [`run`] (`sluice run`; `run::gateway` starts its gateway,
//! `run::terminal` passes the guest's stdin and output and holds them while
//! an `--ask` question is shown), `ask` and `approved` (`--ask`'s prompt and
//! the `always` overlay writer), [`doctor`] (`sluice doctor`), [`policy_cmd`]
//! (`sluice policy check|explain`), [`audit_cmd`] (`sluice audit`).

use std::io::Write as _;

mod approved;
mod ask;
pub mod audit_cmd;
pub mod doctor;
mod egress_floor;
mod gateway_inputs;
pub mod image;
pub mod jail;
pub mod network_mode;
mod phases;
pub mod policy_cmd;
pub mod qemu;
pub mod run;
mod spawn;

/// `sluice image build`: builds (or finds) the cached guest image and prints
/// its directory. Returns the process exit status.
pub fn image_build_main(
    agent: Option<&std::path::Path>,
    kernel: Option<std::path::PathBuf>,
    rootfs: Option<std::path::PathBuf>,
) -> i32 {
    let result = image::find_agent(agent).and_then(|agent| {
        image::prepare(
            &image::ImageOptions {
                agent,
                kernel,
                rootfs,
                cache_dir: image::default_cache_dir(),
                shared_cache: image::shared_cache_dir(),
            },
            &mut |line| eprintln!("sluice: {line}"),
        )
    });
    match result {
        Ok(img) => {
            let _ = writeln!(std::io::stdout(), "{}", img.dir.display());
            0
        }
        Err(e) => {
            eprintln!("sluice: {e}");
            run::EXIT_LAUNCHER
        }
    }
}

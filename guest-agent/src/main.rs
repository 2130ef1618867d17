//! The sluice guest agent: the static binary `/sluice/bin/sluice-agent` that
//! the guest's `/init` runs as PID 1's child.
//!
//! In order it: loads the virtio modules, starts bringing up `eth0` with a
//! bounded DHCP exchange (in the background, so a guest without a gateway
//! still runs commands), opens the virtio-serial port named
//! [`sluice_agent_proto::PORT_NAME`] and serves one host session on it (see
//! that crate for the protocol). When the session ends, for any reason, the
//! agent exits and `/init` powers the guest off.
//!
//! The agent is built with static glibc, which cannot use NSS: it never looks
//! up users or host names itself; those happen in the commands it runs.

mod session;
mod setup;

use std::process::ExitCode;

fn main() -> ExitCode {
    let network = setup::start();
    match session::serve(network) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice-agent: session ended: {e}");
            ExitCode::FAILURE
        }
    }
}

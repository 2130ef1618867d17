//! Guest setup: kernel modules, the network, the sandbox CA.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread::{self, JoinHandle};

/// busybox inside every sluice guest image (also with a custom rootfs).
pub(crate) const BUSYBOX: &str = "/sluice/bin/busybox";
/// Where the image builder puts the virtio modules.
const MODULE_DIR: &str = "/sluice/modules";
/// The udhcpc event script written by the image builder.
const DHCP_SCRIPT: &str = "/sluice/udhcpc.script";
/// The modules copied into the image and loaded by the agent, in order.
const MODULES: [&str; 7] = sluice_agent_proto::GUEST_MODULES;

/// The system CA bundle path inside the guest.
pub(crate) const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// Where the sandbox CA alone is written.
pub(crate) const SANDBOX_CA: &str = "/etc/sluice/sandbox-ca.pem";

/// Loads the modules, then starts the DHCP exchange on a thread. The handle
/// finishes when the network is up or DHCP gave up (bounded by udhcpc's
/// retry count: about 4 seconds without an answer).
pub(crate) fn start() -> JoinHandle<()> {
    for m in MODULES {
        let path = format!("{MODULE_DIR}/{m}.ko");
        if !Path::new(&path).exists() {
            // Built into this kernel, or not needed.
            continue;
        }
        run_quiet(&[BUSYBOX, "insmod", &path]);
    }
    run_quiet(&[BUSYBOX, "ip", "link", "set", "lo", "up"]);
    thread::spawn(|| {
        if !Path::new("/sys/class/net/eth0").exists() {
            eprintln!("sluice-agent: no eth0: the guest has no network");
            return;
        }
        // -q: exit once bound; -n: exit when no lease; 4 tries 1 s apart.
        let ok = run_quiet(&[
            BUSYBOX,
            "udhcpc",
            "-i",
            "eth0",
            "-f",
            "-q",
            "-n",
            "-t",
            "4",
            "-T",
            "1",
            "-s",
            DHCP_SCRIPT,
        ]);
        if !ok {
            eprintln!("sluice-agent: DHCP got no lease: eth0 stays unconfigured");
        }
    })
}

/// Runs a helper, logging its failure; returns whether it succeeded.
fn run_quiet(argv: &[&str]) -> bool {
    let Some((prog, args)) = argv.split_first() else {
        return false;
    };
    match Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
    {
        Ok(s) if s.success() => true,
        Ok(s) => {
            eprintln!("sluice-agent: {argv:?} failed: {s}");
            false
        }
        Err(e) => {
            eprintln!("sluice-agent: cannot run {argv:?}: {e}");
            false
        }
    }
}

/// Installs a PEM CA certificate: appended to the system bundle and written
/// alone to [`SANDBOX_CA`]. Returns the environment variables that point
/// clients at them, for every later command.
pub(crate) fn install_ca(pem: &[u8]) -> Result<Vec<(String, String)>, String> {
    if !pem.starts_with(b"-----BEGIN CERTIFICATE-----") {
        return Err("the CA is not a PEM certificate".into());
    }
    let write = || -> std::io::Result<()> {
        fs::create_dir_all("/etc/sluice")?;
        fs::write(SANDBOX_CA, pem)?;
        fs::create_dir_all("/etc/ssl/certs")?;
        let mut bundle = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(SYSTEM_BUNDLE)?;
        bundle.write_all(b"\n")?;
        bundle.write_all(pem)?;
        Ok(())
    };
    write().map_err(|e| format!("installing the CA: {e}"))?;
    Ok(vec![
        ("SSL_CERT_FILE".into(), SYSTEM_BUNDLE.into()),
        ("CURL_CA_BUNDLE".into(), SYSTEM_BUNDLE.into()),
        ("REQUESTS_CA_BUNDLE".into(), SYSTEM_BUNDLE.into()),
        ("NODE_EXTRA_CA_CERTS".into(), SANDBOX_CA.into()),
    ])
}

//! Guest setup: the basic mounts, kernel modules, the network, the
//! sandbox CA.
//!
//! Mounts and module loads are system calls made here rather than busybox
//! commands: under TCG every fork and exec of a helper costs tens of
//! milliseconds of boot (docs/benchmarks.md "launcher boot phases").

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

/// The file systems every guest gets (type, mount point), in order, with
/// the kernel's default options as `/init`'s busybox `mount` gave them.
const MOUNTS: [(&str, &str); 6] = [
    ("proc", "/proc"),
    ("sysfs", "/sys"),
    ("devtmpfs", "/dev"),
    ("devpts", "/dev/pts"),
    ("tmpfs", "/dev/shm"),
    ("tmpfs", "/tmp"),
];

/// Mounts the basics, loads the modules, then starts the DHCP exchange on
/// a thread. The handle finishes when the network is up or DHCP gave up
/// (bounded by udhcpc's retry count: about 4 seconds without an answer).
pub(crate) fn start() -> JoinHandle<()> {
    mount_basics();
    // Phase marks on the console: `sluice run` times their arrival
    // (SLUICE_BOOT_TIMES, `phases_ms`); the kernel's own clock beside it.
    let uptime = fs::read_to_string("/proc/uptime").unwrap_or_default();
    let uptime = uptime.split_whitespace().next().unwrap_or("?");
    eprintln!("sluice-agent: start (guest uptime {uptime} s)");
    for m in MODULES {
        let path = format!("{MODULE_DIR}/{m}.ko");
        if !Path::new(&path).exists() {
            // Built into this kernel, or not needed.
            continue;
        }
        if let Err(e) = load_module(&path) {
            eprintln!("sluice-agent: loading {path}: {e}");
        }
    }
    eprintln!("sluice-agent: modules loaded");
    thread::spawn(|| {
        run_quiet(&[BUSYBOX, "ip", "link", "set", "lo", "up"]);
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
        if ok {
            eprintln!("sluice-agent: network up");
        } else {
            eprintln!("sluice-agent: DHCP got no lease: eth0 stays unconfigured");
        }
    })
}

/// Mounts [`MOUNTS`] (a mount that fails is reported; the session still
/// starts, as a shell `/init` would go on) and sets the host name.
fn mount_basics() {
    use rustix::mount::{MountFlags, mount};
    for dir in ["/proc", "/sys", "/dev", "/tmp", "/run", "/root"] {
        let _ = fs::create_dir_all(dir);
    }
    for (fstype, target) in MOUNTS {
        if target.starts_with("/dev/") {
            // On the devtmpfs mounted just before.
            let _ = fs::create_dir_all(target);
        }
        if let Err(e) = mount(
            fstype,
            target,
            fstype,
            MountFlags::empty(),
            None::<&std::ffi::CStr>,
        ) {
            eprintln!("sluice-agent: mounting {fstype} on {target}: {e}");
        }
    }
    if let Err(e) = rustix::system::sethostname(b"sluice") {
        eprintln!("sluice-agent: setting the host name: {e}");
    }
}

/// Loads one kernel module from its file (what busybox `insmod` does,
/// without a process). A module already present is not an error.
fn load_module(path: &str) -> std::io::Result<()> {
    let file = fs::File::open(path)?;
    match rustix::system::finit_module(&file, c"", 0) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => Ok(()),
        Err(e) => Err(e.into()),
    }
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

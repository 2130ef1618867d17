//! The QEMU command line: `-M microvm`, direct kernel boot, the agent and
//! network channels and the serial console as inherited descriptors.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The TCG translation cache in MiB (`-accel tcg,tb-size=`): QEMU 7.2's
/// default is 1 GiB, which the VM's memory limit would have to cover.
pub(crate) const TCG_TB_MIB: u64 = 128;

/// The fixed descriptor numbers QEMU inherits (see [`crate::spawn`]).
pub(crate) const NET_FD: i32 = 3;
/// The agent's virtio-serial channel.
pub(crate) const AGENT_FD: i32 = 4;
/// The serial console.
pub(crate) const CONSOLE_FD: i32 = 5;

/// Which accelerator to use and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accel {
    /// `kvm` or `tcg`.
    pub name: &'static str,
    /// One line saying why.
    pub reason: String,
}

/// Chooses KVM only where a stock Debian guest kernel runs under it: a
/// readable `/dev/kvm`, the `kvm_intel` or `kvm_amd` module (not `kvm_pvm`,
/// which only runs PVM guest kernels) and vmx/svm in `/proc/cpuinfo`.
/// `SLUICE_ACCEL=tcg|kvm` overrides the choice.
pub fn choose_accel() -> Accel {
    match std::env::var("SLUICE_ACCEL").as_deref() {
        Ok("tcg") => return accel("tcg", "SLUICE_ACCEL=tcg"),
        Ok("kvm") => return accel("kvm", "SLUICE_ACCEL=kvm"),
        _ => {}
    }
    if Path::new("/sys/module/kvm_pvm").exists() {
        return accel(
            "tcg",
            "kvm_pvm is loaded: it only runs PVM guest kernels, and the guest is Debian's stock kernel",
        );
    }
    if fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_err()
    {
        return accel("tcg", "/dev/kvm cannot be opened");
    }
    let module = ["kvm_intel", "kvm_amd"]
        .into_iter()
        .find(|m| Path::new("/sys/module").join(m).exists());
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let hw = cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"));
    match (module, hw) {
        (Some(m), true) => accel("kvm", &format!("{m} is loaded and the CPU has vmx/svm")),
        (None, _) => accel("tcg", "neither kvm_intel nor kvm_amd is loaded"),
        (Some(_), false) => accel("tcg", "the CPU does not report vmx or svm"),
    }
}

fn accel(name: &'static str, reason: &str) -> Accel {
    Accel {
        name,
        reason: reason.to_owned(),
    }
}

/// The host TSC frequency in kHz from `/proc/cpuinfo` (TCG guests need it
/// on the command line to skip PIT calibration, which hangs under TCG).
fn host_khz() -> u64 {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("cpu MHz")?
                .split(':')
                .nth(1)?
                .trim()
                .parse::<f64>()
                .ok()
        })
        .map(|mhz| (mhz * 1000.0).round())
        .filter(|khz| khz.is_finite() && *khz > 0.0)
        // In range: a positive finite kHz figure far below u64::MAX.
        .map_or(2_000_000, |khz| {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let khz = khz as u64;
            khz
        })
}

/// Kernel command line items that skip boot work this guest never needs
/// (docs/benchmarks.md "launcher boot phases" measured each):
/// - `cryptomgr.notests`: the crypto self-tests of every algorithm
///   registered at boot (about 0.2 s of TCG time in `crypto_algapi_init`).
///   They check the kernel's own implementations against test vectors, which
///   matters in FIPS mode; Debian's kernel does not boot in it here.
/// - `initcall_blacklist=crypto_kdf108_init`: that initcall is only the
///   SP800-108 KDF's self-test (about 0.09 s under TCG); the KDF itself is
///   registered by nothing the guest uses.
const BOOT_SHORTCUTS: &str = " cryptomgr.notests initcall_blacklist=crypto_kdf108_init";

/// The TCG vCPU: QEMU's `max` without ERMS and FSRM. With them the kernel
/// copies and clears memory with `rep movsb`/`rep stosb`, which TCG runs
/// one byte per iteration; without them it uses 8-byte moves (`rep movsq`
/// or unrolled loops): the 27 MB initramfs unpack, every zeroed page and
/// every copy to user space get cheaper (about 0.25 s of QEMU CPU time to
/// `/init`, docs/benchmarks.md).
const TCG_CPU: &str = "max,-erms,-fsrm";

/// What the VM is booted with.
#[derive(Debug, Clone)]
pub(crate) struct VmConfig {
    pub(crate) qemu: PathBuf,
    pub(crate) accel: Accel,
    pub(crate) kernel: PathBuf,
    pub(crate) initrd: PathBuf,
    pub(crate) memory_mib: u32,
    pub(crate) cpus: u32,
    pub(crate) verbose_console: bool,
    /// How the guest's link at [`NET_FD`] reaches the gateway.
    pub(crate) network: crate::network_mode::NetworkMode,
}

/// QEMU's arguments; the caller places [`NET_FD`], [`AGENT_FD`] and
/// [`CONSOLE_FD`] in the child.
pub(crate) fn args(cfg: &VmConfig) -> Vec<String> {
    let mut append = String::from("console=ttyS0 rdinit=/init panic=-1");
    append.push_str(BOOT_SHORTCUTS);
    // Every console byte costs a trap under TCG: keep the kernel quiet
    // unless the console is being watched.
    append.push_str(if cfg.verbose_console {
        " printk.time=1"
    } else {
        " quiet loglevel=3"
    });
    if cfg.accel.name == "tcg" {
        append.push_str(&format!(
            " tsc_early_khz={} tsc=reliable no_timer_check",
            host_khz()
        ));
    }
    let mut cmd = Args(Vec::new());
    let accel = if cfg.accel.name == "tcg" {
        format!("tcg,tb-size={TCG_TB_MIB}")
    } else {
        cfg.accel.name.to_owned()
    };
    cmd.args(["-M", "microvm,x-option-roms=off", "-accel", &accel]);
    cmd.args([
        "-cpu",
        if cfg.accel.name == "kvm" {
            "host"
        } else {
            TCG_CPU
        },
    ]);
    cmd.args([
        "-m",
        &format!("{}M", cfg.memory_mib),
        "-smp",
        &cfg.cpus.to_string(),
    ]);
    cmd.args([
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
    ]);
    cmd.args([
        "-sandbox",
        "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
    ]);
    cmd.args([
        "-chardev",
        &format!("socket,id=con0,fd={CONSOLE_FD},server=off"),
        "-serial",
        "chardev:con0",
    ]);
    cmd.args(["-kernel", &cfg.kernel.to_string_lossy()]);
    cmd.args(["-initrd", &cfg.initrd.to_string_lossy()]);
    cmd.args(["-append", &append]);
    cmd.args([
        "-device",
        "virtio-serial-device",
        "-chardev",
        &format!("socket,id=agent,fd={AGENT_FD},server=off"),
        "-device",
        &format!(
            "virtserialport,chardev=agent,name={}",
            sluice_agent_proto::PORT_NAME
        ),
    ]);
    cmd.args([
        "-netdev",
        &crate::network_mode::qemu_netdev(cfg.network, NET_FD),
        "-device",
        "virtio-net-device,netdev=net0",
    ]);
    cmd.0
}

/// An argument list built like a [`Command`]'s.
struct Args(Vec<String>);

impl Args {
    fn args<const N: usize>(&mut self, args: [&str; N]) {
        self.0.extend(args.iter().map(|a| (*a).to_owned()));
    }
}

/// `qemu-system-x86_64 --version`'s first line, if QEMU runs.
pub fn qemu_version(qemu: &Path) -> Option<String> {
    let out = Command::new(qemu).arg("--version").output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .map(str::to_owned)
}

/// The QEMU binary: `SLUICE_QEMU`, else `qemu-system-x86_64` from `PATH`.
pub fn find_qemu() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SLUICE_QEMU") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("qemu-system-x86_64"))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(accel: &'static str) -> VmConfig {
        VmConfig {
            qemu: PathBuf::from("/usr/bin/qemu-system-x86_64"),
            accel: Accel {
                name: accel,
                reason: String::new(),
            },
            kernel: PathBuf::from("/cache/vmlinux"),
            initrd: PathBuf::from("/cache/initramfs.cpio"),
            memory_mib: 256,
            cpus: 1,
            verbose_console: false,
            network: crate::network_mode::NetworkMode::Stream,
        }
    }

    fn after<'a>(args: &'a [String], flag: &str) -> &'a str {
        let i = args.iter().position(|a| a == flag).unwrap();
        &args[i + 1]
    }

    #[test]
    fn tcg_boots_with_the_shortcuts_and_without_byte_wise_string_ops() {
        let args = args(&config("tcg"));
        assert_eq!(after(&args, "-cpu"), "max,-erms,-fsrm");
        let append = after(&args, "-append");
        for item in [
            "cryptomgr.notests",
            "initcall_blacklist=crypto_kdf108_init",
            "tsc=reliable",
            "quiet",
        ] {
            assert!(append.split(' ').any(|a| a == item), "{item}: {append}");
        }
    }

    #[test]
    fn kvm_keeps_the_host_cpu_and_no_tsc_flags() {
        let args = args(&config("kvm"));
        assert_eq!(after(&args, "-cpu"), "host");
        let append = after(&args, "-append");
        assert!(append.contains("cryptomgr.notests"), "{append}");
        assert!(!append.contains("tsc="), "{append}");
    }
}

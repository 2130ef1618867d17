//! Our own seccomp filters.
//!
//! Choice: a **denylist** with two actions, not an allowlist. QEMU's syscall
//! set is large and varies with its build, accelerator and devices; an
//! allowlist that misses one call kills the VM at random, so we deny the calls
//! that give a compromised process new kernel attack surface or a way out of
//! its namespaces, and allow the rest. Three filters are stacked (the kernel
//! applies the strictest verdict of all):
//!
//! 1. the architecture guard: any call whose `seccomp_data.arch` is not
//!    `AUDIT_ARCH_X86_64` (i386 via `int 0x80`) or whose number has the x32 bit
//!    (`0x4000_0000`) set kills the process. seccompiler checks only the arch;
//!    the x32 ABI shares the x86_64 arch value, hence our own guard.
//! 2. the kill list ([`KILL_ALWAYS`] plus per-profile calls): the process dies
//!    with `SIGSYS` (`SECCOMP_RET_KILL_PROCESS`).
//! 3. the "not implemented" list ([`ENOSYS_ALWAYS`]): calls that libraries
//!    probe and fall back from (`io_uring_setup`, `clone3`, `userfaultfd`,
//!    `perf_event_open`) fail with `ENOSYS` so QEMU and glibc take their
//!    fallback paths instead of dying.
//!
//! Only x86_64 is supported; on other architectures building a filter fails.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch, sock_filter,
};
use serde::{Deserialize, Serialize};

use crate::ConfineError;

/// Which filter to install.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum SeccompProfile {
    /// For QEMU: the common kill list, plus `execveat` and `clone` with any
    /// namespace flag. `execve` stays allowed because the jail must exec QEMU
    /// after installing the filter; Landlock limits what can be executed to the
    /// read-only files of the jail.
    Qemu,
    /// For the gateway: the common kill list plus every way to start a program
    /// or a process: `execve`, `execveat`, `fork`, `vfork`, and `clone` without
    /// `CLONE_THREAD` (threads stay allowed).
    Gateway,
    /// No filter.
    None,
}

/// Calls that kill the process under every profile: mounts and root changes,
/// namespace changes, tracing and cross-process memory access, kernel module
/// and kexec loading, BPF and perf, the kernel keyring, raw I/O ports, clock
/// and system administration, and file handles (`open_by_handle_at`, the
/// "shocker" container escape).
pub const KILL_ALWAYS: &[(&str, i64)] = &[
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("chroot", libc::SYS_chroot),
    ("fsopen", libc::SYS_fsopen),
    ("fsconfig", libc::SYS_fsconfig),
    ("fsmount", libc::SYS_fsmount),
    ("fspick", libc::SYS_fspick),
    ("move_mount", libc::SYS_move_mount),
    ("open_tree", libc::SYS_open_tree),
    ("mount_setattr", libc::SYS_mount_setattr),
    ("unshare", libc::SYS_unshare),
    ("setns", libc::SYS_setns),
    ("ptrace", libc::SYS_ptrace),
    ("process_vm_readv", libc::SYS_process_vm_readv),
    ("process_vm_writev", libc::SYS_process_vm_writev),
    ("pidfd_getfd", libc::SYS_pidfd_getfd),
    ("kcmp", libc::SYS_kcmp),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("bpf", libc::SYS_bpf),
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("reboot", libc::SYS_reboot),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("acct", libc::SYS_acct),
    ("quotactl", libc::SYS_quotactl),
    ("syslog", libc::SYS_syslog),
    ("settimeofday", libc::SYS_settimeofday),
    ("clock_settime", libc::SYS_clock_settime),
    ("clock_adjtime", libc::SYS_clock_adjtime),
    ("adjtimex", libc::SYS_adjtimex),
    ("iopl", libc::SYS_iopl),
    ("ioperm", libc::SYS_ioperm),
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("name_to_handle_at", libc::SYS_name_to_handle_at),
    ("vhangup", libc::SYS_vhangup),
    ("uselib", libc::SYS_uselib),
    ("personality", libc::SYS_personality),
    ("lookup_dcookie", libc::SYS_lookup_dcookie),
    ("sethostname", libc::SYS_sethostname),
    ("setdomainname", libc::SYS_setdomainname),
];

/// Calls that fail with `ENOSYS` under every profile, as if the kernel lacked
/// them: software probes these and falls back (glibc retries `clone3` as
/// `clone`, whose flags the kill list can inspect; QEMU falls back from
/// io_uring to ppoll/epoll).
pub const ENOSYS_ALWAYS: &[(&str, i64)] = &[
    ("clone3", libc::SYS_clone3),
    ("io_uring_setup", libc::SYS_io_uring_setup),
    ("io_uring_enter", libc::SYS_io_uring_enter),
    ("io_uring_register", libc::SYS_io_uring_register),
    ("userfaultfd", libc::SYS_userfaultfd),
    ("perf_event_open", libc::SYS_perf_event_open),
];

/// Namespace flags of `clone(2)`; a `clone` carrying any of them is killed.
const CLONE_NS_FLAGS: &[u64] = &[
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWCGROUP as u64,
];

/// The x32 syscall bit (`__X32_SYSCALL_BIT`).
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
/// `AUDIT_ARCH_X86_64`.
const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;

impl SeccompProfile {
    /// Builds the stacked BPF programs of this profile, in install order (the
    /// architecture guard first). Empty for [`SeccompProfile::None`].
    ///
    /// # Errors
    /// [`ConfineError::SeccompBuild`] on a non-x86_64 build or a filter the
    /// compiler rejects.
    pub fn programs(self) -> Result<Vec<BpfProgram>, ConfineError> {
        if self == Self::None {
            return Ok(Vec::new());
        }
        if !cfg!(target_arch = "x86_64") {
            return Err(ConfineError::SeccompBuild(
                "only x86_64 filters are defined".to_owned(),
            ));
        }
        let mut kill: BTreeMap<i64, Vec<SeccompRule>> = KILL_ALWAYS
            .iter()
            .map(|&(_, nr)| (nr, Vec::new()))
            .collect();
        match self {
            Self::Qemu => {
                kill.insert(libc::SYS_execveat, Vec::new());
                let rules = CLONE_NS_FLAGS
                    .iter()
                    .map(|&flag| flag_rule(flag, flag))
                    .collect::<Result<Vec<_>, _>>()?;
                kill.insert(libc::SYS_clone, rules);
            }
            Self::Gateway => {
                for nr in [
                    libc::SYS_execve,
                    libc::SYS_execveat,
                    libc::SYS_fork,
                    libc::SYS_vfork,
                ] {
                    kill.insert(nr, Vec::new());
                }
                let mut rules = vec![flag_rule(libc::CLONE_THREAD as u64, 0)?];
                for &flag in CLONE_NS_FLAGS {
                    rules.push(flag_rule(flag, flag)?);
                }
                kill.insert(libc::SYS_clone, rules);
            }
            Self::None => {}
        }
        let enosys: BTreeMap<i64, Vec<SeccompRule>> = ENOSYS_ALWAYS
            .iter()
            .map(|&(_, nr)| (nr, Vec::new()))
            .collect();
        let errno_enosys =
            u32::try_from(libc::ENOSYS).map_err(|e| ConfineError::SeccompBuild(e.to_string()))?;
        Ok(vec![
            arch_guard(),
            compile(kill, SeccompAction::KillProcess)?,
            compile(enosys, SeccompAction::Errno(errno_enosys))?,
        ])
    }

    /// Installs this profile's filters on the calling thread (`all_threads`
    /// false; threads it creates later inherit them) or on every thread of the
    /// process (`all_threads` true, `SECCOMP_FILTER_FLAG_TSYNC`). Sets
    /// `no_new_privs` first, which an unprivileged process needs.
    ///
    /// # Errors
    /// [`ConfineError::SeccompBuild`] / [`ConfineError::SeccompInstall`].
    pub fn install(self, all_threads: bool) -> Result<(), ConfineError> {
        let programs = self.programs()?;
        if programs.is_empty() {
            return Ok(());
        }
        crate::limits::set_no_new_privs()?;
        for program in &programs {
            let installed = if all_threads {
                seccompiler::apply_filter_all_threads(program)
            } else {
                seccompiler::apply_filter(program)
            };
            installed.map_err(|e| ConfineError::SeccompInstall(e.to_string()))?;
        }
        Ok(())
    }

    /// The profile's name as `sluice doctor` prints it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Qemu => "qemu",
            Self::Gateway => "gateway",
            Self::None => "none",
        }
    }
}

/// A rule matching when `(arg0 & mask) == value` (the clone flags).
fn flag_rule(mask: u64, value: u64) -> Result<SeccompRule, ConfineError> {
    let condition = SeccompCondition::new(
        0,
        SeccompCmpArgLen::Qword,
        SeccompCmpOp::MaskedEq(mask),
        value,
    )
    .map_err(|e| ConfineError::SeccompBuild(e.to_string()))?;
    SeccompRule::new(vec![condition]).map_err(|e| ConfineError::SeccompBuild(e.to_string()))
}

/// Compiles a filter that applies `on_match` to the listed calls and allows the rest.
fn compile(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    on_match: SeccompAction,
) -> Result<BpfProgram, ConfineError> {
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, on_match, TargetArch::x86_64)
        .map_err(|e| ConfineError::SeccompBuild(e.to_string()))?;
    BpfProgram::try_from(filter).map_err(|e| ConfineError::SeccompBuild(e.to_string()))
}

/// The architecture guard: kill anything that is not a native x86_64 call.
fn arch_guard() -> BpfProgram {
    const BPF_LD_W_ABS: u16 = 0x20;
    const BPF_JMP_JEQ_K: u16 = 0x05 | 0x10;
    const BPF_JMP_JGE_K: u16 = 0x05 | 0x30;
    const BPF_RET_K: u16 = 0x06;
    const SECCOMP_DATA_NR: u32 = 0;
    const SECCOMP_DATA_ARCH: u32 = 4;
    const RET_KILL_PROCESS: u32 = 0x8000_0000;
    const RET_ALLOW: u32 = 0x7fff_0000;
    let insn = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    vec![
        insn(BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_ARCH),
        // arch == x86_64 ? skip the kill : fall into it
        insn(BPF_JMP_JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        insn(BPF_RET_K, 0, 0, RET_KILL_PROCESS),
        insn(BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_NR),
        // nr >= x32 bit ? kill : allow
        insn(BPF_JMP_JGE_K, 0, 1, X32_SYSCALL_BIT),
        insn(BPF_RET_K, 0, 0, RET_KILL_PROCESS),
        insn(BPF_RET_K, 0, 0, RET_ALLOW),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_profile_compiles_within_the_bpf_limit() {
        for profile in [SeccompProfile::Qemu, SeccompProfile::Gateway] {
            let programs = profile.programs().unwrap();
            assert_eq!(programs.len(), 3, "{profile:?}");
            for p in &programs {
                assert!(!p.is_empty() && p.len() < 4096, "{profile:?}: {}", p.len());
            }
        }
        assert!(SeccompProfile::None.programs().unwrap().is_empty());
    }

    #[test]
    fn arch_guard_kills_foreign_arch_and_x32() {
        let guard = arch_guard();
        // Walk the little program by hand for three inputs.
        let run = |arch: u32, nr: u32| -> u32 {
            let (mut pc, mut acc) = (0usize, 0u32);
            loop {
                let i = &guard[pc];
                match i.code {
                    0x20 => acc = if i.k == 4 { arch } else { nr },
                    0x15 => {
                        pc += usize::from(if acc == i.k { i.jt } else { i.jf });
                    }
                    0x35 => {
                        pc += usize::from(if acc >= i.k { i.jt } else { i.jf });
                    }
                    0x06 => return i.k,
                    other => panic!("unexpected opcode {other:#x}"),
                }
                pc += 1;
            }
        };
        assert_eq!(run(AUDIT_ARCH_X86_64, 0), 0x7fff_0000);
        assert_eq!(run(AUDIT_ARCH_X86_64, 0x4000_0000 | 59), 0x8000_0000);
        assert_eq!(run(3 | 0x4000_0000, 1), 0x8000_0000); // AUDIT_ARCH_I386
    }

    #[test]
    fn kill_and_enosys_lists_do_not_overlap() {
        for (name, nr) in ENOSYS_ALWAYS {
            assert!(!KILL_ALWAYS.iter().any(|(_, k)| k == nr), "{name}");
        }
    }
}

//! The rootless jail's user namespace: whether this host lets an ordinary
//! user create one, and entering one that maps only the caller's uid and
//! gid.
//!
//! A rootless helper calls [`enter`] before it makes the PID namespace, so
//! every namespace the jail creates afterwards is owned by this user
//! namespace: the caller has capabilities inside it (to mount, pivot_root,
//! set the hostname) and none outside it.

use std::fs;
use std::io;

use super::sys;

/// Why unprivileged user namespaces cannot be created here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UsernsError {
    /// A sysctl turns them off.
    #[error(
        "unprivileged user namespaces are disabled on this host ({sysctl} = {value}): \
         enable them with `sysctl -w {sysctl}={wanted}`, or run sluice as root"
    )]
    Disabled {
        /// The sysctl's dotted name, e.g. `kernel.unprivileged_userns_clone`.
        sysctl: &'static str,
        /// Its current value.
        value: String,
        /// The value that enables them.
        wanted: &'static str,
    },
    /// `unshare(CLONE_NEWUSER)` was refused although no known sysctl
    /// forbids it (a security module, a container's seccomp filter, the
    /// namespace limit reached).
    #[error(
        "cannot create a user namespace as uid {uid}: {kind} (check the sysctls \
         user.max_user_namespaces and kernel.unprivileged_userns_clone, and any \
         AppArmor/SELinux or container policy), or run sluice as root"
    )]
    Refused {
        /// The caller's uid.
        uid: u32,
        /// The OS error.
        kind: io::ErrorKind,
    },
    /// Writing the id maps failed.
    #[error("writing {file} of the jail's user namespace: {kind}")]
    Map {
        /// `uid_map`, `gid_map` or `setgroups`.
        file: &'static str,
        /// The OS error.
        kind: io::ErrorKind,
    },
}

/// The sysctls that can forbid unprivileged user namespaces, as
/// (`/proc/sys` path, dotted name, value that enables them).
const SYSCTLS: [(&str, &str, &str); 3] = [
    // Debian's and Ubuntu's patch; absent on kernels without it.
    (
        "/proc/sys/kernel/unprivileged_userns_clone",
        "kernel.unprivileged_userns_clone",
        "1",
    ),
    // 0 forbids user namespaces for everyone but the initial one.
    (
        "/proc/sys/user/max_user_namespaces",
        "user.max_user_namespaces",
        "15000",
    ),
    // Ubuntu 23.10+: AppArmor restricts them to profiled programs.
    (
        "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
        "kernel.apparmor_restrict_unprivileged_userns",
        "0",
    ),
];

/// Decides from the sysctls' values (`None`: the file does not exist)
/// whether an ordinary user may create a user namespace. Pure, for tests.
pub(crate) fn verdict(values: [Option<&str>; 3]) -> Result<(), UsernsError> {
    for ((_, sysctl, wanted), value) in SYSCTLS.iter().zip(values) {
        let Some(value) = value.map(str::trim) else {
            continue;
        };
        let off = match *sysctl {
            "kernel.apparmor_restrict_unprivileged_userns" => value != "0",
            _ => value == "0",
        };
        if off {
            return Err(UsernsError::Disabled {
                sysctl,
                value: value.to_owned(),
                wanted,
            });
        }
    }
    Ok(())
}

/// Whether this host lets an ordinary user create user namespaces, from
/// the sysctls (cheap, changes nothing). The kernel may still refuse
/// ([`enter`] then says so).
pub(crate) fn probe() -> Result<(), UsernsError> {
    let read = |p: &str| fs::read_to_string(p).ok();
    let values = SYSCTLS.map(|(p, _, _)| read(p));
    verdict([
        values[0].as_deref(),
        values[1].as_deref(),
        values[2].as_deref(),
    ])
}

/// Moves the calling (single-threaded) process into a new user namespace
/// in which only `uid` and `gid`, the caller's own, are mapped, each to
/// itself. `setgroups` is denied in it (the kernel requires that before an
/// unprivileged gid map), so the caller's supplementary groups stay.
pub(crate) fn enter(uid: u32, gid: u32) -> Result<(), UsernsError> {
    if let Err(e) = sys::unshare(libc::CLONE_NEWUSER) {
        // The sysctls explain most refusals; name the one that is off.
        probe()?;
        return Err(UsernsError::Refused {
            uid,
            kind: e.kind(),
        });
    }
    let write = |file: &'static str, data: String| {
        fs::write(format!("/proc/self/{file}"), data).map_err(|e| UsernsError::Map {
            file,
            kind: e.kind(),
        })
    };
    write("setgroups", "deny".to_owned())?;
    write("uid_map", format!("{uid} {uid} 1\n"))?;
    write("gid_map", format!("{gid} {gid} 1\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_disabling_sysctl_is_named_with_the_value_that_enables_it() {
        let cases = [
            (
                [Some("0\n"), Some("96365\n"), None],
                "sysctl -w kernel.unprivileged_userns_clone=1",
            ),
            (
                [None, Some("0\n"), None],
                "sysctl -w user.max_user_namespaces=15000",
            ),
            (
                [Some("1"), Some("100"), Some("1")],
                "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0",
            ),
        ];
        for (values, fix) in cases {
            let e = verdict(values).unwrap_err();
            let line = e.to_string();
            assert!(line.contains(fix), "{line}");
            assert!(
                line.contains("unprivileged user namespaces are disabled"),
                "{line}"
            );
            assert!(!line.contains('\n'), "one line: {line:?}");
        }
    }

    #[test]
    fn enabled_or_absent_sysctls_allow_user_namespaces() {
        assert_eq!(verdict([None, None, None]), Ok(()));
        assert_eq!(verdict([Some("1\n"), Some("96365\n"), Some("0\n")]), Ok(()));
    }
}

//! Who builds the jail (root or an ordinary user) and where its per-run
//! directories go.
//!
//! As root, jails drop to uid/gid 65534 and their directories go in the
//! system temp dir. Rootless, a jail runs as the caller's own uid and gid
//! (the only ids its user namespace maps) and its directories go in a dir
//! only the caller can enter: `$XDG_RUNTIME_DIR/sluice` when that runtime
//! dir is the caller's, else `/tmp/sluice-<uid>` (mode 0700).

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::sys;

/// The uid (and gid) jails drop to when built by root: nobody/nogroup.
pub const NOBODY: u32 = 65534;

/// Whether this process builds jails without root (effective uid not 0):
/// in a user namespace, as the caller's own ids.
pub fn is_rootless() -> bool {
    sys::geteuid() != 0
}

/// The uid and gid a jailed program runs as: 65534 when root builds the
/// jail, the caller's effective ids when rootless.
pub fn default_ids() -> (u32, u32) {
    if is_rootless() {
        (sys::geteuid(), sys::getegid())
    } else {
        (NOBODY, NOBODY)
    }
}

/// Where per-run directories go (jail mount points, `sluice run`'s run
/// dirs): the system temp dir as root; rootless, `$XDG_RUNTIME_DIR/sluice`
/// when `$XDG_RUNTIME_DIR` is an absolute dir owned by the caller, else
/// `<temp>/sluice-<uid>`. Not created here: see [`ensure_private_dir`].
pub fn default_runtime_dir() -> PathBuf {
    if !is_rootless() {
        return std::env::temp_dir();
    }
    let uid = sys::geteuid();
    let xdg = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|d| d.is_absolute())
        .filter(|d| fs::symlink_metadata(d).is_ok_and(|m| m.is_dir() && m.uid() == uid));
    match xdg {
        Some(d) => d.join("sluice"),
        None => std::env::temp_dir().join(format!("sluice-{uid}")),
    }
}

/// Creates `dir` (mode 0700) if missing and checks that it is a real
/// directory (not a symlink) owned by the caller with no group or other
/// access: in a shared `/tmp` another user could have created it first.
///
/// # Errors
/// Creating it failed, or it exists and is not private to the caller.
pub fn ensure_private_dir(dir: &Path) -> io::Result<()> {
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(io::Error::new(
                e.kind(),
                format!("creating {}: {e}", dir.display()),
            ));
        }
    }
    let meta = fs::symlink_metadata(dir)?;
    let uid = sys::geteuid();
    if !meta.is_dir() || meta.uid() != uid || meta.permissions().mode() & 0o077 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is not a directory private to uid {uid} (owner {}, mode {:o}): \
                 remove it or set XDG_RUNTIME_DIR",
                dir.display(),
                meta.uid(),
                meta.permissions().mode() & 0o7777
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_private_dir_is_created_0700_and_a_shared_one_is_refused() {
        let base = std::env::temp_dir().join(format!("slj-rt-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        ensure_private_dir(&base).unwrap();
        let mode = fs::metadata(&base).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        // Idempotent.
        ensure_private_dir(&base).unwrap();
        fs::set_permissions(&base, fs::Permissions::from_mode(0o755)).unwrap();
        let e = ensure_private_dir(&base).unwrap_err();
        assert!(e.to_string().contains("not a directory private"), "{e}");
        fs::remove_dir_all(&base).unwrap();
        // A symlink to a private dir is refused too.
        let target = base.with_extension("target");
        let _ = fs::remove_dir_all(&target);
        fs::DirBuilder::new().mode(0o700).create(&target).unwrap();
        std::os::unix::fs::symlink(&target, &base).unwrap();
        assert!(ensure_private_dir(&base).is_err());
        fs::remove_file(&base).unwrap();
        fs::remove_dir_all(&target).unwrap();
    }
}

//! The run dir of one `sluice run`: `<runtime>/<sandbox_id>.run`, holding
//! the inline policy, the `--upstream-ca` copies and the control sockets
//! the launcher serves to the jailed gateway (`approve.sock` under `--ask`,
//! `approved.sock` with `--policy`), and a subdirectory [`GATEWAY_OUT`]
//! where the gateway writes the sandbox CA.
//!
//! As root the run dir is root's, group the gateway's own gid
//! (`egress_floor::gateway_gid`), mode 0710, and lies in the sticky temp
//! dir: no process but root can rename, remove or add a name in it, and
//! only the gateway's gid can even search it. The sockets are root's,
//! group that gid, mode 0660 (`gateway_inputs::hand_socket_to_jail`). So a
//! host process running as `nobody` outside the jails (uid 65534, the
//! jails' uid, but not the gateway's gid) can neither put its own socket
//! where the gateway connects (and answer its questions, or say an
//! overlay entry was written) nor connect to the launcher's. Only
//! [`GATEWAY_OUT`] is the jails' uid's (mode 0700): the one place the
//! gateway writes. Rootless everything is the caller's, in the caller's
//! private runtime dir (`jail::default_runtime_dir`).

use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::gateway_inputs::jail_ids;
use crate::jail;

/// The subdirectory of the run dir the gateway may write (the CA).
pub(crate) const GATEWAY_OUT: &str = "out";

/// A per-run directory, removed (with its contents) when dropped.
pub(super) struct RunDir(pub(super) PathBuf);

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Creates the run dir `<runtime>/<sandbox_id>.run` and its
/// [`GATEWAY_OUT`]. As root `<runtime>` is the temp dir, the run dir is
/// root's with the gateway's own gid as group (mode 0710) and [`GATEWAY_OUT`] the
/// jails' uid's (0700); rootless both are the caller's (0700) in the
/// caller's private runtime dir.
///
/// # Errors
/// A directory cannot be made or given its owner.
pub(super) fn make_run_dir(sandbox_id: &str) -> anyhow::Result<RunDir> {
    let rootless = jail::is_rootless();
    let base = jail::default_runtime_dir();
    if rootless {
        jail::ensure_private_dir(&base).context("the run dir's parent")?;
    }
    let path = base.join(format!("{sandbox_id}.run"));
    // A previous launcher with this pid died before its helper started.
    if path.symlink_metadata().is_ok() {
        fs::remove_dir_all(&path).with_context(|| format!("removing stale {}", path.display()))?;
    }
    // Made by this process, so root's as root from the start: there is no
    // moment at which another uid owns it. `create` fails on a name that
    // appeared meanwhile.
    let mode = if rootless { 0o700 } else { 0o710 };
    fs::DirBuilder::new()
        .mode(mode)
        .create(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    let dir = RunDir(path);
    fs::set_permissions(&dir.0, fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {}", dir.0.display()))?;
    let out = dir.0.join(GATEWAY_OUT);
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&out)
        .with_context(|| format!("creating {}", out.display()))?;
    if !rootless {
        let gateway_gid = crate::egress_floor::gateway_gid();
        std::os::unix::fs::chown(&dir.0, None, Some(gateway_gid))
            .with_context(|| format!("chgrp {}", dir.0.display()))?;
        let (uid, gid) = jail_ids();
        std::os::unix::fs::chown(&out, Some(uid), Some(gid))
            .with_context(|| format!("chown {}", out.display()))?;
    }
    Ok(dir)
}

/// Where the gateway writes the sandbox CA in the run dir `run_dir`.
pub(super) fn ca_out(run_dir: &Path) -> PathBuf {
    run_dir.join(GATEWAY_OUT).join("ca.pem")
}

/// Reads a file the gateway wrote in [`GATEWAY_OUT`] (a directory of the
/// jails' uid): never through a symlink it put there (root would read
/// whatever the link names), only a regular file, at most `limit` + 1
/// bytes (the caller refuses more).
///
/// # Errors
/// The open or the read fails, or the name is a symlink or not a regular
/// file.
pub(super) fn read_written(path: &Path, limit: usize) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut data = Vec::new();
    file.take(u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1))
        .read_to_end(&mut data)?;
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt as _;
    use std::os::unix::net::UnixListener;
    use std::process::Command;

    /// What a process of `uid`, `gid` and supplementary `groups` gets from
    /// each operation on the run dir `run` and its socket `sock`: a JSON
    /// object of operation to "ok" or the errno's name.
    fn attempt(uid: u32, gid: u32, groups: &str, run: &Path, sock: &Path) -> serde_json::Value {
        const SCRIPT: &str = r#"
import errno, json, os, socket, sys
run, sock = sys.argv[1], sys.argv[2]
def do(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
def bind(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
print(json.dumps({
    "connect": do(lambda: connect(sock)),
    "unlink": do(lambda: os.unlink(sock)),
    "rename": do(lambda: os.rename(sock, sock + ".old")),
    "bind_beside": do(lambda: bind(os.path.join(run, "evil.sock"))),
    "move_run_dir": do(lambda: os.rename(run, run + ".moved")),
    "write_out": do(lambda: open(os.path.join(run, "out", "ca.pem"), "w").close()),
}))
"#;
        let out = Command::new("setpriv")
            .arg(format!("--reuid={uid}"))
            .arg(format!("--regid={gid}"))
            .arg(groups)
            .args(["/usr/bin/python3", "-I", "-c", SCRIPT])
            .arg(run)
            .arg(sock)
            .current_dir("/")
            .output()
            .expect("setpriv runs");
        assert!(
            out.status.success(),
            "setpriv: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("the script's JSON")
    }

    /// Review s10 #9: as root, a process of the jails' uid 65534 outside the
    /// jails cannot replace the control socket, add one beside it, move the
    /// run dir away or even connect; the gateway's own credentials (uid
    /// 65534, its own gid, 65534 as a supplementary group) connect and
    /// write the CA, and cannot replace the socket either.
    #[test]
    fn only_the_gateways_gid_reaches_the_sockets_and_nobody_replaces_them() {
        if !rustix::process::geteuid().is_root() {
            sluice_test_skip::may_skip("root", "the run dir's ownership needs root");
            return;
        }
        if Command::new("setpriv").arg("--version").output().is_err()
            || !Path::new("/usr/bin/python3").exists()
        {
            sluice_test_skip::may_skip("setpriv", "setpriv or /usr/bin/python3 is missing");
            return;
        }
        let gid = crate::egress_floor::gateway_gid();
        let dir = make_run_dir(&format!("vc-rundir-{}", std::process::id())).unwrap();
        let meta = fs::metadata(&dir.0).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid(), meta.mode() & 0o7777),
            (0, gid, 0o710)
        );
        let sock = dir.0.join("approve.sock");
        let _listener = UnixListener::bind(&sock).unwrap();
        crate::gateway_inputs::hand_socket_to_jail(&sock, &dir.0).unwrap();
        let meta = fs::metadata(&sock).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid(), meta.mode() & 0o777),
            (0, gid, 0o660)
        );

        let nobody = attempt(65534, 65534, "--clear-groups", &dir.0, &sock);
        for (op, want) in [
            ("connect", "EACCES"),
            ("unlink", "EACCES"),
            ("rename", "EACCES"),
            ("bind_beside", "EACCES"),
            // The temp dir is sticky and the run dir root's.
            ("move_run_dir", "EPERM"),
            ("write_out", "EACCES"),
        ] {
            assert_eq!(nobody[op], want, "nobody outside the jail, {op}: {nobody}");
        }
        let gateway = attempt(65534, gid, "--groups=65534", &dir.0, &sock);
        for (op, want) in [
            ("connect", "ok"),
            ("unlink", "EACCES"),
            ("rename", "EACCES"),
            ("bind_beside", "EACCES"),
            ("move_run_dir", "EPERM"),
            ("write_out", "ok"),
        ] {
            assert_eq!(
                gateway[op], want,
                "the gateway's credentials, {op}: {gateway}"
            );
        }
        assert!(sock.exists(), "the socket is gone");
    }

    /// The CA is read from the gateway's directory, never through a symlink
    /// the gateway's uid put there instead.
    #[test]
    fn a_symlinked_ca_is_not_read() {
        let dir = std::env::temp_dir().join(format!("vc-rundir-ca-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let real = dir.join("real.pem");
        fs::write(&real, "-----BEGIN CERTIFICATE-----\n").unwrap();
        assert_eq!(read_written(&real, 64).unwrap().len(), 28);
        assert_eq!(read_written(&real, 4).unwrap().len(), 5);
        let link = dir.join("ca.pem");
        std::os::unix::fs::symlink("/etc/passwd", &link).unwrap();
        assert!(read_written(&link, 1 << 16).is_err());
        assert!(read_written(&dir, 1 << 16).is_err());
        let _ = fs::remove_dir_all(&dir);
    }
}

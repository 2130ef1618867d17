//! The gateway's inputs from the host, as its jail must see them: the policy
//! file, the secret files and environment variables the policy names, and
//! the files `sluice run` writes into the run dir for it.
//!
//! The gateway runs as uid/gid [`jail_ids`] in a mount namespace that holds
//! only what its jail binds (`spawn::gateway_spec`). Reload
//! (`gateway/src/reload.rs`) re-reads the policy *path* and the secret files
//! later, so what is bound must keep showing the host's current file:
//!
//! * A bind of a single file pins the inode that existed when the jail was
//!   built. A file replaced by rename (editors, `mv`, config management,
//!   Kubernetes' `..data` symlink swap) would never be seen. So the file's
//!   **directory** is bound read-only instead, and the gateway is told a
//!   path inside it; the gateway's own Landlock likewise allows reading that
//!   directory (`sluice_confine::gateway_self_restrict`), never writing it.
//! * A directory is bound only when that is safe and works: not `/`, not
//!   world-writable (a shared directory like `/tmp` would show the gateway
//!   every other user's files there), searchable by the jail's uid, and
//!   holding the file itself (a symlink out of it would not resolve in the
//!   jail). Otherwise the file alone is bound and the caller warns that a
//!   rename-replace is not seen.
//! * Every file must be readable by the jail's uid or gid; this is checked
//!   before start so the error names the file rather than coming from the
//!   gateway's log.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, anyhow, bail};
use sluice_policy::{ApprovalBackend, CompiledPolicy, SecretSource};

/// The uid and gid both jails run as: 65534 (nobody/nogroup) as root,
/// the caller's own rootless (`jail::default_ids`).
pub(crate) fn jail_ids() -> (u32, u32) {
    crate::jail::default_ids()
}

/// How the gateway's jail sees one file it re-reads on reload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileView {
    /// The absolute path the gateway opens (the same inside and outside
    /// the jail).
    pub(crate) path: PathBuf,
    /// What is bound read-only at its own path: the file's directory, or
    /// the file alone.
    pub(crate) bind: PathBuf,
    /// Why the file alone is bound (a rename-replace is then not seen by
    /// reload); `None` when its directory is bound.
    pub(crate) file_only: Option<String>,
}

impl FileView {
    /// The view of `--policy FILE`: relative paths and `..` are resolved
    /// against the current directory and the directory's symlinks are
    /// resolved, the file name is kept (it may be a symlink inside the
    /// directory, as Kubernetes ConfigMaps make).
    ///
    /// # Errors
    /// The file does not exist, is not a regular file, or is not readable
    /// by the jail's uid/gid.
    pub(crate) fn of_policy(given: &Path) -> anyhow::Result<Self> {
        let abs = if given.is_absolute() {
            given.to_path_buf()
        } else {
            std::env::current_dir()
                .context("the current directory")?
                .join(given)
        };
        let name = abs
            .file_name()
            .ok_or_else(|| anyhow!("{} names no file", given.display()))?;
        let parent = abs.parent().unwrap_or(Path::new("/"));
        let dir = fs::canonicalize(parent).with_context(|| format!("{}", parent.display()))?;
        Self::of(&dir.join(name))
    }

    /// The view of a secret file named in the policy: the path stays as
    /// written (the gateway opens exactly that), which must be absolute and
    /// free of `..` (the policy requires absolute paths).
    ///
    /// # Errors
    /// As [`FileView::of_policy`], or the path is relative or has `..`.
    pub(crate) fn of_secret(path: &Path) -> anyhow::Result<Self> {
        if !path.is_absolute() || path.components().any(|c| c == Component::ParentDir) {
            bail!(
                "{} is not an absolute path without `..` (the gateway's jail binds it at that path)",
                path.display()
            );
        }
        Self::of(path)
    }

    fn of(path: &Path) -> anyhow::Result<Self> {
        let meta = fs::metadata(path).with_context(|| format!("{}", path.display()))?;
        if !meta.is_file() {
            bail!("{} is not a regular file", path.display());
        }
        let (uid, gid) = jail_ids();
        if !readable_by(&meta, (uid, gid), 0o4) {
            bail!(
                "{} (mode {:o}, owner {}:{}) is not readable by the gateway, which runs as \
                 uid {uid}/gid {gid}: e.g. `chgrp {gid} FILE && chmod g+r FILE`",
                path.display(),
                meta.permissions().mode() & 0o7777,
                meta.uid(),
                meta.gid()
            );
        }
        let dir = path.parent().unwrap_or(Path::new("/")).to_path_buf();
        let file_only = dir_unfit(&dir, path);
        Ok(Self {
            path: path.to_path_buf(),
            bind: if file_only.is_some() {
                path.to_path_buf()
            } else {
                dir
            },
            file_only,
        })
    }
}

/// Why `dir` (holding `file`) must not or cannot be bound whole; `None`
/// when it can.
fn dir_unfit(dir: &Path, file: &Path) -> Option<String> {
    let Ok(real_dir) = fs::canonicalize(dir) else {
        return Some(format!("{} cannot be resolved", dir.display()));
    };
    if real_dir == Path::new("/") {
        return Some("it is in /".to_owned());
    }
    let meta = match fs::metadata(&real_dir) {
        Ok(m) => m,
        Err(e) => return Some(format!("{}: {e}", real_dir.display())),
    };
    if meta.permissions().mode() & 0o002 != 0 {
        return Some(format!(
            "its directory {} is world-writable, a shared directory whose other files the \
             gateway must not see",
            real_dir.display()
        ));
    }
    let (uid, gid) = jail_ids();
    if !readable_by(&meta, (uid, gid), 0o1) {
        return Some(format!(
            "its directory {} is not searchable by uid {uid}/gid {gid}",
            real_dir.display()
        ));
    }
    match fs::canonicalize(file) {
        Ok(real) if real.starts_with(&real_dir) => None,
        Ok(real) => Some(format!(
            "it resolves to {}, outside its directory",
            real.display()
        )),
        Err(e) => Some(format!("{}: {e}", file.display())),
    }
}

/// Whether the permission bit `bit` (4 read, 1 search/execute) of `meta` is
/// granted to uid `id` with gid `id` and no supplementary groups (the
/// jail's identity), by the mode bits alone.
fn readable_by(meta: &fs::Metadata, (uid, gid): (u32, u32), bit: u32) -> bool {
    let mode = meta.permissions().mode();
    let shift = if meta.uid() == uid {
        6
    } else if meta.gid() == gid {
        3
    } else {
        0
    };
    (mode >> shift) & bit != 0
}

/// What the gateway needs for the policy's secrets.
#[derive(Debug, Default)]
pub(crate) struct SecretInputs {
    /// Paths to bind read-only (secret files' directories, or the files).
    pub(crate) read: Vec<PathBuf>,
    /// Environment variables for the gateway: each `env:` secret's
    /// variable with the launcher's value.
    pub(crate) env: Vec<(String, String)>,
    /// Secret files whose directory could not be bound, with why: a
    /// rotation by rename is not seen for them.
    pub(crate) file_only: Vec<(PathBuf, String)>,
}

/// The host inputs of `policy`'s secrets. The gateway's environment is
/// otherwise empty: only the variables the policy names are passed, from
/// the launcher's own environment (the values travel in the jail spec over
/// a pipe, never on a command line).
///
/// # Errors
/// A named variable is unset or not UTF-8; a secret file fails
/// [`FileView::of_secret`].
pub(crate) fn secret_inputs(policy: &CompiledPolicy) -> anyhow::Result<SecretInputs> {
    let mut out = SecretInputs::default();
    for s in policy.secrets() {
        match &s.source {
            SecretSource::Env(var) => {
                let value = std::env::var(var).map_err(|e| {
                    anyhow!(
                        "secret `{}` reads environment variable `{var}`: {e} \
                         (sluice passes it from its own environment to the gateway)",
                        s.name
                    )
                })?;
                if !out.env.iter().any(|(k, _)| k == var) {
                    out.env.push((var.clone(), value));
                }
            }
            SecretSource::File(path) => {
                let view = FileView::of_secret(path)
                    .with_context(|| format!("secret `{}` file", s.name))?;
                if let Some(why) = view.file_only {
                    out.file_only.push((view.path, why));
                }
                if !out.read.contains(&view.bind) {
                    out.read.push(view.bind);
                }
            }
        }
    }
    Ok(out)
}

/// What the gateway's jail must bind read-only for the policy's approval
/// backend (docs/approval.md), when the policy's own backend answers (not
/// under `--ask`): a `unix` backend's socket file alone, and each of a
/// webhook's token and TLS files alone. Never a directory: connect() to a
/// socket on a read-only mount works, so a bound directory such as
/// `/run/user/UID` would hand a compromised gateway every other socket in
/// it (the user's bus, systemd's private socket, docker.sock, agents),
/// and a token's directory may hold other secrets (`~/.ssh` beside
/// `~/token`). A file bind pins the inode: a socket made anew (a UI that
/// restarts) or a file replaced by rename is not seen until the next run.
///
/// # Errors
/// The socket does not exist or is not a socket; a webhook file is not an
/// absolute path without `..`, not a regular file or not readable by the
/// jail's uid/gid.
pub(crate) fn approval_inputs(policy: &CompiledPolicy) -> anyhow::Result<Vec<PathBuf>> {
    use std::os::unix::fs::FileTypeExt;
    let mut read = Vec::new();
    match policy.approval().map(|a| &a.backend) {
        Some(ApprovalBackend::Unix(socket)) => {
            // Bound at the path the gateway connects to (mount follows
            // the host's symlinks for the source; the jail has none).
            if !socket.is_absolute() || socket.components().any(|c| c == Component::ParentDir) {
                bail!(
                    "approval socket {} is not an absolute path without `..`",
                    socket.display()
                );
            }
            let meta = fs::metadata(socket).with_context(|| {
                format!(
                    "approval socket {}: it must exist before `sluice run` starts (the \
                     gateway's jail binds the socket alone)",
                    socket.display()
                )
            })?;
            if !meta.file_type().is_socket() {
                bail!("approval socket {} is not a socket", socket.display());
            }
            read.push(socket.clone());
        }
        Some(ApprovalBackend::Webhook {
            bearer_token_file,
            client_cert,
            client_key,
            ca,
            ..
        }) => {
            for path in [bearer_token_file, client_cert, client_key, ca]
                .into_iter()
                .flatten()
            {
                let view = FileView::of_secret(path)
                    .with_context(|| format!("approval webhook file {}", path.display()))?;
                if !read.contains(&view.path) {
                    read.push(view.path);
                }
            }
        }
        Some(ApprovalBackend::Terminal) | None => {}
    }
    Ok(read)
}

/// `read` as the jail must bind it: without the paths another of its
/// paths already covers (a file of a directory bound whole), since the
/// jail binds each path read-only at its own place and a mount point
/// cannot be made inside a read-only bind (a webhook's key beside the
/// policy, say). The result does not depend on the order of `read`.
///
/// Each path is first given the place it must be bound at: its own, if no
/// other path of `read` is written above it; none, if it is written under
/// such a directory *and* its real path (symlinks resolved) lies under
/// that directory's real path (the jail, which has the directory's bind,
/// shows it); else its real path. A path written under a bound directory
/// that resolves elsewhere (`/etc/sluice/keys`, a symlink to `/srv/keys`)
/// would dangle in the jail: its real path is bound instead, so the
/// symlink in the bound directory leads somewhere. Then every place that
/// lies under another is dropped: the outer bind shows it, and a nested
/// one could not be made.
pub(crate) fn without_covered(read: Vec<PathBuf>) -> Vec<PathBuf> {
    let real = |p: &Path| fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let places: Vec<PathBuf> = read
        .iter()
        .filter_map(|p| {
            let above: Vec<&PathBuf> = read
                .iter()
                .filter(|d| d.as_path() != p && p.starts_with(d))
                .collect();
            if above.is_empty() {
                return Some(p.clone());
            }
            let p_real = real(p);
            if above.iter().any(|d| p_real.starts_with(real(d))) {
                return None;
            }
            Some(p_real)
        })
        .collect();
    let mut out: Vec<PathBuf> = Vec::new();
    for p in &places {
        let inside = places.iter().any(|o| o != p && p.starts_with(o));
        if !inside && !out.contains(p) {
            out.push(p.clone());
        }
    }
    out
}

/// Writes a file of the run dir that the jailed gateway reads (mode 0644;
/// the run dir itself is searchable only by the gateway: `run::run_dir`).
///
/// # Errors
/// The write fails.
pub(crate) fn write_for_jail(path: &Path, data: &[u8]) -> anyhow::Result<()> {
    fs::write(path, data).with_context(|| format!("writing {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o644))
        .with_context(|| format!("chmod {}", path.display()))
}

/// Hands a unix socket the launcher just bound in the run dir to the jailed
/// gateway: owned like the run dir, mode 0660 when that is root's (its
/// group is the gateway's own gid: `run::run_dir`), else 0600 (rootless,
/// the caller's; or the jails' uid's).
///
/// As root the run dir is root's, so no other uid can swap the socket's
/// name; where the dir is another uid's, a process of it could swap the
/// name for a symlink between bind and chown, and a chown or chmod by path
/// would then, as root, follow it to any file. So the name is opened with
/// `O_PATH | O_NOFOLLOW` (a symlink is opened as itself), the fd must be a
/// socket, and both changes go through the fd's `/proc/self/fd` link,
/// which names the opened inode, never a path that can be swapped.
///
/// # Errors
/// The name is not a socket (it was replaced), or the changes fail.
pub(crate) fn hand_socket_to_jail(socket: &Path, run_dir: &Path) -> anyhow::Result<()> {
    use std::os::fd::AsRawFd as _;
    use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
    let owner = fs::metadata(run_dir).with_context(|| format!("{}", run_dir.display()))?;
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(socket)
        .with_context(|| format!("opening {}", socket.display()))?;
    let meta = file
        .metadata()
        .with_context(|| format!("{}", socket.display()))?;
    if !meta.file_type().is_socket() {
        bail!(
            "{} is no longer the socket the launcher bound (it was replaced)",
            socket.display()
        );
    }
    let link = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
    // Root's dir: the gateway connects through the group (its own gid),
    // not as the owner; no one else is in that group.
    let mode = if owner.uid() == 0 { 0o660 } else { 0o600 };
    fs::set_permissions(&link, fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {}", socket.display()))?;
    if meta.uid() != owner.uid() || meta.gid() != owner.gid() {
        std::os::unix::fs::chown(&link, Some(owner.uid()), Some(owner.gid()))
            .with_context(|| format!("chown {}", socket.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_inside_a_bound_directory_is_not_bound_again() {
        let read = vec![
            PathBuf::from("/etc/sluice"),
            PathBuf::from("/etc/sluice/hook.key"),
            PathBuf::from("/etc/sluice-other/ca.pem"),
            PathBuf::from("/etc/sluice"),
            PathBuf::from("/run/approve.sock"),
        ];
        assert_eq!(
            without_covered(read),
            vec![
                PathBuf::from("/etc/sluice"),
                PathBuf::from("/etc/sluice-other/ca.pem"),
                PathBuf::from("/run/approve.sock"),
            ]
        );
    }
    use std::os::unix::fs::symlink;

    #[test]
    fn coverage_is_judged_on_real_paths_and_a_symlink_out_binds_where_it_leads() {
        let t = tmp("covered");
        let pol = t.0.join("pol");
        let elsewhere = t.0.join("elsewhere");
        for d in [
            &pol,
            &pol.join("inside"),
            &elsewhere,
            &elsewhere.join("keys"),
        ] {
            fs::create_dir(d).unwrap();
        }
        file(&pol.join("hook.key"), 0o644);
        file(&pol.join("inside/ca.pem"), 0o644);
        // A secret directory in the policy's directory that is a symlink
        // out of it: seen through the policy's bind, it would dangle.
        symlink(elsewhere.join("keys"), pol.join("keys")).unwrap();
        // And a file symlinked to another inside the directory: covered.
        symlink("hook.key", pol.join("hook-current.key")).unwrap();
        let read = vec![
            pol.clone(),
            pol.join("inside"),
            pol.join("keys"),
            pol.join("hook.key"),
            pol.join("hook-current.key"),
            elsewhere.join("keys"),
        ];
        assert_eq!(
            without_covered(read),
            vec![pol.clone(), elsewhere.join("keys")],
            "the symlinked directory's target is bound once, at its real path"
        );
        let read = vec![pol.clone(), pol.join("keys")];
        assert_eq!(
            without_covered(read),
            vec![pol.clone(), elsewhere.join("keys")]
        );
    }

    #[test]
    fn a_file_under_a_symlinked_directory_is_covered_in_any_order() {
        let t = tmp("order");
        let pol = t.0.join("pol");
        let elsewhere = t.0.join("elsewhere");
        fs::create_dir(&pol).unwrap();
        fs::create_dir_all(elsewhere.join("keys")).unwrap();
        symlink(elsewhere.join("keys"), pol.join("keys")).unwrap();
        file(&elsewhere.join("keys/hook.key"), 0o644);
        let read = [pol.clone(), pol.join("keys"), pol.join("keys/hook.key")];
        let want = vec![
            pol.clone(),
            fs::canonicalize(elsewhere.join("keys")).unwrap(),
        ];
        // Every order of the three: never the key bound inside its
        // directory's bind.
        for order in [
            [0, 1, 2],
            [0, 2, 1],
            [1, 0, 2],
            [1, 2, 0],
            [2, 0, 1],
            [2, 1, 0],
        ] {
            let got = without_covered(order.iter().map(|&i| read[i].clone()).collect());
            let mut got_sorted = got.clone();
            got_sorted.sort();
            let mut want_sorted = want.clone();
            want_sorted.sort();
            assert_eq!(got_sorted, want_sorted, "order {order:?}: {got:?}");
        }
        assert_eq!(without_covered(read.to_vec()), want);
    }

    struct Tmp(PathBuf);
    impl Drop for Tmp {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }
    fn tmp(tag: &str) -> Tmp {
        let p = std::env::temp_dir().join(format!("vc-gi-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        Tmp(p)
    }
    fn file(p: &Path, mode: u32) {
        fs::write(p, "version: 1\n").unwrap();
        fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_private_readable_directory_is_bound_whole() {
        let t = tmp("whole");
        let p = t.0.join("policy.yaml");
        file(&p, 0o644);
        let v = FileView::of_policy(&p).unwrap();
        assert_eq!(v.file_only, None);
        assert_eq!(v.bind, fs::canonicalize(&t.0).unwrap());
        assert_eq!(v.path, v.bind.join("policy.yaml"));
    }

    #[test]
    fn a_symlink_inside_the_directory_keeps_its_name() {
        // The Kubernetes ConfigMap layout: name -> ..data/name, ..data -> dir.
        let t = tmp("k8s");
        fs::create_dir(t.0.join("..v1")).unwrap();
        fs::set_permissions(t.0.join("..v1"), fs::Permissions::from_mode(0o755)).unwrap();
        file(&t.0.join("..v1/policy.yaml"), 0o644);
        symlink("..v1", t.0.join("..data")).unwrap();
        symlink("..data/policy.yaml", t.0.join("policy.yaml")).unwrap();
        let v = FileView::of_policy(&t.0.join("policy.yaml")).unwrap();
        assert_eq!(v.file_only, None);
        assert!(v.path.ends_with("policy.yaml") && !v.path.to_string_lossy().contains("..v1"));
    }

    #[test]
    fn shared_unsearchable_or_escaping_directories_bind_the_file_alone() {
        // World-writable (like /tmp).
        let t = tmp("shared");
        fs::set_permissions(&t.0, fs::Permissions::from_mode(0o1777)).unwrap();
        let p = t.0.join("policy.yaml");
        file(&p, 0o644);
        let v = FileView::of_policy(&p).unwrap();
        assert!(v.file_only.unwrap().contains("world-writable"));
        assert_eq!(v.bind, v.path);

        // Not searchable by the jail's uid (owned by the test's uid).
        let t = tmp("private");
        let p = t.0.join("policy.yaml");
        file(&p, 0o644);
        fs::set_permissions(&t.0, fs::Permissions::from_mode(0o700)).unwrap();
        let v = FileView::of_policy(&p).unwrap();
        if fs::metadata(&t.0).unwrap().uid() != jail_ids().0 {
            assert!(v.file_only.unwrap().contains("not searchable"));
        }

        // A symlink to a file elsewhere.
        let t = tmp("escape");
        let other = tmp("escape-target");
        file(&other.0.join("real.yaml"), 0o644);
        symlink(other.0.join("real.yaml"), t.0.join("policy.yaml")).unwrap();
        let v = FileView::of_policy(&t.0.join("policy.yaml")).unwrap();
        assert!(v.file_only.unwrap().contains("outside its directory"));

        // In /: checked on the directory alone.
        assert_eq!(
            dir_unfit(Path::new("/"), Path::new("/x")).as_deref(),
            Some("it is in /")
        );
    }

    #[test]
    fn an_unreadable_file_or_a_bad_secret_path_is_an_error() {
        let t = tmp("unreadable");
        let p = t.0.join("policy.yaml");
        file(&p, 0o600);
        if fs::metadata(&p).unwrap().uid() != jail_ids().0 {
            let e = FileView::of_policy(&p).unwrap_err();
            assert!(
                format!("{e:#}").contains("not readable by the gateway"),
                "{e:#}"
            );
        }
        assert!(FileView::of_policy(&t.0.join("missing.yaml")).is_err());
        assert!(FileView::of_policy(&t.0).is_err(), "a directory is refused");
        assert!(FileView::of_secret(Path::new("relative/tok")).is_err());
        let dotdot = t.0.join("sub/../policy.yaml");
        assert!(FileView::of_secret(&dotdot).is_err());
    }

    #[test]
    fn group_and_owner_bits_are_checked_for_the_jail_identity() {
        let t = tmp("bits");
        let p = t.0.join("f");
        file(&p, 0o640);
        let meta = fs::metadata(&p).unwrap();
        // As the file's owner: owner bits; as its group: group bits; else other.
        assert!(readable_by(&meta, (meta.uid(), u32::MAX - 2), 0o4));
        assert!(!readable_by(&meta, (u32::MAX - 1, u32::MAX - 2), 0o4));
        assert!(readable_by(&meta, (u32::MAX - 1, meta.gid()), 0o4));
        fs::set_permissions(&p, fs::Permissions::from_mode(0o604)).unwrap();
        let meta = fs::metadata(&p).unwrap();
        assert!(readable_by(&meta, (u32::MAX - 1, u32::MAX - 2), 0o4));
    }

    #[test]
    fn env_secrets_are_passed_and_a_missing_variable_is_named() {
        let yaml = "version: 1\nid: vc-gi\nallow:\n  - domain: api.example.com\n\
                    secrets:\n  - name: tok\n    placeholder: sk-sluice-placeholder-vcgi\n\
                    \x20   env: VC_GI_SECRET_UNSET_0\n    hosts: [api.example.com]\n";
        let policy =
            sluice_policy::from_yaml_str(yaml, "test", &sluice_policy::CompileOptions::default())
                .unwrap();
        let e = secret_inputs(&policy).unwrap_err();
        assert!(format!("{e:#}").contains("VC_GI_SECRET_UNSET_0"), "{e:#}");
    }
    #[test]
    fn a_socket_swapped_for_a_symlink_is_not_followed_when_handed_to_the_jail() {
        let t = tmp("hand");
        let sock = t.0.join("approved.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        // As root, the run dir belongs to the jail's uid, as make_run_dir
        // leaves it, so the socket is chowned.
        if rustix::process::geteuid().is_root() {
            std::os::unix::fs::chown(&t.0, Some(65534), Some(65534)).unwrap();
        }
        hand_socket_to_jail(&sock, &t.0).unwrap();
        let meta = fs::metadata(&sock).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let dir = fs::metadata(&t.0).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (dir.uid(), dir.gid()));
        // The name swapped for a symlink to another file: refused, and the
        // file's mode is untouched.
        let victim = t.0.join("victim");
        file(&victim, 0o644);
        fs::remove_file(&sock).unwrap();
        symlink(&victim, &sock).unwrap();
        let e = hand_socket_to_jail(&sock, &t.0).unwrap_err();
        assert!(format!("{e:#}").contains("replaced"), "{e:#}");
        assert_eq!(
            fs::metadata(&victim).unwrap().permissions().mode() & 0o777,
            0o644
        );
    }
    #[test]
    fn the_approval_backends_files_are_bound_and_a_socket_nowhere_is_an_error() {
        let compile = |yaml: String| {
            sluice_policy::from_yaml_str(&yaml, "test", &sluice_policy::CompileOptions::default())
                .unwrap()
        };
        let ask = |backend: String| {
            compile(format!(
                "version: 1\nid: a\nunlisted: ask\napproval:\n  backend:\n{backend}\n"
            ))
        };
        // A unix socket: the socket file alone, never its directory (a
        // gateway must not reach the directory's other sockets), and an
        // error while it does not exist or is not a socket.
        let t = tmp("ask-sock");
        let sock = t.0.join("ui.sock");
        let policy = ask(format!("    unix: {}", sock.display()));
        let e = approval_inputs(&policy).unwrap_err();
        assert!(format!("{e:#}").contains("must exist"), "{e:#}");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let _other = std::os::unix::net::UnixListener::bind(t.0.join("bus")).unwrap();
        assert_eq!(approval_inputs(&policy).unwrap(), vec![sock.clone()]);
        let not_sock = t.0.join("plain");
        file(&not_sock, 0o644);
        let e = approval_inputs(&ask(format!("    unix: {}", not_sock.display()))).unwrap_err();
        assert!(format!("{e:#}").contains("not a socket"), "{e:#}");
        // In a shared directory, the same.
        let shared = tmp("ask-shared");
        fs::set_permissions(&shared.0, fs::Permissions::from_mode(0o1777)).unwrap();
        let sock = shared.0.join("ui.sock");
        let _shared_listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let policy = ask(format!("    unix: {}", sock.display()));
        assert_eq!(approval_inputs(&policy).unwrap(), vec![sock.clone()]);
        // A webhook's files, each alone, never their directory (which
        // holds other files here).
        let token = t.0.join("token");
        file(&token, 0o644);
        let ca = t.0.join("ca.pem");
        file(&ca, 0o644);
        file(&t.0.join("id_ed25519"), 0o644);
        let read = approval_inputs(&ask(format!(
            "    webhook:\n      url: https://hook.example.com/ask\n      bearer_token_file: {}\n      ca: {}",
            token.display(),
            ca.display()
        )))
        .unwrap();
        assert_eq!(read, vec![token.clone(), ca.clone()]);
        // The terminal binds nothing.
        assert!(
            approval_inputs(&ask("    terminal".into()))
                .unwrap()
                .is_empty()
        );
    }
}

//! The approval overlay: `POLICY.approved.yaml` beside a policy file holds
//! the names a backend approved with "always".
//!
//! It is an ordinary policy file that may hold only `allow` rules for
//! names (no `deny`, `cidr`, `internal`, secrets or settings), so an
//! operator can read it, review it and fold it into the real policy.
//! [`crate::load_file`] reads it with the policy it sits beside: its rules
//! are added to the policy's allow rules, after validating the overlay on
//! its own (its errors name the overlay file). The policy's `deny:` rules
//! and the platform deny set still win over anything it allows.
//!
//! [`append`] adds one approved name, rewriting the file by rename so a
//! reader (the gateway's reload poll) never sees half of it; [`prepare`]
//! and [`Prepared::commit`] are its two halves, for a writer that must
//! know it may still report the result before the file changes.
//!
//! The writer trusts nothing in the policy's directory but the policy's
//! owner and root. It opens that directory once (`O_DIRECTORY|O_NOFOLLOW`,
//! its path resolved first) and refuses it unless it belongs to the policy's owner or root and no
//! group or other user may write it; every later step (the lock, the
//! existing overlay, the temporary file, the rename, the unlink) is made
//! relative to that descriptor, so swapping a path component meanwhile
//! changes nothing. Writers in one directory take turns: each holds an
//! exclusive `flock` on that directory descriptor from [`prepare`] to
//! [`Prepared::commit`] (or its drop), waits at most a few seconds for
//! another's, and the commit is refused if the
//! overlay changed meanwhile anyway (its owner edited it). The existing
//! overlay is opened without following a symlink and read only if it is a
//! regular file with one link, owned by the policy's owner or root; the new
//! file is made under a random name nobody else may have taken
//! (`O_EXCL`), given the policy's owner, group and mode (or refused when
//! that fails), checked against [`crate::MAX_POLICY_BYTES`], synced, and
//! renamed into place, and the directory is synced after the rename. The
//! loader ([`crate::load_file`]) applies the same checks to the overlay it
//! reads, and refuses one in a world-writable directory.

use std::ffi::{OsStr, OsString};
use std::io::{Read as _, Write as _};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, FlockOperation, Mode, OFlags, Stat};
use thiserror::Error;

use crate::error::{PolicyError, PolicyErrors};
use crate::model::RawPolicy;

/// The overlay's path for the policy at `policy`: `p.yaml` ->
/// `p.approved.yaml`, `p.yml` -> `p.approved.yml`, `p` -> `p.approved.yaml`.
#[must_use]
pub fn overlay_path(policy: &Path) -> PathBuf {
    let name = policy
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let file = match name.rsplit_once('.') {
        Some((stem, ext @ ("yaml" | "yml"))) => format!("{stem}.approved.{ext}"),
        _ => format!("{name}.approved.yaml"),
    };
    policy.with_file_name(file)
}

/// One name approved with "always".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approved<'a> {
    /// The exact name (normalised).
    pub name: &'a str,
    /// TCP ports the approval opened.
    pub tcp_ports: &'a [u16],
    /// UDP ports the approval opened.
    pub udp_ports: &'a [u16],
    /// Who decided (the backend, and its `by`).
    pub by: &'a str,
    /// The sandbox that asked.
    pub sandbox: &'a str,
    /// When (RFC 3339).
    pub at: &'a str,
}

/// Why an approval could not be written.
#[derive(Debug, Error)]
pub enum OverlayError {
    /// The existing overlay is not a valid overlay; it is left as it is.
    #[error("{0}")]
    Invalid(PolicyErrors),
    /// Reading or writing the file failed.
    #[error("approval overlay {path}: {source}")]
    Io {
        /// The overlay's path.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

const HEADER: &str = "\
# Destinations approved with \"always\" through sluice's runtime approval.
# Review each entry and fold it into the policy this file sits beside;
# sluice reads this file together with that policy each time it loads it.
# Only allow rules for names may appear here.
version: 1
id: approved
allow:
";

/// Adds `entry` to the overlay of the policy at `policy` (created if
/// missing). A name already listed is left as it is (`Ok(false)`).
///
/// # Errors
/// As [`prepare`] and [`Prepared::commit`].
pub fn append(policy: &Path, entry: &Approved<'_>) -> Result<bool, OverlayError> {
    match prepare(policy, entry)? {
        Some(p) => p.commit().map(|()| true),
        None => Ok(false),
    }
}

/// A new overlay written beside the old one under a temporary name,
/// replacing it on [`Prepared::commit`]; removed if dropped uncommitted.
/// It holds the lock on the overlay's directory until then: another
/// writer's [`prepare`] waits (a few seconds at most, then refuses), so
/// neither loses the other's entry.
#[derive(Debug)]
pub struct Prepared {
    /// The policy's directory, as opened and checked by [`prepare`], and
    /// locked exclusively (released when dropped).
    dir: OwnedFd,
    /// The temporary file's name in `dir`.
    tmp: OsString,
    /// The overlay's name in `dir`.
    name: OsString,
    /// The overlay's path, for messages.
    path: PathBuf,
    /// The overlay as [`prepare`] read it (`None`: there was none).
    seen: Option<Identity>,
    committed: bool,
}

/// What tells one version of a file from another: device, inode, size
/// and modification time (seconds, nanoseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Identity([i128; 5]);

impl Identity {
    fn of(st: &Stat) -> Self {
        Self([
            i128::from(st.st_dev),
            i128::from(st.st_ino),
            i128::from(st.st_size),
            i128::from(st.st_mtime),
            i128::from(st.st_mtime_nsec),
        ])
    }
}

impl Prepared {
    /// Replaces the overlay with the prepared file (a rename in its
    /// directory: a reader sees the old file or the new one), then syncs
    /// the directory so the new name survives a power loss.
    ///
    /// # Errors
    /// The overlay changed since [`prepare`] read it (someone edited it:
    /// nothing is written, their change is kept); the rename failed
    /// (nothing changed); or syncing the directory failed after the
    /// rename (the error says so).
    pub fn commit(mut self) -> Result<(), OverlayError> {
        let io = |source: std::io::Error| OverlayError::Io {
            path: self.path.clone(),
            source,
        };
        let now = match rustix::fs::statat(&self.dir, &self.name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Some(Identity::of(&st)),
            Err(rustix::io::Errno::NOENT) => None,
            Err(e) => return Err(io(e.into())),
        };
        if now != self.seen {
            return Err(io(std::io::Error::other(
                "it changed since this entry was prepared: not written (the change is kept)",
            )));
        }
        rustix::fs::renameat(&self.dir, &self.tmp, &self.dir, &self.name)
            .map_err(|e| io(e.into()))?;
        self.committed = true;
        rustix::fs::fsync(&self.dir).map_err(|e| {
            io(std::io::Error::other(format!(
                "renamed into place, but syncing its directory failed: {e}"
            )))
        })
    }
}

impl Drop for Prepared {
    fn drop(&mut self) {
        if !self.committed {
            let _ = rustix::fs::unlinkat(&self.dir, &self.tmp, AtFlags::empty());
        }
    }
}

/// Writes the overlay of the policy at `policy` with `entry` added, under
/// a temporary name beside it, ready for [`Prepared::commit`]; `None` when
/// the overlay already lists the name. Waits (a few seconds at most) while
/// another writer holds the directory's lock (between its own `prepare`
/// and commit), then refuses.
///
/// # Errors
/// The policy's directory (its path resolved) is writable by its group or
/// by anyone, or belongs to neither the policy's owner nor root; the existing
/// overlay is not a plain file of the policy's owner (a symlink, a hard
/// link, another owner's), or is invalid (it is not rewritten); the entry
/// would make it larger than a policy may be; the new file cannot be given
/// the policy's owner and group (a writer running as another uid); or the
/// file could not be read or written (a read-only policy directory, for
/// one); or another writer kept the directory locked too long.
pub fn prepare(policy: &Path, entry: &Approved<'_>) -> Result<Option<Prepared>, OverlayError> {
    let path = overlay_path(policy);
    let io = |source| OverlayError::Io {
        path: path.clone(),
        source,
    };
    let errno = |e: rustix::io::Errno| io(e.into());
    let refuse = |why: String| io(std::io::Error::other(why));
    let origin = path.display().to_string();
    let (Some(policy_name), Some(name)) = (policy.file_name(), path.file_name()) else {
        return Err(refuse("the policy's path names no file".to_owned()));
    };
    let shown = dir_of(&path);
    let dir = open_policy_dir(shown).map_err(io)?;
    // The policy's owner, through the directory just opened (the policy
    // itself may be a symlink, as Kubernetes ConfigMaps make).
    let owner = rustix::fs::statat(&dir, policy_name, AtFlags::empty()).map_err(errno)?;
    let dir_stat = rustix::fs::fstat(&dir).map_err(errno)?;
    if dir_stat.st_uid != owner.st_uid && dir_stat.st_uid != 0 {
        return Err(refuse(format!(
            "the policy's directory {} belongs to uid {}, neither the policy's owner (uid {}) \
             nor root: not writing there",
            shown.display(),
            dir_stat.st_uid,
            owner.st_uid
        )));
    }
    if dir_stat.st_mode & 0o022 != 0 {
        return Err(refuse(format!(
            "the policy's directory {} (mode {:o}) is writable by its group or by anyone: \
             not writing there (make it writable by its owner alone: chmod go-w {})",
            shown.display(),
            dir_stat.st_mode & 0o7777,
            shown.display()
        )));
    }
    lock_overlay(&dir, LOCK_PATIENCE).map_err(io)?;
    let (mut text, seen) = match read_existing(&dir, name, owner.st_uid) {
        Ok(Some((text, seen))) => {
            let raw = validate(&text, &origin).map_err(OverlayError::Invalid)?;
            let listed = raw.allow.iter().any(|a| {
                a.value
                    .domain
                    .as_ref()
                    .is_some_and(|d| d.value == entry.name)
                    || a.value
                        .domains
                        .as_ref()
                        .is_some_and(|ds| ds.iter().any(|d| d.value == entry.name))
            });
            if listed {
                return Ok(None);
            }
            (text, Some(seen))
        }
        Ok(None) => (HEADER.to_owned(), None),
        Err(Existing::Refused(why)) => return Err(refuse(format!("{why}; left as it is"))),
        Err(Existing::Io(e)) => return Err(io(e)),
    };
    if !text.ends_with('\n') {
        text.push('\n');
    }
    let quote = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let list = |ports: &[u16]| {
        ports
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    text.push_str(&format!(
        "  - domain: {}\n    ports: [{}]\n    udp_ports: [{}]\n    comment: {}\n",
        quote(entry.name),
        list(entry.tcp_ports),
        list(entry.udp_ports),
        quote(&format!(
            "approved always by {} for sandbox {} at {}",
            entry.by, entry.sandbox, entry.at
        )),
    ));
    // Past the limit every later load of the policy would fail.
    if text.len() as u64 > crate::MAX_POLICY_BYTES {
        return Err(refuse(format!(
            "adding {} would make it larger than a policy may be ({} bytes): not written \
             (fold its entries into the policy and remove it)",
            entry.name,
            crate::MAX_POLICY_BYTES
        )));
    }
    // The result must still be a valid overlay before it replaces the file.
    validate(&text, &origin).map_err(OverlayError::Invalid)?;
    let (f, tmp) = create_temporary(&dir, name).map_err(io)?;
    let prepared = Prepared {
        dir,
        tmp,
        name: name.to_owned(),
        path: path.clone(),
        seen,
        committed: false,
    };
    let mut f = std::fs::File::from(f);
    like_policy(&f, &owner)
        .and_then(|()| f.write_all(text.as_bytes()))
        .and_then(|()| f.sync_all())
        .map_err(io)?;
    Ok(Some(prepared))
}

/// Opens the directory `shown` (resolved first: the policy may be given by
/// a path through symlinks) with `O_NOFOLLOW`, for every later step of
/// [`prepare`] to be relative to.
fn open_policy_dir(shown: &Path) -> std::io::Result<OwnedFd> {
    let real = std::fs::canonicalize(shown)?;
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    Ok(rustix::fs::open(&real, flags, Mode::empty())?)
}

/// How long [`prepare`] waits for another writer of the same directory to
/// finish before refusing: a writer holds the lock from its `prepare` to
/// its commit, which the launcher bounds well below this.
const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

/// How often [`lock_overlay`] tries the lock again while it is held.
const LOCK_RETRY: std::time::Duration = std::time::Duration::from_millis(20);

/// Locks the policy's directory `dir` (the descriptor [`prepare`] opened
/// and checked) exclusively with `flock`, trying again for up to
/// `patience` while another writer holds it, then refusing. Locking the
/// directory itself creates and chowns nothing, so nobody can plant a
/// file for the writer to give away; the lock lasts as long as that
/// descriptor is open.
fn lock_overlay(dir: &OwnedFd, patience: std::time::Duration) -> std::io::Result<()> {
    let start = std::time::Instant::now();
    loop {
        match rustix::fs::flock(dir, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(()),
            Err(rustix::io::Errno::WOULDBLOCK) if start.elapsed() < patience => {
                std::thread::sleep(LOCK_RETRY);
            }
            Err(rustix::io::Errno::WOULDBLOCK) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::WouldBlock,
                    format!(
                        "another writer holds the overlay (its directory stayed locked for {} s):                          not written",
                        patience.as_secs()
                    ),
                ));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// How many random temporary names [`create_temporary`] tries.
const TEMPORARY_TRIES: usize = 16;

/// Makes a new file `.NAME.RANDOM.tmp` in `dir` (`O_EXCL`: never one a
/// symlink points at, never one someone planted; a name left by a crash
/// is skipped), mode 0600 until [`like_policy`]; the file and its name.
fn create_temporary(dir: &OwnedFd, name: &OsStr) -> std::io::Result<(OwnedFd, OsString)> {
    use ring::rand::SecureRandom as _;
    let random = ring::rand::SystemRandom::new();
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    for _ in 0..TEMPORARY_TRIES {
        let mut bytes = [0u8; 8];
        random
            .fill(&mut bytes)
            .map_err(|_| std::io::Error::other("no random bytes for a temporary name"))?;
        let mut tmp = OsString::from(".");
        tmp.push(name);
        tmp.push(format!(".{:016x}.tmp", u64::from_le_bytes(bytes)));
        match rustix::fs::openat(dir, &tmp, flags, Mode::RUSR | Mode::WUSR) {
            Ok(fd) => return Ok((fd, tmp)),
            Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AlreadyExists,
        format!("{TEMPORARY_TRIES} temporary names tried, each already taken"),
    ))
}

/// Why the existing overlay was not read.
enum Existing {
    /// It is not a file the writer may trust.
    Refused(&'static str),
    /// Reading it failed.
    Io(std::io::Error),
}

/// The existing overlay `name` in `dir`: its text and identity (`None`:
/// there is none), read from what was opened without following a symlink,
/// and only if that is a regular file with one link owned by `owner` (the
/// policy's) or root.
fn read_existing(
    dir: impl AsFd,
    name: &OsStr,
    owner: u32,
) -> Result<Option<(String, Identity)>, Existing> {
    // A FIFO planted there must not block the open.
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let fd = match rustix::fs::openat(dir, name, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(rustix::io::Errno::LOOP) => return Err(Existing::Refused("is a symlink")),
        Err(e) => return Err(Existing::Io(e.into())),
    };
    let st = rustix::fs::fstat(&fd).map_err(|e| Existing::Io(e.into()))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(Existing::Refused("is not a regular file"));
    }
    if st.st_nlink != 1 {
        return Err(Existing::Refused("has other hard links"));
    }
    if st.st_uid != owner && st.st_uid != 0 {
        return Err(Existing::Refused(
            "is owned by neither the policy's owner nor root",
        ));
    }
    if u64::try_from(st.st_size).unwrap_or(u64::MAX) > crate::MAX_POLICY_BYTES {
        return Err(Existing::Refused("is larger than a policy may be"));
    }
    // Read no more than the limit even if the file grows meanwhile.
    let mut text = String::new();
    std::fs::File::from(fd)
        .take(crate::MAX_POLICY_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(Existing::Io)?;
    if text.len() as u64 > crate::MAX_POLICY_BYTES {
        return Err(Existing::Refused("is larger than a policy may be"));
    }
    Ok(Some((text, Identity::of(&st))))
}

/// Gives `f` the policy file's (`policy`) permission bits (read and write
/// only), owner and group: the overlay is read by whoever reads the policy
/// (a jailed gateway, for one), and the next writer and loader accept only
/// the policy's owner or root as its owner.
///
/// # Errors
/// The owner or group cannot be given (only root may give a file away, or
/// a group its owner is not in): an overlay of the writer's own would be
/// refused by the next write or unreadable by the policy's readers.
fn like_policy(f: &std::fs::File, policy: &Stat) -> std::io::Result<()> {
    rustix::fs::fchmod(f, Mode::from_raw_mode(policy.st_mode & 0o666))?;
    let st = rustix::fs::fstat(f)?;
    if (st.st_uid, st.st_gid) == (policy.st_uid, policy.st_gid) {
        return Ok(());
    }
    rustix::fs::fchown(
        f,
        Some(rustix::fs::Uid::from_raw(policy.st_uid)),
        Some(rustix::fs::Gid::from_raw(policy.st_gid)),
    )
    .map_err(|e| {
        std::io::Error::other(format!(
            "cannot give the new overlay the policy's owner and group {}:{} (this writer \
             runs as uid {}): {e}; not written (write it as the policy's owner or root)",
            policy.st_uid,
            policy.st_gid,
            rustix::process::geteuid().as_raw()
        ))
    })
}

/// Parses, checks and compiles an overlay on its own; its raw form.
fn validate(text: &str, origin: &str) -> Result<RawPolicy, PolicyErrors> {
    let raw = crate::compile::parse_raw(text, origin)?;
    check(&raw, origin)?;
    crate::compile::Compiler::new(origin).compile(raw, &crate::CompileOptions::default())?;
    crate::compile::parse_raw(text, origin)
}

/// The overlay may hold only `version`, `id`, `label`, `comment` and
/// `allow` rules for names.
pub(crate) fn check(raw: &RawPolicy, origin: &str) -> Result<(), PolicyErrors> {
    let mut errors = Vec::new();
    let mut err = |line: u64, column: u64, message: &str| {
        errors.push(PolicyError {
            origin: origin.to_owned(),
            line: u32::try_from(line).unwrap_or(u32::MAX),
            column: u32::try_from(column).unwrap_or(u32::MAX),
            message: format!("an approval overlay may hold only allow rules for names: {message}"),
        });
    };
    let extra = !raw.deny.is_empty()
        || !raw.internal.is_empty()
        || raw.ports.is_some()
        || !raw.inspect.is_empty()
        || raw.dns.is_some()
        || !raw.secrets.is_empty()
        || raw.unlisted.is_some()
        || raw.approval.is_some();
    if extra {
        err(
            0,
            0,
            "remove every key but version, id, label, comment and allow",
        );
    }
    for a in &raw.allow {
        if a.value.cidr.is_some() || a.value.cidrs.is_some() {
            let at = a.referenced;
            err(at.line(), at.column(), "a `cidr` rule cannot be approved");
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(PolicyErrors::new(errors))
    }
}

/// The overlay beside `policy`, if there is one: its text and origin.
///
/// The loader trusts the overlay as little as the writer does ([`prepare`]):
/// it is opened without following a symlink and without blocking on a
/// FIFO, and read only if what was opened is a regular file with one link,
/// owned by the policy's owner or root, within [`crate::MAX_POLICY_BYTES`];
/// an overlay in a directory anyone may write is refused. A refused overlay
/// fails the load, as a malformed policy does (a reload keeps the running
/// policy): anyone able to plant a file beside the policy must not be able
/// to widen it, block its loader or exhaust its memory.
pub(crate) fn read(policy: &Path) -> Result<Option<(String, String)>, PolicyErrors> {
    let path = overlay_path(policy);
    let origin = path.display().to_string();
    let fail = |message: String| {
        PolicyErrors::new(vec![PolicyError {
            origin: origin.clone(),
            line: 0,
            column: 0,
            message,
        }])
    };
    let owner = std::fs::metadata(policy)
        .map_err(|e| fail(format!("cannot read approval overlay: the policy: {e}")))?
        .uid();
    let Some(name) = path.file_name() else {
        return Ok(None);
    };
    let dir = dir_of(&path);
    // Only searched, never listed: `O_PATH` needs no read permission.
    let dir_fd = rustix::fs::open(
        dir,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| fail(format!("cannot read approval overlay's directory: {e}")))?;
    let text = match read_existing(&dir_fd, name, owner) {
        Ok(None) => return Ok(None),
        Ok(Some((text, _))) => text,
        Err(Existing::Refused(why)) => {
            return Err(fail(format!(
                "approval overlay {why}: refused (remove it, or fold it into the policy)"
            )));
        }
        Err(Existing::Io(e)) => return Err(fail(format!("cannot read approval overlay: {e}"))),
    };
    let dir_stat = rustix::fs::fstat(&dir_fd)
        .map_err(|e| fail(format!("cannot read approval overlay's directory: {e}")))?;
    if dir_stat.st_mode & 0o002 != 0 {
        return Err(fail(format!(
            "approval overlay is in {}, a directory anyone may write: refused \
             (keep the policy in a directory only its owner may write)",
            dir.display()
        )));
    }
    Ok(Some((text, origin)))
}

/// The directory `path` sits in (`.` for a bare file name, whose parent
/// is the empty path).
fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CompileOptions, Decision, load_file};

    fn dir(tag: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt as _;
        let d = std::env::temp_dir().join(format!("sluice-overlay-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        // The writer refuses a group-writable directory: not up to the umask.
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        d
    }

    fn entry(name: &str) -> Approved<'_> {
        Approved {
            name,
            tcp_ports: &[443],
            udp_ports: &[],
            by: "terminal",
            sandbox: "sb-1",
            at: "2026-11-25T23:00:00Z",
        }
    }

    #[test]
    fn paths() {
        assert_eq!(
            overlay_path(Path::new("/p/a.yaml")),
            Path::new("/p/a.approved.yaml")
        );
        assert_eq!(
            overlay_path(Path::new("/p/a.yml")),
            Path::new("/p/a.approved.yml")
        );
        assert_eq!(
            overlay_path(Path::new("/p/policy")),
            Path::new("/p/policy.approved.yaml")
        );
    }

    #[test]
    fn an_approved_name_is_allowed_by_the_next_load_and_deny_still_wins() {
        let d = dir("load");
        let policy = d.join("p.yaml");
        std::fs::write(&policy, "version: 1\nid: p\ndeny:\n  - bad.example.org\n").unwrap();
        let opts = CompileOptions::default();
        assert_eq!(
            load_file(&policy, &opts)
                .unwrap()
                .check_name("new.example.org")
                .decision,
            Decision::Deny
        );
        assert!(append(&policy, &entry("new.example.org")).unwrap());
        assert!(
            !append(&policy, &entry("new.example.org")).unwrap(),
            "listed twice"
        );
        assert!(append(&policy, &entry("bad.example.org")).unwrap());
        let p = load_file(&policy, &opts).unwrap();
        assert_eq!(p.id(), "p");
        assert_eq!(p.check_name("new.example.org").decision, Decision::Allow);
        assert_eq!(
            p.check_name("bad.example.org").decision,
            Decision::Deny,
            "deny: wins"
        );
        let text = std::fs::read_to_string(overlay_path(&policy)).unwrap();
        assert!(
            text.contains("approved always by terminal for sandbox sb-1"),
            "{text}"
        );
        assert_eq!(text.matches("domain:").count(), 2);
    }

    #[test]
    fn a_symlinked_overlay_is_never_written_through_and_modes_follow_the_policy() {
        use std::os::unix::fs::PermissionsExt as _;
        let d = dir("link");
        let policy = d.join("p.yaml");
        std::fs::write(&policy, "version: 1\nid: p\n").unwrap();
        std::fs::set_permissions(&policy, std::fs::Permissions::from_mode(0o640)).unwrap();
        let elsewhere = d.join("elsewhere.yaml");
        std::os::unix::fs::symlink(&elsewhere, overlay_path(&policy)).unwrap();
        assert!(append(&policy, &entry("x.example.org")).is_err());
        assert!(!elsewhere.exists(), "written through the symlink");
        std::fs::remove_file(overlay_path(&policy)).unwrap();
        assert!(append(&policy, &entry("x.example.org")).unwrap());
        let mode = std::fs::metadata(overlay_path(&policy))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o640);
    }

    #[test]
    fn files_at_pid_named_temporary_names_neither_block_nor_are_followed() {
        // A file a crash left at a guessable temporary name (the pid is 1
        // in containers), or a symlink planted there, must not fail or
        // redirect a later write.
        let d = dir("tmplink");
        let policy = d.join("p.yaml");
        std::fs::write(&policy, "version: 1\nid: p\n").unwrap();
        let elsewhere = d.join("elsewhere.yaml");
        let stale = d.join(format!(".p.approved.yaml.{}.tmp", std::process::id()));
        std::os::unix::fs::symlink(&elsewhere, &stale).unwrap();
        std::fs::write(d.join(".p.approved.yaml.1.tmp"), "left by a crash").unwrap();
        assert!(append(&policy, &entry("x.example.org")).unwrap());
        assert!(append(&policy, &entry("y.example.org")).unwrap());
        assert!(!elsewhere.exists(), "written through the planted symlink");
        assert!(
            std::fs::symlink_metadata(&stale)
                .unwrap()
                .file_type()
                .is_symlink(),
            "the planted link was replaced"
        );
        let text = std::fs::read_to_string(overlay_path(&policy)).unwrap();
        assert!(text.contains("x.example.org") && text.contains("y.example.org"));
        assert_eq!(temporaries(&d), 2, "only the two planted files");
    }

    /// How many `*.tmp` files `d` holds.
    fn temporaries(d: &Path) -> usize {
        std::fs::read_dir(d)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".tmp")
            })
            .count()
    }

    #[test]
    fn an_overlay_with_other_links_or_not_a_file_is_left_alone() {
        let d = dir("links");
        let policy = d.join("p.yaml");
        std::fs::write(&policy, "version: 1\nid: p\n").unwrap();
        assert!(append(&policy, &entry("a.example.org")).unwrap());
        let overlay = overlay_path(&policy);
        let before = std::fs::read_to_string(&overlay).unwrap();
        // A hard link elsewhere (a file someone else could read or keep).
        let link = d.join("kept.yaml");
        std::fs::hard_link(&overlay, &link).unwrap();
        let err = append(&policy, &entry("b.example.org")).unwrap_err();
        assert!(err.to_string().contains("hard links"), "{err}");
        assert_eq!(std::fs::read_to_string(&overlay).unwrap(), before);
        std::fs::remove_file(&link).unwrap();
        // A FIFO: refused at once, never waited on.
        std::fs::remove_file(&overlay).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(&overlay)
            .status()
            .unwrap();
        assert!(made.success());
        let err = append(&policy, &entry("b.example.org")).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
    }

    #[test]
    fn an_overlay_owned_by_someone_else_is_left_alone() {
        let d = dir("owner");
        let policy = d.join("p.yaml");
        std::fs::write(&policy, "version: 1\nid: p\n").unwrap();
        assert!(append(&policy, &entry("a.example.org")).unwrap());
        let overlay = overlay_path(&policy);
        // Only root may give the file to another uid; others cannot test it.
        if std::os::unix::fs::chown(&overlay, Some(54_321), None).is_err() {
            return;
        }
        let err = append(&policy, &entry("b.example.org")).unwrap_err();
        assert!(err.to_string().contains("owned by neither"), "{err}");
        assert!(
            !std::fs::read_to_string(&overlay)
                .unwrap()
                .contains("b.example.org")
        );
    }

    #[test]
    fn a_policy_directory_others_may_write_is_refused() {
        use std::os::unix::fs::PermissionsExt as _;
        for mode in [0o777, 0o1777, 0o775, 0o770, 0o757] {
            let d = dir(&format!("ww{mode:o}"));
            let policy = d.join("p.yaml");
            std::fs::write(&policy, "version: 1\nid: p\n").unwrap();
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode)).unwrap();
            let err = append(&policy, &entry("a.example.org")).unwrap_err();
            let err = err.to_string();
            assert!(err.contains("writable by its group"), "{err}");
            assert!(
                err.contains(&format!("chmod go-w {}", d.display())),
                "{err}"
            );
            assert!(!overlay_path(&policy).exists());
            // Doing what the refusal says is enough.
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode & !0o022)).unwrap();
            assert!(append(&policy, &entry("a.example.org")).unwrap());
        }
    }

    #[test]
    fn a_policy_directory_of_another_owner_is_refused() {
        let d = dir("dirowner");
        let policy = d.join("p.yaml");
        std::fs::write(&policy, "version: 1\nid: p\n").unwrap();
        if !is_root() && sluice_test_skip::may_skip("root", "only root may give a directory away") {
            return;
        }
        std::os::unix::fs::chown(&d, Some(54_321), None).unwrap();
        let err = append(&policy, &entry("a.example.org")).unwrap_err();
        assert!(err.to_string().contains("belongs to uid 54321"), "{err}");
        assert!(!overlay_path(&policy).exists());
        // The policy's own owner's directory is fine.
        std::os::unix::fs::chown(&policy, Some(54_321), None).unwrap();
        assert!(append(&policy, &entry("a.example.org")).unwrap());
    }

    #[test]
    fn a_policy_given_through_a_symlinked_directory_is_written_in_the_real_one() {
        let d = dir("dirlink");
        std::fs::create_dir(d.join("real")).unwrap();
        std::os::unix::fs::symlink("real", d.join("current")).unwrap();
        std::fs::write(d.join("real/p.yaml"), "version: 1\nid: p\n").unwrap();
        let policy = d.join("current/p.yaml");
        assert!(append(&policy, &entry("a.example.org")).unwrap());
        assert!(d.join("real/p.approved.yaml").is_file());
        assert_eq!(
            load_file(&policy, &CompileOptions::default())
                .unwrap()
                .check_name("a.example.org")
                .decision,
            Decision::Allow
        );
    }

    fn is_root() -> bool {
        rustix::process::geteuid().is_root()
    }

    #[test]
    fn a_prepared_overlay_changes_nothing_until_committed() {
        let d = dir("prepare");
        let policy = d.join("p.yaml");
        std::fs::write(&policy, "version: 1\nid: p\n").unwrap();
        let p = prepare(&policy, &entry("a.example.org")).unwrap().unwrap();
        assert!(!overlay_path(&policy).exists());
        assert_eq!(temporaries(&d), 1);
        drop(p);
        assert_eq!(temporaries(&d), 0, "the temporary file outlived its drop");
        let p = prepare(&policy, &entry("a.example.org")).unwrap().unwrap();
        p.commit().unwrap();
        assert!(prepare(&policy, &entry("a.example.org")).unwrap().is_none());
        assert_eq!(temporaries(&d), 0);
        assert!(overlay_path(&policy).is_file());
    }

    /// Loads the policy at `policy`; the error's text (the load must fail).
    fn load_err(policy: &Path) -> String {
        load_file(policy, &CompileOptions::default())
            .map(|p| p.id().to_owned())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn the_loader_refuses_a_symlinked_overlay() {
        let d = dir("loadlink");
        let policy = d.join("p.yaml");
        std::fs::write(&policy, "version: 1\nid: p\n").unwrap();
        let elsewhere = d.join("elsewhere.yaml");
        std::fs::write(
            &elsewhere,
            "version: 1\nid: a\nallow:\n  - domain: x.example.org\n",
        )
        .unwrap();
        std::os::unix::fs::symlink(&elsewhere, overlay_path(&policy)).unwrap();
        let err = load_err(&policy);
        assert!(err.contains("p.approved.yaml"), "{err}");
        assert!(err.contains("is a symlink"), "{err}");
        // Through a symlink to an endless file: refused, never read.
        std::fs::remove_file(overlay_path(&policy)).unwrap();
        std::os::unix::fs::symlink("/dev/zero", overlay_path(&policy)).unwrap();
        assert!(load_err(&policy).contains("is a symlink"));
    }

    #[test]
    fn the_loader_refuses_a_fifo_at_once() {
        let d = dir("loadfifo");
        let policy = d.join("p.yaml");
        std::fs::write(&policy, "version: 1\nid: p\n").unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(overlay_path(&policy))
            .status()
            .unwrap();
        assert!(made.success());
        // Nobody opens the FIFO's other end: a blocking open would hang here.
        let err = load_err(&policy);
        assert!(err.contains("not a regular file"), "{err}");
    }

    #[test]
    fn the_loader_refuses_a_hard_linked_overlay() {
        let d = dir("loadhard");
        let policy = d.join("p.yaml");
        std::fs::write(&policy, "version: 1\nid: p\n").unwrap();
        assert!(append(&policy, &entry("a.example.org")).unwrap());
        let link = d.join("kept.yaml");
        std::fs::hard_link(overlay_path(&policy), &link).unwrap();
        let err = load_err(&policy);
        assert!(err.contains("hard links"), "{err}");
        std::fs::remove_file(&link).unwrap();
        assert_eq!(
            load_file(&policy, &CompileOptions::default())
                .unwrap()
                .check_name("a.example.org")
                .decision,
            Decision::Allow
        );
    }

    #[test]
    fn the_loader_refuses_an_overlay_of_another_owner() {
        let d = dir("loadowner");
        let policy = d.join("p.yaml");
        std::fs::write(&policy, "version: 1\nid: p\n").unwrap();
        assert!(append(&policy, &entry("a.example.org")).unwrap());
        let overlay = overlay_path(&policy);
        // Only root may give a file to another uid; as root the test runs
        // both ways (the project's tests run as root).
        let chown = |uid: u32| std::os::unix::fs::chown(&overlay, Some(uid), None);
        if chown(54_321).is_err() {
            assert!(
                load_file(&policy, &CompileOptions::default()).is_ok(),
                "the owner's own overlay"
            );
            return;
        }
        let err = load_err(&policy);
        assert!(err.contains("owned by neither"), "{err}");
        // The policy's owner (root here) is trusted again.
        chown(0).unwrap();
        assert!(load_file(&policy, &CompileOptions::default()).is_ok());
    }

    #[test]
    fn the_loader_refuses_an_overlay_in_a_world_writable_directory() {
        use std::os::unix::fs::PermissionsExt as _;
        let d = dir("loadww");
        let policy = d.join("p.yaml");
        std::fs::write(&policy, "version: 1\nid: p\n").unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).unwrap();
        // No overlay there: the policy loads as before.
        assert!(load_file(&policy, &CompileOptions::default()).is_ok());
        std::fs::write(
            overlay_path(&policy),
            "version: 1\nid: a\nallow:\n  - domain: x.example.org\n",
        )
        .unwrap();
        let err = load_err(&policy);
        assert!(err.contains("anyone may write"), "{err}");
    }

    #[test]
    fn an_overlay_with_anything_but_name_rules_is_refused_by_name() {
        let d = dir("bad");
        let policy = d.join("p.yaml");
        std::fs::write(&policy, "version: 1\nid: p\n").unwrap();
        for bad in [
            "version: 1\nid: a\nallow:\n  - cidr: 10.0.0.0/8\n",
            "version: 1\nid: a\ninternal:\n  - 10.0.0.0/8\nallow: []\n",
            "version: 1\nid: a\nallow:\n  - domain: \"bad domain\"\n",
        ] {
            std::fs::write(overlay_path(&policy), bad).unwrap();
            let err = load_file(&policy, &CompileOptions::default())
                .unwrap_err()
                .to_string();
            assert!(err.contains("p.approved.yaml"), "{bad:?}: {err}");
            assert!(
                append(&policy, &entry("x.example.org")).is_err(),
                "{bad:?} was rewritten"
            );
            assert_eq!(std::fs::read_to_string(overlay_path(&policy)).unwrap(), bad);
        }
    }

    /// A descriptor of `d` of its own, as another writer would open.
    fn open_dir(d: &Path) -> OwnedFd {
        open_policy_dir(d).unwrap()
    }

    #[test]
    fn a_prepared_entry_holds_the_directory_lock_until_its_commit() {
        let d = dir("lock");
        let policy = d.join("p.yaml");
        std::fs::write(&policy, "version: 1\nid: p\n").unwrap();
        let first = prepare(&policy, &entry("a.example.org")).unwrap().unwrap();
        let err = lock_overlay(&open_dir(&d), std::time::Duration::ZERO).unwrap_err();
        assert!(
            err.to_string().contains("another writer holds the overlay"),
            "{err}"
        );
        first.commit().unwrap();
        lock_overlay(&open_dir(&d), std::time::Duration::ZERO).unwrap();
        // Nothing was made for the lock: only the policy and its overlay.
        let mut names: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names, ["p.approved.yaml", "p.yaml"]);
    }

    #[test]
    fn a_second_writer_waits_for_the_first_and_keeps_its_entry() {
        let d = dir("wait");
        let policy = d.join("p.yaml");
        std::fs::write(&policy, "version: 1\nid: p\n").unwrap();
        // The first writer has read the overlay (none) and holds its entry
        // until its commit, as the launcher does while the gateway decides.
        let first = prepare(&policy, &entry("a.example.org")).unwrap().unwrap();
        let second = {
            let policy = policy.clone();
            std::thread::spawn(move || append(&policy, &entry("b.example.org")))
        };
        first.commit().unwrap();
        assert!(second.join().unwrap().unwrap());
        let text = std::fs::read_to_string(overlay_path(&policy)).unwrap();
        assert!(
            text.contains("a.example.org") && text.contains("b.example.org"),
            "an entry was lost: {text}"
        );
    }

    #[test]
    fn a_writer_refuses_when_the_lock_stays_held() {
        let d = dir("held");
        let policy = d.join("p.yaml");
        std::fs::write(&policy, "version: 1\nid: p\n").unwrap();
        let other = open_dir(&d);
        rustix::fs::flock(&other, FlockOperation::LockExclusive).unwrap();
        let err = append(&policy, &entry("a.example.org")).unwrap_err();
        assert!(
            err.to_string().contains("another writer holds the overlay"),
            "{err}"
        );
        assert!(!overlay_path(&policy).exists());
    }

    #[test]
    fn an_overlay_edited_between_prepare_and_commit_is_kept() {
        let d = dir("edited");
        let policy = d.join("p.yaml");
        std::fs::write(&policy, "version: 1\nid: p\n").unwrap();
        assert!(append(&policy, &entry("a.example.org")).unwrap());
        let prepared = prepare(&policy, &entry("b.example.org")).unwrap().unwrap();
        // The owner removes the reviewed entry meanwhile (no lock taken).
        let reviewed = "version: 1\nid: approved\nallow:\n  - domain: kept.example.org\n";
        std::fs::write(overlay_path(&policy), reviewed).unwrap();
        let err = prepared.commit().unwrap_err();
        assert!(err.to_string().contains("changed since"), "{err}");
        assert_eq!(
            std::fs::read_to_string(overlay_path(&policy)).unwrap(),
            reviewed
        );
        assert_eq!(temporaries(&d), 0);
        // The next write starts from the reviewed file.
        assert!(append(&policy, &entry("b.example.org")).unwrap());
        let text = std::fs::read_to_string(overlay_path(&policy)).unwrap();
        assert!(
            !text.contains("a.example.org")
                && text.contains("kept.example.org")
                && text.contains("b.example.org"),
            "{text}"
        );
    }

    #[test]
    fn an_entry_that_would_pass_the_size_limit_is_refused_and_the_overlay_still_loads() {
        let d = dir("size");
        let policy = d.join("p.yaml");
        std::fs::write(&policy, "version: 1\nid: p\n").unwrap();
        assert!(append(&policy, &entry("a.example.org")).unwrap());
        // Padded with one comment line to a few bytes under the limit.
        let mut text = std::fs::read_to_string(overlay_path(&policy)).unwrap();
        let room = usize::try_from(crate::MAX_POLICY_BYTES).unwrap() - text.len() - 40;
        text.push_str("# ");
        text.push_str(&"x".repeat(room - 3));
        text.push('\n');
        std::fs::write(overlay_path(&policy), &text).unwrap();
        let err = append(&policy, &entry("b.example.org")).unwrap_err();
        assert!(
            err.to_string().contains("larger than a policy may be"),
            "{err}"
        );
        assert_eq!(temporaries(&d), 0);
        let p = load_file(&policy, &CompileOptions::default()).unwrap();
        assert_eq!(p.check_name("a.example.org").decision, Decision::Allow);
    }

    /// The environment the child writer ([`child_append`]) reads.
    const CHILD_POLICY: &str = "SLUICE_OVERLAY_TEST_CHILD_POLICY";
    const CHILD_NAME: &str = "SLUICE_OVERLAY_TEST_CHILD_NAME";

    /// Appends `name` to the overlay of `policy` from a child process
    /// running as `uid`:`gid` (this test binary, its ignored test
    /// [`child_append`]): `Ok(written)`, or the error's text.
    fn append_as(uid: u32, gid: u32, policy: &Path, name: &str) -> Result<bool, String> {
        use std::os::unix::process::CommandExt as _;
        let mut child = std::process::Command::new(std::env::current_exe().unwrap());
        child.uid(uid).gid(gid);
        append_in(child, policy, name)
    }

    /// As [`append_as`], in the process `child` describes.
    fn append_in(
        mut child: std::process::Command,
        policy: &Path,
        name: &str,
    ) -> Result<bool, String> {
        let out = child
            .args([
                "--ignored",
                "--exact",
                "overlay::tests::child_append",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_POLICY, policy)
            .env(CHILD_NAME, name)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let result = stdout
            .lines()
            .find_map(|l| l.split_once("RESULT ").map(|(_, r)| r))
            .unwrap_or_else(|| {
                panic!(
                    "the child wrote no result: {stdout} {}",
                    String::from_utf8_lossy(&out.stderr)
                )
            });
        match result.strip_prefix("ok ") {
            Some(written) => Ok(written == "true"),
            None => Err(result.to_owned()),
        }
    }

    /// Not a test of its own: the entry point of the child process
    /// [`append_as`] starts (this test binary, filtered to this name, with
    /// the policy and name in its environment). Run any other way (e.g.
    /// `--include-ignored`) it has nothing to write and returns; the tests
    /// that start it check what it wrote.
    #[test]
    #[ignore = "the child writer of append_as, run by the tests that write as another uid"]
    fn child_append() {
        let (Some(policy), Ok(name)) = (std::env::var_os(CHILD_POLICY), std::env::var(CHILD_NAME))
        else {
            return;
        };
        match append(Path::new(&policy), &entry(&name)) {
            Ok(written) => println!("RESULT ok {written}"),
            Err(e) => println!("RESULT err {e}"),
        }
    }

    /// A policy directory and policy file owned by `owner` (uid, gid of the
    /// file), the directory 0755 and the file 0644 (the child can read both).
    fn owned(tag: &str, dir_owner: u32, owner: (u32, u32)) -> PathBuf {
        use std::os::unix::fs::PermissionsExt as _;
        let d = dir(tag);
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        let policy = d.join("p.yaml");
        std::fs::write(&policy, "version: 1\nid: p\n").unwrap();
        std::fs::set_permissions(&policy, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::chown(&d, Some(dir_owner), Some(dir_owner)).unwrap();
        std::os::unix::fs::chown(&policy, Some(owner.0), Some(owner.1)).unwrap();
        policy
    }

    #[test]
    fn a_writer_running_as_the_policys_owner_writes_again_after_root() {
        if !is_root()
            && sluice_test_skip::may_skip("root", "only root may run a writer as another uid")
        {
            return;
        }
        let policy = owned("asowner", 54_321, (54_321, 54_321));
        // Root writes first: the overlay becomes the owner's.
        assert!(append(&policy, &entry("a.example.org")).unwrap());
        assert_eq!(
            append_as(54_321, 54_321, &policy, "b.example.org"),
            Ok(true)
        );
        assert_eq!(
            append_as(54_321, 54_321, &policy, "c.example.org"),
            Ok(true)
        );
        let text = std::fs::read_to_string(overlay_path(&policy)).unwrap();
        assert_eq!(text.matches("domain:").count(), 3, "{text}");
        assert!(load_file(&policy, &CompileOptions::default()).is_ok());
    }

    #[test]
    fn a_writer_that_cannot_give_the_overlay_the_policys_group_writes_nothing() {
        if !is_root()
            && sluice_test_skip::may_skip("root", "only root may run a writer as another uid")
        {
            return;
        }
        // The policy's group is root's, which the owner is not in: the
        // overlay would be the writer's group, unreadable by the policy's.
        let policy = owned("asgroup", 54_321, (54_321, 0));
        let err = append_as(54_321, 54_321, &policy, "a.example.org").unwrap_err();
        assert!(err.contains("cannot give the new overlay"), "{err}");
        assert!(!overlay_path(&policy).exists());
        assert_eq!(temporaries(policy.parent().unwrap()), 0);
    }

    #[test]
    fn a_writer_of_another_uid_in_a_directory_it_owns_is_refused_up_front() {
        if !is_root()
            && sluice_test_skip::may_skip("root", "only root may run a writer as another uid")
        {
            return;
        }
        // A standalone gateway running as 54322 with the policy's
        // directory its own: its overlay would be its own, which the next
        // write (and every load) refuses. Refused before anything is written.
        let policy = owned("asother", 54_322, (0, 0));
        let err = append_as(54_322, 54_322, &policy, "a.example.org").unwrap_err();
        assert!(err.contains("neither the policy's owner"), "{err}");
        assert!(!overlay_path(&policy).exists());
    }

    #[test]
    fn a_policy_named_by_a_relative_path_is_written_beside_it() {
        // `sluice-gateway --policy p.yaml`: the overlay's parent is the
        // empty path. In a child process, whose directory is the policy's.
        let d = dir("relative");
        std::fs::write(d.join("p.yaml"), "version: 1\nid: p\n").unwrap();
        let mut child = std::process::Command::new(std::env::current_exe().unwrap());
        child.current_dir(&d);
        assert_eq!(
            append_in(child, Path::new("p.yaml"), "a.example.org"),
            Ok(true)
        );
        assert!(
            std::fs::read_to_string(d.join("p.approved.yaml"))
                .unwrap()
                .contains("a.example.org")
        );
    }
}

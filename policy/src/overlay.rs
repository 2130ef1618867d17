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
    let fail = |message: String| PolicyErrors::whole_file(&origin, message);
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
mod tests;

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
//! owner: it refuses a world-writable directory, opens the existing
//! overlay without following a symlink and checks the file it opened (a
//! regular file, one link, owned by the policy's owner or root) before
//! reading it, and makes its new file under a name nobody else may have
//! taken (`create_new`: a file or symlink planted there fails the write).
//! The loader ([`crate::load_file`]) applies the same checks to the
//! overlay it reads, and refuses one in a world-writable directory.

use std::io::{Read as _, Write as _};
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

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
#[derive(Debug)]
pub struct Prepared {
    tmp: PathBuf,
    path: PathBuf,
    committed: bool,
}

impl Prepared {
    /// Replaces the overlay with the prepared file (a rename in its
    /// directory: a reader sees the old file or the new one).
    ///
    /// # Errors
    /// The rename failed; nothing changed.
    pub fn commit(mut self) -> Result<(), OverlayError> {
        std::fs::rename(&self.tmp, &self.path).map_err(|source| OverlayError::Io {
            path: self.path.clone(),
            source,
        })?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for Prepared {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Writes the overlay of the policy at `policy` with `entry` added, under
/// a temporary name beside it, ready for [`Prepared::commit`]; `None` when
/// the overlay already lists the name.
///
/// # Errors
/// The policy's directory is writable by anyone; the existing overlay is
/// not a plain file of the policy's owner (a symlink, a hard link, another
/// owner's), or is invalid (it is not rewritten); or the file could not be
/// read or written (a read-only policy directory, for one).
pub fn prepare(policy: &Path, entry: &Approved<'_>) -> Result<Option<Prepared>, OverlayError> {
    let path = overlay_path(policy);
    let io = |source| OverlayError::Io {
        path: path.clone(),
        source,
    };
    let refuse = |why: String| io(std::io::Error::other(why));
    let origin = path.display().to_string();
    let owner = std::fs::metadata(policy).map_err(io)?;
    let dir = dir_of(&path);
    let dir_meta = std::fs::metadata(dir).map_err(io)?;
    if dir_meta.mode() & 0o002 != 0 {
        return Err(refuse(format!(
            "the policy's directory {} is writable by anyone: not writing there",
            dir.display()
        )));
    }
    let mut text = match read_existing(&path, owner.uid()) {
        Ok(Some(text)) => {
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
            text
        }
        Ok(None) => HEADER.to_owned(),
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
    // The result must still be a valid overlay before it replaces the file.
    validate(&text, &origin).map_err(OverlayError::Invalid)?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        std::process::id()
    ));
    // A new file (O_EXCL: never one a symlink points at, never one
    // someone planted), readable by whoever may read the policy: its mode
    // and, where allowed, its owner.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(io)?;
    let prepared = Prepared {
        tmp,
        path: path.clone(),
        committed: false,
    };
    like_policy(&f, &owner)
        .and_then(|()| f.write_all(text.as_bytes()))
        .and_then(|()| f.sync_all())
        .map_err(io)?;
    Ok(Some(prepared))
}

/// Why the existing overlay was not read.
enum Existing {
    /// It is not a file the writer may trust.
    Refused(&'static str),
    /// Reading it failed.
    Io(std::io::Error),
}

/// The existing overlay's text (`None`: there is none), read from what was
/// opened without following a symlink, and only if that is a regular file
/// with one link owned by `owner` (the policy's) or root.
fn read_existing(path: &Path, owner: u32) -> Result<Option<String>, Existing> {
    let opened = std::fs::OpenOptions::new()
        .read(true)
        // A FIFO planted there must not block the open.
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path);
    let f = match opened {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(Existing::Refused("is a symlink"));
        }
        Err(e) => return Err(Existing::Io(e)),
    };
    let meta = f.metadata().map_err(Existing::Io)?;
    if !meta.file_type().is_file() {
        return Err(Existing::Refused("is not a regular file"));
    }
    if meta.nlink() != 1 {
        return Err(Existing::Refused("has other hard links"));
    }
    if meta.uid() != owner && meta.uid() != 0 {
        return Err(Existing::Refused(
            "is owned by neither the policy's owner nor root",
        ));
    }
    if meta.len() > crate::MAX_POLICY_BYTES {
        return Err(Existing::Refused("is larger than a policy may be"));
    }
    // Read no more than the limit even if the file grows meanwhile.
    let mut text = String::new();
    f.take(crate::MAX_POLICY_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(Existing::Io)?;
    if text.len() as u64 > crate::MAX_POLICY_BYTES {
        return Err(Existing::Refused("is larger than a policy may be"));
    }
    Ok(Some(text))
}

/// Gives `f` the policy file's (`meta`) permission bits (read and write
/// only) and, when this process may, its owner and group: the overlay is read by
/// whoever reads the policy (a jailed gateway, for one).
fn like_policy(f: &std::fs::File, meta: &std::fs::Metadata) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    f.set_permissions(std::fs::Permissions::from_mode(meta.mode() & 0o666))?;
    // Only root may give a file away; anyone else keeps it as their own.
    let _ = std::os::unix::fs::fchown(f, Some(meta.uid()), Some(meta.gid()));
    Ok(())
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
    let text = match read_existing(&path, owner) {
        Ok(None) => return Ok(None),
        Ok(Some(text)) => text,
        Err(Existing::Refused(why)) => {
            return Err(fail(format!(
                "approval overlay {why}: refused (remove it, or fold it into the policy)"
            )));
        }
        Err(Existing::Io(e)) => return Err(fail(format!("cannot read approval overlay: {e}"))),
    };
    let dir = dir_of(&path);
    let dir_meta = std::fs::metadata(dir)
        .map_err(|e| fail(format!("cannot read approval overlay's directory: {e}")))?;
    if dir_meta.mode() & 0o002 != 0 {
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
        let d = std::env::temp_dir().join(format!("sluice-overlay-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
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
    fn a_symlink_planted_at_the_temporary_name_fails_the_write_closed() {
        let d = dir("tmplink");
        let policy = d.join("p.yaml");
        std::fs::write(&policy, "version: 1\nid: p\n").unwrap();
        let elsewhere = d.join("elsewhere.yaml");
        let tmp = d.join(format!(".p.approved.yaml.{}.tmp", std::process::id()));
        std::os::unix::fs::symlink(&elsewhere, &tmp).unwrap();
        let err = append(&policy, &entry("x.example.org")).unwrap_err();
        assert!(matches!(err, OverlayError::Io { .. }), "{err}");
        assert!(!elsewhere.exists(), "written through the planted symlink");
        assert!(!overlay_path(&policy).exists());
        assert!(
            std::fs::symlink_metadata(&tmp)
                .unwrap()
                .file_type()
                .is_symlink(),
            "the planted link was replaced, not refused"
        );
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
    fn a_world_writable_policy_directory_is_refused() {
        use std::os::unix::fs::PermissionsExt as _;
        for mode in [0o777, 0o1777] {
            let d = dir(&format!("ww{mode:o}"));
            let policy = d.join("p.yaml");
            std::fs::write(&policy, "version: 1\nid: p\n").unwrap();
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode)).unwrap();
            let err = append(&policy, &entry("a.example.org")).unwrap_err();
            assert!(err.to_string().contains("writable by anyone"), "{err}");
            assert!(!overlay_path(&policy).exists());
        }
    }

    #[test]
    fn a_prepared_overlay_changes_nothing_until_committed() {
        let d = dir("prepare");
        let policy = d.join("p.yaml");
        std::fs::write(&policy, "version: 1\nid: p\n").unwrap();
        let p = prepare(&policy, &entry("a.example.org")).unwrap().unwrap();
        assert!(!overlay_path(&policy).exists());
        drop(p);
        assert_eq!(
            std::fs::read_dir(&d).unwrap().count(),
            1,
            "the temporary file outlived its drop"
        );
        let p = prepare(&policy, &entry("a.example.org")).unwrap().unwrap();
        p.commit().unwrap();
        assert!(prepare(&policy, &entry("a.example.org")).unwrap().is_none());
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 2);
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
}

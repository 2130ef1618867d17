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

/// A fresh directory for the test `tag` holding the policy `p.yaml` (no
/// rules): the directory and the policy's path.
fn fresh_policy(tag: &str) -> (PathBuf, PathBuf) {
    let d = dir(tag);
    let policy = d.join("p.yaml");
    std::fs::write(&policy, "version: 1\nid: p\n").unwrap();
    (d, policy)
}

/// As [`fresh_policy`], with `a.example.org` already approved into its
/// overlay.
fn policy_with_overlay(tag: &str) -> (PathBuf, PathBuf) {
    let (d, policy) = fresh_policy(tag);
    assert!(append(&policy, &entry("a.example.org")).unwrap());
    (d, policy)
}

/// What the policy at `policy`, loaded with its overlay, decides for `name`.
fn decision(policy: &Path, name: &str) -> Decision {
    load_file(policy, &CompileOptions::default())
        .unwrap()
        .check_name(name)
        .decision
}

/// Whether a test may run a writer as another uid (root only); when not,
/// the skip is `may_skip`'s to allow or to fail.
fn may_write_as_another_uid() -> bool {
    is_root() || !sluice_test_skip::may_skip("root", "only root may run a writer as another uid")
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
    let (d, policy) = fresh_policy("link");
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
    let (d, policy) = fresh_policy("tmplink");
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
    let (d, policy) = policy_with_overlay("links");
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
    let (_, policy) = policy_with_overlay("owner");
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
        let (d, policy) = fresh_policy(&format!("ww{mode:o}"));
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
    let (d, policy) = fresh_policy("dirowner");
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
    assert_eq!(decision(&policy, "a.example.org"), Decision::Allow);
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

#[test]
fn a_prepared_overlay_changes_nothing_until_committed() {
    let (d, policy) = fresh_policy("prepare");
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
    let (d, policy) = fresh_policy("loadlink");
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
    let (_, policy) = fresh_policy("loadfifo");
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
    let (d, policy) = policy_with_overlay("loadhard");
    let link = d.join("kept.yaml");
    std::fs::hard_link(overlay_path(&policy), &link).unwrap();
    let err = load_err(&policy);
    assert!(err.contains("hard links"), "{err}");
    std::fs::remove_file(&link).unwrap();
    assert_eq!(decision(&policy, "a.example.org"), Decision::Allow);
}

#[test]
fn the_loader_refuses_an_overlay_of_another_owner() {
    let (_, policy) = policy_with_overlay("loadowner");
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
    let (d, policy) = fresh_policy("loadww");
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
    let (_, policy) = fresh_policy("bad");
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
    let (d, policy) = fresh_policy("lock");
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
    let (_, policy) = fresh_policy("wait");
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
    let (d, policy) = fresh_policy("held");
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
    let (d, policy) = policy_with_overlay("edited");
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
    let (d, policy) = policy_with_overlay("size");
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
fn append_in(mut child: std::process::Command, policy: &Path, name: &str) -> Result<bool, String> {
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
    let (d, policy) = fresh_policy(tag);
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&policy, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::os::unix::fs::chown(&d, Some(dir_owner), Some(dir_owner)).unwrap();
    std::os::unix::fs::chown(&policy, Some(owner.0), Some(owner.1)).unwrap();
    policy
}

#[test]
fn a_writer_running_as_the_policys_owner_writes_again_after_root() {
    if !may_write_as_another_uid() {
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
    if !may_write_as_another_uid() {
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
    if !may_write_as_another_uid() {
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

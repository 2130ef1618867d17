//! cgroup v1 and v2: find the controllers, create a jail's cgroup(s), write
//! limits, join, remove.
//!
//! v1 (this project's test hosts): one hierarchy per controller under
//! `/sys/fs/cgroup/{memory,pids,cpu}`, so a jail gets one dir per used
//! controller. v2: one dir `/sys/fs/cgroup/<name>` with the controllers
//! enabled in the root's `cgroup.subtree_control`. A controller found in a v1
//! hierarchy is used there; otherwise the unified hierarchy must be mounted
//! at `/sys/fs/cgroup` itself (a hybrid host's `unified/` mount typically
//! holds no controllers).
//!
//! Rootless, only a v2 subtree delegated to the caller can be used: the
//! highest ancestor of the process's own cgroup that the caller owns (e.g.
//! systemd's `user@<uid>.service`); the jail's dir is made inside it. v1
//! hierarchies belong to root and are never delegated.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::CgroupLimits;

const ROOT: &str = "/sys/fs/cgroup";

/// A cgroup controller we limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Controller {
    /// memory
    Memory,
    /// pids
    Pids,
    /// cpu
    Cpu,
}

impl Controller {
    fn name(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Pids => "pids",
            Self::Cpu => "cpu",
        }
    }
}

/// Where a controller lives.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Hierarchy {
    /// A v1 hierarchy mounted at this dir.
    V1(PathBuf),
    /// The v2 unified hierarchy: jail dirs go directly below this dir
    /// ([`ROOT`] as root, the delegated subtree rootless).
    V2(PathBuf),
}

fn locate(c: Controller) -> Option<Hierarchy> {
    if is_root() {
        locate_in(Path::new(ROOT), c)
    } else {
        locate_rootless(c).ok()
    }
}

/// Where a rootless jail's `c` cgroup goes, or why there is none.
fn locate_rootless(c: Controller) -> Result<Hierarchy, String> {
    let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    delegated_in(Path::new(ROOT), &own, super::sys::geteuid(), c)
}

/// [`locate_rootless`] under `root`, for the process whose
/// `/proc/self/cgroup` is `own`, running as `uid`.
fn delegated_in(root: &Path, own: &str, uid: u32, c: Controller) -> Result<Hierarchy, String> {
    use std::os::unix::fs::MetadataExt;
    if let Some(Hierarchy::V1(_)) = locate_in(root, c) {
        return Err(format!(
            "this host has cgroup v1, whose hierarchies belong to root and cannot be \
             delegated to uid {uid}"
        ));
    }
    if !root.join("cgroup.controllers").exists() {
        return Err(format!(
            "no cgroup v2 hierarchy at {} to delegate to uid {uid}",
            root.display()
        ));
    }
    // The v2 line is "0::/path".
    let Some(path) = own.lines().find_map(|l| l.strip_prefix("0::")) else {
        return Err(
            "this process is in no cgroup v2 (no 0:: line in /proc/self/cgroup)".to_owned(),
        );
    };
    let owned = |d: &Path| {
        let mine = |p: &Path| fs::metadata(p).is_ok_and(|m| m.uid() == uid);
        mine(d) && mine(&d.join("cgroup.procs")) && mine(&d.join("cgroup.subtree_control"))
    };
    // The highest owned ancestor: moving a process between two of its
    // descendants needs write access to the common ancestor's cgroup.procs.
    let mut dir = root.to_path_buf();
    let mut delegated = None;
    for part in path
        .trim()
        .split('/')
        .filter(|p| !p.is_empty() && *p != "..")
    {
        dir.push(part);
        if owned(&dir) {
            delegated = Some(dir.clone());
            break;
        }
    }
    let Some(base) = delegated else {
        return Err(format!(
            "cgroup v2, but no part of this process's cgroup {} is delegated to uid {uid} \
             (start sluice in a delegated one, e.g. `systemd-run --user --scope -p Delegate=yes`)",
            path.trim()
        ));
    };
    let controllers = fs::read_to_string(base.join("cgroup.controllers")).unwrap_or_default();
    if !controllers.split_whitespace().any(|n| n == c.name()) {
        return Err(format!(
            "cgroup v2 subtree {} delegated to uid {uid} lacks the {} controller",
            base.display(),
            c.name()
        ));
    }
    Ok(Hierarchy::V2(base))
}

/// [`locate`] under `root` (the cgroup mount root; a fake tree in tests).
fn locate_in(root: &Path, c: Controller) -> Option<Hierarchy> {
    let v1 = root.join(c.name());
    let v1_file = match c {
        Controller::Memory => "memory.limit_in_bytes",
        Controller::Pids => "cgroup.procs",
        Controller::Cpu => "cpu.cfs_quota_us",
    };
    // `cgroup.clone_children` exists only in v1 hierarchies.
    if v1.join("cgroup.clone_children").exists() && v1.join(v1_file).exists() {
        return Some(Hierarchy::V1(v1));
    }
    let controllers = fs::read_to_string(root.join("cgroup.controllers")).ok()?;
    controllers
        .split_whitespace()
        .any(|n| n == c.name())
        .then_some(Hierarchy::V2(root.to_path_buf()))
}

/// Whether `c` can be used here, and how.
pub(super) fn probe(c: Controller) -> (bool, String) {
    if !is_root() {
        return match locate_rootless(c) {
            Ok(Hierarchy::V2(base)) => (
                true,
                format!(
                    "cgroup v2 subtree {} delegated to uid {}",
                    base.display(),
                    super::sys::geteuid()
                ),
            ),
            Ok(Hierarchy::V1(_)) => (false, "cgroup v1 cannot be delegated".to_owned()),
            Err(why) => (false, why),
        };
    }
    match locate(c) {
        Some(Hierarchy::V1(dir)) => (true, format!("cgroup v1 {}", dir.display())),
        Some(Hierarchy::V2(_)) => (true, format!("cgroup v2 {ROOT}")),
        None => (
            false,
            format!(
                "no {} controller in a v1 hierarchy or in v2 at {ROOT}",
                c.name()
            ),
        ),
    }
}

fn is_root() -> bool {
    super::sys::geteuid() == 0
}

/// Creates the cgroup dirs for the requested limits and writes the limits.
/// Returns the created dirs (to join and later remove). On error, removes
/// what it created.
pub(super) fn create(name: &str, limits: &CgroupLimits) -> io::Result<Vec<PathBuf>> {
    let mut created = Vec::new();
    let result = create_inner(name, limits, &mut created);
    if result.is_err() {
        remove(&created);
    }
    result.map(|()| created)
}

fn create_inner(name: &str, limits: &CgroupLimits, created: &mut Vec<PathBuf>) -> io::Result<()> {
    create_with(&locate, name, limits, created)
}

/// [`create_inner`] under `root` (as root).
#[cfg(test)]
fn create_in(
    root: &Path,
    name: &str,
    limits: &CgroupLimits,
    created: &mut Vec<PathBuf>,
) -> io::Result<()> {
    create_with(&|c| locate_in(root, c), name, limits, created)
}

/// Creates the dirs where `locate` puts each controller.
fn create_with(
    locate: &dyn Fn(Controller) -> Option<Hierarchy>,
    name: &str,
    limits: &CgroupLimits,
    created: &mut Vec<PathBuf>,
) -> io::Result<()> {
    let wanted = [
        (Controller::Memory, limits.memory_bytes),
        (Controller::Pids, limits.pids),
        (Controller::Cpu, limits.cpu_millis),
    ];
    for (c, limit) in wanted {
        let Some(limit) = limit else { continue };
        let Some(hierarchy) = locate(c) else {
            return Err(io::Error::other(format!("no {} controller", c.name())));
        };
        let dir = match &hierarchy {
            Hierarchy::V1(base) | Hierarchy::V2(base) => base.join(name),
        };
        if let Hierarchy::V2(base) = &hierarchy {
            enable_v2_controller(base, c)?;
        }
        if !created.contains(&dir) {
            fs::create_dir(&dir)
                .map_err(|e| io::Error::new(e.kind(), format!("mkdir {}: {e}", dir.display())))?;
            created.push(dir.clone());
        }
        write_limit(&dir, &hierarchy, c, limit)?;
    }
    Ok(())
}

fn enable_v2_controller(root: &Path, c: Controller) -> io::Result<()> {
    let control = root.join("cgroup.subtree_control");
    let enabled = fs::read_to_string(&control)?;
    if !enabled.split_whitespace().any(|n| n == c.name()) {
        write(&control, &format!("+{}", c.name()))?;
    }
    Ok(())
}

fn write(path: &Path, value: &str) -> io::Result<()> {
    fs::write(path, value).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("writing {value:?} to {}: {e}", path.display()),
        )
    })
}

fn write_limit(dir: &Path, h: &Hierarchy, c: Controller, limit: u64) -> io::Result<()> {
    const PERIOD_US: u64 = 100_000;
    let v1 = matches!(h, Hierarchy::V1(_));
    match c {
        Controller::Memory if v1 => {
            write(&dir.join("memory.limit_in_bytes"), &limit.to_string())?;
            // Swap accounting is optional on v1; limit memory+swap where present.
            let memsw = dir.join("memory.memsw.limit_in_bytes");
            if memsw.exists() {
                write(&memsw, &limit.to_string())?;
            }
            Ok(())
        }
        Controller::Memory => {
            write(&dir.join("memory.max"), &limit.to_string())?;
            let swap = dir.join("memory.swap.max");
            if swap.exists() {
                write(&swap, "0")?;
            }
            Ok(())
        }
        Controller::Pids => write(&dir.join("pids.max"), &limit.to_string()),
        Controller::Cpu => {
            let quota = limit.saturating_mul(PERIOD_US) / 1000;
            let quota = quota.max(1000);
            if v1 {
                write(&dir.join("cpu.cfs_period_us"), &PERIOD_US.to_string())?;
                write(&dir.join("cpu.cfs_quota_us"), &quota.to_string())
            } else {
                write(&dir.join("cpu.max"), &format!("{quota} {PERIOD_US}"))
            }
        }
    }
}

/// Moves the calling process into each dir (`cgroup.procs` <- "0").
pub(super) fn join_self(dirs: &[PathBuf]) -> io::Result<()> {
    for dir in dirs {
        write(&dir.join("cgroup.procs"), "0")?;
    }
    Ok(())
}

/// SIGKILLs anything still in the dirs, then removes them, retrying briefly
/// while exiting tasks leave. Errors are ignored (best effort; the launcher
/// retries on drop).
pub(super) fn remove(dirs: &[PathBuf]) {
    for dir in dirs {
        for attempt in 0..100 {
            if let Ok(procs) = fs::read_to_string(dir.join("cgroup.procs")) {
                for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                    let _ = super::sys::kill(pid, libc::SIGKILL);
                }
            }
            match fs::remove_dir(dir) {
                Ok(()) => break,
                Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                Err(_) if attempt < 99 => std::thread::sleep(std::time::Duration::from_millis(20)),
                Err(_) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The v2 path logic on a fake tree: these hosts are v1, so a live v2
    //! host never runs this code here (docs/isolation.md). The kernel's v2
    //! files are plain files in the fake tree; `mkdir` of a cgroup creates
    //! no interface files, so the test creates the optional ones itself.
    use super::*;

    fn fake_root(tag: &str) -> PathBuf {
        let root = std::env::temp_dir().join(format!("la-cg-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root).unwrap();
        root
    }

    #[test]
    fn v2_root_with_controllers_is_located_as_v2() {
        let root = fake_root("locate");
        fs::write(
            root.join("cgroup.controllers"),
            "cpuset cpu io memory pids\n",
        )
        .unwrap();
        for c in [Controller::Memory, Controller::Pids, Controller::Cpu] {
            assert_eq!(
                locate_in(&root, c),
                Some(Hierarchy::V2(root.clone())),
                "{c:?}"
            );
        }
        // A v2 root without the pids controller delegated.
        fs::write(root.join("cgroup.controllers"), "cpu memory\n").unwrap();
        assert_eq!(locate_in(&root, Controller::Pids), None);
        // A v1 hierarchy wins over v2 for its controller.
        let v1 = root.join("memory");
        fs::create_dir_all(&v1).unwrap();
        fs::write(v1.join("cgroup.clone_children"), "0").unwrap();
        fs::write(v1.join("memory.limit_in_bytes"), "max").unwrap();
        assert_eq!(
            locate_in(&root, Controller::Memory),
            Some(Hierarchy::V1(v1))
        );
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn v2_create_enables_controllers_and_writes_v2_limits() {
        let root = fake_root("create");
        fs::write(root.join("cgroup.controllers"), "cpu memory pids\n").unwrap();
        fs::write(root.join("cgroup.subtree_control"), "").unwrap();
        let dir = root.join("la-jail");
        let limits = CgroupLimits {
            memory_bytes: Some(512 << 20),
            pids: Some(64),
            cpu_millis: Some(1500),
        };
        let mut created = Vec::new();
        create_in(&root, "la-jail", &limits, &mut created).unwrap();
        assert_eq!(created, vec![dir.clone()], "one dir for all controllers");
        let read = |f: &str| fs::read_to_string(dir.join(f)).unwrap();
        assert_eq!(read("memory.max"), (512u64 << 20).to_string());
        assert_eq!(read("pids.max"), "64");
        // 1.5 CPUs: 150 ms of every 100 ms period.
        assert_eq!(read("cpu.max"), "150000 100000");
        assert!(!dir.join("memory.limit_in_bytes").exists());
        // Each controller was enabled in the parent's subtree_control (the
        // fake file keeps only the last write; the kernel accumulates).
        let control = fs::read_to_string(root.join("cgroup.subtree_control")).unwrap();
        assert!(control.starts_with('+'), "{control:?}");
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn v2_memory_disables_swap_where_the_file_exists() {
        let root = fake_root("swap");
        let dir = root.join("j");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("memory.swap.max"), "max").unwrap();
        write_limit(
            &dir,
            &Hierarchy::V2(root.clone()),
            Controller::Memory,
            1 << 30,
        )
        .unwrap();
        assert_eq!(
            fs::read_to_string(dir.join("memory.swap.max")).unwrap(),
            "0"
        );
        // A tiny CPU share is raised to the 1 ms minimum quota.
        write_limit(&dir, &Hierarchy::V2(root.clone()), Controller::Cpu, 1).unwrap();
        assert_eq!(
            fs::read_to_string(dir.join("cpu.max")).unwrap(),
            "1000 100000"
        );
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn rootless_uses_the_highest_delegated_v2_ancestor_or_says_why_not() {
        use std::os::unix::fs::MetadataExt;
        let root = fake_root("deleg");
        let me = fs::metadata(&root).unwrap().uid();
        fs::write(root.join("cgroup.controllers"), "cpu memory pids\n").unwrap();
        let user = root.join("user.slice/user-1000.slice/user@1000.service");
        let app = user.join("app.slice/run-1.scope");
        fs::create_dir_all(&app).unwrap();
        for d in [&user, &user.join("app.slice"), &app] {
            fs::write(d.join("cgroup.procs"), "").unwrap();
            fs::write(d.join("cgroup.subtree_control"), "").unwrap();
        }
        fs::write(user.join("cgroup.controllers"), "memory pids\n").unwrap();
        let own = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/run-1.scope\n";
        // Dirs without the delegated files (user.slice, user-1000.slice)
        // are not the user's; user@1000.service is the highest that is.
        assert_eq!(
            delegated_in(&root, own, me, Controller::Memory),
            Ok(Hierarchy::V2(user.clone()))
        );
        let e = delegated_in(&root, own, me, Controller::Cpu).unwrap_err();
        assert!(e.contains("lacks the cpu controller"), "{e}");
        let other = me.wrapping_add(4242);
        let e = delegated_in(&root, own, other, Controller::Memory).unwrap_err();
        assert!(e.contains("no part of this process's cgroup"), "{e}");
        assert!(e.contains("systemd-run --user --scope"), "{e}");
        // Without a v2 line.
        let e = delegated_in(&root, "1:name=systemd:/\n", me, Controller::Pids).unwrap_err();
        assert!(e.contains("no 0:: line"), "{e}");
        // A v1 hierarchy for the controller: never delegated.
        let v1 = root.join("memory");
        fs::create_dir_all(&v1).unwrap();
        fs::write(v1.join("cgroup.clone_children"), "0").unwrap();
        fs::write(v1.join("memory.limit_in_bytes"), "max").unwrap();
        let e = delegated_in(&root, own, me, Controller::Memory).unwrap_err();
        assert!(
            e.contains("cgroup v1") && e.contains("cannot be delegated"),
            "{e}"
        );
        fs::remove_dir_all(&root).unwrap();
    }
}

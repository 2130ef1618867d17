//! The jail helper (`sluice __jail-exec`): the supervisor outside the jail
//! and, after its fork, the child that builds the jail and execs the program.
//! The order of operations is the module doc of `jail`.

use std::collections::BTreeSet;
use std::ffi::CString;
use std::fs;
use std::io::{self, BufRead, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt};
use std::path::{Path, PathBuf};

use sluice_confine::{LandlockOutcome, LandlockRules};

use super::launch::{HelperRequest, Report};
use super::sys::{self, Forked, WaitStatus};
use super::{JailExit, JailSpec, Layer, LayerStatus, cgroup, userns};

/// The hidden argument that makes the launcher binary act as the helper.
pub const HELPER_ARG: &str = "__jail-exec";

/// Call first thing in `main` of any binary used as the jail helper (the
/// `sluice` binary by default): when `argv[1]` is [`HELPER_ARG`], runs the
/// helper and exits the process; otherwise returns and `main` goes on.
pub fn helper_main_if_requested() {
    if std::env::args_os().nth(1).is_some_and(|a| a == HELPER_ARG) {
        let code = helper_main();
        std::process::exit(code);
    }
}

/// Writes one report line to stdout (the launcher's report pipe). A closed
/// pipe (launcher gone) is ignored.
fn report(r: &Report) {
    if let Ok(mut line) = serde_json::to_vec(r) {
        line.push(b'\n');
        let mut out = io::stdout().lock();
        let _ = out.write_all(&line).and_then(|()| out.flush());
    }
}

fn helper_main() -> i32 {
    let mut line = String::new();
    if let Err(e) = io::stdin().lock().read_line(&mut line) {
        report(&Report::Failed {
            error: format!("reading the spec: {e}"),
        });
        return 1;
    }
    let request: HelperRequest = match serde_json::from_str(&line) {
        Ok(r) => r,
        Err(e) => {
            report(&Report::Failed {
                error: format!("parsing the spec: {e}"),
            });
            return 1;
        }
    };
    close_stray_fds(&request.spec);
    match supervise(&request) {
        Ok(()) => 0,
        Err(error) => {
            report(&Report::Failed { error });
            1
        }
    }
}

/// Closes every fd the helper inherited by accident (a launcher's fds that
/// lack close-on-exec): only stdio and the passed fds stay.
fn close_stray_fds(spec: &JailSpec) {
    let keep: BTreeSet<RawFd> = [0, 1, 2]
        .into_iter()
        .chain(spec.fds.iter().map(|m| m.parent))
        .collect();
    let open: Vec<RawFd> = match fs::read_dir("/proc/self/fd") {
        Ok(dir) => dir
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect(),
        Err(_) => return,
    };
    for fd in open.into_iter().filter(|fd| !keep.contains(fd)) {
        sys::close(fd);
    }
}

/// What to remove after the program ends.
struct Cleanup {
    cgroups: Vec<PathBuf>,
    jail_dir: Option<PathBuf>,
    /// The caller's [`JailSpec::remove_after`] dirs.
    remove_after: Vec<PathBuf>,
    /// The removal of the caller's [`JailSpec::egress_floor`] table,
    /// prepared before the PID namespace is made: once the jail's init has
    /// exited, this process can no longer fork.
    egress_floor: Option<sluice_floor::egress::Removal>,
}

impl Cleanup {
    fn run(&mut self) {
        cgroup::remove(&std::mem::take(&mut self.cgroups));
        if let Some(dir) = self.jail_dir.take() {
            let _ = fs::remove_dir(dir);
        }
        for dir in std::mem::take(&mut self.remove_after) {
            let _ = fs::remove_dir_all(dir);
        }
        if let Some(removal) = self.egress_floor.take() {
            // Nobody is left to report to; a table that stays matches a
            // gid no process holds, and the next launcher with the same
            // pid replaces it.
            let _ = removal.run();
        }
    }

    fn paths(&self) -> Vec<PathBuf> {
        self.cgroups
            .iter()
            .cloned()
            .chain(self.jail_dir.clone())
            .collect()
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        self.run();
    }
}

/// The parent side: set up, fork, report, wait, clean up.
fn supervise(req: &HelperRequest) -> Result<(), String> {
    let spec = &req.spec;
    let on: BTreeSet<Layer> = req
        .layers
        .iter()
        .filter(|(_, s)| s.available)
        .map(|(l, _)| *l)
        .collect();
    let layers: Vec<LayerStatus> = req.layers.iter().map(|(_, s)| s.clone()).collect();

    // 1. cgroups, with only the limits whose layer is on.
    let limits = super::CgroupLimits {
        memory_bytes: spec
            .cgroup
            .memory_bytes
            .filter(|_| on.contains(&Layer::CgroupMemory)),
        pids: spec.cgroup.pids.filter(|_| on.contains(&Layer::CgroupPids)),
        cpu_millis: spec
            .cgroup
            .cpu_millis
            .filter(|_| on.contains(&Layer::CgroupCpu)),
    };
    let mut cleanup = Cleanup {
        cgroups: Vec::new(),
        jail_dir: None,
        remove_after: spec.remove_after.clone(),
        egress_floor: None,
    };
    if let Some(table) = &spec.egress_floor {
        cleanup.egress_floor = Some(
            sluice_floor::egress::Removal::prepare(table, sys::close_fds_across_exec)
                .map_err(|e| format!("the egress floor's removal: {e}"))?,
        );
    }
    cleanup.cgroups = cgroup::create(&spec.name, &limits).map_err(|e| format!("cgroups: {e}"))?;

    // 2. The jail's mount point on the host: an empty dir, removed afterwards.
    let jail_dir = spec.runtime_dir.join(format!("{}.jail", spec.name));
    let rootless = on.contains(&Layer::UserNs);
    if on.contains(&Layer::PivotRoot) {
        if rootless {
            super::ensure_private_dir(&spec.runtime_dir).map_err(|e| e.to_string())?;
        }
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&jail_dir)
            .map_err(|e| format!("creating {}: {e}", jail_dir.display()))?;
        cleanup.jail_dir = Some(jail_dir.clone());
    }

    // Things the child needs and cannot get inside the jail.
    let dev_null = fs::File::options()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|e| format!("opening /dev/null: {e}"))?;
    let last_cap = fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(63);
    let (mut err_read, err_write) = io::pipe().map_err(|e| format!("pipe: {e}"))?;

    // 3. Rootless: a user namespace mapping only the caller's ids, which
    //    owns every namespace made from here on. Then the PID namespace for
    //    the children, then fork.
    if rootless {
        userns::enter(spec.uid, spec.gid).map_err(|e| e.to_string())?;
    }
    if on.contains(&Layer::PidNs) {
        sys::unshare(libc::CLONE_NEWPID).map_err(|e| format!("unshare(CLONE_NEWPID): {e}"))?;
    }
    let child = match sys::fork().map_err(|e| format!("fork: {e}"))? {
        Forked::Child => {
            drop(err_read);
            let ctx = ChildContext {
                spec,
                on: &on,
                cgroups: &cleanup.cgroups,
                jail_dir: &jail_dir,
                dev_null: dev_null.as_raw_fd(),
                err_fd: err_write.as_raw_fd(),
                last_cap,
                rootless,
            };
            let Err(error) = jail_child(&ctx);
            let mut err_write = err_write;
            let _ = err_write.write_all(error.as_bytes());
            sys::exit_now(127);
        }
        Forked::Parent(pid) => pid,
    };
    drop(err_write);
    drop(dev_null);
    // The passed fds now belong to the child only.
    for m in &spec.fds {
        sys::close(m.parent);
    }
    // The child's error, if any, or EOF on exec (the pipe is close-on-exec).
    let mut error = String::new();
    let _ = io::Read::read_to_string(&mut err_read, &mut error);
    if !error.is_empty() {
        let _ = sys::waitpid(child);
        return Err(error);
    }

    // 4. Report, then wait for the child or the lifeline.
    let pid = u32::try_from(child).map_err(|e| e.to_string())?;
    report(&Report::Started {
        pid,
        layers,
        cleanup: cleanup.paths(),
    });
    let exit = wait_child_or_lifeline(child);
    cleanup.run();
    match exit {
        Ok(exit) => {
            report(&Report::Exited { exit });
            Ok(())
        }
        Err(e) => Err(format!("waiting for the program: {e}")),
    }
}

/// Waits for the child to exit or for stdin (the lifeline) to close; on the
/// latter, kills the child first.
fn wait_child_or_lifeline(child: libc::pid_t) -> io::Result<JailExit> {
    let pidfd = sys::pidfd_open(child)?;
    let ready = sys::poll_readable(&[pidfd, 0]);
    sys::close(pidfd);
    let child_done = ready.as_ref().is_ok_and(|r| r.first() == Some(&true));
    if !child_done {
        // Lifeline closed (or poll failed): kill. With a PID namespace the
        // kernel then kills everything else in it.
        let _ = sys::kill(child, libc::SIGKILL);
    }
    Ok(match sys::waitpid(child)? {
        WaitStatus::Exited(code) => JailExit::Code(code),
        WaitStatus::Signaled(sig) => JailExit::Signal(sig),
    })
}

/// What the child needs from the helper.
struct ChildContext<'a> {
    spec: &'a JailSpec,
    on: &'a BTreeSet<Layer>,
    cgroups: &'a [PathBuf],
    jail_dir: &'a Path,
    dev_null: RawFd,
    err_fd: RawFd,
    last_cap: u32,
    /// Inside a user namespace of the caller's (no `setgroups`; the
    /// capabilities it holds in that namespace are cleared explicitly).
    rootless: bool,
}

/// The child, top to bottom. Returns only on error.
fn jail_child(ctx: &ChildContext<'_>) -> Result<std::convert::Infallible, String> {
    let spec = ctx.spec;
    let on = |l: Layer| ctx.on.contains(&l);
    let step = |what: &str, r: io::Result<()>| r.map_err(|e| format!("{what}: {e}"));

    // Die with the helper; own session (no controlling terminal).
    step(
        "PR_SET_PDEATHSIG",
        sys::set_parent_death_signal(libc::SIGKILL),
    )?;
    if !on(Layer::PidNs) && sys::getppid() == 1 {
        return Err("the helper died during start-up".to_owned());
    }
    step("setsid", sys::setsid())?;

    // cgroups: join before anything else runs in this process.
    step("joining the cgroups", cgroup::join_self(ctx.cgroups))?;

    // Namespaces (the PID one was made by the parent).
    let mut flags = 0;
    for (layer, flag) in [
        (Layer::MountNs, libc::CLONE_NEWNS),
        (Layer::IpcNs, libc::CLONE_NEWIPC),
        (Layer::UtsNs, libc::CLONE_NEWUTS),
        (Layer::NetNs, libc::CLONE_NEWNET),
    ] {
        if on(layer) {
            flags |= flag;
        }
    }
    if flags != 0 {
        step("unshare", sys::unshare(flags))?;
    }
    if on(Layer::UtsNs) {
        step("sethostname", sys::sethostname("sluice"))?;
    }

    // The root filesystem.
    if on(Layer::PivotRoot) {
        build_root(spec, ctx.jail_dir, ctx.rootless)?;
    }

    // File descriptors.
    setup_fds(spec, ctx.dev_null, ctx.err_fd)?;

    // Limits, then identity.
    spec.rlimits.apply().map_err(|e| e.to_string())?;
    let program = sys::cstring(spec.program.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    let argv = std::iter::once(Ok(program.clone()))
        .chain(spec.args.iter().map(|a| sys::cstring(a.as_bytes())))
        .collect::<io::Result<Vec<CString>>>()
        .map_err(|e| format!("argument: {e}"))?;
    let envp = spec
        .env
        .iter()
        .map(|(k, v)| sys::cstring(format!("{k}={v}")))
        .collect::<io::Result<Vec<CString>>>()
        .map_err(|e| format!("environment: {e}"))?;
    step(
        "dropping capabilities",
        sys::drop_bounding_and_ambient_caps(ctx.last_cap),
    )?;
    step(
        "dropping uid/gid",
        sys::drop_ids(
            spec.uid,
            spec.gid,
            (!ctx.rootless).then_some(&spec.groups[..]),
        ),
    )?;
    // Rootless the uid does not change, so setresuid kept the capabilities
    // this process holds inside its user namespace: clear them.
    step("clearing capabilities", sys::clear_capabilities())?;
    // A change of ids clears the parent-death signal: set it again.
    step(
        "PR_SET_PDEATHSIG",
        sys::set_parent_death_signal(libc::SIGKILL),
    )?;
    sluice_confine::set_no_new_privs().map_err(|e| e.to_string())?;

    // Landlock, then seccomp last: after it only execve runs.
    if let Some(extra) = spec.landlock.as_ref().filter(|_| on(Layer::Landlock)) {
        // A partial outcome (older ABI) was already reported by the probe.
        match derived_landlock(spec, extra).restrict_self() {
            Ok(LandlockOutcome::Full | LandlockOutcome::Partial(_)) => {}
            Err(_) if spec.allow_missing.contains(&Layer::Landlock) => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    if on(Layer::Seccomp) {
        spec.seccomp.install(false).map_err(|e| e.to_string())?;
    }
    Err(format!(
        "execve {}: {}",
        spec.program.display(),
        sys::execve(&program, &argv, &envp)
    ))
}

/// The Landlock rules of a jail: its read-only files read+execute, its
/// writable paths and device nodes read+write, plus the caller's extras.
fn derived_landlock(spec: &JailSpec, extra: &LandlockRules) -> LandlockRules {
    let mut rules = extra.clone();
    for p in std::iter::once(&spec.program).chain(&spec.ro_paths) {
        if is_device(p) {
            rules.read_write.push(p.clone());
        } else {
            rules.read_exec.push(p.clone());
        }
    }
    rules.read_write.extend(spec.rw_paths.iter().cloned());
    rules
}

fn is_device(p: &Path) -> bool {
    fs::metadata(p).is_ok_and(|m| m.file_type().is_char_device() || m.file_type().is_block_device())
}

/// Mount namespace is new: make it private, mount a tmpfs on the jail dir,
/// bind-mount every path at its own path, pivot_root, drop the old root,
/// remount the new root read-only.
fn build_root(spec: &JailSpec, jail: &Path, rootless: bool) -> Result<(), String> {
    let c = |p: &Path| sys::cstring(p.as_os_str().as_bytes()).map_err(|e| e.to_string());
    let root = c(Path::new("/"))?;
    sys::mount(None, &root, None, libc::MS_REC | libc::MS_PRIVATE, None)
        .map_err(|e| format!("making / private: {e}"))?;
    let jail_c = c(jail)?;
    let tmpfs = sys::cstring("tmpfs").map_err(|e| e.to_string())?;
    let data = sys::cstring("size=1m,nr_inodes=4096,mode=0755").map_err(|e| e.to_string())?;
    sys::mount(
        Some(&tmpfs),
        &jail_c,
        Some(&tmpfs),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        Some(&data),
    )
    .map_err(|e| format!("mounting the jail tmpfs: {e}"))?;

    let mut seen = BTreeSet::new();
    let ro = std::iter::once(&spec.program)
        .chain(&spec.ro_paths)
        .map(|p| (p, false));
    for (path, writable) in ro.chain(spec.rw_paths.iter().map(|p| (p, true))) {
        if !seen.insert(path.clone()) {
            continue;
        }
        bind_into(jail, path, writable, rootless)?;
    }

    let old = jail.join(".old");
    fs::create_dir(&old).map_err(|e| format!("mkdir .old: {e}"))?;
    sys::pivot_root(&jail_c, &c(&old)?).map_err(|e| format!("pivot_root: {e}"))?;
    std::env::set_current_dir("/").map_err(|e| format!("chdir /: {e}"))?;
    let old_in = c(Path::new("/.old"))?;
    sys::umount2(&old_in, libc::MNT_DETACH).map_err(|e| format!("detaching the old root: {e}"))?;
    fs::remove_dir("/.old").map_err(|e| format!("rmdir /.old: {e}"))?;
    sys::mount(
        None,
        &root,
        None,
        libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
        None,
    )
    .map_err(|e| format!("remounting / read-only: {e}"))
}

/// Bind-mounts host `path` at `jail/path`: read-only unless `writable`,
/// always `nosuid`; `nodev` and `noexec` except where a device node must
/// keep working. Rootless, the flags the host's mount had are kept as well
/// (the kernel locks them in a user namespace; the remount fails without).
fn bind_into(jail: &Path, path: &Path, writable: bool, rootless: bool) -> Result<(), String> {
    let meta = fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let rel = path.strip_prefix("/").unwrap_or(path);
    let target = jail.join(rel);
    if meta.is_dir() {
        fs::create_dir_all(&target)
    } else {
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent).map_err(|e| format!("mkdir {}: {e}", parent.display()))?;
        }
        fs::File::create(&target).map(drop)
    }
    .map_err(|e| format!("creating {}: {e}", target.display()))?;
    let c = |p: &Path| sys::cstring(p.as_os_str().as_bytes()).map_err(|e| e.to_string());
    let (src, dst) = (c(path)?, c(&target)?);
    sys::mount(Some(&src), &dst, None, libc::MS_BIND | libc::MS_REC, None)
        .map_err(|e| format!("bind-mounting {}: {e}", path.display()))?;
    let device = meta.file_type().is_char_device() || meta.file_type().is_block_device();
    let mut flags = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_NOSUID;
    if rootless {
        flags |= sys::mount_flags(&dst)
            .map_err(|e| format!("reading the mount flags of {}: {e}", path.display()))?;
    }
    if !writable {
        flags |= libc::MS_RDONLY;
    }
    if !device {
        flags |= libc::MS_NODEV;
    } else {
        flags |= libc::MS_NOEXEC;
    }
    sys::mount(None, &dst, None, flags, None)
        .map_err(|e| format!("remounting {} (ro={}): {e}", path.display(), !writable))
}

/// Moves each passed fd to its number, points unpassed 0/1/2 at /dev/null,
/// keeps the error pipe just above the highest, closes everything else: the
/// numbers above it, and every number below it that is not a target (the
/// helper's own copies of the passed fds may sit there; left open they would
/// reach the program as extra fds).
fn setup_fds(spec: &JailSpec, dev_null: RawFd, err_fd: RawFd) -> Result<(), String> {
    fn io_err(what: &'static str) -> impl Fn(io::Error) -> String {
        move |e| format!("{what}: {e}")
    }
    let highest = spec
        .fds
        .iter()
        .flat_map(|m| [m.parent, m.child])
        .chain([dev_null, err_fd, 2])
        .max()
        .unwrap_or(2);
    let above = highest + 1;
    // Phase 1: copies of every source above all numbers in play.
    let mut moved = Vec::new();
    for m in &spec.fds {
        let tmp = sys::dup_cloexec_at_least(m.parent, above).map_err(io_err("dup"))?;
        moved.push((tmp, m.child));
    }
    let null_tmp = sys::dup_cloexec_at_least(dev_null, above).map_err(io_err("dup"))?;
    let err_tmp = sys::dup_cloexec_at_least(err_fd, above).map_err(io_err("dup"))?;
    // Phase 2: into place (dup2 clears close-on-exec on the new numbers).
    for &(tmp, child) in &moved {
        sys::dup2(tmp, child).map_err(io_err("dup2"))?;
    }
    for std_fd in 0..3 {
        if !spec.fds.iter().any(|m| m.child == std_fd) {
            sys::dup2(null_tmp, std_fd).map_err(io_err("dup2 /dev/null"))?;
        }
    }
    let max_child = spec.fds.iter().map(|m| m.child).max().unwrap_or(2).max(2);
    let err_final = max_child + 1;
    sys::dup2(err_tmp, err_final).map_err(io_err("dup2 error pipe"))?;
    sys::set_cloexec(err_final).map_err(io_err("cloexec"))?;
    for fd in 3..err_final {
        if !spec.fds.iter().any(|m| m.child == fd) {
            sys::close(fd);
        }
    }
    sys::close_from(err_final + 1).map_err(io_err("close_range"))
}

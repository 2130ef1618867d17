//! The host-side resources a [`World`](crate::World) owns, each removed
//! when dropped (also after a panic): network namespaces ([`Netns`]),
//! processes with their logs ([`Proc`]) and temporary directories
//! ([`TempDir`]); and running commands that must succeed ([`run_ok`]).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::wait_until;

/// Runs `cmd`, returning its output, failing only when it cannot be spawned.
fn output(cmd: &mut Command) -> Result<Output> {
    cmd.stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {cmd:?}"))
}

/// Runs `cmd` and requires exit status 0.
pub fn run_ok(cmd: &mut Command) -> Result<Output> {
    let out = output(cmd)?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out)
}

/// A log file's content for an error message (empty when unreadable).
pub(crate) fn read_log(path: &Path) -> String {
    format!(
        "--- {} ---\n{}",
        path.display(),
        std::fs::read_to_string(path).unwrap_or_default()
    )
}

/// `ip ARGS...`, required to succeed.
fn ip(args: &[&str]) -> Result<()> {
    run_ok(Command::new("ip").args(args)).map(|_| ())
}

/// A network namespace, deleted (with `/etc/netns/<name>`) on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates namespace `name` with its loopback up. A namespace of that
    /// name left by an earlier, killed run (names carry the pid, so a live
    /// process never owns it) is deleted first.
    pub fn new(name: &str) -> Result<Self> {
        if Path::new("/run/netns").join(name).exists() {
            let _ = ip(&["netns", "del", name]);
        }
        ip(&["netns", "add", name])?;
        let ns = Self {
            name: name.to_string(),
        };
        ip(&["-n", name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A command that runs `prog` inside the namespace (`ip netns exec`).
    pub fn cmd(&self, prog: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(prog);
        c
    }

    /// Runs `ip -n <ns> ARGS...`, required to succeed.
    pub fn ip(&self, args: &[&str]) -> Result<()> {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// Runs `sh -c script` inside the namespace under a deadline of `secs`
    /// (killed after it), returning its output whatever the exit status.
    pub fn sh(&self, script: &str, secs: u32) -> Result<Output> {
        let mut c = self.cmd("timeout");
        c.args(["-k", "5", &secs.to_string(), "sh", "-c", script]);
        output(&mut c)
    }

    /// Like [`Netns::sh`] but requires exit status 0; returns stdout.
    pub fn sh_ok(&self, script: &str, secs: u32) -> Result<String> {
        let out = self.sh(script, secs)?;
        if !out.status.success() {
            bail!(
                "in {}: `{script}` failed ({}): stdout: {} stderr: {}",
                self.name,
                out.status,
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Waits (up to [`STARTUP_WAIT`]) until a socket of `proto` (`"tcp"` or
    /// `"udp"`) is bound to `addr` in the namespace (`ss` lists it); `what`
    /// names it in the error, which shows what `ss` listed.
    pub fn wait_listening(&self, what: &str, proto: &str, addr: &str) -> Result<()> {
        let flag = if proto == "udp" { "-Hlnu" } else { "-Hlnt" };
        let mut seen = String::new();
        wait_until(what, STARTUP_WAIT, || {
            seen = self
                .sh(&format!("ss {flag} src {addr}"), 30)
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            !seen.trim().is_empty()
        })
        .with_context(|| {
            let all = self
                .sh(&format!("ss {flag}"), 30)
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            format!(
                "nothing bound to {proto} {addr} in {}; ss {flag}:\n{all}",
                self.name
            )
        })
    }

    /// The `/etc/netns/<name>` directory `ip netns exec` bind-mounts over /etc.
    pub fn etc_dir(&self) -> PathBuf {
        Path::new("/etc/netns").join(&self.name)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Kill whatever still runs inside, then delete.
        let _ = Command::new("ip")
            .args(["netns", "pids", &self.name])
            .output()
            .map(|o| {
                for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                    if let Ok(pid) = pid.parse::<i32>() {
                        // SAFETY: kill has no memory effects.
                        #[allow(unsafe_code)]
                        unsafe {
                            libc::kill(pid, libc::SIGKILL);
                        }
                    }
                }
            });
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
        let _ = std::fs::remove_dir_all(self.etc_dir());
    }
}

/// A child process killed (SIGKILL) and reaped on drop.
#[derive(Debug)]
pub struct Proc {
    what: String,
    child: Option<Child>,
}

impl Proc {
    /// Spawns `cmd` (stdout and stderr to `log`, stdin closed).
    pub fn spawn(what: &str, cmd: &mut Command, log: &Path) -> Result<Self> {
        let f =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let f2 = f.try_clone()?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(f)
            .stderr(f2)
            .spawn()
            .with_context(|| format!("spawning {what}: {cmd:?}"))?;
        Ok(Self {
            what: what.to_string(),
            child: Some(child),
        })
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Fails if the process has already exited.
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(c) = self.child.as_mut()
            && let Some(st) = c.try_wait()?
        {
            bail!("{} exited early: {st}", self.what);
        }
        Ok(())
    }

    /// Sends `sig` and waits for the exit, up to `deadline` (then SIGKILL and
    /// an error).
    pub fn signal_and_wait(&mut self, sig: i32, deadline: Duration) -> Result<ExitStatus> {
        let Some(mut c) = self.child.take() else {
            bail!("{} already reaped", self.what);
        };
        let pid = i32::try_from(c.id()).context("pid")?;
        // SAFETY: kill has no memory effects; pid is our own unreaped child.
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(pid, sig);
        }
        let start = Instant::now();
        loop {
            if let Some(st) = c.try_wait()? {
                return Ok(st);
            }
            if start.elapsed() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                bail!(
                    "{} did not exit within {deadline:?} of signal {sig}",
                    self.what
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Resident set size in kB (from /proc), if the process lives.
    pub fn rss_kb(&self) -> Option<u64> {
        let pid = self.pid()?;
        let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Bound on the harness's waits for its own services (origin, dnsmasq,
/// sidecar socket, TAP carrier): generous, because a 2-core CI machine
/// running two tests with QEMU guests beside them can be very slow; it only
/// stops a hung start, it measures nothing.
pub const STARTUP_WAIT: Duration = Duration::from_secs(60);

/// A temporary directory `/tmp/<name>`, removed on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates `/tmp/<name>`, empty: what an earlier, killed run left
    /// under that name (names carry the pid) is removed first, so a stale
    /// ready file or log can never be taken for this run's.
    pub fn new(name: &str) -> Result<Self> {
        let p = std::env::temp_dir().join(name);
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).with_context(|| format!("creating {}", p.display()))?;
        Ok(Self(p))
    }
    /// The path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::env::var_os("SLUICE_E2E_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

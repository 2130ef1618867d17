//! Starting a program in the jail ([`spawn`]): the helper re-executed with
//! the spec and the layer plan on its stdin, its reports read from its
//! stdout; and the handle on the running program ([`Jailed`]), whose
//! lifeline (the helper's stdin) kills the jail when it closes.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde::{Deserialize, Serialize};

use super::layers::plan_layers;
use super::{HELPER_ARG, JailError, JailSpec, Layer, LayerStatus, probe_layers, sys};

/// How a jailed program ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum JailExit {
    /// It exited with this code.
    Code(i32),
    /// It was killed by this signal (e.g. 31 = SIGSYS from seccomp, 9 = SIGKILL).
    Signal(i32),
}

/// The helper's reports, one JSON line each, on its stdout.
#[derive(Debug, Serialize, Deserialize)]
pub(super) enum Report {
    /// The program is running.
    Started {
        pid: u32,
        layers: Vec<LayerStatus>,
        cleanup: Vec<PathBuf>,
    },
    /// Setting up the jail failed; nothing is left behind.
    Failed { error: String },
    /// The program ended and everything was removed.
    Exited { exit: JailExit },
}

/// A running jailed program. Dropping it kills the program and removes its
/// cgroups and jail dir (blocking until the helper has done so).
#[derive(Debug)]
pub struct Jailed {
    /// The program's pid (in the launcher's PID namespace).
    pub pid: u32,
    /// Every layer of [`Layer::ALL`]: applied or not, and why.
    pub layers: Vec<LayerStatus>,
    helper: Child,
    lifeline: Option<ChildStdin>,
    reports: BufReader<ChildStdout>,
    cleanup: Vec<PathBuf>,
    exit: Option<JailExit>,
}

impl Jailed {
    /// Blocks until the program has ended and the helper has cleaned up.
    ///
    /// # Errors
    /// [`JailError::Channel`] if the helper died without reporting (the
    /// launcher then removes what it can).
    pub fn wait(&mut self) -> Result<JailExit, JailError> {
        if let Some(exit) = self.exit {
            return Ok(exit);
        }
        let report = read_report(&mut self.reports);
        self.lifeline = None;
        let _ = self.helper.wait();
        remove_leftovers(&self.cleanup);
        match report {
            Ok(Report::Exited { exit }) => {
                self.exit = Some(exit);
                Ok(exit)
            }
            Ok(other) => Err(JailError::Channel(format!("unexpected report {other:?}"))),
            Err(e) => Err(e),
        }
    }

    /// Kills the program (SIGKILL, and with the PID namespace everything in
    /// it) and waits as [`Jailed::wait`] does.
    ///
    /// # Errors
    /// As [`Jailed::wait`].
    pub fn kill(&mut self) -> Result<JailExit, JailError> {
        self.lifeline = None;
        self.wait()
    }

    /// Takes the lifeline out, so that another thread can kill the jail
    /// while this one blocks in [`Jailed::wait`] (e.g. to enforce a timeout).
    /// The jail is killed when the handle is [`KillHandle::kill`]ed **or
    /// dropped**. `None` if it was taken before.
    pub fn kill_handle(&mut self) -> Option<KillHandle> {
        self.lifeline.take().map(|l| KillHandle { _lifeline: l })
    }

    /// The supervising helper's pid (root, outside the jail).
    pub fn helper_pid(&self) -> u32 {
        self.helper.id()
    }
}

/// Kills a jail from another thread; see [`Jailed::kill_handle`].
#[derive(Debug)]
pub struct KillHandle {
    /// Held only to be closed: closing the lifeline makes the helper kill.
    _lifeline: ChildStdin,
}

impl KillHandle {
    /// Kills the jail (SIGKILL to its PID 1); its [`Jailed::wait`] then
    /// returns once the helper has cleaned up.
    pub fn kill(self) {
        drop(self);
    }
}

impl Drop for Jailed {
    fn drop(&mut self) {
        if self.exit.is_none() {
            let _ = self.kill();
        }
    }
}

fn read_report(reader: &mut BufReader<ChildStdout>) -> Result<Report, JailError> {
    let mut line = String::new();
    match reader.read_line(&mut line) {
        Ok(0) => Err(JailError::Channel(
            "the helper exited without a report".to_owned(),
        )),
        Ok(_) => serde_json::from_str(&line)
            .map_err(|e| JailError::Channel(format!("bad report {line:?}: {e}"))),
        Err(e) => Err(JailError::Channel(e.to_string())),
    }
}

/// Best-effort removal of cgroup dirs and the jail dir (the helper does this;
/// this covers a helper that was killed). Only empty dirs are removed.
fn remove_leftovers(paths: &[PathBuf]) {
    for p in paths {
        if p.exists() {
            let _ = std::fs::remove_dir(p);
        }
    }
}

/// Starts `spec.program` in the jail and returns once it has been exec'd
/// (or setting up failed, leaving nothing behind).
///
/// # Errors
/// [`JailError::InvalidSpec`], [`JailError::LayerUnavailable`] for a
/// requested layer this host cannot apply and `allow_missing` does not list,
/// [`JailError::Helper`] / [`JailError::Setup`] / [`JailError::Channel`].
pub fn spawn(spec: &JailSpec) -> Result<Jailed, JailError> {
    spec.validate()?;
    let probed = probe_layers();
    let plan = plan_layers(spec, &probed)?;

    // Duplicate the passed fds above 2 so that the helper's stdio set-up
    // cannot clobber them; the duplicates are closed when this returns.
    let mut dups: Vec<OwnedFd> = Vec::new();
    let mut helper_spec = spec.clone();
    for m in &mut helper_spec.fds {
        let dup = sys::dup_owned_at_least(m.parent, 3).map_err(|e| {
            JailError::InvalidSpec(format!("passed fd {} is not open: {e}", m.parent))
        })?;
        m.parent = dup.as_raw_fd();
        dups.push(dup);
    }
    let helper_path = match &spec.helper {
        Some(p) => p.clone(),
        None => std::env::current_exe().map_err(|e| JailError::Helper {
            path: PathBuf::from("/proc/self/exe"),
            source: e,
        })?,
    };
    let mut cmd = Command::new(&helper_path);
    // The jail's name is only there for `ps`: the helper reads its spec.
    cmd.arg(HELPER_ARG)
        .arg(&spec.name)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .current_dir("/");
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    sys::keep_fds_across_exec(&mut cmd, dups.iter().map(AsRawFd::as_raw_fd).collect());
    let mut child = cmd.spawn().map_err(|e| JailError::Helper {
        path: helper_path.clone(),
        source: e,
    })?;
    drop(dups);
    let (Some(mut lifeline), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(JailError::Channel("helper pipes missing".to_owned()));
    };
    let request = HelperRequest {
        spec: helper_spec,
        layers: plan,
    };
    let mut line = serde_json::to_vec(&request)
        .map_err(|e| JailError::Channel(format!("serialising the spec: {e}")))?;
    line.push(b'\n');
    if let Err(e) = lifeline.write_all(&line).and_then(|()| lifeline.flush()) {
        drop(lifeline);
        let _ = child.wait();
        return Err(JailError::Channel(format!("sending the spec: {e}")));
    }
    let mut reports = BufReader::new(stdout);
    match read_report(&mut reports) {
        Ok(Report::Started {
            pid,
            layers,
            cleanup,
        }) => Ok(Jailed {
            pid,
            layers,
            helper: child,
            lifeline: Some(lifeline),
            reports,
            cleanup,
            exit: None,
        }),
        other => {
            drop(lifeline);
            let _ = child.wait();
            Err(match other {
                Ok(Report::Failed { error }) => JailError::Setup(error),
                Ok(r) => JailError::Channel(format!("unexpected report {r:?}")),
                Err(e) => e,
            })
        }
    }
}

/// What the launcher sends the helper.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct HelperRequest {
    pub(super) spec: JailSpec,
    /// The plan: one status per layer of [`Layer::ALL`] (`available` = to apply).
    pub(super) layers: Vec<(Layer, LayerStatus)>,
}

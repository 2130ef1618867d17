//! `sluice run --ask`: the launcher's side of runtime approval
//! (docs/approval.md). The gateway asks over a unix socket in the run dir
//! (its `--approval-socket`); a thread of the launcher answers each
//! question with a prompt on the controlling terminal (`/dev/tty`), one at
//! a time. With no terminal, or under `--json` (whose stdout is a result
//! document, not a conversation), every question is denied at once and the
//! run's summary says so and why.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread;

use anyhow::Context;
use sluice_approval::backend::terminal::{Mode, Served, serve};

/// The socket's name in the run dir.
const SOCKET: &str = "approve.sock";

/// The prompt server of one run.
#[derive(Debug)]
pub(crate) struct AskServer {
    /// The socket the gateway is given (`--approval-socket`).
    pub(crate) socket: PathBuf,
    served: Arc<Mutex<Served>>,
    /// Why questions are denied without a prompt (`None`: prompted).
    auto_deny: Option<String>,
}

impl AskServer {
    /// Listens in `run_dir` (a socket only the jail's uid and the launcher
    /// reach: the run dir is 0700) and serves questions on a thread of its
    /// own until the process ends.
    ///
    /// # Errors
    /// The socket cannot be made or handed to the jail's uid.
    pub(crate) fn start(run_dir: &Path, json: bool) -> anyhow::Result<Self> {
        let socket = run_dir.join(SOCKET);
        let listener = std::os::unix::net::UnixListener::bind(&socket)
            .with_context(|| format!("--ask: listening on {}", socket.display()))?;
        // The jailed gateway runs as the run dir's owner.
        if let Ok(meta) = fs::metadata(run_dir) {
            use std::os::unix::fs::MetadataExt;
            let _ = std::os::unix::fs::chown(&socket, Some(meta.uid()), Some(meta.gid()));
        }
        fs::set_permissions(&socket, fs::Permissions::from_mode(0o600))
            .with_context(|| format!("chmod {}", socket.display()))?;
        listener
            .set_nonblocking(true)
            .context("--ask: the socket")?;
        let tty = if json {
            Err("--json".to_owned())
        } else {
            fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/tty")
                .map_err(|e| format!("no terminal ({e})"))
        };
        let auto_deny = tty.as_ref().err().cloned();
        let served = Arc::new(Mutex::new(Served::default()));
        let keep = Arc::clone(&served);
        thread::Builder::new()
            .name("sluice-ask".into())
            .spawn(move || {
                let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    return;
                };
                rt.block_on(async move {
                    let Ok(listener) = tokio::net::UnixListener::from_std(listener) else {
                        return;
                    };
                    let mode = match tty.and_then(|f| {
                        let r = f.try_clone().map_err(|e| e.to_string())?;
                        Ok((r, f))
                    }) {
                        Ok((r, w)) => Mode::Prompt(
                            tokio::io::BufReader::new(tokio::fs::File::from_std(r)),
                            tokio::fs::File::from_std(w),
                        ),
                        Err(why) => Mode::AutoDeny(why),
                    };
                    serve(listener, mode, keep).await;
                });
            })
            .context("--ask: starting the prompt thread")?;
        Ok(Self {
            socket,
            served,
            auto_deny,
        })
    }

    /// The run summary's part: questions prompted and auto-denied, and why.
    pub(crate) fn summary(&self) -> serde_json::Value {
        let s = self.served.lock().map(|s| s.clone()).unwrap_or_default();
        serde_json::json!({
            "prompted": s.prompted,
            "auto_denied": s.auto_denied,
            "auto_deny_reason": self.auto_deny,
        })
    }

    /// One line for the terminal summary, when questions were auto-denied.
    pub(crate) fn summary_line(&self) -> Option<String> {
        let s = self.served.lock().map(|s| s.clone()).unwrap_or_default();
        (s.auto_denied > 0).then(|| {
            format!(
                "sluice: --ask: {} approval question(s) denied without a prompt: {}",
                s.auto_denied,
                self.auto_deny.as_deref().unwrap_or("the terminal failed")
            )
        })
    }
}

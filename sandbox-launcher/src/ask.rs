//! `sluice run --ask`: the launcher's side of runtime approval
//! (docs/approval.md). The gateway asks over a unix socket in the run dir
//! (its `--approval-socket`); a thread of the launcher answers each
//! question with a prompt on the controlling terminal (`/dev/tty`), one at
//! a time. With no terminal, or under `--json` (whose stdout is a result
//! document, not a conversation), every question is denied at once and the
//! run's summary says so and why.
//!
//! The guest command's stdin is forwarded from the launcher's (`run`).
//! When that stdin is the controlling terminal itself, the terminal has
//! one reader, the stdin forwarder, and the prompt owns the keys while a
//! question waits ([`Keys`]): they go to the prompt then, never to the
//! guest, and to the guest otherwise. Whenever it prompts, the guest's
//! output is held while a question is shown (`run::terminal::TerminalGate`).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread;

use anyhow::Context;
use sluice_approval::backend::terminal::{Mode, NotShared, Served, TerminalShare, serve_shared};

use crate::run::terminal::TerminalGate;

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
    /// The prompt's input when stdin is the terminal (taken by the stdin
    /// forwarder).
    keys: Option<Keys>,
    /// The terminal the prompt shares with the guest, when it prompts.
    gate: Option<Arc<TerminalGate>>,
}

/// The terminal's keys, when the guest's stdin is the same terminal: the
/// stdin forwarder reads the terminal and, while a question waits, writes
/// what it read to `to_prompt` (the prompt's input) instead of the guest
/// ([`TerminalGate::take_keys`]).
#[derive(Debug)]
pub(crate) struct Keys {
    /// Where the keys go.
    pub(crate) gate: Arc<TerminalGate>,
    /// The write end of the pipe the prompt reads.
    pub(crate) to_prompt: fs::File,
}

/// Whether stdin is this process's controlling terminal (what `/dev/tty`
/// opens): then the guest's stdin and the prompt would read the same keys.
fn stdin_is_the_terminal() -> bool {
    let stdin = std::io::stdin();
    rustix::termios::isatty(&stdin) && rustix::termios::tcgetpgrp(&stdin).is_ok()
}

impl AskServer {
    /// Listens in `run_dir` (a socket only the launcher and the gateway's
    /// gid reach: see `run::run_dir`) and serves questions on a thread of
    /// its own until the process ends.
    ///
    /// # Errors
    /// The socket cannot be made or handed to the gateway.
    pub(crate) fn start(run_dir: &Path, json: bool) -> anyhow::Result<Self> {
        let socket = run_dir.join(SOCKET);
        let listener = std::os::unix::net::UnixListener::bind(&socket)
            .with_context(|| format!("--ask: listening on {}", socket.display()))?;
        // The jailed gateway runs as the run dir's owner.
        crate::gateway_inputs::hand_socket_to_jail(&socket, run_dir)?;
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
        let gate = tty
            .as_ref()
            .ok()
            .map(|f| Arc::new(TerminalGate::new(f.try_clone().ok())));
        // One reader of the terminal: the prompt reads a pipe the stdin
        // forwarder fills while a question waits.
        let (input, keys) = match &gate {
            Some(gate) if stdin_is_the_terminal() => {
                let (r, w) = std::io::pipe().context("--ask: a pipe for the prompt's keys")?;
                let to_prompt = fs::File::from(std::os::fd::OwnedFd::from(w));
                // Never a blocking write under the gate's lock (a paste
                // nobody reads would stop the terminal for good).
                crate::run::terminal::nonblocking(&to_prompt)
                    .context("--ask: the prompt's key pipe")?;
                (
                    Some(fs::File::from(std::os::fd::OwnedFd::from(r))),
                    Some(Keys {
                        gate: Arc::clone(gate),
                        to_prompt,
                    }),
                )
            }
            _ => (None, None),
        };
        let share = gate.clone();
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
                    // The keys are read through the reactor (not a
                    // blocking read), so that what is already typed when a
                    // question arrives can be discarded (`serve_shared`).
                    let mode = match tty.and_then(|f| {
                        let r = match input {
                            Some(pipe) => tokio::net::unix::pipe::Receiver::from_file(pipe),
                            // A description of its own: the reader is made
                            // non-blocking, the prompt's writer stays not.
                            None => {
                                use std::os::unix::fs::OpenOptionsExt as _;
                                fs::OpenOptions::new()
                                    .read(true)
                                    .custom_flags(libc::O_NONBLOCK)
                                    .open("/dev/tty")
                                    .and_then(tokio::net::unix::pipe::Receiver::from_file_unchecked)
                            }
                        }
                        .map_err(|e| format!("reading the terminal: {e}"))?;
                        Ok((r, f))
                    }) {
                        Ok((r, w)) => {
                            Mode::Prompt(tokio::io::BufReader::new(r), tokio::fs::File::from_std(w))
                        }
                        Err(why) => Mode::AutoDeny(why),
                    };
                    let share: &dyn TerminalShare = match &share {
                        Some(gate) => &**gate,
                        None => &NotShared,
                    };
                    serve_shared(listener, mode, keep, share).await;
                });
            })
            .context("--ask: starting the prompt thread")?;
        Ok(Self {
            socket,
            served,
            auto_deny,
            keys,
            gate,
        })
    }

    /// The terminal the prompt shares with the guest's output, when it
    /// prompts (none with `--json` or without a terminal).
    pub(crate) fn gate(&self) -> Option<Arc<TerminalGate>> {
        self.gate.clone()
    }

    /// The prompt's record (what it answered; the names answered
    /// `always`, which alone the overlay writer accepts under `--ask`).
    pub(crate) fn served(&self) -> Arc<Mutex<Served>> {
        Arc::clone(&self.served)
    }

    /// The prompt's side of the terminal's keys, when the guest's stdin is
    /// that terminal (once: the stdin forwarder takes it).
    pub(crate) fn take_keys(&mut self) -> Option<Keys> {
        self.keys.take()
    }

    /// The run summary's part: questions prompted and auto-denied, and why.
    pub(crate) fn summary(&self) -> serde_json::Value {
        let s = self.served.lock().map(|s| s.clone()).unwrap_or_default();
        serde_json::json!({
            "prompted": s.prompted,
            "auto_denied": s.auto_denied,
            "withdrawn": s.withdrawn,
            "auto_deny_reason": self.auto_deny,
        })
    }

    /// The terminal summary's lines, when questions were auto-denied or
    /// keys typed at a prompt were dropped (a paste its pipe had no room
    /// for).
    pub(crate) fn summary_line(&self) -> Option<String> {
        let s = self.served.lock().map(|s| s.clone()).unwrap_or_default();
        let mut lines = Vec::new();
        if s.auto_denied > 0 {
            lines.push(format!(
                "sluice: --ask: {} approval question(s) denied without a prompt: {}",
                s.auto_denied,
                self.auto_deny.as_deref().unwrap_or("the terminal failed")
            ));
        }
        let dropped = self.gate.as_ref().map_or(0, |g| g.dropped_keys());
        if dropped > 0 {
            lines.push(format!(
                "sluice: --ask: {dropped} byte(s) typed at a prompt dropped (more than it reads)"
            ));
        }
        (!lines.is_empty()).then(|| lines.join("\n"))
    }
}

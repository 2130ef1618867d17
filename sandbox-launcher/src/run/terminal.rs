//! The run's terminal side: the launcher's stdin forwarded to the guest
//! command (with `--ask`, the prompt's keys routed away from it), and the
//! guest's stdout and stderr passed on to the launcher's (or captured for
//! `--json`).

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::thread;

use sluice_agent_proto::{CHUNK, Message, write_frame};

use crate::ask::Keys;

/// How much output `--json` captures per stream.
const JSON_CAPTURE: usize = 16 * 1024 * 1024;

/// Where the guest's stdout and stderr go: the launcher's own, or with
/// `--json` a bounded capture for the result document.
pub(super) struct GuestOutput {
    json: bool,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl GuestOutput {
    /// Passes output on (`json`: captures it instead).
    pub(super) fn new(json: bool) -> Self {
        Self {
            json,
            stdout: Vec::new(),
            stderr: Vec::new(),
        }
    }

    /// Passes on one chunk of the guest's stdout (`err`: stderr).
    pub(super) fn write(&mut self, err: bool, data: &[u8]) {
        if self.json {
            let buf = if err {
                &mut self.stderr
            } else {
                &mut self.stdout
            };
            let room = JSON_CAPTURE.saturating_sub(buf.len());
            buf.extend_from_slice(&data[..data.len().min(room)]);
            return;
        }
        write_out(err, data);
    }

    /// What `--json` captured of stdout (`err`: stderr).
    pub(super) fn captured(&self, err: bool) -> &[u8] {
        if err { &self.stderr } else { &self.stdout }
    }
}

/// Writes to the launcher's stdout (`err`: stderr) and flushes.
fn write_out(err: bool, data: &[u8]) {
    // A closed stdout/stderr on the host is not the guest's problem.
    if err {
        let mut e = io::stderr().lock();
        let _ = e.write_all(data).and_then(|()| e.flush());
    } else {
        let mut o = io::stdout().lock();
        let _ = o.write_all(data).and_then(|()| o.flush());
    }
}

/// Forwards the launcher's stdin to the command (through the agent's
/// `writer`) until EOF, on a thread of its own. With `keys` (`--ask`, stdin
/// is the terminal the prompt uses), what is read while a question waits
/// goes to the prompt instead, and the terminal is still read after the
/// guest's EOF, for later prompts, until it ends.
pub(super) fn forward_stdin(writer: Arc<Mutex<UnixStream>>, keys: Option<Keys>) {
    thread::spawn(move || {
        let mut stdin = io::stdin().lock();
        let mut buf = vec![0u8; CHUNK];
        let mut guest_open = true;
        loop {
            let read = stdin.read(&mut buf);
            if let (Some(k), Ok(n @ 1..)) = (&keys, &read)
                && k.pending()
            {
                if (&k.to_prompt).write_all(&buf[..*n]).is_err() {
                    return;
                }
                continue;
            }
            let msg = match read {
                Ok(0) | Err(_) => Message::StdinEof,
                Ok(n) => Message::Stdin(buf[..n].to_vec()),
            };
            let eof = msg == Message::StdinEof;
            if !guest_open {
                // Keys typed with no question pending after the
                // guest's EOF are dropped; the terminal's end ends it.
                if eof {
                    return;
                }
                continue;
            }
            let sent = writer
                .lock()
                .map(|mut w| write_frame(&mut *w, &msg).is_ok())
                .unwrap_or(false);
            if !sent || (eof && keys.is_none()) {
                return;
            }
            guest_open = !eof;
        }
    });
}

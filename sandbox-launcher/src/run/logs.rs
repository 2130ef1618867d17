//! The readers of a run's child output: the guest's serial console and the
//! stderr of QEMU and the gateway, each on a thread of its own, each kept
//! (its tail, bounded) for error messages and echoed under `--debug`.

use std::io::{self, Read};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Instant;

use super::terminal::DebugEcho;
use crate::phases::Phases;

/// How much of the serial console is kept for `--debug` and boot failures.
const CONSOLE_KEEP: usize = 256 * 1024;
/// How much of QEMU's and the gateway's stderr is kept for error messages.
const LOG_KEEP: usize = 16 * 1024;

/// Reads the guest's serial console: marks boot phases, echoes it under
/// `--debug` and keeps its tail for boot failures.
pub(super) fn spawn_console_reader(
    console: UnixStream,
    keep: Arc<Mutex<Vec<u8>>>,
    debug: Option<DebugEcho>,
    phases: Phases,
) {
    thread::spawn(move || {
        let mut console = console;
        let mut buf = [0u8; 4096];
        // The line being received, for the guest's phase marks (bounded:
        // only a line's start can be a mark).
        let mut line = Vec::new();
        loop {
            let n = match console.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let at = Instant::now();
            for &b in &buf[..n] {
                if b == b'\n' {
                    phases.console_line(&String::from_utf8_lossy(&line), at);
                    line.clear();
                } else if line.len() < 128 {
                    line.push(b);
                }
            }
            if let Some(echo) = &debug {
                echo.write(&buf[..n]);
            }
            if let Ok(mut k) = keep.lock() {
                k.extend_from_slice(&buf[..n]);
                if k.len() > CONSOLE_KEEP {
                    let cut = k.len() - CONSOLE_KEEP;
                    k.drain(..cut);
                }
            }
        }
    });
}

/// The last lines of a kept log, as `":\n  line\n  line"`, or "".
pub(super) fn log_tail(log: &Mutex<Vec<u8>>) -> String {
    let log = log.lock().map(|l| l.clone()).unwrap_or_default();
    let text = String::from_utf8_lossy(&log);
    let lines: Vec<&str> = text.lines().rev().take(15).collect();
    if lines.is_empty() {
        return String::new();
    }
    let mut out = String::from(":");
    for l in lines.iter().rev() {
        out.push_str("\n  ");
        out.push_str(l);
    }
    out
}

/// Reads a child's stderr: keeps the tail and echoes it under `--debug`
/// (through `debug`, which holds it while an `--ask` question is shown).
pub(super) fn spawn_log_reader(
    stream: io::PipeReader,
    keep: Arc<Mutex<Vec<u8>>>,
    debug: Option<DebugEcho>,
    who: &'static str,
) {
    thread::spawn(move || {
        let mut lines = io::BufReader::new(stream);
        let mut line = Vec::new();
        while matches!(io::BufRead::read_until(&mut lines, b'\n', &mut line), Ok(n) if n > 0) {
            if let Some(echo) = &debug {
                echo.line(&format!(
                    "sluice: {who}: {}",
                    String::from_utf8_lossy(&line)
                ));
            }
            if let Ok(mut k) = keep.lock() {
                k.extend_from_slice(&line);
                if k.len() > LOG_KEEP {
                    let cut = k.len() - LOG_KEEP;
                    k.drain(..cut);
                }
            }
            line.clear();
        }
    });
}

//! The run's terminal side: the launcher's stdin forwarded to the guest
//! command (with `--ask`, the prompt's keys routed away from it), and the
//! guest's stdout and stderr passed on to the launcher's (or captured for
//! `--json`).
//!
//! Under `--ask` the prompt shares the terminal with the guest
//! ([`TerminalGate`]): while a question is shown, the guest's output is
//! held (up to [`HOLD_LIMIT`], then not read at all, so the guest waits)
//! and released in order after the answer, so the guest can neither draw
//! over the prompt nor ask the terminal something whose reply would reach
//! it; what is typed goes to the prompt, and what arrives before the
//! question settled is discarded.

use std::fs;
use std::future::Future;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use sluice_agent_proto::{CHUNK, Message, write_frame};
use sluice_approval::backend::terminal::TerminalShare;

use crate::ask::Keys;

/// The most guest output held while a question is shown. Beyond it the
/// launcher stops reading the guest's output until the answer: the agent's
/// writes, then the guest's, wait. Nothing is dropped or reordered.
pub(crate) const HOLD_LIMIT: usize = 1024 * 1024;

/// How often a write waiting for the answer checks whether the run ends.
const HOLD_POLL: Duration = Duration::from_millis(100);

/// How long the run's end waits for a question shown to be cancelled
/// before it gives up on the output the question holds.
const FINISH_WAIT: Duration = Duration::from_secs(2);

/// The terminal shared by the `--ask` prompt and the guest: the prompt
/// tells it when a question begins, settles and ends
/// ([`TerminalShare`]); the guest's output and the stdin forwarder ask it
/// where their bytes go.
pub(crate) struct TerminalGate {
    keys: Mutex<KeyRoute>,
    held: Mutex<Held>,
    released: Condvar,
    /// The controlling terminal, whose unread input a settled question
    /// discards (`tcflush`); `None` if it could not be duplicated.
    tty: Option<fs::File>,
    /// Where the guest's output goes ([`write_out`]; tests: a recorder).
    sink: Sink,
    /// The run is ending ([`TerminalGate::finish`]): no question may be
    /// shown any more.
    over: AtomicBool,
    /// Wakes [`TerminalShare::ending`] when `over` is set.
    wake: tokio::sync::Notify,
    /// Bytes for the prompt dropped because its pipe was full.
    dropped: AtomicU64,
}

/// The `--debug` echo of the guest's console and of QEMU's and the
/// gateway's logs to stderr. Under `--ask` these are guest- or
/// gateway-controlled bytes like the guest's output, so once the prompt's
/// gate is attached they are held while a question is shown
/// ([`TerminalGate::write_debug`]); and log lines (`escape`: those of the
/// gateway and of QEMU, either of which may be compromised) have their
/// control characters escaped, so they cannot move the cursor or change
/// how the terminal draws even between questions. The guest's console is
/// held but not escaped, like the guest's own output: between questions
/// the terminal is the guest's to draw on (a console is raw bytes whose
/// `\r\n` and colours escaping would mangle), and what it holds is
/// never drawn over a question.
#[derive(Clone, Default)]
pub(crate) struct DebugEcho {
    gate: Arc<OnceLock<Arc<TerminalGate>>>,
    escape: bool,
}

impl DebugEcho {
    /// An echo to stderr, through `gate` when given; `escape`: log lines
    /// are escaped ([`DebugEcho::line`]).
    pub(crate) fn new(gate: Option<Arc<TerminalGate>>, escape: bool) -> Self {
        let echo = Self {
            gate: Arc::default(),
            escape,
        };
        if let Some(gate) = gate {
            echo.attach(gate);
        }
        echo
    }

    /// An echo through the same gate as this one (attached to either, it
    /// is attached to both), escaping log lines or not.
    pub(crate) fn escaping(&self, escape: bool) -> Self {
        Self {
            gate: Arc::clone(&self.gate),
            escape,
        }
    }

    /// From now on, through `gate` (the prompt's, made after the echo's
    /// first readers started). A second gate is ignored.
    pub(crate) fn attach(&self, gate: Arc<TerminalGate>) {
        let _ = self.gate.set(gate);
    }

    /// Echoes raw bytes (the guest's console), held while a question is
    /// shown.
    pub(crate) fn write(&self, data: &[u8]) {
        match self.gate.get() {
            Some(gate) => gate.write_debug(data),
            None => write_out(true, data),
        }
    }

    /// Echoes one log line (with its newline), escaped if the echo
    /// escapes, held while a question is shown.
    pub(crate) fn line(&self, text: &str) {
        if self.escape {
            self.write(escape_controls(text).as_bytes());
        } else {
            self.write(text.as_bytes());
        }
    }
}

/// `text` with every control character but newline and tab (C0, DEL, C1:
/// what starts an escape sequence or changes the charset) written as an
/// escape (`\u{1b}`), so a terminal shows it instead of obeying it.
pub(crate) fn escape_controls(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            if c.is_control() && c != '\n' && c != '\t' {
                c.escape_default().collect()
            } else {
                vec![c]
            }
        })
        .collect()
}

/// Takes one chunk of the guest's stdout (or, `true`, stderr).
type Sink = Box<dyn Fn(bool, &[u8]) + Send + Sync>;

impl std::fmt::Debug for TerminalGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TerminalGate")
            .field("keys", &self.keys)
            .field("held", &self.held)
            .field("tty", &self.tty)
            .finish_non_exhaustive()
    }
}

/// Where the terminal's keys go.
#[derive(Debug, Clone, Copy)]
enum KeyRoute {
    /// No question: to the guest.
    Guest,
    /// A question is drawn and settling: nowhere.
    Settling,
    /// A question waits for its key: to the prompt, if read from `since`.
    Prompt { since: Instant },
}

/// The guest's output held while a question is shown.
#[derive(Debug, Default)]
struct Held {
    holding: bool,
    /// Chunks in arrival order, each stdout or (`true`) stderr.
    chunks: Vec<(bool, Vec<u8>)>,
    bytes: usize,
    /// `--debug` bytes dropped because the hold was full.
    debug_dropped: usize,
    /// Writes passed on and not yet finished. Each is decided under the
    /// lock and written after it is let go, so a stalled terminal stalls
    /// only the writer at it, never everyone waiting for the lock; a
    /// question begins only once these are done ([`TerminalShare::begin`]).
    passing: usize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding these: a poisoned one is still whole.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl TerminalGate {
    /// A gate for the controlling terminal `tty` (`None`: its unread input
    /// cannot be discarded, only what was read of it).
    pub(crate) fn new(tty: Option<fs::File>) -> Self {
        Self {
            keys: Mutex::new(KeyRoute::Guest),
            held: Mutex::new(Held::default()),
            released: Condvar::new(),
            tty,
            sink: Box::new(write_out),
            over: AtomicBool::new(false),
            wake: tokio::sync::Notify::new(),
            dropped: AtomicU64::new(0),
        }
    }

    /// Ends the sharing at the end of the run: a question still shown is
    /// cancelled (the prompt denies it and says so) and later ones are
    /// denied unasked; only then is the output it held released, never
    /// over a question still on the screen. If the prompt does not end
    /// the question within [`FINISH_WAIT`] (its terminal is stalled), the
    /// held output is dropped with one line on stderr, not drawn over it.
    pub(crate) fn finish(&self) {
        self.over.store(true, Ordering::SeqCst);
        self.wake.notify_waiters();
        let until = Instant::now() + FINISH_WAIT;
        let mut held = lock(&self.held);
        while held.holding {
            let now = Instant::now();
            if now >= until {
                let bytes = std::mem::take(&mut held.bytes);
                held.chunks.clear();
                self.released.notify_all();
                drop(held);
                eprintln!(
                    "sluice: --ask: {bytes} byte(s) of the guest's output held for an \
                     unanswered question not shown"
                );
                return;
            }
            held = self
                .released
                .wait_timeout(held, until - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Takes `data`, read from the terminal at `at`, if it is not the
    /// guest's: written to `to_prompt` when a settled question waits and
    /// it was read since, else discarded. `Ok(false)`: the guest's.
    ///
    /// `to_prompt` must be non-blocking ([`nonblocking`]): nobody reads
    /// the pipe once the prompt has its answer, and a write that blocked
    /// here, under the lock, would stop the prompt's `end()` and with it
    /// the guest's output and the terminal for good (a large paste). What
    /// does not fit in the pipe is dropped and counted
    /// ([`TerminalGate::dropped_keys`]): no prompt's answer is that long.
    ///
    /// # Errors
    /// Writing to the prompt's pipe failed.
    pub(crate) fn take_keys(
        &self,
        at: Instant,
        data: &[u8],
        mut to_prompt: &fs::File,
    ) -> io::Result<bool> {
        // Under the lock: a question that settles meanwhile (and drains
        // the pipe) sees this write before it, or this sees it settled.
        match *lock(&self.keys) {
            KeyRoute::Guest => Ok(false),
            KeyRoute::Settling => Ok(true),
            KeyRoute::Prompt { since } if at < since => Ok(true),
            KeyRoute::Prompt { .. } => {
                let mut rest = data;
                while !rest.is_empty() {
                    match to_prompt.write(rest) {
                        Ok(n) => rest = &rest[n..],
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            self.dropped.fetch_add(rest.len() as u64, Ordering::Relaxed);
                            break;
                        }
                        Err(e) => return Err(e),
                    }
                }
                Ok(true)
            }
        }
    }

    /// Passes on a `--debug` echo (`data`, to stderr), or holds it while a
    /// question is shown, like the guest's output. It never waits for a
    /// question: the echo's readers are QEMU's and the gateway's pipes,
    /// and a gateway blocked on its log would stall its datapath. What
    /// does not fit in the hold is dropped, and counted in one line when
    /// it is released. Passed on, it waits only for stderr itself, and
    /// without the lock ([`TerminalGate::pass`]): a stalled stderr (Ctrl-S,
    /// a pager) stops this writer alone, not the other readers nor a
    /// question beginning.
    pub(crate) fn write_debug(&self, data: &[u8]) {
        let mut held = lock(&self.held);
        if !held.holding {
            self.pass(held, true, data);
        } else if held.bytes + data.len() <= HOLD_LIMIT {
            held.bytes += data.len();
            held.chunks.push((true, data.to_vec()));
        } else {
            held.debug_dropped += data.len();
        }
    }

    /// Writes `data` (stdout, or `err`: stderr), decided under `held` (no
    /// question shown), after letting the lock go. Counted in `passing`
    /// meanwhile: a question that begins waits for it, so nothing passed
    /// on before the question lands on it.
    fn pass(&self, mut held: MutexGuard<'_, Held>, err: bool, data: &[u8]) {
        held.passing += 1;
        drop(held);
        (self.sink)(err, data);
        let mut held = lock(&self.held);
        held.passing -= 1;
        if held.passing == 0 {
            self.released.notify_all();
        }
    }

    /// Bytes typed for the prompt that its pipe had no room for.
    pub(crate) fn dropped_keys(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Passes on the guest's `data` (stdout, or `err`: stderr), or holds
    /// it while a question is shown. When the hold is full, waits for the
    /// answer, asking `check` now and then whether to stop waiting.
    ///
    /// # Errors
    /// What `check` returned.
    fn write<E>(&self, err: bool, data: &[u8], check: impl Fn() -> Result<(), E>) -> Result<(), E> {
        let mut held = lock(&self.held);
        loop {
            if !held.holding {
                self.pass(held, err, data);
                return Ok(());
            }
            if held.chunks.is_empty() || held.bytes + data.len() <= HOLD_LIMIT {
                held.bytes += data.len();
                held.chunks.push((err, data.to_vec()));
                return Ok(());
            }
            held = self
                .released
                .wait_timeout(held, HOLD_POLL)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            check()?;
        }
    }
}

impl TerminalShare for TerminalGate {
    /// From now on output is held. Waits for the writes passed on
    /// before (`Held::passing`), not holding the lock meanwhile: the
    /// question starts on a terminal the guest and the logs have finished
    /// writing to. That wait is the terminal's own (a stalled terminal
    /// could not show the question either) and blocks only the prompt's
    /// runtime, which is its alone (`ask`); the other writers hold their
    /// output meanwhile instead of waiting.
    fn begin(&self) {
        *lock(&self.keys) = KeyRoute::Settling;
        let mut held = lock(&self.held);
        held.holding = true;
        while held.passing > 0 {
            held = self
                .released
                .wait(held)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn settled(&self) {
        let mut keys = lock(&self.keys);
        if let Some(tty) = &self.tty {
            // A partial line (a query's reply has no newline) waits in the
            // line discipline: gone, with everything else unread.
            let _ = rustix::termios::tcflush(tty, rustix::termios::QueueSelector::IFlush);
        }
        *keys = KeyRoute::Prompt {
            since: Instant::now(),
        };
    }

    fn end(&self) {
        *lock(&self.keys) = KeyRoute::Guest;
        // Released without the lock, so a stalled terminal stops only
        // this: output arriving meanwhile is still held, after what is
        // being released (nothing overtakes it), until none is left.
        let mut held = lock(&self.held);
        loop {
            let dropped = std::mem::take(&mut held.debug_dropped);
            if dropped > 0 {
                let line = format!(
                    "sluice: --debug: {dropped} byte(s) of console and log output dropped while \
                     a question was shown\n"
                );
                held.chunks.push((true, line.into_bytes()));
            }
            if held.chunks.is_empty() {
                break;
            }
            let chunks = std::mem::take(&mut held.chunks);
            held.bytes = 0;
            // A writer waiting for room may add to the hold now.
            self.released.notify_all();
            drop(held);
            for (err, data) in chunks {
                (self.sink)(err, &data);
            }
            held = lock(&self.held);
        }
        held.holding = false;
        self.released.notify_all();
    }

    fn ending(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            loop {
                // Made before the flag is read: a `notify_waiters` after
                // the read still wakes it.
                let woken = self.wake.notified();
                if self.over.load(Ordering::SeqCst) {
                    return;
                }
                woken.await;
            }
        })
    }
}

/// Makes `f` (the prompt's pipe, written by [`TerminalGate::take_keys`])
/// non-blocking.
///
/// # Errors
/// The descriptor's flags could not be read or set.
pub(crate) fn nonblocking(f: &fs::File) -> io::Result<()> {
    use rustix::fs::{OFlags, fcntl_getfl, fcntl_setfl};
    let flags = fcntl_getfl(f)?;
    fcntl_setfl(f, flags | OFlags::NONBLOCK)?;
    Ok(())
}

/// How much output `--json` captures per stream.
const JSON_CAPTURE: usize = 16 * 1024 * 1024;

/// Where the guest's stdout and stderr go: the launcher's own, or with
/// `--json` a bounded capture for the result document.
pub(super) struct GuestOutput {
    json: bool,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    /// The `--ask` prompt's terminal, when it prompts.
    gate: Option<Arc<TerminalGate>>,
}

impl GuestOutput {
    /// Passes output on (`json`: captures it instead), through `gate`
    /// when a prompt shares the terminal.
    pub(super) fn new(json: bool, gate: Option<Arc<TerminalGate>>) -> Self {
        Self {
            json,
            stdout: Vec::new(),
            stderr: Vec::new(),
            gate,
        }
    }

    /// Passes on one chunk of the guest's stdout (`err`: stderr). While a
    /// question is shown it is held, and when the hold is full this waits
    /// for the answer, asking `check` now and then whether to stop.
    ///
    /// # Errors
    /// What `check` returned.
    pub(super) fn write<E>(
        &mut self,
        err: bool,
        data: &[u8],
        check: impl Fn() -> Result<(), E>,
    ) -> Result<(), E> {
        if self.json {
            let buf = if err {
                &mut self.stderr
            } else {
                &mut self.stdout
            };
            let room = JSON_CAPTURE.saturating_sub(buf.len());
            buf.extend_from_slice(&data[..data.len().min(room)]);
            return Ok(());
        }
        match &self.gate {
            Some(gate) => gate.write(err, data, check),
            None => {
                write_out(err, data);
                Ok(())
            }
        }
    }

    /// At the end of the run (the guest exited, or the run stops): a
    /// question still shown is cancelled and denied first, then what it
    /// held is released in order ([`TerminalGate::finish`]).
    pub(super) fn release(&self) {
        if let Some(gate) = &self.gate {
            gate.finish();
        }
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
/// guest's EOF, for later prompts, until it ends ([`TerminalGate`]).
pub(super) fn forward_stdin(writer: Arc<Mutex<UnixStream>>, keys: Option<Keys>) {
    thread::spawn(move || {
        let mut stdin = io::stdin().lock();
        let mut buf = vec![0u8; CHUNK];
        let mut guest_open = true;
        loop {
            let read = stdin.read(&mut buf);
            let at = Instant::now();
            if let (Some(k), Ok(n @ 1..)) = (&keys, &read) {
                match k.gate.take_keys(at, &buf[..*n], &k.to_prompt) {
                    Ok(true) => continue,
                    Ok(false) => {}
                    Err(_) => return,
                }
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    type Seen = Arc<Mutex<Vec<(bool, Vec<u8>)>>>;

    fn recording() -> (TerminalGate, Seen) {
        let seen: Seen = Arc::default();
        let keep = Arc::clone(&seen);
        let mut gate = TerminalGate::new(None);
        gate.sink = Box::new(move |err, data| keep.lock().unwrap().push((err, data.to_vec())));
        (gate, seen)
    }

    fn ok() -> Result<(), ()> {
        Ok(())
    }

    #[test]
    fn output_during_a_question_is_held_and_released_in_order_after_it() {
        let (gate, seen) = recording();
        gate.write(false, b"before\n", ok).unwrap();
        gate.begin();
        gate.write(false, b"one\n", ok).unwrap();
        gate.write(true, b"two\n", ok).unwrap();
        gate.write(false, b"three\n", ok).unwrap();
        assert_eq!(seen.lock().unwrap().len(), 1, "written during the question");
        gate.settled();
        gate.end();
        gate.write(true, b"after\n", ok).unwrap();
        let seen = seen.lock().unwrap();
        let want: Vec<(bool, Vec<u8>)> = [
            (false, "before\n"),
            (false, "one\n"),
            (true, "two\n"),
            (false, "three\n"),
            (true, "after\n"),
        ]
        .into_iter()
        .map(|(e, d)| (e, d.as_bytes().to_vec()))
        .collect();
        assert_eq!(*seen, want);
    }

    #[test]
    fn a_full_hold_makes_the_writer_wait_for_the_answer_and_drops_nothing() {
        let (gate, seen) = recording();
        let gate = Arc::new(gate);
        gate.begin();
        let big = vec![b'x'; HOLD_LIMIT];
        gate.write(false, &big, ok).unwrap();
        let checks = Arc::new(AtomicUsize::new(0));
        let writer = {
            let (gate, checks) = (Arc::clone(&gate), Arc::clone(&checks));
            thread::spawn(move || {
                gate.write(true, b"one more", || {
                    checks.fetch_add(1, Ordering::SeqCst);
                    Ok::<(), ()>(())
                })
            })
        };
        // The writer is waiting (it asked whether to stop) and nothing
        // reached the terminal.
        while checks.load(Ordering::SeqCst) == 0 {
            thread::sleep(Duration::from_millis(10));
        }
        assert!(seen.lock().unwrap().is_empty());
        assert!(!writer.is_finished());
        gate.end();
        writer.join().unwrap().unwrap();
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0], (false, big));
        assert_eq!(seen[1], (true, b"one more".to_vec()));
    }

    #[test]
    fn a_full_hold_stops_waiting_when_the_run_ends() {
        let (gate, _) = recording();
        gate.begin();
        gate.write(false, &vec![b'x'; HOLD_LIMIT], ok).unwrap();
        assert_eq!(
            gate.write(false, b"more", || Err("interrupted")),
            Err("interrupted")
        );
    }

    #[test]
    fn the_runs_end_cancels_the_question_before_releasing_its_output() {
        let (gate, seen) = recording();
        let gate = Arc::new(gate);
        // The prompt's side: a question shown until the run's end cancels
        // it, on a runtime of its own as in `ask`.
        gate.begin();
        gate.write(false, b"\x1b[8A\x1b[Jfake prompt", ok).unwrap();
        let prompt = {
            let (gate, seen) = (Arc::clone(&gate), Arc::clone(&seen));
            thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                rt.block_on(gate.ending());
                // Still shown while the prompt says it is denied.
                let shown = seen.lock().unwrap().len();
                gate.end();
                shown
            })
        };
        gate.finish();
        assert_eq!(prompt.join().unwrap(), 0, "released over the question");
        assert_eq!(seen.lock().unwrap().len(), 1, "released after it");
        // A later question is cancelled at once.
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(gate.ending());
    }

    #[test]
    fn a_question_never_ended_drops_its_output_at_the_runs_end() {
        let (gate, seen) = recording();
        gate.begin();
        gate.write(false, b"held", ok).unwrap();
        gate.finish();
        assert!(seen.lock().unwrap().is_empty(), "drawn over the question");
    }

    #[test]
    fn a_paste_larger_than_the_prompts_pipe_is_dropped_not_waited_on() {
        let (gate, _) = recording();
        let (r, w) = io::pipe().unwrap();
        let (mut r, w) = (
            fs::File::from(std::os::fd::OwnedFd::from(r)),
            fs::File::from(std::os::fd::OwnedFd::from(w)),
        );
        nonblocking(&w).unwrap();
        gate.begin();
        gate.settled();
        // Nobody reads the pipe (the prompt has its answer): far more than
        // a pipe holds (64 KiB by default) must neither block nor fail.
        let paste = vec![b'x'; 4096];
        let mut typed = 0u64;
        while gate.dropped_keys() == 0 {
            assert!(gate.take_keys(Instant::now(), &paste, &w).unwrap());
            typed += paste.len() as u64;
            assert!(typed < 64 << 20, "the pipe never filled");
        }
        // One more, still not blocking, and the question can end.
        assert!(gate.take_keys(Instant::now(), &paste, &w).unwrap());
        gate.end();
        drop(w);
        let mut got = Vec::new();
        r.read_to_end(&mut got).unwrap();
        assert_eq!(got.len() as u64 + gate.dropped_keys(), typed + 4096);
    }

    #[test]
    fn keys_go_to_the_guest_then_nowhere_then_to_the_prompt() {
        let (gate, _) = recording();
        let (r, w) = io::pipe().unwrap();
        let (mut r, w) = (
            fs::File::from(std::os::fd::OwnedFd::from(r)),
            fs::File::from(std::os::fd::OwnedFd::from(w)),
        );
        assert!(!gate.take_keys(Instant::now(), b"g\n", &w).unwrap());
        gate.begin();
        assert!(gate.take_keys(Instant::now(), b"early\n", &w).unwrap());
        let before = Instant::now();
        gate.settled();
        // Read before the question settled (passed on after): discarded.
        assert!(gate.take_keys(before, b"late\n", &w).unwrap());
        assert!(gate.take_keys(Instant::now(), b"o\n", &w).unwrap());
        gate.end();
        assert!(!gate.take_keys(Instant::now(), b"g2\n", &w).unwrap());
        drop(w);
        let mut got = String::new();
        r.read_to_string(&mut got).unwrap();
        assert_eq!(got, "o\n");
    }

    #[test]
    fn debug_lines_during_a_question_are_held_and_never_wait() {
        let (gate, seen) = recording();
        let gate = Arc::new(gate);
        // Attached after its readers started, as in `Session::new`.
        let echo = DebugEcho::new(None, true);
        echo.attach(Arc::clone(&gate));
        echo.line("sluice: gateway: before\n");
        assert_eq!(seen.lock().unwrap().len(), 1, "no question: straight on");
        gate.begin();
        // A gateway log line that would redraw the screen, and the guest's
        // console: both held while the question is shown.
        echo.line("sluice: gateway: \u{1b}[8A\u{1b}[Jfake prompt\n");
        echo.write(b"console\n");
        assert_eq!(seen.lock().unwrap().len(), 1, "written over the question");
        // A full hold drops the echo (counted) instead of stalling its
        // reader, which would stall the gateway's log.
        gate.write(false, &vec![b'x'; HOLD_LIMIT - 1000], ok)
            .unwrap();
        echo.write(&[b'y'; 2000]);
        gate.end();
        let seen = seen.lock().unwrap();
        let text: Vec<String> = seen
            .iter()
            .map(|(_, d)| String::from_utf8_lossy(d).into_owned())
            .collect();
        assert_eq!(text.len(), 5, "{text:?}");
        assert_eq!(text[1], "sluice: gateway: \\u{1b}[8A\\u{1b}[Jfake prompt\n");
        assert!(!text[1].contains('\u{1b}'));
        assert_eq!(text[2], "console\n");
        assert!(
            text[4].contains("2000 byte(s) of console and log output dropped"),
            "{text:?}"
        );
    }

    #[test]
    fn a_stalled_terminal_stops_only_its_writer_not_a_question_beginning() {
        use std::sync::mpsc;
        // The terminal: a pipe nobody reads, filled, so the next write to
        // it blocks (Ctrl-S, `2>&1 | less`).
        let (r, w) = io::pipe().unwrap();
        let (mut r, w) = (
            fs::File::from(std::os::fd::OwnedFd::from(r)),
            fs::File::from(std::os::fd::OwnedFd::from(w)),
        );
        nonblocking(&w).unwrap();
        while (&w).write(&[b'f'; 4096]).is_ok() {}
        rustix::fs::fcntl_setfl(&w, rustix::fs::OFlags::empty()).unwrap();
        let entered = Arc::new(AtomicUsize::new(0));
        let mut gate = TerminalGate::new(None);
        gate.sink = {
            let entered = Arc::clone(&entered);
            Box::new(move |_, data| {
                entered.fetch_add(1, Ordering::SeqCst);
                let _ = (&w).write_all(data);
            })
        };
        let gate = Arc::new(gate);
        let echo = DebugEcho::new(Some(Arc::clone(&gate)), false);
        let qemu = echo.escaping(true);
        let stalled = {
            let echo = echo.clone();
            thread::spawn(move || echo.write(b"stalled\n"))
        };
        let patience = Instant::now() + Duration::from_secs(60);
        while entered.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < patience, "the echo never wrote");
            thread::sleep(Duration::from_millis(10));
        }
        // A question begins while that write is stuck: output is held
        // from now on, and `begin` waits for the stuck write ...
        let begin = {
            let gate = Arc::clone(&gate);
            thread::spawn(move || gate.begin())
        };
        loop {
            if let Ok(held) = gate.held.try_lock()
                && held.holding
            {
                break;
            }
            assert!(Instant::now() < patience, "the question never began");
            thread::sleep(Duration::from_millis(10));
        }
        // ... but the other writers are held without waiting for it.
        let (done, others) = mpsc::channel();
        {
            let (gate, qemu) = (Arc::clone(&gate), qemu.clone());
            thread::spawn(move || {
                qemu.line("sluice: qemu: \u{1b}[2Jlog\n");
                gate.write(false, b"guest\n", ok).unwrap();
                done.send(()).unwrap();
            });
        }
        others
            .recv_timeout(Duration::from_secs(60))
            .expect("a writer waited behind the stalled terminal");
        assert!(!begin.is_finished(), "began over a write in progress");
        assert_eq!(entered.load(Ordering::SeqCst), 1);
        // The terminal drains: the stuck write lands, then the question
        // begins; after it, the held output follows in order.
        let reader = thread::spawn(move || {
            let mut got = Vec::new();
            r.read_to_end(&mut got).unwrap();
            got
        });
        stalled.join().unwrap();
        begin.join().unwrap();
        gate.end();
        drop(echo);
        drop(qemu);
        drop(Arc::try_unwrap(gate).expect("the gate is still shared"));
        let got = reader.join().unwrap();
        let text = String::from_utf8_lossy(&got);
        assert!(
            text.trim_start_matches('f') == "stalled\nsluice: qemu: \\u{1b}[2Jlog\nguest\n",
            "{:?}",
            text.trim_start_matches('f')
        );
    }

    #[test]
    fn escaping_keeps_text_newlines_and_tabs_only() {
        assert_eq!(
            escape_controls("a\tb\u{7}\u{9b}2J\u{e}\u{7f}é\n"),
            "a\tb\\u{7}\\u{9b}2J\\u{e}\\u{7f}é\n"
        );
    }
}

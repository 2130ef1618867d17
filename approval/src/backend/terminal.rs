//! The terminal backend: the question on a terminal, one key (and Enter)
//! per choice, and for `always` the name itself typed in full. The
//! launcher runs it for `sluice run --ask`, answering the gateway over a
//! unix socket ([`super::unix::Asked`]); one prompt at a time. A question
//! the gateway withdraws (it hung up: its timeout passed) is taken down
//! at once, or never drawn if it was withdrawn while it waited, and
//! answers nothing.
//!
//! The prompt shows the exact name and the ports an approval opens. The
//! name is printed with every character outside printable ASCII escaped, so
//! a hostile name cannot move the cursor or rewrite the prompt. Input that
//! is not a key is asked again, three times at most, then denied.
//!
//! A terminal the prompt shares with others ([`TerminalShare`]: the guest's
//! output and stdin under `sluice run --ask`) is told when a prompt begins
//! and ends, so that nothing else draws on it meanwhile. What arrives from
//! the terminal within [`SETTLE`] of the question being drawn is discarded:
//! replies to terminal queries sent before (a cursor position report comes
//! back as input) and keys typed ahead for something else. The `choice> `
//! line appears only then; a key is read from that moment.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::{AsyncBufRead, AsyncWrite, AsyncWriteExt};

use super::BackendError;
use super::unix::read_line;
use crate::wire::{Answer, Choice, Question};

/// Times an unreadable key is asked again before the answer is deny.
const ATTEMPTS: usize = 3;

/// The name as printed: printable ASCII kept, everything else escaped.
#[must_use]
pub fn printable(name: &str) -> String {
    name.chars()
        .flat_map(|c| {
            if c.is_ascii_graphic() {
                vec![c]
            } else {
                c.escape_default().collect()
            }
        })
        .collect()
}

fn ports(q: &Question) -> String {
    let mut parts: Vec<String> = q.tcp_ports.iter().map(|p| format!("TCP {p}")).collect();
    parts.extend(q.udp_ports.iter().map(|p| format!("UDP {p}")));
    if parts.is_empty() {
        "no ports".to_owned()
    } else {
        parts.join(", ")
    }
}

/// Written before each question: a soft terminal reset (`ESC [ ! p`), the
/// default rendition, the ASCII charset (`ESC ( B`, SI), a visible cursor,
/// and a new line.
pub const RESET: &str = "\x1b[!p\x1b[0m\x1b(B\x0f\x1b[?25h\r\n";

/// How long after a question is drawn the terminal's input is discarded.
pub const SETTLE: Duration = Duration::from_millis(300);

/// How long a connection to the question socket has to send its question
/// (one short line, written as it connects). Questions are served one at
/// a time: a peer that connects and sends nothing must not stop every
/// later question from being asked.
pub const QUESTION_READ: Duration = Duration::from_secs(2);

/// Others that use the prompt's terminal: told when a prompt begins and
/// ends. Each method is called from the prompt's task and must not block
/// for long.
pub trait TerminalShare: Sync {
    /// A question is about to be drawn: hold other output to the terminal
    /// and stop passing its keys to anyone but the prompt. May wait for
    /// output already on its way to the terminal (so it lands before the
    /// question), never for output held.
    fn begin(&self);
    /// The question has settled ([`SETTLE`]): throw away what the terminal
    /// holds unread (a partial line in the line discipline, keys read for
    /// the prompt before now); keys read from now on answer it.
    fn settled(&self) {}
    /// The answer is shown: release what was held, in order, and give the
    /// keys back.
    fn end(&self);
    /// Resolves when no question may be shown any more (the run ends): a
    /// question shown then is cancelled and denied, and later ones are
    /// denied without a prompt. Never, by default.
    fn ending(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(std::future::pending())
    }
}

/// A terminal nobody else uses.
#[derive(Debug, Clone, Copy, Default)]
pub struct NotShared;

impl TerminalShare for NotShared {
    fn begin(&self) {}
    fn end(&self) {}
}

/// A flag that is true exactly while a prompt is shown.
impl TerminalShare for AtomicBool {
    fn begin(&self) {
        self.store(true, Ordering::SeqCst);
    }
    fn end(&self) {
        self.store(false, Ordering::SeqCst);
    }
}

/// The key for each choice offered. A line with a control character (an
/// escape sequence: a terminal's reply to a query) is never a key.
/// `always` is not a key but the name asked about, typed in full (any
/// case, a trailing dot allowed): a screen the guest faked cannot make a
/// person type the name it hides ([`prompt`]).
fn choice_for(key: &str, q: &Question) -> Option<Choice> {
    let key = key.trim();
    if key.chars().any(char::is_control) {
        return None;
    }
    match key {
        "o" | "O" => Some(Choice::AllowOnce),
        "s" | "S" => Some(Choice::AllowSandbox),
        "d" | "D" => Some(Choice::DenyOnce),
        "n" | "N" => Some(Choice::DenySandbox),
        typed
            if q.always_allowed
                && !q.name.is_empty()
                && typed
                    .strip_suffix('.')
                    .unwrap_or(typed)
                    .eq_ignore_ascii_case(&printable(&q.name)) =>
        {
            Some(Choice::AllowAlways)
        }
        _ => None,
    }
}

/// The line that says what was answered, once the gateway has it.
#[must_use]
pub fn answered_line(q: &Question, choice: Choice) -> String {
    format!("sluice: {} {}\n", choice.as_str(), printable(&q.name))
}

/// Shows `q` on `out` and reads the choice from `input`. What `input`
/// gives within `settle` of the question being drawn is discarded, then
/// `share` is told the question settled and `choice> ` is shown (a zero
/// `settle`: at once, nothing discarded).
///
/// `o`, `s`, `d` and `n` (then Enter) choose once, sandbox, deny once and
/// deny for the sandbox; `always` (when offered) is the name itself typed
/// in full. The answer is not confirmed on `out` here: the caller prints
/// [`answered_line`] once the gateway has it (a question withdrawn
/// meanwhile answers nothing, and must not say it did).
///
/// # Errors
/// The terminal closed or failed; the caller denies.
pub async fn prompt<R, W>(
    q: &Question,
    input: &mut R,
    out: &mut W,
    settle: Duration,
    share: &dyn TerminalShare,
) -> Result<Answer, BackendError>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    // Typed, not a key: a guest that draws a fake question over a hidden
    // real one gets `o`/`s` for the wrong name at worst, never a lasting
    // entry in the policy's overlay.
    let always = if q.always_allowed {
        "  [type the name] always (writes the policy's .approved.yaml)\n"
    } else {
        ""
    };
    let again: &[u8] = if q.always_allowed {
        b"sluice: press o, s, d or n, or type the name asked about for always, then Enter\n"
    } else {
        b"sluice: press o, s, d or n, then Enter\n"
    };
    // A flood of names is one line here, never a prompt each.
    let refused = match q.refused_since {
        0 => String::new(),
        n => format!(
            "\nsluice: {n} other name(s) refused without asking (too many questions; see the audit log)"
        ),
    };
    // Whatever the terminal was left in by others (the guest's output
    // released after the last question: concealed or black-on-black text,
    // a scroll region, another charset, a hidden cursor) is undone before
    // the question is drawn, so that it is seen as written: a soft reset
    // (DECSTR), then SGR, charset and cursor again for terminals without it,
    // then a new line of its own.
    out.write_all(RESET.as_bytes())
        .await
        .map_err(BackendError::Io)?;
    let text = format!(
        "{refused}\nsluice: sandbox {} wants to reach {} ({}), not listed in policy {}\n  \
         [o] allow once (until the DNS answer expires)\n  \
         [s] allow for this sandbox\n{always}  \
         [d] deny once\n  \
         [n] deny for this sandbox\n",
        printable(&q.sandbox),
        printable(&q.name),
        ports(q),
        printable(&q.policy),
    );
    out.write_all(text.as_bytes())
        .await
        .map_err(BackendError::Io)?;
    out.flush().await.map_err(BackendError::Io)?;
    if !settle.is_zero() {
        discard_for(input, settle).await?;
        share.settled();
        // What the other reader of the terminal passed on before it knew.
        discard_ready(input).await;
    }
    for _ in 0..ATTEMPTS {
        out.write_all(b"choice> ").await.map_err(BackendError::Io)?;
        out.flush().await.map_err(BackendError::Io)?;
        // A line over the wire's bound (a paste) is an unreadable key, not
        // a failed terminal: later questions are still prompted.
        let line = match read_line(input).await {
            Ok(line) => line,
            Err(BackendError::Wire(_)) => {
                skip_line(input).await?;
                Vec::new()
            }
            Err(e) => return Err(e),
        };
        let key = String::from_utf8_lossy(&line);
        if let Some(choice) = choice_for(&key, q) {
            return Ok(Answer {
                decision: choice,
                by: Some("terminal".into()),
            });
        }
        out.write_all(again).await.map_err(BackendError::Io)?;
    }
    out.write_all(b"sluice: no choice; denied\n")
        .await
        .map_err(BackendError::Io)?;
    out.flush().await.map_err(BackendError::Io)?;
    Ok(Answer {
        decision: Choice::DenyOnce,
        by: Some("terminal: no choice".into()),
    })
}

/// Consumes the rest of the current line of `input` (one too long to be
/// read as a key), up to and with its newline.
///
/// # Errors
/// The input ended or failed.
async fn skip_line<R: AsyncBufRead + Unpin>(input: &mut R) -> Result<(), BackendError> {
    use tokio::io::AsyncBufReadExt as _;
    loop {
        let buf = input.fill_buf().await.map_err(BackendError::Io)?;
        if buf.is_empty() {
            return Err(BackendError::Closed);
        }
        match buf.iter().position(|&b| b == b'\n') {
            Some(i) => {
                input.consume(i + 1);
                return Ok(());
            }
            None => {
                let n = buf.len();
                input.consume(n);
            }
        }
    }
}

/// Discards every line `input` gives for `window`. A line over the wire's
/// bound is discarded too; only the input's end is an error.
async fn discard_for<R: AsyncBufRead + Unpin>(
    input: &mut R,
    window: Duration,
) -> Result<(), BackendError> {
    let until = tokio::time::Instant::now() + window;
    loop {
        // A read cut short at the deadline loses what it took: the start
        // of a line typed within the window, which is to be discarded.
        match tokio::time::timeout_at(until, read_line(input)).await {
            Err(_elapsed) => return Ok(()),
            Ok(Ok(_) | Err(BackendError::Wire(_))) => {}
            Ok(Err(e)) => return Err(e),
        }
    }
}

/// Discards what `input` holds ready now: its buffer and what its source
/// can give without waiting. Only a source whose readiness is known without
/// reading (a pipe or terminal as `tokio::net::unix::pipe::Receiver`) is
/// drained; a blocking file's read started here would deliver its bytes to
/// the prompt later.
async fn discard_ready<R: AsyncBufRead + Unpin>(input: &mut R) {
    loop {
        let ready = std::future::poll_fn(|cx| {
            std::task::Poll::Ready(match Pin::new(&mut *input).poll_fill_buf(cx) {
                std::task::Poll::Ready(Ok(buf)) if !buf.is_empty() => Some(buf.len()),
                _ => None,
            })
        })
        .await;
        match ready {
            Some(n) => Pin::new(&mut *input).consume(n),
            None => return,
        }
    }
}

/// What [`serve`] did, for the run's summary.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Served {
    /// Questions answered from the terminal.
    pub prompted: u64,
    /// Questions denied without a prompt (no terminal, `--json`).
    pub auto_denied: u64,
    /// Questions the gateway withdrew (its timeout passed, or it ended)
    /// before they were answered: taken down from the terminal, or never
    /// drawn; nothing was answered.
    pub withdrawn: u64,
    /// Names answered `always` on the terminal and not yet taken by
    /// [`Served::take_always`]: under `sluice run --ask` the launcher
    /// writes an overlay entry only for these (the gateway's report of an
    /// `always` answer is not trusted alone). Recorded before the answer
    /// reaches the gateway.
    pub always: Vec<String>,
}

impl Served {
    /// Whether `name` was answered `always` and not yet taken; takes it.
    pub fn take_always(&mut self, name: &str) -> bool {
        match self.always.iter().position(|n| n == name) {
            Some(i) => {
                self.always.swap_remove(i);
                true
            }
            None => false,
        }
    }
}

/// How [`serve`] answers.
#[derive(Debug)]
pub enum Mode<R, W> {
    /// Prompt on this terminal (input, output).
    Prompt(R, W),
    /// Deny every question without prompting; the reason (`no terminal`,
    /// `--json`) goes into each answer's `by`.
    AutoDeny(String),
}

/// Serves the gateway's questions arriving on `listener` (the `unix`
/// backend's other side) one at a time: each is prompted on the terminal,
/// or denied at once in [`Mode::AutoDeny`]. Runs until `listener` fails;
/// `served` is updated after each question. A terminal that fails denies
/// the question and every later one. A connection that has not sent its
/// question within [`QUESTION_READ`] is dropped unasked.
pub async fn serve<R, W>(
    listener: tokio::net::UnixListener,
    mode: Mode<R, W>,
    served: std::sync::Arc<std::sync::Mutex<Served>>,
) where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    serve_shared(listener, mode, served, &NotShared).await;
}

/// As [`serve`], on a terminal shared with others: `share` is told when
/// each prompt begins, settles and ends ([`TerminalShare`]). A caller
/// whose terminal is also another reader's input (the guest's stdin under
/// `sluice run --ask`) routes the keys typed meanwhile to the prompt's
/// input, and holds the other writers' output.
pub async fn serve_shared<R, W>(
    listener: tokio::net::UnixListener,
    mut mode: Mode<R, W>,
    served: std::sync::Arc<std::sync::Mutex<Served>>,
    share: &dyn TerminalShare,
) where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    while let Ok((stream, _)) = listener.accept().await {
        let asked =
            match tokio::time::timeout(QUESTION_READ, super::unix::Asked::read(stream)).await {
                Ok(Ok(asked)) => asked,
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "approval question not read");
                    continue;
                }
                Err(_) => {
                    // Dropped: the peer's connection is closed.
                    tracing::debug!("approval question not sent in time; connection dropped");
                    continue;
                }
            };
        let outcome = match &mut mode {
            Mode::Prompt(input, out) => ask_one(asked, input, out, &served, share).await,
            Mode::AutoDeny(why) => {
                let answer = Answer {
                    decision: Choice::DenyOnce,
                    by: Some(format!("auto-denied: {why}")),
                };
                if let Err(e) = asked.answer(&answer).await {
                    tracing::debug!(error = %e, "approval answer not written");
                }
                Outcome::AutoDenied
            }
        };
        if let Ok(mut s) = served.lock() {
            match &outcome {
                Outcome::Prompted => s.prompted += 1,
                Outcome::AutoDenied => s.auto_denied += 1,
                Outcome::Withdrawn => s.withdrawn += 1,
                Outcome::Failed(_) => s.prompted += 1,
            }
        }
        if let Outcome::Failed(why) = outcome {
            mode = Mode::AutoDeny(format!("the terminal failed: {why}"));
        }
    }
}

/// What became of one question.
enum Outcome {
    /// Shown and answered (or denied because the run ended).
    Prompted,
    /// Denied without a prompt.
    AutoDenied,
    /// Withdrawn by the gateway before it had an answer: nothing answered.
    Withdrawn,
    /// The terminal failed (the question was denied): so are later ones.
    Failed(String),
}

/// Shows one question and answers it, unless the gateway withdraws it
/// first ([`super::unix::Asked::withdrawn`]): one that is already
/// withdrawn when its turn comes (it waited behind another past the
/// gateway's timeout) is never drawn; one withdrawn while shown is taken
/// down with one line, and the held output released (`share.end()`), with
/// nothing answered and no `always` recorded. The answer's line
/// ([`answered_line`]) is printed only once the gateway has the answer.
async fn ask_one<R, W>(
    mut asked: super::unix::Asked,
    input: &mut R,
    out: &mut W,
    served: &std::sync::Mutex<Served>,
    share: &dyn TerminalShare,
) -> Outcome
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    if asked.hung_up() {
        return Outcome::Withdrawn;
    }
    let q = asked.question().clone();
    // A line typed after the last answer (or before this question) must
    // not answer it.
    discard_ready(input).await;
    share.begin();
    // The run's end cancels the question before the held output is
    // released (never over a question still shown); one that arrives after
    // is denied at once (`biased`: nothing is drawn then). The gateway
    // giving up takes it down the same way.
    let asked_for = tokio::select! {
        biased;
        () = share.ending() => Err(None),
        w = asked.withdrawn() => Err(Some(w)),
        a = prompt(&q, input, out, SETTLE, share) => Ok(a),
    };
    let name = printable(&q.name);
    let (answer, outcome) = match asked_for {
        Err(None) => {
            let msg = format!("\nsluice: the run ended; {name} denied\n");
            let _ = out.write_all(msg.as_bytes()).await;
            let answer = Answer {
                decision: Choice::DenyOnce,
                by: Some("terminal: the run ended".into()),
            };
            (Some(answer), Outcome::Prompted)
        }
        Err(Some(why)) => {
            let _ = out.write_all(withdrawn_line(&name, why).as_bytes()).await;
            (None, Outcome::Withdrawn)
        }
        Ok(Ok(_)) if asked.hung_up() => {
            // Typed just as the gateway gave up: it took nothing.
            let why = super::unix::Withdrawn::HungUp;
            let _ = out.write_all(withdrawn_line(&name, why).as_bytes()).await;
            (None, Outcome::Withdrawn)
        }
        Ok(Ok(a)) => (Some(a), Outcome::Prompted),
        Ok(Err(e)) => {
            let answer = Answer {
                decision: Choice::DenyOnce,
                by: Some("terminal: failed".into()),
            };
            (Some(answer), Outcome::Failed(e.to_string()))
        }
    };
    let outcome = match answer {
        Some(a) => answer_shown(asked, &q, &a, out, served)
            .await
            .unwrap_or(outcome),
        None => outcome,
    };
    // On the terminal before anything the caller releases after.
    let _ = out.flush().await;
    share.end();
    outcome
}

/// Writes `a` back to the gateway. An `always` is recorded first (the
/// gateway's overlay entry may follow at once) and taken back if the
/// answer could not be written. A terminal answer's line is printed once
/// the gateway has it; `Some(Withdrawn)` if it did not take it.
async fn answer_shown<W: AsyncWrite + Unpin>(
    asked: super::unix::Asked,
    q: &Question,
    a: &Answer,
    out: &mut W,
    served: &std::sync::Mutex<Served>,
) -> Option<Outcome> {
    let always = a.decision == Choice::AllowAlways;
    if always && let Ok(mut s) = served.lock() {
        s.always.push(q.name.clone());
    }
    let confirm = a.by.as_deref() == Some("terminal");
    match asked.answer(a).await {
        Ok(()) => {
            if confirm {
                let _ = out.write_all(answered_line(q, a.decision).as_bytes()).await;
            }
            None
        }
        Err(e) => {
            tracing::debug!(error = %e, "approval answer not written");
            if always && let Ok(mut s) = served.lock() {
                s.take_always(&q.name);
            }
            if confirm {
                let why = super::unix::Withdrawn::HungUp;
                let line = withdrawn_line(&printable(&q.name), why);
                let _ = out.write_all(line.as_bytes()).await;
                return Some(Outcome::Withdrawn);
            }
            None
        }
    }
}

/// The line that takes down a question the gateway withdrew.
fn withdrawn_line(name: &str, why: super::unix::Withdrawn) -> String {
    match why {
        super::unix::Withdrawn::TimedOut => {
            format!("\nsluice: {name}: not answered in time, denied\n")
        }
        super::unix::Withdrawn::HungUp => {
            format!(
                "\nsluice: {name}: the gateway withdrew the question (not answered in time), denied\n"
            )
        }
    }
}

#[cfg(test)]
mod tests;

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
mod tests {
    use super::*;
    use crate::wire::WIRE_VERSION;

    fn q(always: bool) -> Question {
        Question {
            version: WIRE_VERSION,
            sandbox: "sb".into(),
            policy: "p".into(),
            name: "evil\u{1b}[2J.example".into(),
            qtype: "A".into(),
            tcp_ports: vec![443, 8443],
            udp_ports: vec![],
            always_allowed: always,
            refused_since: 0,
            timeout_ms: 0,
        }
    }

    /// A question about a plain name, `always` offered.
    fn plain() -> Question {
        Question {
            name: "files.example.org".into(),
            ..q(true)
        }
    }

    /// `f`, failed if it has not finished within a minute: a regression
    /// that leaves a question unanswered fails the test instead of hanging
    /// it.
    async fn bounded<T>(f: impl Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(60), f)
            .await
            .expect("the test did not finish within a minute")
    }

    async fn run_q(q: &Question, input: &str) -> (Result<Answer, BackendError>, String) {
        let mut r = tokio::io::BufReader::new(input.as_bytes());
        let mut out = Vec::new();
        let a = prompt(q, &mut r, &mut out, Duration::ZERO, &NotShared).await;
        (a, String::from_utf8(out).unwrap())
    }

    async fn run(input: &str, always: bool) -> (Result<Answer, BackendError>, String) {
        let mut r = tokio::io::BufReader::new(input.as_bytes());
        let mut out = Vec::new();
        let a = prompt(&q(always), &mut r, &mut out, Duration::ZERO, &NotShared).await;
        (a, String::from_utf8(out).unwrap())
    }

    #[tokio::test]
    async fn keys_map_to_choices() {
        for (key, want) in [
            ("o\n", Choice::AllowOnce),
            ("s\n", Choice::AllowSandbox),
            ("d\n", Choice::DenyOnce),
            ("n\n", Choice::DenySandbox),
        ] {
            assert_eq!(run(key, false).await.0.unwrap().decision, want);
        }
        assert_eq!(
            run_q(&plain(), "files.example.org\n")
                .await
                .0
                .unwrap()
                .decision,
            Choice::AllowAlways
        );
    }

    #[tokio::test]
    async fn always_is_not_offered_unless_allowed() {
        let no = Question {
            always_allowed: false,
            ..plain()
        };
        let (a, out) = run_q(&no, "files.example.org\na\na\n").await;
        assert_eq!(a.unwrap().decision, Choice::DenyOnce);
        assert!(!out.contains("always"), "{out}");
    }

    #[tokio::test]
    async fn always_needs_the_name_typed_in_full_never_a_single_key() {
        // A key, a word, the first label, another name, a name with more
        // around it: none is `always`; three of them are a deny.
        for typed in [
            "a\nA\nalways\n",
            "files\nfiles.example\nexample.org\n",
            "pypi.org\nfiles.example.org.evil\nxfiles.example.org\n",
        ] {
            let (a, out) = run_q(&plain(), typed).await;
            let a = a.unwrap();
            assert_eq!(a.decision, Choice::DenyOnce, "{typed:?}: {out}");
            assert_eq!(a.by.as_deref(), Some("terminal: no choice"), "{out}");
            assert_eq!(
                out.matches("or type the name asked about for always")
                    .count(),
                3,
                "{out}"
            );
        }
        // The name itself, in any case, with or without the root's dot,
        // and with blanks around it.
        for typed in [
            "files.example.org\n",
            "FILES.Example.ORG\n",
            "files.example.org.\n",
            "  files.example.org \n",
        ] {
            let (a, out) = run_q(&plain(), typed).await;
            assert_eq!(a.unwrap().decision, Choice::AllowAlways, "{typed:?}");
            assert!(out.contains("[type the name] always"), "{out}");
        }
    }

    #[tokio::test]
    async fn the_prompt_shows_the_exact_host_escaped_and_the_ports() {
        let (_, out) = run("d\n", false).await;
        assert!(out.contains("evil\\u{1b}[2J.example"), "{out}");
        let drawn = out.strip_prefix(RESET).expect("the reset first");
        assert!(!drawn.contains('\u{1b}'), "{drawn}");
        assert!(out.contains("TCP 443, TCP 8443"));
    }

    #[tokio::test]
    async fn names_refused_before_a_question_are_one_line_above_it() {
        let (_, out) = run("d\n", false).await;
        assert!(!out.contains("refused without asking"), "{out}");
        let q = Question {
            refused_since: 312,
            ..q(false)
        };
        let mut out = Vec::new();
        let mut r = tokio::io::BufReader::new(&b"d\n"[..]);
        prompt(&q, &mut r, &mut out, Duration::ZERO, &NotShared)
            .await
            .unwrap();
        let out = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = out
            .lines()
            .filter(|l| l.contains("refused without asking"))
            .collect();
        assert_eq!(lines.len(), 1, "{out}");
        assert!(lines[0].contains("312 other name(s)"), "{out}");
    }

    #[tokio::test]
    async fn a_terminal_query_reply_is_never_a_key() {
        // Cursor position and device attribute reports, then a real key.
        let (a, out) = run("\u{1b}[12;1Ro\n\u{1b}[?62;c\nd\n", false).await;
        assert_eq!(a.unwrap().decision, Choice::DenyOnce);
        assert_eq!(out.matches("press o, s, d or n").count(), 2, "{out}");
        let (a, _) = run("o\u{1b}\no\u{7}\n\u{1b}[Oo\n", false).await;
        assert_eq!(a.unwrap().decision, Choice::DenyOnce, "no key: denied");
    }

    /// Records the calls a prompt makes on its shared terminal.
    #[derive(Default)]
    struct Recorded(std::sync::Mutex<Vec<&'static str>>);

    impl TerminalShare for Recorded {
        fn begin(&self) {
            self.0.lock().unwrap().push("begin");
        }
        fn settled(&self) {
            self.0.lock().unwrap().push("settled");
        }
        fn end(&self) {
            self.0.lock().unwrap().push("end");
        }
    }

    #[tokio::test]
    async fn what_arrives_while_the_question_settles_is_discarded() {
        use tokio::io::AsyncReadExt as _;
        let (mut key_w, key_r) = tokio::io::duplex(64);
        let (mut out_w, mut screen) = tokio::io::duplex(4096);
        let share = Recorded::default();
        let asking = async {
            let mut input = tokio::io::BufReader::new(key_r);
            prompt(
                &q(false),
                &mut input,
                &mut out_w,
                Duration::from_secs(3),
                &share,
            )
            .await
        };
        let typing = async {
            let mut seen = String::new();
            let mut typed_early = false;
            while !seen.contains("choice> ") {
                if !typed_early && seen.contains("[n] deny for this sandbox") {
                    // A key (or a query reply) arriving as the question
                    // is drawn: not an answer.
                    key_w.write_all(b"o\n").await.unwrap();
                    typed_early = true;
                }
                let mut chunk = [0u8; 256];
                let n = screen.read(&mut chunk).await.unwrap();
                assert!(n > 0, "{seen}");
                seen.push_str(&String::from_utf8_lossy(&chunk[..n]));
            }
            assert!(typed_early, "{seen}");
            key_w.write_all(b"d\n").await.unwrap();
        };
        let (answer, ()) = tokio::join!(asking, typing);
        assert_eq!(answer.unwrap().decision, Choice::DenyOnce);
        assert_eq!(*share.0.lock().unwrap(), vec!["settled"]);
    }

    #[tokio::test]
    async fn each_question_starts_on_a_reset_terminal_and_a_line_of_its_own() {
        let (_, out) = run("d\n", false).await;
        assert!(out.starts_with("\x1b[!p\x1b[0m"), "{out:?}");
        let drawn = out.strip_prefix(RESET).unwrap();
        assert!(RESET.ends_with('\n'));
        assert!(
            drawn.trim_start().starts_with("sluice: sandbox sb"),
            "{drawn}"
        );
    }

    /// A shared terminal whose run ends when `over` is notified.
    #[derive(Default)]
    struct Ends {
        over: AtomicBool,
        wake: tokio::sync::Notify,
        calls: std::sync::Mutex<Vec<&'static str>>,
    }

    impl TerminalShare for Ends {
        fn begin(&self) {
            self.calls.lock().unwrap().push("begin");
        }
        fn end(&self) {
            self.calls.lock().unwrap().push("end");
        }
        fn ending(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
            Box::pin(async move {
                loop {
                    let woken = self.wake.notified();
                    if self.over.load(Ordering::SeqCst) {
                        return;
                    }
                    woken.await;
                }
            })
        }
    }

    /// A fresh directory for one test and a listener on its `ask.sock`.
    fn ask_socket(
        tag: &str,
    ) -> (
        std::path::PathBuf,
        std::path::PathBuf,
        tokio::net::UnixListener,
    ) {
        let dir = std::env::temp_dir().join(format!("sluice-term-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ask.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        (dir, path, listener)
    }

    #[tokio::test]
    async fn the_runs_end_denies_the_question_shown_and_every_later_one() {
        use crate::backend::Backend as _;
        let (dir, path, listener) = ask_socket("ends");
        let served = std::sync::Arc::new(std::sync::Mutex::new(Served::default()));
        let (_key_w, key_r) = tokio::io::duplex(64);
        let (out_w, mut screen) = tokio::io::duplex(1 << 16);
        let share = Ends::default();
        // The server's future is not Send (its terminal share's is not):
        // it runs beside the test's body, not on a task of its own.
        let server = serve_shared(
            listener,
            Mode::Prompt(tokio::io::BufReader::new(key_r), out_w),
            std::sync::Arc::clone(&served),
            &share,
        );
        let body = async {
            let backend = super::super::unix::UnixBackend::new(&path);
            let asking = {
                let backend = backend.clone();
                tokio::spawn(async move { backend.ask(&q(true)).await })
            };
            let mut seen = String::new();
            while !seen.contains("choice> ") {
                let mut chunk = [0u8; 256];
                let n = tokio::io::AsyncReadExt::read(&mut screen, &mut chunk)
                    .await
                    .unwrap();
                assert!(n > 0, "{seen}");
                seen.push_str(&String::from_utf8_lossy(&chunk[..n]));
            }
            // The run ends with the question shown and no key typed.
            share.over.store(true, Ordering::SeqCst);
            share.wake.notify_waiters();
            let a = asking.await.unwrap().unwrap();
            assert_eq!(a.decision, Choice::DenyOnce);
            assert_eq!(a.by.as_deref(), Some("terminal: the run ended"));
            assert_eq!(*share.calls.lock().unwrap(), vec!["begin", "end"]);
            // A later question is denied without being drawn.
            let a = backend.ask(&q(true)).await.unwrap();
            assert_eq!(a.by.as_deref(), Some("terminal: the run ended"));
        };
        bounded(async {
            tokio::select! {
                () = server => panic!("the server stopped"),
                () = body => {}
            }
        })
        .await;
        let mut rest = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut screen, &mut rest)
            .await
            .unwrap();
        let rest = String::from_utf8_lossy(&rest);
        assert!(rest.contains("the run ended"), "{rest}");
        assert!(!rest.contains("wants to reach"), "{rest}");
        assert!(served.lock().unwrap().always.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_line_too_long_is_an_unreadable_key_not_a_failed_terminal() {
        let long = format!("{}\nd\n", "x".repeat(10_000));
        let (a, out) = run(&long, false).await;
        let a = a.unwrap();
        assert_eq!(a.decision, Choice::DenyOnce);
        assert_eq!(a.by.as_deref(), Some("terminal"), "d was read: {out}");
        assert_eq!(out.matches("press o, s, d or n").count(), 1, "{out}");
    }

    #[tokio::test]
    async fn a_closed_terminal_is_an_error() {
        assert!(matches!(run("", false).await.0, Err(BackendError::Closed)));
    }

    #[tokio::test]
    async fn an_always_answer_is_recorded_before_the_gateway_hears_it() {
        use crate::backend::Backend as _;
        let (dir, path, listener) = ask_socket("always");
        let served = std::sync::Arc::new(std::sync::Mutex::new(Served::default()));
        // Keys through a pipe, typed once the prompt is drawn; a line typed
        // before it (`n`, stale) is discarded at the prompt's start.
        let (mut key_w, key_r) = tokio::io::duplex(64);
        let (out_w, out_r) = tokio::io::duplex(4096);
        key_w.write_all(b"n\n").await.unwrap();
        let server = tokio::spawn(serve(
            listener,
            Mode::Prompt(tokio::io::BufReader::new(key_r), out_w),
            std::sync::Arc::clone(&served),
        ));
        let mut screen = out_r;
        let backend = super::super::unix::UnixBackend::new(&path);
        let question = plain();
        for (key, want) in [
            (&b"files.example.org\n"[..], Choice::AllowAlways),
            (&b"o\n"[..], Choice::AllowOnce),
        ] {
            let asking = {
                let (backend, question) = (backend.clone(), question.clone());
                tokio::spawn(async move { backend.ask(&question).await })
            };
            let mut seen = String::new();
            while !seen.contains("choice> ") {
                let mut chunk = [0u8; 256];
                let n = tokio::io::AsyncReadExt::read(&mut screen, &mut chunk)
                    .await
                    .unwrap();
                assert!(n > 0, "{seen}");
                seen.push_str(&String::from_utf8_lossy(&chunk[..n]));
            }
            key_w.write_all(key).await.unwrap();
            let a = asking.await.unwrap().unwrap();
            assert_eq!(a.decision, want);
            if want == Choice::AllowAlways {
                // Recorded by the time the answer arrived.
                assert_eq!(served.lock().unwrap().always, vec![question.name.clone()]);
            }
        }
        let mut s = served.lock().unwrap();
        assert!(s.take_always(&question.name));
        assert!(!s.take_always(&question.name));
        assert!(!s.take_always("other.example"));
        drop(s);
        server.abort();
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The gateway's side of one question, by hand: connected, the
    /// question written, the connection kept (dropping it hangs up).
    async fn raw_ask(path: &std::path::Path, q: &Question) -> tokio::net::UnixStream {
        let mut c = tokio::net::UnixStream::connect(path).await.unwrap();
        c.write_all(&q.to_line().unwrap()).await.unwrap();
        c
    }

    /// Reads `screen` until what it showed contains `want`; returns all of it.
    async fn screen_until(screen: &mut tokio::io::DuplexStream, seen: &mut String, want: &str) {
        while !seen.contains(want) {
            let mut chunk = [0u8; 256];
            let n = tokio::io::AsyncReadExt::read(screen, &mut chunk)
                .await
                .unwrap();
            assert!(n > 0, "{seen}");
            seen.push_str(&String::from_utf8_lossy(&chunk[..n]));
        }
    }

    #[tokio::test]
    async fn a_question_the_gateway_withdraws_is_taken_down_and_answers_nothing() {
        let (dir, path, listener) = ask_socket("withdrawn");
        let served = std::sync::Arc::new(std::sync::Mutex::new(Served::default()));
        let (mut key_w, key_r) = tokio::io::duplex(64);
        let (out_w, mut screen) = tokio::io::duplex(1 << 16);
        let share = Ends::default();
        let server = serve_shared(
            listener,
            Mode::Prompt(tokio::io::BufReader::new(key_r), out_w),
            std::sync::Arc::clone(&served),
            &share,
        );
        let body = async {
            let mut seen = String::new();
            let gateway = raw_ask(&path, &plain()).await;
            screen_until(&mut screen, &mut seen, "choice> ").await;
            // The gateway gives up (its timeout): the question comes down
            // and the held output is released, with no key typed.
            drop(gateway);
            screen_until(&mut screen, &mut seen, "withdrew the question").await;
            while share.calls.lock().unwrap().len() < 2 {
                tokio::task::yield_now().await;
            }
            assert_eq!(*share.calls.lock().unwrap(), vec!["begin", "end"]);
            // A later question is drawn and answered as usual; the key
            // typed for it is not taken for the one withdrawn.
            let mut seen = std::mem::take(&mut seen);
            let mut later = String::new();
            let mut gateway = raw_ask(&path, &plain()).await;
            screen_until(&mut screen, &mut later, "choice> ").await;
            key_w.write_all(b"o\n").await.unwrap();
            let mut r = tokio::io::BufReader::new(&mut gateway);
            let line = read_line(&mut r).await.unwrap();
            assert_eq!(Answer::parse(&line).unwrap().decision, Choice::AllowOnce);
            screen_until(
                &mut screen,
                &mut later,
                "sluice: allow_once files.example.org",
            )
            .await;
            seen.push_str(&later);
            seen
        };
        let seen = bounded(async {
            tokio::select! {
                () = server => panic!("the server stopped"),
                seen = body => seen,
            }
        })
        .await;
        assert_eq!(seen.matches("allow_once").count(), 1, "{seen}");
        let s = served.lock().unwrap().clone();
        assert_eq!((s.prompted, s.withdrawn), (1, 1), "{s:?}");
        assert!(s.always.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_question_past_its_timeout_is_taken_down_and_answers_nothing() {
        let (dir, path, listener) = ask_socket("late");
        let served = std::sync::Arc::new(std::sync::Mutex::new(Served::default()));
        let (_key_w, key_r) = tokio::io::duplex(64);
        let (out_w, mut screen) = tokio::io::duplex(1 << 16);
        let share = Ends::default();
        let server = serve_shared(
            listener,
            Mode::Prompt(tokio::io::BufReader::new(key_r), out_w),
            std::sync::Arc::clone(&served),
            &share,
        );
        let body = async {
            let mut seen = String::new();
            // A gateway that keeps the connection but said it waits 500 ms.
            let q = Question {
                timeout_ms: 500,
                ..plain()
            };
            let mut gateway = raw_ask(&path, &q).await;
            screen_until(&mut screen, &mut seen, "not answered in time, denied").await;
            // Nothing answered: the connection just ends.
            let mut rest = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut gateway, &mut rest)
                .await
                .unwrap();
            assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
            seen
        };
        let seen = bounded(async {
            tokio::select! {
                () = server => panic!("the server stopped"),
                seen = body => seen,
            }
        })
        .await;
        assert!(
            seen.contains("sluice: files.example.org: not answered in time"),
            "{seen}"
        );
        assert_eq!(served.lock().unwrap().withdrawn, 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_question_whose_gateway_hung_up_while_it_waited_is_never_drawn() {
        let (dir, path, listener) = ask_socket("stale");
        let served = std::sync::Arc::new(std::sync::Mutex::new(Served::default()));
        let (mut key_w, key_r) = tokio::io::duplex(64);
        let (out_w, mut screen) = tokio::io::duplex(1 << 16);
        // Asked and given up on before the prompt got to it (it waited in
        // the listener's backlog behind another question).
        let stale = Question {
            name: "stale.example.org".into(),
            ..plain()
        };
        drop(raw_ask(&path, &stale).await);
        let share = Ends::default();
        let server = serve_shared(
            listener,
            Mode::Prompt(tokio::io::BufReader::new(key_r), out_w),
            std::sync::Arc::clone(&served),
            &share,
        );
        let body = async {
            let mut seen = String::new();
            let mut gateway = raw_ask(&path, &plain()).await;
            screen_until(&mut screen, &mut seen, "choice> ").await;
            key_w.write_all(b"d\n").await.unwrap();
            let mut r = tokio::io::BufReader::new(&mut gateway);
            let line = read_line(&mut r).await.unwrap();
            assert_eq!(Answer::parse(&line).unwrap().decision, Choice::DenyOnce);
            screen_until(&mut screen, &mut seen, "sluice: deny_once").await;
            seen
        };
        let seen = bounded(async {
            tokio::select! {
                () = server => panic!("the server stopped"),
                seen = body => seen,
            }
        })
        .await;
        assert!(!seen.contains("stale.example.org"), "{seen}");
        assert_eq!(*share.calls.lock().unwrap(), vec!["begin", "end"]);
        let s = served.lock().unwrap().clone();
        assert_eq!((s.prompted, s.withdrawn), (1, 1), "{s:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_peer_that_sends_no_question_is_dropped_and_the_next_is_asked() {
        let (dir, path, listener) = ask_socket("silent");
        let served = std::sync::Arc::new(std::sync::Mutex::new(Served::default()));
        let (mut key_w, key_r) = tokio::io::duplex(64);
        let (out_w, mut screen) = tokio::io::duplex(1 << 16);
        // Connected first, holding its connection open, sending nothing.
        let mut silent = tokio::net::UnixStream::connect(&path).await.unwrap();
        let share = Ends::default();
        let server = serve_shared(
            listener,
            Mode::Prompt(tokio::io::BufReader::new(key_r), out_w),
            std::sync::Arc::clone(&served),
            &share,
        );
        let body = async {
            let mut gateway = raw_ask(&path, &plain()).await;
            // The silent peer is hung up on (after `QUESTION_READ`) ...
            let mut rest = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut silent, &mut rest)
                .await
                .unwrap();
            assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
            // ... and the question behind it is asked and answered.
            let mut seen = String::new();
            screen_until(&mut screen, &mut seen, "choice> ").await;
            key_w.write_all(b"d\n").await.unwrap();
            let mut r = tokio::io::BufReader::new(&mut gateway);
            let line = read_line(&mut r).await.unwrap();
            assert_eq!(Answer::parse(&line).unwrap().decision, Choice::DenyOnce);
        };
        bounded(async {
            tokio::select! {
                () = server => panic!("the server stopped"),
                () = body => {}
            }
        })
        .await;
        assert_eq!(*share.calls.lock().unwrap(), vec!["begin", "end"]);
        assert_eq!(served.lock().unwrap().prompted, 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn an_always_typed_as_the_gateway_gives_up_is_not_recorded_nor_confirmed() {
        let (dir, path, listener) = ask_socket("late-always");
        let served = std::sync::Arc::new(std::sync::Mutex::new(Served::default()));
        let (mut key_w, key_r) = tokio::io::duplex(64);
        let (out_w, mut screen) = tokio::io::duplex(1 << 16);
        let share = Ends::default();
        let server = serve_shared(
            listener,
            Mode::Prompt(tokio::io::BufReader::new(key_r), out_w),
            std::sync::Arc::clone(&served),
            &share,
        );
        let body = async {
            let mut seen = String::new();
            let gateway = raw_ask(&path, &plain()).await;
            screen_until(&mut screen, &mut seen, "choice> ").await;
            // The gateway hangs up and the name is typed, before the
            // prompt runs again: whichever it sees first, nothing is
            // answered, confirmed or recorded.
            drop(gateway);
            key_w.write_all(b"files.example.org\n").await.unwrap();
            screen_until(&mut screen, &mut seen, "withdrew the question").await;
            while share.calls.lock().unwrap().len() < 2 {
                tokio::task::yield_now().await;
            }
            seen
        };
        let seen = bounded(async {
            tokio::select! {
                () = server => panic!("the server stopped"),
                seen = body => seen,
            }
        })
        .await;
        assert!(!seen.contains("allow_always"), "{seen}");
        let s = served.lock().unwrap().clone();
        assert!(s.always.is_empty(), "{s:?}");
        assert_eq!(s.withdrawn, 1);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

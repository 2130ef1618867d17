//! The terminal backend: the question on a terminal, one key (and Enter)
//! per choice. The launcher runs it for `sluice run --ask`, answering the
//! gateway over a unix socket ([`super::unix::serve_one`]); one prompt at a
//! time.
//!
//! The prompt shows the exact name and the ports an approval opens. The
//! name is printed with every character outside printable ASCII escaped, so
//! a hostile name cannot move the cursor or rewrite the prompt. Input that
//! is not a key is asked again, three times at most, then denied.

use std::sync::atomic::{AtomicBool, Ordering};

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

/// The key for each choice offered.
fn choice_for(key: &str, always: bool) -> Option<Choice> {
    match key.trim() {
        "o" | "O" => Some(Choice::AllowOnce),
        "s" | "S" => Some(Choice::AllowSandbox),
        "a" | "A" if always => Some(Choice::AllowAlways),
        "d" | "D" => Some(Choice::DenyOnce),
        "n" | "N" => Some(Choice::DenySandbox),
        _ => None,
    }
}

/// Shows `q` on `out` and reads the choice from `input`.
///
/// # Errors
/// The terminal closed or failed; the caller denies.
pub async fn prompt<R, W>(q: &Question, input: &mut R, out: &mut W) -> Result<Answer, BackendError>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let always = if q.always_allowed {
        "  [a] always (writes the policy's .approved.yaml)\n"
    } else {
        ""
    };
    // A flood of names is one line here, never a prompt each.
    let refused = match q.refused_since {
        0 => String::new(),
        n => format!(
            "\nsluice: {n} other name(s) refused without asking (too many questions; see the audit log)"
        ),
    };
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
    for _ in 0..ATTEMPTS {
        out.write_all(b"choice> ").await.map_err(BackendError::Io)?;
        out.flush().await.map_err(BackendError::Io)?;
        let line = read_line(input).await?;
        let key = String::from_utf8_lossy(&line);
        if let Some(choice) = choice_for(&key, q.always_allowed) {
            let msg = format!("sluice: {} {}\n", choice.as_str(), printable(&q.name));
            out.write_all(msg.as_bytes())
                .await
                .map_err(BackendError::Io)?;
            return Ok(Answer {
                decision: choice,
                by: Some("terminal".into()),
            });
        }
        out.write_all(b"sluice: press o, s, d or n, then Enter\n")
            .await
            .map_err(BackendError::Io)?;
    }
    out.write_all(b"sluice: no choice; denied\n")
        .await
        .map_err(BackendError::Io)?;
    Ok(Answer {
        decision: Choice::DenyOnce,
        by: Some("terminal: no choice".into()),
    })
}

/// Discards what `input` holds ready now: its buffer and what its source
/// can give without waiting. Only a source whose readiness is known without
/// reading (a pipe or terminal as `tokio::net::unix::pipe::Receiver`) is
/// drained; a blocking file's read started here would deliver its bytes to
/// the prompt later.
async fn discard_ready<R: AsyncBufRead + Unpin>(input: &mut R) {
    loop {
        let ready = std::future::poll_fn(|cx| {
            std::task::Poll::Ready(match std::pin::Pin::new(&mut *input).poll_fill_buf(cx) {
                std::task::Poll::Ready(Ok(buf)) if !buf.is_empty() => Some(buf.len()),
                _ => None,
            })
        })
        .await;
        match ready {
            Some(n) => std::pin::Pin::new(&mut *input).consume(n),
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
/// the question and every later one.
pub async fn serve<R, W>(
    listener: tokio::net::UnixListener,
    mode: Mode<R, W>,
    served: std::sync::Arc<std::sync::Mutex<Served>>,
) where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    serve_routed(listener, mode, served, &AtomicBool::new(false)).await;
}

/// As [`serve`], and `pending` is true exactly while a prompt is shown and
/// waits for its key: a caller whose terminal is also another reader's
/// input (the guest's stdin under `sluice run --ask`) routes the keys typed
/// meanwhile to the prompt's input, and to the other reader otherwise.
pub async fn serve_routed<R, W>(
    listener: tokio::net::UnixListener,
    mut mode: Mode<R, W>,
    served: std::sync::Arc<std::sync::Mutex<Served>>,
    pending: &AtomicBool,
) where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    while let Ok((stream, _)) = listener.accept().await {
        let mut prompted = false;
        let mut failed = None;
        let answer = super::unix::serve_one(stream, |q| {
            let (mode, prompted, failed) = (&mut mode, &mut prompted, &mut failed);
            let served = &served;
            async move {
                match mode {
                    Mode::Prompt(input, out) => {
                        // A line typed after the last answer (or before
                        // this question) must not answer it.
                        discard_ready(input).await;
                        *prompted = true;
                        pending.store(true, Ordering::SeqCst);
                        let asked = prompt(&q, input, out).await;
                        pending.store(false, Ordering::SeqCst);
                        match asked {
                            Ok(a) => {
                                if a.decision == Choice::AllowAlways
                                    && let Ok(mut s) = served.lock()
                                {
                                    s.always.push(q.name.clone());
                                }
                                a
                            }
                            Err(e) => {
                                *failed = Some(e.to_string());
                                Answer {
                                    decision: Choice::DenyOnce,
                                    by: Some("terminal: failed".into()),
                                }
                            }
                        }
                    }
                    Mode::AutoDeny(why) => Answer {
                        decision: Choice::DenyOnce,
                        by: Some(format!("auto-denied: {why}")),
                    },
                }
            }
        })
        .await;
        if let Err(e) = answer {
            tracing::debug!(error = %e, "approval question not served");
        }
        if let Ok(mut s) = served.lock() {
            if prompted {
                s.prompted += 1;
            } else {
                s.auto_denied += 1;
            }
        }
        if let Some(why) = failed {
            mode = Mode::AutoDeny(format!("the terminal failed: {why}"));
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
        }
    }

    async fn run(input: &str, always: bool) -> (Result<Answer, BackendError>, String) {
        let mut r = tokio::io::BufReader::new(input.as_bytes());
        let mut out = Vec::new();
        let a = prompt(&q(always), &mut r, &mut out).await;
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
            run("a\n", true).await.0.unwrap().decision,
            Choice::AllowAlways
        );
    }

    #[tokio::test]
    async fn always_is_not_offered_unless_allowed() {
        let (a, out) = run("a\na\na\n", false).await;
        assert_eq!(a.unwrap().decision, Choice::DenyOnce);
        assert!(!out.contains("[a]"));
    }

    #[tokio::test]
    async fn the_prompt_shows_the_exact_host_escaped_and_the_ports() {
        let (_, out) = run("d\n", false).await;
        assert!(out.contains("evil\\u{1b}[2J.example"), "{out}");
        assert!(!out.contains('\u{1b}'));
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
        prompt(&q, &mut r, &mut out).await.unwrap();
        let out = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = out
            .lines()
            .filter(|l| l.contains("refused without asking"))
            .collect();
        assert_eq!(lines.len(), 1, "{out}");
        assert!(lines[0].contains("312 other name(s)"), "{out}");
    }

    #[tokio::test]
    async fn a_closed_terminal_is_an_error() {
        assert!(matches!(run("", false).await.0, Err(BackendError::Closed)));
    }

    #[tokio::test]
    async fn an_always_answer_is_recorded_before_the_gateway_hears_it() {
        use crate::backend::Backend as _;
        let dir = std::env::temp_dir().join(format!("sluice-term-always-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ask.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
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
        let question = q(true);
        for (key, want) in [
            (&b"a\n"[..], Choice::AllowAlways),
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
}

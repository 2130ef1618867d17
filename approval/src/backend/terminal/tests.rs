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

/// `q` prompted on a terminal nobody shares that types `input`: the
/// answer and everything the prompt wrote.
async fn run_q(q: &Question, input: &str) -> (Result<Answer, BackendError>, String) {
    let mut r = tokio::io::BufReader::new(input.as_bytes());
    let mut out = Vec::new();
    let a = prompt(q, &mut r, &mut out, Duration::ZERO, &NotShared).await;
    (a, String::from_utf8(out).unwrap())
}

/// As [`run_q`], for the hostile name of [`q`].
async fn run(input: &str, always: bool) -> (Result<Answer, BackendError>, String) {
    run_q(&q(always), input).await
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
    let (a, out) = run_q(&q, "d\n").await;
    a.unwrap();
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

/// The prompt's terminal as a test drives it: keys typed into one pipe,
/// the screen read from another, and the question socket a gateway
/// connects to.
struct Tty {
    /// The question socket (`ask.sock`).
    path: std::path::PathBuf,
    keys: tokio::io::DuplexStream,
    screen: tokio::io::DuplexStream,
    /// Everything the screen showed so far.
    seen: String,
    /// Where in `seen` [`Tty::until`] starts looking.
    mark: usize,
}

impl Tty {
    /// Reads the screen until what it showed since the last
    /// [`Tty::mark`] contains `want`.
    async fn until(&mut self, want: &str) {
        while !self.seen[self.mark..].contains(want) {
            let mut chunk = [0u8; 256];
            let n = tokio::io::AsyncReadExt::read(&mut self.screen, &mut chunk)
                .await
                .unwrap();
            assert!(n > 0, "{}", self.seen);
            self.seen.push_str(&String::from_utf8_lossy(&chunk[..n]));
        }
    }

    /// From now on [`Tty::until`] looks only at what is shown next.
    fn mark(&mut self) {
        self.mark = self.seen.len();
    }

    async fn type_keys(&mut self, keys: &[u8]) {
        self.keys.write_all(keys).await.unwrap();
    }

    /// The gateway's side of one question, by hand: connected, the
    /// question written, the connection kept (dropping it hangs up).
    async fn ask(&self, q: &Question) -> tokio::net::UnixStream {
        let mut c = tokio::net::UnixStream::connect(&self.path).await.unwrap();
        c.write_all(&q.to_line().unwrap()).await.unwrap();
        c
    }
}

/// The answer a gateway connected with [`Tty::ask`] reads.
async fn answer_on(gateway: &mut tokio::net::UnixStream) -> Choice {
    let mut r = tokio::io::BufReader::new(gateway);
    let line = read_line(&mut r).await.unwrap();
    Answer::parse(&line).unwrap().decision
}

/// Fails unless `peer` is hung up on with nothing written to it.
async fn hung_up_unanswered(peer: &mut tokio::net::UnixStream) {
    let mut rest = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(peer, &mut rest)
        .await
        .unwrap();
    assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
}

/// The question server of `sluice run --ask` for one test: a fresh
/// directory with a listener on its `ask.sock`, prompting on a [`Tty`]
/// shared with [`Ends`]. The directory is removed when it drops.
struct Rig {
    dir: std::path::PathBuf,
    served: std::sync::Arc<std::sync::Mutex<Served>>,
    share: Ends,
    server: Option<(
        tokio::net::UnixListener,
        Mode<tokio::io::BufReader<tokio::io::DuplexStream>, tokio::io::DuplexStream>,
    )>,
    tty: Tty,
}

impl Rig {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("sluice-term-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ask.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let (keys, key_r) = tokio::io::duplex(64);
        let (out_w, screen) = tokio::io::duplex(1 << 16);
        Self {
            dir,
            served: std::sync::Arc::default(),
            share: Ends::default(),
            server: Some((
                listener,
                Mode::Prompt(tokio::io::BufReader::new(key_r), out_w),
            )),
            tty: Tty {
                path,
                keys,
                screen,
                seen: String::new(),
                mark: 0,
            },
        }
    }

    /// Runs `body` beside the server, within a minute, and returns what
    /// it returns; the server stopping first fails the test. The server's
    /// future is not Send (its terminal share's is not): it runs beside
    /// the body, not on a task of its own. Once only: the server ends
    /// with it (its end of the screen closes).
    async fn serving<T>(&mut self, body: impl AsyncFnOnce(&mut Tty, &Ends) -> T) -> T {
        let (listener, mode) = self.server.take().expect("the server runs once");
        let server = serve_shared(
            listener,
            mode,
            std::sync::Arc::clone(&self.served),
            &self.share,
        );
        let body = body(&mut self.tty, &self.share);
        bounded(async {
            tokio::select! {
                () = server => panic!("the server stopped"),
                out = body => out,
            }
        })
        .await
    }

    fn served(&self) -> Served {
        self.served.lock().unwrap().clone()
    }

    fn calls(&self) -> Vec<&'static str> {
        self.share.calls.lock().unwrap().clone()
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Waits until the prompt has begun and ended once (the answer or the
/// withdrawal is shown before `end` is called).
async fn ended_once(share: &Ends) {
    while share.calls.lock().unwrap().len() < 2 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn the_runs_end_denies_the_question_shown_and_every_later_one() {
    use crate::backend::Backend as _;
    let mut rig = Rig::new("ends");
    rig.serving(async |tty, share| {
        let backend = super::super::unix::UnixBackend::new(&tty.path);
        let asking = {
            let backend = backend.clone();
            tokio::spawn(async move { backend.ask(&q(true)).await })
        };
        tty.until("choice> ").await;
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
    })
    .await;
    let mut rest = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut rig.tty.screen, &mut rest)
        .await
        .unwrap();
    let rest = String::from_utf8_lossy(&rest);
    assert!(rest.contains("the run ended"), "{rest}");
    assert!(!rest.contains("wants to reach"), "{rest}");
    assert!(rig.served().always.is_empty());
}

#[tokio::test]
async fn an_always_answer_is_recorded_before_the_gateway_hears_it() {
    use crate::backend::Backend as _;
    let mut rig = Rig::new("always");
    // A line typed before the prompt is drawn (`n`, stale) is discarded
    // at the prompt's start.
    rig.tty.type_keys(b"n\n").await;
    let served = std::sync::Arc::clone(&rig.served);
    let question = plain();
    rig.serving(async |tty, _| {
        let backend = super::super::unix::UnixBackend::new(&tty.path);
        for (key, want) in [
            (&b"files.example.org\n"[..], Choice::AllowAlways),
            (&b"o\n"[..], Choice::AllowOnce),
        ] {
            let asking = {
                let (backend, question) = (backend.clone(), question.clone());
                tokio::spawn(async move { backend.ask(&question).await })
            };
            tty.mark();
            tty.until("choice> ").await;
            tty.type_keys(key).await;
            let a = asking.await.unwrap().unwrap();
            assert_eq!(a.decision, want);
            if want == Choice::AllowAlways {
                // Recorded by the time the answer arrived.
                assert_eq!(served.lock().unwrap().always, vec![question.name.clone()]);
            }
        }
    })
    .await;
    let mut s = rig.served.lock().unwrap();
    assert!(s.take_always(&question.name));
    assert!(!s.take_always(&question.name));
    assert!(!s.take_always("other.example"));
}

#[tokio::test]
async fn a_question_the_gateway_withdraws_is_taken_down_and_answers_nothing() {
    let mut rig = Rig::new("withdrawn");
    rig.serving(async |tty, share| {
        let gateway = tty.ask(&plain()).await;
        tty.until("choice> ").await;
        // The gateway gives up (its timeout): the question comes down
        // and the held output is released, with no key typed.
        drop(gateway);
        tty.until("withdrew the question").await;
        ended_once(share).await;
        assert_eq!(*share.calls.lock().unwrap(), vec!["begin", "end"]);
        // A later question is drawn and answered as usual; the key
        // typed for it is not taken for the one withdrawn.
        tty.mark();
        let mut gateway = tty.ask(&plain()).await;
        tty.until("choice> ").await;
        tty.type_keys(b"o\n").await;
        assert_eq!(answer_on(&mut gateway).await, Choice::AllowOnce);
        tty.until("sluice: allow_once files.example.org").await;
    })
    .await;
    let seen = &rig.tty.seen;
    assert_eq!(seen.matches("allow_once").count(), 1, "{seen}");
    let s = rig.served();
    assert_eq!((s.prompted, s.withdrawn), (1, 1), "{s:?}");
    assert!(s.always.is_empty());
}

#[tokio::test]
async fn a_question_past_its_timeout_is_taken_down_and_answers_nothing() {
    let mut rig = Rig::new("late");
    rig.serving(async |tty, _| {
        // A gateway that keeps the connection but said it waits 500 ms.
        let q = Question {
            timeout_ms: 500,
            ..plain()
        };
        let mut gateway = tty.ask(&q).await;
        tty.until("not answered in time, denied").await;
        // Nothing answered: the connection just ends.
        hung_up_unanswered(&mut gateway).await;
    })
    .await;
    let seen = &rig.tty.seen;
    assert!(
        seen.contains("sluice: files.example.org: not answered in time"),
        "{seen}"
    );
    assert_eq!(rig.served().withdrawn, 1);
}

#[tokio::test]
async fn a_question_whose_gateway_hung_up_while_it_waited_is_never_drawn() {
    let mut rig = Rig::new("stale");
    // Asked and given up on before the prompt got to it (it waited in
    // the listener's backlog behind another question).
    let stale = Question {
        name: "stale.example.org".into(),
        ..plain()
    };
    drop(rig.tty.ask(&stale).await);
    rig.serving(async |tty, _| {
        let mut gateway = tty.ask(&plain()).await;
        tty.until("choice> ").await;
        tty.type_keys(b"d\n").await;
        assert_eq!(answer_on(&mut gateway).await, Choice::DenyOnce);
        tty.until("sluice: deny_once").await;
    })
    .await;
    let seen = &rig.tty.seen;
    assert!(!seen.contains("stale.example.org"), "{seen}");
    assert_eq!(rig.calls(), vec!["begin", "end"]);
    let s = rig.served();
    assert_eq!((s.prompted, s.withdrawn), (1, 1), "{s:?}");
}

#[tokio::test]
async fn a_peer_that_sends_no_question_is_dropped_and_the_next_is_asked() {
    let mut rig = Rig::new("silent");
    // Connected first, holding its connection open, sending nothing.
    let mut silent = tokio::net::UnixStream::connect(&rig.tty.path)
        .await
        .unwrap();
    rig.serving(async |tty, _| {
        let mut gateway = tty.ask(&plain()).await;
        // The silent peer is hung up on (after `QUESTION_READ`) ...
        hung_up_unanswered(&mut silent).await;
        // ... and the question behind it is asked and answered.
        tty.until("choice> ").await;
        tty.type_keys(b"d\n").await;
        assert_eq!(answer_on(&mut gateway).await, Choice::DenyOnce);
    })
    .await;
    assert_eq!(rig.calls(), vec!["begin", "end"]);
    assert_eq!(rig.served().prompted, 1);
}

#[tokio::test]
async fn an_always_typed_as_the_gateway_gives_up_is_not_recorded_nor_confirmed() {
    let mut rig = Rig::new("late-always");
    rig.serving(async |tty, share| {
        let gateway = tty.ask(&plain()).await;
        tty.until("choice> ").await;
        // The gateway hangs up and the name is typed, before the
        // prompt runs again: whichever it sees first, nothing is
        // answered, confirmed or recorded.
        drop(gateway);
        tty.type_keys(b"files.example.org\n").await;
        tty.until("withdrew the question").await;
        ended_once(share).await;
    })
    .await;
    let seen = &rig.tty.seen;
    assert!(!seen.contains("allow_always"), "{seen}");
    let s = rig.served();
    assert!(s.always.is_empty(), "{s:?}");
    assert_eq!(s.withdrawn, 1);
}

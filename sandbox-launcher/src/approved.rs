//! `always` approvals under `sluice run`: the launcher writes the policy's
//! overlay (`POLICY.approved.yaml`, docs/approval.md) for the gateway.
//!
//! The gateway's jail binds the policy's directory read-only, so the
//! gateway cannot write beside the policy. It hands each `always` entry
//! over a unix socket in the run dir (its `--approval-overlay-socket`,
//! `sluice_approval::handoff`) to a thread of the launcher, which places
//! it. The gateway may be compromised, so nothing it sends is trusted: the
//! entry's schema is narrow (a name, its ports, who decided; unknown
//! fields refused); the policy is read afresh and the name must be one it
//! would ask about ([`sluice_policy::CompiledPolicy::would_ask`]: never a
//! platform, metadata, `deny:`, listed or PSL-wildcard-like name), its
//! `approval.always` must be on and the ports among those its `approval:`
//! section opens; the sandbox and the time are the launcher's own. The
//! overlay is written by [`sluice_policy::overlay::append`]: validated as a
//! policy, never through a symlink, replaced by rename inside the policy's
//! directory. Each refusal is one line on stderr (rate-limited: a
//! compromised gateway must not flood the terminal) and the gateway is told,
//! so its audit record says `sandbox`, not `always`. The file is renamed
//! into place only on the gateway's go-ahead after it heard the entry was
//! prepared (`sluice_approval::handoff`): a gateway that gave up waiting
//! gets nothing written, so its audit and the file always agree.
//!
//! With the policy's directory bound (`gateway_inputs`), the running
//! gateway's reload poll sees the new overlay and loads it; the next run
//! reads it with the policy.

use std::fs;
use std::io::{BufRead as _, BufReader, Read as _, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::Context;
use sluice_approval::backend::terminal::{Served, printable};
use sluice_approval::handoff::{HandoffReply, OverlayEntry, is_commit};
use sluice_approval::wire::MAX_MESSAGE_BYTES;
use sluice_policy::CompileOptions;

/// The socket's name in the run dir.
const SOCKET: &str = "approved.sock";

/// How long one connection may take in all, from its accept to the
/// outcome: sending its entry, the policy load, the overlay's lock and its
/// go-ahead. The overlay's directory stays locked from the prepare to the
/// go-ahead, so a gateway trickling bytes must not keep it locked longer
/// (other runs' writers give up on the lock after a few seconds).
const HANDOFF_DEADLINE: Duration = Duration::from_secs(10);

/// Reads from a stream until one deadline: each read may wait only for
/// what is left of it, so a peer sending a byte now and then cannot stretch
/// the connection past it.
struct Deadlined<'a> {
    stream: &'a UnixStream,
    deadline: Instant,
}

/// The error of a read past the deadline.
fn too_late() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!(
            "the hand-off took longer than {} s",
            HANDOFF_DEADLINE.as_secs()
        ),
    )
}

impl std::io::Read for Deadlined<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(too_late());
        }
        self.stream.set_read_timeout(Some(left))?;
        let mut stream = self.stream;
        // A socket's read timeout ends the read with `WouldBlock`.
        stream.read(buf).map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => too_late(),
            _ => e,
        })
    }
}

/// Entries one run takes at most, counted when they reach [`place`]
/// (written, already listed, refused by the policy, or prepared and then
/// abandoned by the gateway): each costs a policy load and may cost an
/// overlay write, and a compromised gateway must neither make the launcher
/// work without bound nor grow the overlay without bound.
pub(crate) const MAX_ENTRIES_PER_RUN: usize = 16;

/// The stderr lines about entries shown at once before the rate limit.
const NOTICE_BURST: u32 = 8;

/// One more stderr line about entries may be shown per this interval once
/// the burst is spent.
const NOTICE_INTERVAL: Duration = Duration::from_secs(10);

/// Which entries this run accepts beyond what the policy allows.
#[derive(Debug)]
struct Gate {
    /// Entries that reached [`place`] so far.
    placed: usize,
    /// Under `--ask`: the launcher's own prompt's record; an entry is
    /// accepted only for a name it answered `always` (taken once).
    /// `None` with a webhook or unix backend, whose answer the launcher
    /// only hears from the gateway.
    prompt: Option<Arc<Mutex<Served>>>,
}

impl Gate {
    /// Why `entry` is refused before the policy is read, if it is.
    fn refuses(&self, entry: &OverlayEntry) -> Option<String> {
        if self.placed >= MAX_ENTRIES_PER_RUN {
            return Some(format!(
                "this run already took {MAX_ENTRIES_PER_RUN} entries, its limit"
            ));
        }
        let prompt = self.prompt.as_ref()?;
        let answered = prompt.lock().is_ok_and(|mut s| s.take_always(&entry.name));
        (!answered)
            .then(|| "the launcher's prompt did not answer `always` for it in this run".into())
    }
}

/// The launcher's stderr lines about the gateway's entries, rate-limited:
/// a compromised gateway may send refused entries as fast as it likes and
/// must not flood the person's terminal. At most `burst` lines at once,
/// then one per `interval`; the lines held back are counted, and the next
/// line shown says how many. (A `written` entry's line is not limited:
/// there are at most [`MAX_ENTRIES_PER_RUN`].)
struct Notices {
    out: Box<dyn Write + Send>,
    burst: u32,
    interval: Duration,
    /// Lines that may be shown now.
    tokens: u32,
    /// When `tokens` was last refilled.
    refilled: Instant,
    /// Lines held back since the last one shown.
    held: u64,
}

impl std::fmt::Debug for Notices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notices")
            .field("tokens", &self.tokens)
            .field("held", &self.held)
            .finish_non_exhaustive()
    }
}

impl Notices {
    fn new(out: Box<dyn Write + Send>, burst: u32, interval: Duration, now: Instant) -> Self {
        Self {
            out,
            burst,
            interval,
            tokens: burst,
            refilled: now,
            held: 0,
        }
    }

    /// Shows `line` at `now` if the rate allows, else counts it.
    fn say(&mut self, now: Instant, line: &str) {
        let periods = now.saturating_duration_since(self.refilled).as_nanos()
            / self.interval.as_nanos().max(1);
        if periods > 0 {
            let gained = u32::try_from(periods).unwrap_or(u32::MAX);
            self.tokens = self.tokens.saturating_add(gained).min(self.burst);
            self.refilled = now;
        }
        if self.tokens == 0 {
            self.held += 1;
            return;
        }
        self.tokens -= 1;
        self.show(line);
    }

    /// Shows `line` whatever the rate, with the count of lines held back.
    fn show(&mut self, line: &str) {
        let _ = match std::mem::take(&mut self.held) {
            0 => writeln!(self.out, "{line}"),
            held => writeln!(
                self.out,
                "{line} ({held} more such lines not shown: too many too fast)"
            ),
        };
    }
}

/// The overlay writer of one run.
#[derive(Debug)]
pub(crate) struct OverlayWriter {
    /// The socket the gateway is given (`--approval-overlay-socket`).
    pub(crate) socket: PathBuf,
}

impl OverlayWriter {
    /// Listens in `run_dir` (only the launcher and the gateway's gid reach
    /// it: see `run::run_dir`) and writes the overlay of `policy` for sandbox `sandbox`
    /// on a thread of its own, one entry at a time, until the process ends,
    /// at most [`MAX_ENTRIES_PER_RUN`]. Under `--ask`, `prompt` is the
    /// prompt's record and only names it answered `always` are written.
    ///
    /// # Errors
    /// The socket cannot be made or handed to the gateway.
    pub(crate) fn start(
        run_dir: &Path,
        policy: PathBuf,
        sandbox: String,
        prompt: Option<Arc<Mutex<Served>>>,
    ) -> anyhow::Result<Self> {
        let notices = Notices::new(
            Box::new(std::io::stderr()),
            NOTICE_BURST,
            NOTICE_INTERVAL,
            Instant::now(),
        );
        Self::start_with(run_dir, policy, sandbox, prompt, notices)
    }

    /// [`OverlayWriter::start`], its lines about entries to `notices`.
    fn start_with(
        run_dir: &Path,
        policy: PathBuf,
        sandbox: String,
        prompt: Option<Arc<Mutex<Served>>>,
        notices: Notices,
    ) -> anyhow::Result<Self> {
        let socket = run_dir.join(SOCKET);
        let listener = UnixListener::bind(&socket)
            .with_context(|| format!("listening on {}", socket.display()))?;
        // The jailed gateway runs as the run dir's owner.
        crate::gateway_inputs::hand_socket_to_jail(&socket, run_dir)?;
        thread::Builder::new()
            .name("sluice-approved".into())
            .spawn(move || {
                let mut gate = Gate { placed: 0, prompt };
                let mut notices = notices;
                for stream in listener.incoming().flatten() {
                    serve(stream, &policy, &sandbox, &mut gate, &mut notices);
                }
            })
            .context("starting the approval overlay thread")?;
        Ok(Self { socket })
    }
}

/// Reads one entry from `stream`, prepares it, and on the gateway's
/// go-ahead writes it; answers at each step, and tells the person on
/// `notices`.
fn serve(stream: UnixStream, policy: &Path, sandbox: &str, gate: &mut Gate, notices: &mut Notices) {
    let deadline = Instant::now() + HANDOFF_DEADLINE;
    let mut lines = BufReader::new(Deadlined {
        stream: &stream,
        deadline,
    });
    let read_line = |lines: &mut BufReader<Deadlined<'_>>| {
        let mut line = Vec::new();
        let limit = u64::try_from(MAX_MESSAGE_BYTES + 1).unwrap_or(u64::MAX);
        lines.take(limit).read_until(b'\n', &mut line).map(|_| line)
    };
    let reply = |r: &HandoffReply| {
        let left = deadline.saturating_duration_since(Instant::now());
        !left.is_zero()
            && stream.set_write_timeout(Some(left)).is_ok()
            && r.to_line()
                .is_ok_and(|bytes| (&stream).write_all(&bytes).is_ok())
    };
    let line = match read_line(&mut lines) {
        Ok(line) => line,
        Err(e) => {
            notices.say(
                Instant::now(),
                &format!("sluice: approval overlay: reading from the gateway: {e}"),
            );
            return;
        }
    };
    let entry = match OverlayEntry::parse(line.trim_ascii()) {
        Ok(entry) => entry,
        Err(e) => {
            let why = format!("not an overlay entry: {e}");
            notices.say(
                Instant::now(),
                &format!(
                    "sluice: approval overlay: refused a message from the gateway: {}",
                    printable(&why)
                ),
            );
            reply(&HandoffReply::Refused(why));
            return;
        }
    };
    let refused = |notices: &mut Notices, why: String| {
        notices.say(
            Instant::now(),
            &format!(
                "sluice: approval overlay: refused {} from the gateway: {}",
                printable(&entry.name),
                printable(&why)
            ),
        );
        HandoffReply::Refused(why)
    };
    let placed = match gate.refuses(&entry) {
        Some(why) => Err(why),
        None => {
            // Counted whatever comes of it: the policy load and the
            // prepared file cost the same when refused or abandoned.
            gate.placed += 1;
            place(policy, sandbox, &entry)
        }
    };
    let (prepared, path) = match placed {
        Err(why) => {
            reply(&refused(notices, why));
            return;
        }
        Ok(Placed::Listed) => {
            reply(&HandoffReply::Written);
            return;
        }
        Ok(Placed::Prepared(prepared, path)) => (prepared, path),
    };
    // Renamed into place only if the gateway still waits for the outcome:
    // otherwise `prepared` is dropped, and with it the temporary file.
    if !reply(&HandoffReply::Prepared) || !read_line(&mut lines).is_ok_and(|l| is_commit(&l)) {
        notices.say(
            Instant::now(),
            &format!(
                "sluice: approval overlay: the gateway gave up on {} before it was written; \
                 nothing written",
                printable(&entry.name)
            ),
        );
        return;
    }
    let outcome = match prepared.commit() {
        Ok(()) => {
            notices.show(&format!(
                "sluice: {} approved always: added to {} (review it and fold it into the policy)",
                printable(&entry.name),
                path.display()
            ));
            HandoffReply::Written
        }
        Err(e) => refused(notices, e.to_string()),
    };
    reply(&outcome);
}

/// What [`place`] did with an entry.
#[derive(Debug)]
pub(crate) enum Placed {
    /// The overlay already lists the name.
    Listed,
    /// The new overlay is ready to replace the one at this path.
    Prepared(Box<sluice_policy::overlay::Prepared>, PathBuf),
}

/// Validates `entry` against the policy at `policy` as it is now and
/// prepares the policy's overlay with it added, or why not.
pub(crate) fn place(policy: &Path, sandbox: &str, entry: &OverlayEntry) -> Result<Placed, String> {
    let first_line = |e: &dyn std::fmt::Display| {
        let text = e.to_string();
        text.lines().next().unwrap_or_default().to_owned()
    };
    // The policy with its overlay must load (an invalid overlay is never
    // rewritten); the checks are against the policy alone, so that a name
    // the overlay already lists is written again as a no-op.
    sluice_policy::load_file(policy, &CompileOptions::default())
        .map_err(|e| format!("the policy does not load: {}", first_line(&e)))?;
    let text = fs::read_to_string(policy)
        .map_err(|e| format!("reading the policy: {}", first_line(&e)))?;
    let compiled = sluice_policy::from_yaml_str(
        &text,
        &policy.display().to_string(),
        &CompileOptions::default(),
    )
    .map_err(|e| format!("the policy does not load: {}", first_line(&e)))?;
    let spec = compiled
        .approval()
        .ok_or("the policy has no `approval:` section")?;
    if !spec.always {
        return Err("the policy's `approval.always` is off".into());
    }
    match sluice_policy::normalize_name(&entry.name) {
        Ok(n) if n.as_str() == entry.name => {}
        _ => return Err("not a normalised DNS name".into()),
    }
    if !compiled.would_ask(&entry.name) {
        let verdict = compiled.check_name(&entry.name);
        return Err(format!(
            "the policy would not ask about it ({}), so no approval may open it",
            verdict.reason
        ));
    }
    let within = |given: &[u16], opened: &[u16]| given.iter().all(|p| opened.contains(p));
    if !within(&entry.tcp_ports, &spec.tcp_ports) || !within(&entry.udp_ports, &spec.udp_ports) {
        return Err(format!(
            "ports TCP {:?} UDP {:?} are not among those the `approval:` section opens (TCP {:?} UDP {:?})",
            entry.tcp_ports, entry.udp_ports, spec.tcp_ports, spec.udp_ports
        ));
    }
    // `by` goes into the overlay a person reviews: no control, bidi or
    // line-separator characters that could disguise it.
    if !entry.by.chars().all(|c| c == ' ' || c.is_ascii_graphic()) {
        return Err("`by` holds characters other than printable ASCII".into());
    }
    let at = serde_json::to_value(sluice_policy::audit::Timestamp::now())
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    let prepared = sluice_policy::overlay::prepare(
        policy,
        &sluice_policy::overlay::Approved {
            name: &entry.name,
            tcp_ports: &entry.tcp_ports,
            udp_ports: &entry.udp_ports,
            by: &entry.by,
            sandbox,
            at: &at,
        },
    )
    .map_err(|e| e.to_string())?;
    let path = sluice_policy::overlay::overlay_path(policy);
    Ok(match prepared {
        Some(p) => Placed::Prepared(Box::new(p), path),
        None => Placed::Listed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Tmp(PathBuf);
    impl Drop for Tmp {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn policy(tag: &str, always: bool) -> (Tmp, PathBuf) {
        let d = std::env::temp_dir().join(format!("sluice-approved-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        let p = d.join("p.yaml");
        fs::write(
            &p,
            format!(
                "version: 1\nid: p\nunlisted: ask\napproval:\n  backend: terminal\n  always: {always}\n  \
                 ports: [443]\nallow:\n  - domain: listed.example.com\ndeny:\n  - blocked.example.com\n"
            ),
        )
        .unwrap();
        (Tmp(d), p)
    }

    /// The writer of sandbox `sb` for the policy `p`, its socket in `t`'s
    /// `run/`.
    fn writer(t: &Tmp, p: &Path, served: Option<Arc<Mutex<Served>>>) -> OverlayWriter {
        let run = t.0.join("run");
        fs::create_dir(&run).unwrap();
        OverlayWriter::start(&run, p.to_path_buf(), "sb".into(), served).unwrap()
    }

    fn entry(name: &str, tcp: &[u16]) -> OverlayEntry {
        OverlayEntry {
            name: name.into(),
            tcp_ports: tcp.to_vec(),
            udp_ports: vec![],
            by: "unix".into(),
        }
    }

    /// [`place`], and the prepared file committed.
    fn write(policy: &Path, sandbox: &str, e: &OverlayEntry) -> Result<PathBuf, String> {
        match place(policy, sandbox, e)? {
            Placed::Listed => Ok(sluice_policy::overlay::overlay_path(policy)),
            Placed::Prepared(prepared, path) => {
                prepared.commit().map_err(|e| e.to_string())?;
                Ok(path)
            }
        }
    }

    #[test]
    fn a_plain_miss_is_written_and_loads_with_the_policy() {
        let (_t, p) = policy("ok", true);
        let path = write(&p, "sb-1", &entry("new.example.com", &[443])).unwrap();
        assert_eq!(path, sluice_policy::overlay::overlay_path(&p));
        let text = fs::read_to_string(&path).unwrap();
        assert!(
            text.contains("new.example.com") && text.contains("sandbox sb-1"),
            "{text}"
        );
        let loaded = sluice_policy::load_file(&p, &CompileOptions::default()).unwrap();
        assert!(!loaded.would_ask("new.example.com"), "now listed");
        // Twice is fine, and still one entry.
        assert!(matches!(
            place(&p, "sb-1", &entry("new.example.com", &[443])).unwrap(),
            Placed::Listed
        ));
        assert_eq!(
            fs::read_to_string(&path)
                .unwrap()
                .matches("domain:")
                .count(),
            1
        );
    }

    #[test]
    fn what_the_policy_would_deny_or_never_ask_about_is_refused_unwritten() {
        let (_t, p) = policy("deny", true);
        for (e, why) in [
            (entry("blocked.example.com", &[443]), "would not ask"),
            (entry("listed.example.com", &[443]), "would not ask"),
            (entry("169.254.169.254", &[443]), "would not ask"),
            (entry("co.uk", &[443]), "would not ask"),
            (entry("localhost", &[443]), "would not ask"),
            (entry("*.example.com", &[443]), "normalised"),
            (entry("New.Example.com", &[443]), "normalised"),
            (entry("new.example.com", &[22]), "ports"),
            (
                OverlayEntry {
                    by: "x\ny".into(),
                    ..entry("new.example.com", &[443])
                },
                "printable ASCII",
            ),
            (
                OverlayEntry {
                    by: "unix: \u{202e}evil".into(),
                    ..entry("new.example.com", &[443])
                },
                "printable ASCII",
            ),
        ] {
            let err = place(&p, "sb", &e).unwrap_err();
            assert!(err.contains(why), "{}: {err}", e.name);
        }
        assert!(!sluice_policy::overlay::overlay_path(&p).exists());
        let (_t, p) = policy("off", false);
        let err = place(&p, "sb", &entry("new.example.com", &[443])).unwrap_err();
        assert!(err.contains("always"), "{err}");
    }

    #[test]
    fn a_symlink_in_place_of_the_overlay_is_not_written_through() {
        let (t, p) = policy("link", true);
        let target = t.0.join("target.yaml");
        std::os::unix::fs::symlink(&target, sluice_policy::overlay::overlay_path(&p)).unwrap();
        assert!(place(&p, "sb", &entry("new.example.com", &[443])).is_err());
        assert!(!target.exists());
    }

    #[test]
    fn the_socket_answers_written_or_refused_with_the_reason() {
        let (t, p) = policy("sock", true);
        let w = writer(&t, &p, None);
        let ask = |line: &[u8]| ask_on(&w.socket, line);
        let good = entry("new.example.com", &[443]).to_line().unwrap();
        assert_eq!(ask(&good), HandoffReply::Written);
        let bad = entry("blocked.example.com", &[443]).to_line().unwrap();
        assert!(matches!(ask(&bad), HandoffReply::Refused(_)));
        let extra =
            br#"{"name":"x.example.com","tcp_ports":[443],"udp_ports":[],"by":"u","allow":"*"}
"#;
        assert!(
            matches!(ask(extra), HandoffReply::Refused(w) if w.contains("not an overlay entry"))
        );
    }

    /// Sends `line` as the gateway does; on `prepared`, the go-ahead.
    fn ask_on(socket: &Path, line: &[u8]) -> HandoffReply {
        let mut s = UnixStream::connect(socket).unwrap();
        s.write_all(line).unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut reply = String::new();
        r.read_line(&mut reply).unwrap();
        match HandoffReply::parse(reply.trim().as_bytes()).unwrap() {
            HandoffReply::Prepared => {
                s.write_all(sluice_approval::handoff::COMMIT).unwrap();
                reply.clear();
                r.read_line(&mut reply).unwrap();
                HandoffReply::parse(reply.trim().as_bytes()).unwrap()
            }
            done => done,
        }
    }

    /// The gateway's own side of the hand-off, with its deadline.
    fn hand_off(socket: &Path, e: &OverlayEntry, within: Duration) -> Result<HandoffReply, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let deadline = tokio::time::Instant::now() + within;
            sluice_approval::handoff::hand_off(socket, e, deadline)
                .await
                .map_err(|e| e.to_string())
        })
    }

    #[test]
    fn a_gateway_that_gave_up_waiting_gets_nothing_written() {
        let (t, p) = policy("late", true);
        let w = writer(&t, &p, None);
        let overlay = sluice_policy::overlay::overlay_path(&p);
        // Prepared, then the gateway goes away without its go-ahead.
        let mut s = UnixStream::connect(&w.socket).unwrap();
        s.write_all(&entry("dropped.example.com", &[443]).to_line().unwrap())
            .unwrap();
        let mut reply = String::new();
        BufReader::new(&s).read_line(&mut reply).unwrap();
        assert_eq!(
            HandoffReply::parse(reply.trim().as_bytes()).unwrap(),
            HandoffReply::Prepared
        );
        drop(s);
        // A launcher busy with a connection that sends nothing (it waits
        // HANDOFF_DEADLINE on it, serially): the gateway's deadline passes
        // first, and the entry it sent is never written.
        let stall = UnixStream::connect(&w.socket).unwrap();
        let late = hand_off(
            &w.socket,
            &entry("late.example.com", &[443]),
            Duration::from_secs(1),
        );
        assert!(late.is_err(), "{late:?}");
        drop(stall);
        // Served after both (one at a time): only this one is in the file.
        assert_eq!(
            hand_off(
                &w.socket,
                &entry("kept.example.com", &[443]),
                Duration::from_secs(60)
            ),
            Ok(HandoffReply::Written)
        );
        let text = fs::read_to_string(&overlay).unwrap();
        assert!(text.contains("kept.example.com"), "{text}");
        assert!(
            !text.contains("dropped.example.com") && !text.contains("late.example.com"),
            "written after the gateway gave up: {text}"
        );
        // No temporary file left beside the policy.
        let names: Vec<String> = fs::read_dir(&t.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(!names.iter().any(|n| n.ends_with(".tmp")), "{names:?}");
    }

    #[test]
    fn under_ask_only_a_name_the_prompt_answered_always_is_written_once() {
        let (t, p) = policy("gate", true);
        let served = Arc::new(Mutex::new(Served::default()));
        let w = writer(&t, &p, Some(Arc::clone(&served)));
        // Never answered always: refused, nothing written.
        let never = entry("never.example.com", &[443]).to_line().unwrap();
        assert!(
            matches!(ask_on(&w.socket, &never), HandoffReply::Refused(why) if why.contains("did not answer")),
        );
        assert!(!sluice_policy::overlay::overlay_path(&p).exists());
        // Answered always: written, once.
        served.lock().unwrap().always.push("new.example.com".into());
        let good = entry("new.example.com", &[443]).to_line().unwrap();
        assert_eq!(ask_on(&w.socket, &good), HandoffReply::Written);
        assert!(matches!(ask_on(&w.socket, &good), HandoffReply::Refused(_)));
    }

    #[test]
    fn a_run_writes_at_most_its_limit_of_entries() {
        let (t, p) = policy("cap", true);
        let w = writer(&t, &p, None);
        for i in 0..MAX_ENTRIES_PER_RUN {
            let line = entry(&format!("n{i}.example.com"), &[443])
                .to_line()
                .unwrap();
            assert_eq!(ask_on(&w.socket, &line), HandoffReply::Written, "{i}");
        }
        let line = entry("one-more.example.com", &[443]).to_line().unwrap();
        assert!(
            matches!(ask_on(&w.socket, &line), HandoffReply::Refused(why) if why.contains("limit"))
        );
        let text = fs::read_to_string(sluice_policy::overlay::overlay_path(&p)).unwrap();
        assert_eq!(text.matches("domain:").count(), MAX_ENTRIES_PER_RUN);
    }

    /// A [`Notices`] output the test reads back.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);
    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    impl Captured {
        fn lines(&self) -> Vec<String> {
            String::from_utf8(self.0.lock().unwrap().clone())
                .unwrap()
                .lines()
                .map(str::to_owned)
                .collect()
        }
    }

    #[test]
    fn notices_past_the_burst_are_held_counted_and_let_through_at_the_rate() {
        let out = Captured::default();
        let t0 = Instant::now();
        let mut n = Notices::new(Box::new(out.clone()), 3, Duration::from_secs(10), t0);
        for i in 0..5 {
            n.say(t0, &format!("line {i}"));
        }
        assert_eq!(out.lines(), ["line 0", "line 1", "line 2"]);
        n.say(t0 + Duration::from_secs(9), "held");
        assert_eq!(out.lines().len(), 3, "before the interval");
        n.say(t0 + Duration::from_secs(10), "line 5");
        assert_eq!(
            out.lines()[3],
            "line 5 (3 more such lines not shown: too many too fast)"
        );
        // A long quiet spell refills the burst, no more.
        let later = t0 + Duration::from_secs(3600);
        for i in 0..5 {
            n.say(later, &format!("later {i}"));
        }
        assert_eq!(out.lines().len(), 7);
        // A written entry's line is never held.
        n.show("written");
        assert_eq!(
            out.lines()[7],
            "written (2 more such lines not shown: too many too fast)"
        );
    }

    /// A writer whose lines about entries go to the returned capture (at
    /// most [`NOTICE_BURST`], then one an hour).
    fn captured_writer(t: &Tmp, p: &Path) -> (OverlayWriter, Captured) {
        let run = t.0.join("run");
        fs::create_dir(&run).unwrap();
        let out = Captured::default();
        let notices = Notices::new(
            Box::new(out.clone()),
            NOTICE_BURST,
            Duration::from_secs(3600),
            Instant::now(),
        );
        let w =
            OverlayWriter::start_with(&run, p.to_path_buf(), "sb".into(), None, notices).unwrap();
        (w, out)
    }

    #[test]
    fn a_gateway_sending_junk_fast_gets_a_few_lines_on_stderr_not_one_each() {
        let (t, p) = policy("flood", true);
        let (w, out) = captured_writer(&t, &p);
        for i in 0..50 {
            let junk = format!("{{\"junk\":{i}}}\n");
            assert!(matches!(
                ask_on(&w.socket, junk.as_bytes()),
                HandoffReply::Refused(_)
            ));
        }
        let lines = out.lines();
        assert_eq!(lines.len(), NOTICE_BURST as usize, "{lines:?}");
        assert!(lines[0].contains("refused a message from the gateway"));
        // The next entry written is shown, with the count held back.
        let good = entry("new.example.com", &[443]).to_line().unwrap();
        assert_eq!(ask_on(&w.socket, &good), HandoffReply::Written);
        let last = out.lines().pop().unwrap();
        assert!(
            last.contains("approved always") && last.contains("42 more such lines"),
            "{last}"
        );
    }

    #[test]
    fn entries_refused_by_the_policy_or_abandoned_count_against_the_limit() {
        let (t, p) = policy("count", true);
        let (w, _out) = captured_writer(&t, &p);
        let half = MAX_ENTRIES_PER_RUN / 2;
        for _ in 0..half {
            let bad = entry("blocked.example.com", &[443]).to_line().unwrap();
            assert!(matches!(ask_on(&w.socket, &bad), HandoffReply::Refused(_)));
        }
        // Prepared (a policy load and an overlay write), then abandoned.
        for i in half..MAX_ENTRIES_PER_RUN {
            let mut s = UnixStream::connect(&w.socket).unwrap();
            s.write_all(
                &entry(&format!("n{i}.example.com"), &[443])
                    .to_line()
                    .unwrap(),
            )
            .unwrap();
            let mut reply = String::new();
            BufReader::new(&s).read_line(&mut reply).unwrap();
            assert_eq!(
                HandoffReply::parse(reply.trim().as_bytes()).unwrap(),
                HandoffReply::Prepared
            );
        }
        let good = entry("new.example.com", &[443]).to_line().unwrap();
        assert!(
            matches!(ask_on(&w.socket, &good), HandoffReply::Refused(why) if why.contains("limit"))
        );
        assert!(!sluice_policy::overlay::overlay_path(&p).exists());
    }

    #[test]
    fn a_peer_trickling_bytes_is_cut_off_at_the_deadline() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        // A byte every 50 ms, never a newline: each read alone would end
        // well within any per-read timeout.
        let trickle = thread::spawn(move || {
            let mut theirs = theirs;
            while theirs.write_all(b"x").is_ok() {
                thread::sleep(Duration::from_millis(50));
            }
        });
        let mut lines = BufReader::new(Deadlined {
            stream: &ours,
            deadline: Instant::now() + Duration::from_millis(500),
        });
        let mut line = Vec::new();
        let err = lines.read_until(b'\n', &mut line).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");
        assert!(!line.is_empty(), "the peer's bytes were read until then");
        drop(lines);
        drop(ours);
        trickle.join().unwrap();
    }
}

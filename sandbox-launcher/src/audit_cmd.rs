//! `sluice audit`: read, follow and filter gateway audit logs, like `hubble
//! observe` (docs/audit.md, "Reading the audit: sluice audit").
//!
//! Reads schema-1 and OCSF lines alike ([`entry`]), one or more files,
//! optionally following them across rotation ([`follow`]); keeps what every
//! given filter matches ([`filter`]) and prints one aligned line per
//! decision (coloured on a terminal unless `NO_COLOR` is set), the lines as
//! read (`--json`), or per sandbox the top denied names and reasons and the
//! reloads (`--summary`).
//!
//! A malformed line is reported on stderr as `FILE:N: ...` and skipped;
//! reading goes on. A partial last line (no newline yet: a writer is
//! mid-line) is waited for with `--follow`, and otherwise used if it is a
//! whole record, else reported and left out. Exit status: 0, or 1 when a
//! line was malformed or a file could not be read.

pub mod entry;
pub mod filter;
pub mod follow;

use std::collections::{BTreeMap, HashMap};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};

use entry::Entry;
use filter::Filter;
use follow::Source;

/// How often `--follow` looks for new lines and rotation.
const FOLLOW_POLL: Duration = Duration::from_millis(200);
/// How many names and reasons `--summary` lists per sandbox.
const TOP: usize = 10;

/// `--decision allow|deny`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DecisionArg {
    /// Allowed traffic only.
    Allow,
    /// Denied traffic only.
    Deny,
}

/// Arguments of `sluice audit`.
#[derive(Debug, Args)]
pub struct AuditArgs {
    /// Audit files (schema-1 or OCSF JSON lines, as `sluice-gateway --audit` writes them).
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Keep reading as the files grow, across rotation (until interrupted).
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// Only records of this kind (dns, connection, http, flow_close, policy_reload, summary,
    /// gateway); repeatable.
    #[arg(long, value_name = "K")]
    pub kind: Vec<String>,
    /// Only allowed or only denied decisions.
    #[arg(long, value_enum)]
    pub decision: Option<DecisionArg>,
    /// Only this reason (e.g. not_allowlisted); repeatable.
    #[arg(long, value_name = "R")]
    pub reason: Vec<String>,
    /// Only records about a name matching GLOB (`*`, `?`; the DNS query, SNI or Host).
    #[arg(long, value_name = "GLOB")]
    pub name: Option<String>,
    /// Only this sandbox.
    #[arg(long, value_name = "ID")]
    pub sandbox: Option<String>,
    /// Only decisions at or after TIME: RFC 3339 UTC (2026-11-21T19:20:30Z) or an age (90s,
    /// 15m, 2h, 1d).
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// Print the matching lines as read (JSON, either format).
    #[arg(long, conflicts_with = "summary")]
    pub json: bool,
    /// Per sandbox: decisions, the top denied names and reasons, and the reloads.
    #[arg(long, conflicts_with = "follow")]
    pub summary: bool,
}

/// Runs `sluice audit`; returns the exit status.
pub fn main(args: AuditArgs) -> i32 {
    let now_ms = sluice_policy::audit::Timestamp::now().unix_millis();
    let since_ms = match args
        .since
        .as_deref()
        .map(|s| filter::parse_since(s, now_ms))
    {
        Some(Err(e)) => {
            eprintln!("sluice audit: {e}");
            return 2;
        }
        Some(Ok(t)) => Some(t),
        None => None,
    };
    let filter = Filter {
        kinds: args.kind.clone(),
        deny: args.decision.map(|d| d == DecisionArg::Deny),
        reasons: args.reason.clone(),
        name: args.name.clone(),
        sandbox: args.sandbox.clone(),
        since_ms,
    };
    let colour = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let mode = if args.summary {
        Mode::Summary(BTreeMap::new())
    } else if args.json {
        Mode::Json
    } else {
        Mode::Human { colour }
    };
    let mut viewer = Viewer {
        filter,
        mode,
        failed: false,
    };
    let mut sources: Vec<Source> = args.files.iter().map(|p| Source::new(p)).collect();
    loop {
        for s in &mut sources {
            let mut lines = Vec::new();
            let mut push = |p: &Path, n: u64, t: &str| lines.push((p.to_owned(), n, t.to_owned()));
            let res = s.poll(&mut push).and_then(|()| {
                if args.follow {
                    s.check_rotation(&mut push).map(|_| ())
                } else {
                    Ok(())
                }
            });
            for (p, n, t) in lines {
                viewer.line(&p, n, &t, true);
            }
            match res {
                Ok(()) if !args.follow && s.open().ok() == Some(false) => {
                    eprintln!("sluice audit: {}: no such file", s.path().display());
                    viewer.failed = true;
                }
                Ok(()) => {}
                Err(e) => {
                    eprintln!("sluice audit: {}: {e}", s.path().display());
                    viewer.failed = true;
                }
            }
        }
        if !args.follow {
            break;
        }
        std::thread::sleep(FOLLOW_POLL);
    }
    for s in &mut sources {
        if let Some((n, text)) = s.finish() {
            viewer.line(s.path(), n, &text, false);
        }
    }
    if let Mode::Summary(by_sandbox) = &viewer.mode {
        print_summary(by_sandbox);
    }
    i32::from(viewer.failed)
}

/// What the viewer prints.
enum Mode {
    Human { colour: bool },
    Json,
    Summary(BTreeMap<String, SandboxSummary>),
}

struct Viewer {
    filter: Filter,
    mode: Mode,
    failed: bool,
}

impl Viewer {
    /// One line of a file; `complete`: its newline was read.
    fn line(&mut self, path: &Path, n: u64, text: &str, complete: bool) {
        if text.trim().is_empty() {
            return;
        }
        let e = match Entry::parse(text) {
            Ok(e) => e,
            Err(err) if !complete => {
                eprintln!(
                    "sluice audit: {}:{n}: partial last line (no newline), left out: {err}",
                    path.display()
                );
                return;
            }
            Err(err) => {
                eprintln!(
                    "sluice audit: {}:{n}: malformed audit line: {err}",
                    path.display()
                );
                self.failed = true;
                return;
            }
        };
        if !self.filter.matches(&e) {
            return;
        }
        let mut out = std::io::stdout().lock();
        let res = match &mut self.mode {
            Mode::Human { colour } => writeln!(out, "{}", human_line(&e, *colour)),
            Mode::Json => writeln!(out, "{text}"),
            Mode::Summary(by) => {
                by.entry(e.sandbox.clone()).or_default().add(&e);
                Ok(())
            }
        };
        if res.is_err() {
            // stdout closed (a pager quit): nothing more to show.
            std::process::exit(i32::from(self.failed));
        }
    }
}

/// One aligned line: time, sandbox, decision, kind, reason, subject.
pub fn human_line(e: &Entry, colour: bool) -> String {
    let decision = if e.deny { "DENY " } else { "ALLOW" };
    let decision = match (colour, e.deny) {
        (false, _) => decision.to_owned(),
        (true, true) => format!("\x1b[31m{decision}\x1b[0m"),
        (true, false) => format!("\x1b[32m{decision}\x1b[0m"),
    };
    let mut subject = e.subject.clone();
    if !e.suppressed.is_empty() {
        let parts: Vec<String> = e
            .suppressed
            .iter()
            .map(|(k, r, c)| format!("{k}/{r}={c}"))
            .collect();
        subject = format!("suppressed {}", parts.join(" "));
    }
    format!(
        "{}  {:<12}  {}  {:<13}  {:<24}  {}",
        e.timestamp(),
        e.sandbox,
        decision,
        e.kind,
        e.reason,
        subject
    )
}

/// What `--summary` keeps per sandbox.
#[derive(Debug, Default)]
struct SandboxSummary {
    allowed: u64,
    denied: u64,
    suppressed: u64,
    denied_names: HashMap<String, u64>,
    deny_reasons: HashMap<String, u64>,
    reloads: Vec<(String, String, String)>,
}

impl SandboxSummary {
    fn add(&mut self, e: &Entry) {
        match e.kind.as_str() {
            "summary" => {
                for (_, reason, count) in &e.suppressed {
                    self.suppressed += count;
                    let deny =
                        sluice_policy::Reason::from_name(reason).is_some_and(|r| !r.is_allow());
                    if deny {
                        *self.deny_reasons.entry(reason.clone()).or_default() += count;
                    }
                }
                return;
            }
            "policy_reload" => {
                self.reloads
                    .push((e.timestamp(), e.reason.clone(), e.subject.clone()));
            }
            _ => {}
        }
        if e.deny {
            self.denied += 1;
            *self.deny_reasons.entry(e.reason.clone()).or_default() += 1;
            for n in &e.names {
                *self.denied_names.entry(n.clone()).or_default() += 1;
            }
        } else {
            self.allowed += 1;
        }
    }
}

/// The `TOP` largest counts, largest first, ties by name.
fn top(m: &HashMap<String, u64>) -> Vec<(&str, u64)> {
    let mut v: Vec<(&str, u64)> = m.iter().map(|(k, c)| (k.as_str(), *c)).collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    v.truncate(TOP);
    v
}

fn print_summary(by: &BTreeMap<String, SandboxSummary>) {
    let mut out = String::new();
    for (sandbox, s) in by {
        out.push_str(&format!(
            "sandbox {sandbox}: {} allowed, {} denied, {} suppressed by the rate limit\n",
            s.allowed, s.denied, s.suppressed
        ));
        out.push_str("  top denied names:\n");
        for (n, c) in top(&s.denied_names) {
            out.push_str(&format!("    {c:>8}  {n}\n"));
        }
        out.push_str("  top deny reasons (suppressed included):\n");
        for (r, c) in top(&s.deny_reasons) {
            out.push_str(&format!("    {c:>8}  {r}\n"));
        }
        out.push_str(&format!("  reloads: {}\n", s.reloads.len()));
        for (ts, reason, subject) in &s.reloads {
            out.push_str(&format!("    {ts}  {reason:<15}  {subject}\n"));
        }
    }
    let _ = std::io::stdout().lock().write_all(out.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    const DENY: &str = r#"{"schema":1,"ts":"2026-11-21T19:20:29.990Z","sandbox":"vm-1","kind":"dns","decision":"deny","reason":"not_allowlisted","policy":{"id":"p","version":"v"},"qname":"evil.example","qtype":"A","rcode":"REFUSED"}"#;

    #[test]
    fn human_lines_are_aligned_and_coloured_only_when_asked() {
        let e = Entry::parse(DENY).unwrap();
        let plain = human_line(&e, false);
        assert_eq!(
            plain,
            "2026-11-21T19:20:29.990Z  vm-1          DENY   dns            not_allowlisted           evil.example A -> REFUSED"
        );
        let c = human_line(&e, true);
        assert!(c.contains("\x1b[31mDENY \x1b[0m"), "{c:?}");
        assert!(!plain.contains('\x1b'));
    }

    #[test]
    fn summaries_count_denied_names_reasons_and_suppressed_denials() {
        let mut s = SandboxSummary::default();
        for _ in 0..3 {
            s.add(&Entry::parse(DENY).unwrap());
        }
        let summary = DENY
            .replace("\"kind\":\"dns\"", "\"kind\":\"summary\"")
            .replace("\"decision\":\"deny\"", "\"decision\":\"allow\"")
            .replace("\"not_allowlisted\"", "\"rate_limit_summary\"")
            .replace(
                ",\"qname\":\"evil.example\",\"qtype\":\"A\",\"rcode\":\"REFUSED\"",
                ",\"suppressed\":[{\"kind\":\"dns\",\"reason\":\"not_allowlisted\",\"count\":5},{\"kind\":\"dns\",\"reason\":\"dns_answered\",\"count\":2}]",
            );
        s.add(&Entry::parse(&summary).unwrap());
        assert_eq!((s.allowed, s.denied, s.suppressed), (0, 3, 7));
        assert_eq!(top(&s.denied_names), [("evil.example", 3)]);
        assert_eq!(top(&s.deny_reasons), [("not_allowlisted", 8)]);
    }
}

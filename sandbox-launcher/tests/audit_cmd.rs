//! `sluice audit`, run as the built binary on real files: both formats,
//! filters, `--json`, `--summary`, a malformed line, a partial last line,
//! and `--follow` across a rotation. (A file a real gateway wrote is read in
//! the end-to-end suite `tests/tests/ocsf.rs`.)

#![allow(clippy::unwrap_used, reason = "test helpers: a panic is a failed test")]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use sluice_policy::Reason;
use sluice_policy::audit::{AuditRecord, Kind, PolicyRef, Timestamp};

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("slp-audit-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
    fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn record(kind: Kind, reason: Reason, sandbox: &'static str, ms: i64) -> AuditRecord<'static> {
    AuditRecord::new(
        Timestamp::from_unix_millis(ms).unwrap(),
        sandbox,
        kind,
        reason,
        PolicyRef {
            id: "p".into(),
            version: "v".into(),
            label: None,
        },
    )
}

/// A mixed log: vm-1 asks for two names (one denied twice), connects, a
/// reload is rejected; vm-2 is denied a name. `ocsf` writes it as OCSF.
fn log(ocsf: bool) -> String {
    let t0 = 1_795_288_800_000;
    let mut recs = Vec::new();
    let dns = |reason, name: &'static str, sb, ms| {
        let mut r = record(Kind::Dns, reason, sb, ms).query(name, "A");
        r.rcode = Some(
            if reason == Reason::DnsAnswered {
                "NOERROR"
            } else {
                "REFUSED"
            }
            .into(),
        );
        r
    };
    recs.push(dns(Reason::DnsAnswered, "pypi.org", "vm-1", t0));
    recs.push(dns(
        Reason::NotAllowlisted,
        "evil.example",
        "vm-1",
        t0 + 1000,
    ));
    recs.push(dns(
        Reason::NotAllowlisted,
        "evil.example",
        "vm-1",
        t0 + 2000,
    ));
    recs.push(dns(
        Reason::Denylisted,
        "gist.github.com",
        "vm-2",
        t0 + 3000,
    ));
    recs.push(
        record(Kind::Connection, Reason::Allowlisted, "vm-1", t0 + 4000)
            .flow(1)
            .endpoints(
                sluice_policy::Transport::Tcp,
                "10.0.2.15:40000".parse().unwrap(),
                "151.101.0.223:443".parse().unwrap(),
            )
            .sni("pypi.org"),
    );
    recs.push(
        record(
            Kind::PolicyReload,
            Reason::ReloadRejected,
            "vm-1",
            t0 + 5000,
        )
        .detail("trigger: sighup\npolicy.yaml:2:5: bad"),
    );
    let mut out = String::new();
    for r in &recs {
        if ocsf {
            let mut b = Vec::new();
            sluice_gateway::audit::ocsf::write_line(r, &mut b).unwrap();
            out.push_str(&String::from_utf8(b).unwrap());
        } else {
            out.push_str(&r.to_json());
            out.push('\n');
        }
    }
    out
}

fn sluice(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8(o.stdout).unwrap(),
        String::from_utf8(o.stderr).unwrap(),
    )
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn both_formats_print_the_same_lines() {
    let t = TempDir::new("formats");
    let s1 = t.file("s1.jsonl", &log(false));
    let oc = t.file("ocsf.jsonl", &log(true));
    let (c1, out1, err1) = sluice(&["audit", path(&s1)]);
    let (c2, out2, err2) = sluice(&["audit", path(&oc)]);
    assert_eq!((c1, c2), (0, 0), "{err1}{err2}");
    assert_eq!(out1, out2);
    assert_eq!(out1.lines().count(), 6, "{out1}");
    // Plain (not a terminal): no colour codes; aligned columns.
    assert!(!out1.contains('\x1b'));
    let first = out1.lines().next().unwrap();
    assert!(
        first.starts_with("2026-11-21T19:20:00.000Z  vm-1          ALLOW  dns            dns_answered              pypi.org A -> NOERROR"),
        "{first}"
    );
}

#[test]
fn filters_select_and_json_prints_the_lines_as_read() {
    let t = TempDir::new("filters");
    let s1 = t.file("s1.jsonl", &log(false));
    let oc = t.file("ocsf.jsonl", &log(true));
    for f in [&s1, &oc] {
        let (_, out, _) = sluice(&["audit", path(f), "--decision", "deny"]);
        assert_eq!(out.lines().count(), 4, "{out}");
        let (_, out, _) = sluice(&["audit", path(f), "--kind", "dns", "--sandbox", "vm-1"]);
        assert_eq!(out.lines().count(), 3, "{out}");
        let (_, out, _) = sluice(&["audit", path(f), "--name", "*.EXAMPLE"]);
        assert_eq!(out.lines().count(), 2, "{out}");
        let (_, out, _) = sluice(&[
            "audit",
            path(f),
            "--reason",
            "denylisted",
            "--reason",
            "reload_rejected",
        ]);
        assert_eq!(out.lines().count(), 2, "{out}");
        let (_, out, _) = sluice(&["audit", path(f), "--since", "2026-11-21T19:20:04Z"]);
        assert_eq!(out.lines().count(), 2, "{out}");
        let (_, out, _) = sluice(&["audit", path(f), "--json", "--name", "pypi.org"]);
        let want: Vec<String> = std::fs::read_to_string(f)
            .unwrap()
            .lines()
            .filter(|l| l.contains("pypi.org"))
            .map(str::to_owned)
            .collect();
        assert_eq!(out.lines().map(str::to_owned).collect::<Vec<_>>(), want);
    }
    let (code, _, err) = sluice(&["audit", path(&s1), "--since", "yesterday"]);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn summary_lists_top_denied_names_reasons_and_reloads_per_sandbox() {
    let t = TempDir::new("summary");
    let oc = t.file("ocsf.jsonl", &log(true));
    let (code, out, err) = sluice(&["audit", "--summary", path(&oc)]);
    assert_eq!(code, 0, "{err}");
    let want = "sandbox vm-1: 2 allowed, 3 denied, 0 suppressed by the rate limit
  top denied names:
           2  evil.example
  top deny reasons (suppressed included):
           2  not_allowlisted
           1  reload_rejected
  reloads: 1
    2026-11-21T19:20:05.000Z  reload_rejected  trigger: sighup
sandbox vm-2: 0 allowed, 1 denied, 0 suppressed by the rate limit
  top denied names:
           1  gist.github.com
  top deny reasons (suppressed included):
           1  denylisted
  reloads: 0
";
    assert_eq!(out, want);
}

#[test]
fn malformed_lines_are_reported_with_their_numbers_and_reading_goes_on() {
    let t = TempDir::new("malformed");
    let good = log(false);
    let mut lines: Vec<&str> = good.lines().collect();
    lines.insert(1, "{not json");
    lines.insert(3, r#"{"hello":"world"}"#);
    // A partial last line (a writer mid-line): left out, not an error.
    let text = format!("{}\n{{\"schema\":1,\"ts\":", lines.join("\n"));
    let f = t.file("bad.jsonl", &text);
    let (code, out, err) = sluice(&["audit", path(&f)]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(out.lines().count(), 6, "{out}");
    let name = f.display();
    assert!(
        err.contains(&format!("{name}:2: malformed audit line: not JSON")),
        "{err}"
    );
    assert!(
        err.contains(&format!("{name}:4: malformed audit line: neither")),
        "{err}"
    );
    assert!(
        err.contains(&format!("{name}:9: partial last line")),
        "{err}"
    );
    // A partial last line that is a whole record is used; exit 0.
    let f2 = t.file("partial.jsonl", good.trim_end());
    let (code, out, err) = sluice(&["audit", path(&f2)]);
    assert_eq!((code, out.lines().count()), (0, 6), "{err}");
    // A missing file is an error, the others are still read.
    let (code, out, err) = sluice(&["audit", path(&t.0.join("none")), path(&f2)]);
    assert_eq!((code, out.lines().count()), (1, 6), "{err}");
}

#[test]
fn follow_reads_new_lines_across_a_rotation() {
    let t = TempDir::new("follow");
    let recs = log(false);
    let lines: Vec<&str> = recs.lines().collect();
    let f = t.file("audit.jsonl", &format!("{}\n", lines[0]));
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["audit", "--follow", "--kind", "dns", path(&f)])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines() {
            if tx.send(l.unwrap()).is_err() {
                break;
            }
        }
    });
    let next = || rx.recv_timeout(Duration::from_secs(30)).unwrap();
    assert!(next().contains("pypi.org"));
    // Appended in two writes: the line is shown once it is whole.
    let mut w = std::fs::OpenOptions::new().append(true).open(&f).unwrap();
    let (a, b) = lines[1].split_at(20);
    w.write_all(a.as_bytes()).unwrap();
    w.flush().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    w.write_all(format!("{b}\n").as_bytes()).unwrap();
    assert!(next().contains("evil.example"));
    // Rotated: a last line into the old file, then a new file.
    w.write_all(format!("{}\n", lines[2]).as_bytes()).unwrap();
    std::fs::rename(&f, t.0.join("audit.jsonl.1")).unwrap();
    std::fs::write(&f, format!("{}\n", lines[3])).unwrap();
    assert!(next().contains("evil.example"));
    assert!(next().contains("gist.github.com"));
    child.kill().unwrap();
    child.wait().unwrap();
}

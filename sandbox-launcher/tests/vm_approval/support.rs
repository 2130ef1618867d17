//! What the tests of `vm_approval.rs` share: the world a run boots in and
//! the launcher's command line there, the `--ask` policy, the prompt's
//! terminal (a pane of a tmux server of the test's own) and the mutual-TLS
//! webhook's fixtures.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use sluice_e2e::wait_until;

use crate::common::*;

/// Whether tmux (the ask tests' real pty) is installed; when not, the skip
/// is `may_skip`'s to allow (and count) or to fail.
fn tmux_present() -> bool {
    if Command::new("tmux").arg("-V").output().is_ok() {
        return true;
    }
    sluice_test_skip::may_skip("tmux", "tmux is not installed (scripts/install-deps)");
    false
}

/// A [`RunWorld`] for a test of the prompt: None when tmux is missing
/// (and the skip allowed), or what [`RunWorld::start`] says.
pub(crate) fn ask_world() -> Option<RunWorld> {
    if !tmux_present() {
        return None;
    }
    RunWorld::start()
}

/// Writes at `path` an `unlisted: ask` policy with the terminal backend and
/// a timeout of `timeout` seconds (`approval_extra`, e.g. `always: true\n  `,
/// goes before the timeout) that lists the origin and the world's own
/// entries.
pub(crate) fn write_ask_policy(path: &Path, id: &str, approval_extra: &str, timeout: u32) {
    fs::write(
        path,
        format!(
            "version: 1\nid: {id}\nunlisted: ask\napproval:\n  backend: terminal\n  \
             {approval_extra}timeout: {timeout}\nallow:\n  - domain: {}\n{}",
            sluice_e2e::ORIGIN_NAME,
            world_policy_tail()
        ),
    )
    .unwrap();
}

/// `words` as one `sh` command line, each word single-quoted.
pub(crate) fn shell_line(words: &[String]) -> String {
    let quoted: Vec<String> = words
        .iter()
        .map(|w| format!("'{}'", w.replace('\'', r"'\''")))
        .collect();
    quoted.join(" ")
}

/// A tmux server of the test's own (`-L`) with one detached 200x50
/// session running `sh SCRIPT`: the prompt's terminal, a real pty. The
/// server is killed when this drops.
pub(crate) struct Pane {
    server: String,
}

impl Pane {
    pub(crate) fn start(mark: &str, script: &Path) -> Self {
        let pane = Self {
            server: format!("{mark}-tmux"),
        };
        pane.tmux(&[
            "new-session",
            "-d",
            "-x",
            "200",
            "-y",
            "50",
            "sh",
            &script.display().to_string(),
        ]);
        pane
    }

    fn command(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .args(["-L", &self.server])
            .args(args)
            .output()
            .unwrap()
    }

    /// `tmux args` on this server, which must succeed.
    pub(crate) fn tmux(&self, args: &[&str]) {
        let o = self.command(args);
        assert!(o.status.success(), "tmux {args:?}: {}", text(&o.stderr));
    }

    /// The pane's text, joined lines, with `history` lines of scrollback;
    /// empty if tmux cannot say.
    pub(crate) fn screen(&self, history: u32) -> String {
        text(
            &self
                .command(&["capture-pane", "-p", "-J", "-S", &format!("-{history}")])
                .stdout,
        )
    }

    /// Types `keys` and Enter.
    pub(crate) fn type_line(&self, keys: &str) {
        self.tmux(&["send-keys", keys, "Enter"]);
    }
}

impl Drop for Pane {
    fn drop(&mut self) {
        let _ = self.command(&["kill-server"]);
    }
}

/// Whether the last question shown as `line` on `screen` settled: its
/// `choice> ` is shown, and keys typed now answer it.
fn question_settled(screen: &str, line: &str) -> bool {
    screen
        .rfind(line)
        .is_some_and(|at| screen[at..].contains("choice> "))
}

/// Waits up to 240 s for the question shown as `line` to settle on
/// `screen()`, or the run's end (`exit` written). Fails, with `why` of the
/// screen, unless the question settled. Keys count from `choice> `: what
/// comes before it is discarded.
pub(crate) fn wait_settled(
    screen: impl Fn() -> String,
    line: &str,
    exit: &Path,
    why: impl Fn(&str) -> String,
) {
    let shown = wait_until("the prompt", Duration::from_secs(240), || {
        question_settled(&screen(), line) || exit.exists()
    });
    let now = screen();
    assert!(
        shown.is_ok() && question_settled(&now, line),
        "no prompt on the terminal{}",
        why(&now)
    );
}

/// Runs the command line `words` in a [`Pane`], waits for `prompt` on its
/// screen, types `key` and Enter, and waits for the command's end: its
/// output (stdout and stderr, to a file) and exit code. Its stdin is
/// /dev/null, or with `guest` = (`after`, `line`) the terminal itself (the
/// one the prompt reads, `/dev/tty`): once the output shows `after`, `line`
/// and Enter are typed for the guest.
pub(crate) fn answer_in_tmux(
    dir: &Path,
    tag: &str,
    words: &[String],
    (prompt, key): (&str, &str),
    guest: Option<(&str, &str)>,
) -> (String, String) {
    let (out, exit) = (
        dir.join(format!("{tag}-out.txt")),
        dir.join(format!("{tag}-exit.txt")),
    );
    let sh = dir.join(format!("{tag}.sh"));
    fs::write(
        &sh,
        format!(
            "{}{} >{} 2>&1\necho $? >{}\n",
            shell_line(words),
            if guest.is_some() { "" } else { " </dev/null" },
            out.display(),
            exit.display()
        ),
    )
    .unwrap();
    let pane = Pane::start(&mark(), &sh);
    let output = || fs::read_to_string(&out).unwrap_or_default();
    wait_settled(
        || pane.screen(200),
        prompt,
        &exit,
        |now| format!(":\n{now}\nlauncher: {}", output()),
    );
    pane.type_line(key);
    if let Some((after, line)) = guest {
        wait_until("the guest's output", Duration::from_secs(300), || {
            output().contains(after) || exit.exists()
        })
        .unwrap();
        assert!(output().contains(after), "launcher: {}", output());
        pane.type_line(line);
    }
    wait_until("the run's end", Duration::from_secs(300), || exit.exists()).unwrap();
    drop(pane);
    (
        fs::read_to_string(&out).unwrap(),
        fs::read_to_string(&exit).unwrap().trim().to_owned(),
    )
}

/// The last 40 lines of `s`.
pub(crate) fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// The approval webhook for the mutual-TLS test:
/// Python's `ssl` server requiring a client certificate from CA; it logs
/// each question with the client's common name and allows every name but
/// those starting `deny`.
pub(crate) const MTLS_WEBHOOK: &str = r#"
import http.server, json, ssl, sys, os
log, portfile, port, cert, key, client_ca = sys.argv[1:7]
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        q = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
        subject = dict(x[0] for x in self.connection.getpeercert().get("subject", ()))
        with open(log, "a") as f:
            f.write(json.dumps({"client": subject.get("commonName"), "name": q["name"]}) + "\n")
        decision = "deny_once" if q["name"].startswith("deny") else "allow_once"
        answer = json.dumps({"decision": decision, "by": "hook"}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)
    def log_message(self, *a):
        pass
s = http.server.HTTPServer(("127.0.0.1", int(port)), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
ctx.verify_mode = ssl.CERT_REQUIRED
ctx.load_verify_locations(client_ca)
s.socket = ctx.wrap_socket(s.socket, server_side=True)
with open(portfile + ".tmp", "w") as f:
    f.write(port)
os.rename(portfile + ".tmp", portfile)
s.serve_forever()
"#;

/// Run as uid 65534 outside the jails with the run dir and one of its
/// sockets: what each attempt to take the socket's place, or to reach it,
/// gets (a JSON object of operation to "ok" or the errno's name).
pub(crate) const NOBODY_REPLACES: &str = r#"
import errno, json, os, socket, sys
run, sock = sys.argv[1], sys.argv[2]
def do(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
def bind(path):
    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).bind(path)
def connect(path):
    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).connect(path)
print(json.dumps({
    "unlink": do(lambda: os.unlink(sock)),
    "bind_beside": do(lambda: bind(os.path.join(run, "evil.sock"))),
    "connect": do(lambda: connect(sock)),
    "move_run_dir": do(lambda: os.rename(run, run + ".moved")),
}))
"#;

/// `openssl` in `dir`: a CA `{tag}-ca.pem`, and a leaf `{tag}-leaf.pem`
/// (key `{tag}-leaf.key`) it signs for `cn` with the extensions `ext`.
pub(crate) fn openssl_pki(
    dir: &Path,
    tag: &str,
    cn: &str,
    ext: &str,
) -> (PathBuf, PathBuf, PathBuf) {
    let f = |n: &str| dir.join(format!("{tag}-{n}"));
    let openssl = |args: &[&str]| {
        let o = Command::new("openssl").args(args).output().unwrap();
        assert!(o.status.success(), "openssl {args:?}: {}", text(&o.stderr));
    };
    let p = |p: PathBuf| p.display().to_string();
    // `openssl req` with a new P-256 key, unencrypted, written to `key`.
    let new_key = |key: PathBuf, rest: &[&str]| {
        let key = p(key);
        let mut args = vec![
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
        ];
        args.extend(rest);
        openssl(&args);
    };
    new_key(
        f("ca.key"),
        &[
            "-x509",
            "-out",
            &p(f("ca.pem")),
            "-days",
            "2",
            "-subj",
            &format!("/CN={tag} CA"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,digitalSignature",
        ],
    );
    new_key(
        f("leaf.key"),
        &["-out", &p(f("leaf.csr")), "-subj", &format!("/CN={cn}")],
    );
    fs::write(f("leaf.ext"), ext).unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        &p(f("leaf.csr")),
        "-CA",
        &p(f("ca.pem")),
        "-CAkey",
        &p(f("ca.key")),
        "-CAcreateserial",
        "-out",
        &p(f("leaf.pem")),
        "-days",
        "2",
        "-extfile",
        &p(f("leaf.ext")),
    ]);
    (f("ca.pem"), f("leaf.pem"), f("leaf.key"))
}

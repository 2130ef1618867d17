//! End-to-end tests of `sluice run --ask` and the approval backends under
//! `sluice run` (issue 17): real QEMU (TCG here), the real guest image and
//! agent, the launcher's prompt on a real pty (a tmux server of the test's
//! own), and a webhook over mutual TLS. Leftover checks as in `vm.rs`.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

mod common;
use common::*;
#[path = "vm_approval/support.rs"]
mod support;
use support::*;

/// `sluice run --ask` (issue 17): the launcher's prompt on its controlling
/// terminal, a real pty (a tmux server of the test's own), decides a name
/// the policy does not list. The guest's fetch of it waits on the prompt,
/// which names the exact host and the port an approval opens; the key `o`
/// (allow once) sent through tmux lets it through, and the audit's
/// `approval` record says the terminal decided and for how long. The same
/// run under `--json` (stdout is a result, not a conversation) denies
/// without a prompt: the fetch fails and the result says how many were
/// denied and why.
#[test]
#[ignore = "needs root: run via scripts/test"]
fn ask_prompts_on_the_terminal_and_json_auto_denies() {
    use sluice_e2e::ORIGIN2_NAME;
    let Some(rw) = ask_world() else {
        return;
    };
    let dir = &rw.dir;
    let policy = dir.join("ask-policy.yaml");
    write_ask_policy(&policy, "la-vm-ask", "", 300);
    let fetch =
        format!("curl -sS --max-time 280 --cacert /tmp/ca.pem https://{ORIGIN2_NAME}/ </dev/null");
    let script = format!("{fetch}; echo asked=$?; read -r line; echo \"guest-read=[$line]\"");

    // On a terminal: the prompt, then the key.
    let audit = dir.join("ask-audit.jsonl");
    let audit_flag = audit.display().to_string();
    let words = rw.env_run_words(
        &mark(),
        &["--audit", &audit_flag, "--ask"],
        &policy,
        script.clone(),
    );
    let prompt = format!("wants to reach {ORIGIN2_NAME} (TCP 443)");
    let (output, code) = answer_in_tmux(
        dir,
        "ask",
        &words,
        (&prompt, "o"),
        Some(("asked=", "typed-for-the-guest")),
    );
    assert_eq!(code, "0", "launcher: {output}");
    // The terminal is also the guest's stdin: the key went to the prompt
    // only, the later line to the guest only.
    assert!(
        output.contains("guest-read=[typed-for-the-guest]"),
        "the guest's stdin: {output}"
    );
    assert!(
        output.contains("hello from sluice-test-origin\nasked=0"),
        "the approved fetch failed: {output}"
    );
    let lines = audit_records(&audit);
    assert!(
        lines.iter().any(|l| l["kind"] == "approval"
            && l["reason"] == "approval_allowed"
            && l["approval"]["name"] == ORIGIN2_NAME
            && l["approval"]["decision"] == "allow_once"
            && l["approval"]["lasts"] == "dns_ttl"
            && l["approval"]["by"]
                .as_str()
                .is_some_and(|b| b.starts_with("terminal"))),
        "no approval record by the terminal: {lines:#?}"
    );
    assert!(
        lines.iter().any(|l| l["kind"] == "connection"
            && l["decision"] == "allow"
            && l["reason"] == "approval_allowed"
            && l["sni"] == ORIGIN2_NAME),
        "no connection admitted by the approval: {lines:#?}"
    );

    // Under --json: denied without a prompt, and the result says why.
    let audit = dir.join("ask-json-audit.jsonl");
    let audit_flag = audit.display().to_string();
    let m = mark();
    let child = rw.spawn_run(
        &m,
        &["--audit", &audit_flag, "--ask", "--json"],
        &policy,
        script,
    );
    let nsenter = child.id();
    let out = child.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr: {stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let stdout = v["stdout"].as_str().unwrap_or_default();
    assert!(
        stdout.contains("asked=") && !stdout.contains("asked=0"),
        "fetched under --json: {stdout}"
    );
    assert!(
        v["approval"]["auto_denied"]
            .as_u64()
            .is_some_and(|n| n >= 1)
            && v["approval"]["auto_deny_reason"] == "--json"
            && v["approval"]["prompted"] == 0,
        "the result's approval summary: {}",
        v["approval"]
    );
    assert!(
        audit_records(&audit)
            .iter()
            .any(|l| l["kind"] == "approval" && l["reason"] == "approval_denied"),
        "no denied approval record"
    );
    assert_no_leftovers(&m, nsenter);
    drop(rw);
}

/// Review s9 finding 3: while an `--ask` question is on the terminal, the
/// guest's output is held and released after the answer. The guest prints
/// numbered lines without pause from before the question until after its
/// answer, to the same terminal (a tmux pane whose every byte is recorded
/// with `pipe-pane`). In the recording the question, from its first line
/// to the answer's, holds no guest byte, and the guest's bytes around it,
/// put together, are every line it printed, in order, none missing.
#[test]
#[ignore = "needs root: run via scripts/test"]
fn a_question_holds_the_guests_output_until_it_is_answered() {
    use sluice_e2e::{ORIGIN2_NAME, wait_until};
    let Some(rw) = ask_world() else {
        return;
    };
    let dir = &rw.dir;
    let policy = dir.join("hold-policy.yaml");
    write_ask_policy(&policy, "la-vm-hold", "", 300);
    // The printer starts before the fetch asks and stops after its answer.
    let script = format!(
        "(i=0; while [ ! -e /tmp/answered ]; do echo \"out-$i\"; i=$((i+1)); done; \
         echo \"out-end-$i\") & \
         curl -sS --max-time 280 --cacert /tmp/ca.pem https://{ORIGIN2_NAME}/ \
         </dev/null >/dev/null; echo asked=$?; touch /tmp/answered; wait"
    );
    let m = mark();
    let words = rw.env_run_words(&m, &["--ask"], &policy, script);
    let (go, record, exit) = (
        dir.join("hold-go"),
        dir.join("hold-pane.bin"),
        dir.join("hold-exit.txt"),
    );
    let sh = dir.join("hold.sh");
    // The run starts once the pane is recorded; its stdin, stdout and
    // stderr are the pane's terminal.
    fs::write(
        &sh,
        format!(
            "while [ ! -e {} ]; do sleep 0.1; done\n{}\necho $? >{}\n",
            go.display(),
            shell_line(&words),
            exit.display()
        ),
    )
    .unwrap();
    let pane = Pane::start(&m, &sh);
    pane.tmux(&["pipe-pane", "-O", &format!("cat >>{}", record.display())]);
    fs::write(&go, "").unwrap();
    let recorded = || fs::read(&record).map(|b| text(&b)).unwrap_or_default();
    let question = format!("wants to reach {ORIGIN2_NAME} (TCP 443)");
    wait_settled(recorded, &question, &exit, |now| {
        format!("; the pane's tail:\n{}", tail(now))
    });
    pane.type_line("o");
    wait_until("the run's end", Duration::from_secs(300), || exit.exists()).unwrap();
    let code = fs::read_to_string(&exit).unwrap();
    drop(pane);
    let pane = recorded().replace("\r\n", "\n");
    assert_eq!(code.trim(), "0", "{}", tail(&pane));

    // The question, from the newline before its first line to the end of
    // the answer's line: the prompt's own bytes and the typed key only.
    let start = pane
        .find("\nsluice: sandbox ")
        .unwrap_or_else(|| panic!("no question: {}", tail(&pane)));
    let answer = format!("sluice: allow_once {ORIGIN2_NAME}\n");
    let end = pane[start..]
        .find(&answer)
        .map(|i| start + i + answer.len())
        .unwrap_or_else(|| panic!("no answer: {}", &pane[start..]));
    let block = &pane[start..end];
    assert!(
        !block.contains("out-") && block.contains("choice> "),
        "the guest's output inside the question:\n{block}"
    );
    // Around it: the guest's lines, every one, in order.
    let guest = format!("{}{}", &pane[..start], &pane[end..]);
    let mut next = 0u64;
    let mut last = None;
    for line in guest.lines() {
        if let Some(n) = line.strip_prefix("out-end-") {
            last = n.parse::<u64>().ok();
        } else if let Some(n) = line.strip_prefix("out-") {
            assert_eq!(
                n.parse::<u64>().ok(),
                Some(next),
                "a guest line missing or out of order at {line:?}"
            );
            next += 1;
        }
    }
    assert_eq!(
        last,
        Some(next),
        "the guest printed {last:?} lines, {next} arrived"
    );
    assert!(
        pane[..start].contains("out-") && pane[end..].contains("out-"),
        "the guest did not print across the question"
    );
    assert!(guest.contains("asked=0"), "the approved fetch failed");
    drop(rw);
}

/// A webhook approval backend under `sluice run` (docs/approval.md): the
/// webhook is a Python `ssl` server on the launcher's loopback requiring a
/// client certificate (mutual TLS). The gateway's egress floor drops its
/// packets to loopback, but opens exactly the webhook's address and port
/// (the launcher says so); the gateway's jail binds the policy's CA,
/// client certificate and key files alone (the key readable by the jail's
/// group, as docs/launcher.md says to share a file). The webhook's `allow`
/// lets the guest fetch the origin and its `deny` refuses the other name;
/// the audit names the webhook as the decider, and the server saw the
/// gateway's client certificate.
#[test]
#[ignore = "needs root: run via scripts/test"]
fn a_webhook_over_mutual_tls_on_loopback_decides_under_sluice_run() {
    use std::os::unix::fs::PermissionsExt as _;

    use sluice_e2e::{ORIGIN_NAME, ORIGIN2_NAME, Proc, wait_until};
    let Some(rw) = RunWorld::start() else {
        return;
    };
    let world = &rw.world;
    let dir = rw.dir.join("hook");
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
    let (server_ca, server_cert, server_key) = openssl_pki(
        &dir,
        "server",
        "127.0.0.1",
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    );
    let (client_ca, client_cert, client_key) = openssl_pki(
        &dir,
        "client",
        "sluice-gateway",
        "extendedKeyUsage=clientAuth\n",
    );
    // Shared with the jail's group only.
    let chown = Command::new("chgrp")
        .arg("65534")
        .arg(&client_key)
        .status()
        .unwrap();
    assert!(chown.success());
    fs::set_permissions(&client_key, fs::Permissions::from_mode(0o640)).unwrap();
    for f in [&server_ca, &client_cert] {
        fs::set_permissions(f, fs::Permissions::from_mode(0o644)).unwrap();
    }
    let script = dir.join("hook.py");
    fs::write(&script, MTLS_WEBHOOK).unwrap();
    let (log, portfile) = (dir.join("hook.jsonl"), dir.join("hook.port"));
    let port = "18443";
    let _hook = Proc::spawn(
        "mTLS webhook",
        world
            .host
            .cmd("python3")
            .arg(&script)
            .arg(&log)
            .arg(&portfile)
            .arg(port)
            .arg(&server_cert)
            .arg(&server_key)
            .arg(&client_ca),
        &dir.join("hook.log"),
    )
    .unwrap();
    wait_until("the webhook's port", Duration::from_secs(60), || {
        portfile.exists()
    })
    .unwrap();

    let policy = dir.join("policy.yaml");
    fs::write(
        &policy,
        format!(
            "version: 1\nid: la-vm-hook\nunlisted: ask\napproval:\n  backend:\n    webhook:\n      \
             url: https://127.0.0.1:{port}/ask\n      ca: {}\n      client_cert: {}\n      \
             client_key: {}\n  timeout: 120\nallow:\n  - domain: {ORIGIN_NAME}\n{}",
            server_ca.display(),
            client_cert.display(),
            client_key.display(),
            world_policy_tail()
        ),
    )
    .unwrap();
    let denied_name = "deny-me.example.org";
    let script = format!(
        "curl -sS --max-time 200 --cacert /tmp/ca.pem https://{ORIGIN2_NAME}/; echo allowed=$?; \
         curl -sS --max-time 200 --cacert /tmp/ca.pem https://{denied_name}/; echo denied=$?"
    );
    let audit = dir.join("audit.jsonl");
    let audit_flag = audit.display().to_string();
    let m = mark();
    let child = rw.spawn_run(&m, &["--audit", &audit_flag], &policy, script);
    let nsenter = child.id();
    // Review s10 #9: while the run is live, a process of the jails' uid
    // (65534) outside the jails can neither replace the launcher's socket
    // nor reach it; the run below still gets its answers.
    let run_dir = std::env::temp_dir().join(format!("sluice-{nsenter}.run"));
    let socket = run_dir.join("approved.sock");
    wait_until("the run's approved.sock", Duration::from_secs(240), || {
        socket.exists()
    })
    .unwrap();
    let outsider = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args(["/usr/bin/python3", "-I", "-c", NOBODY_REPLACES])
        .arg(&run_dir)
        .arg(&socket)
        .current_dir("/")
        .output()
        .unwrap();
    assert!(outsider.status.success(), "{}", text(&outsider.stderr));
    let got: serde_json::Value = serde_json::from_slice(&outsider.stdout).unwrap();
    for (op, want) in [
        ("unlink", "EACCES"),
        ("bind_beside", "EACCES"),
        ("connect", "EACCES"),
        ("move_run_dir", "EPERM"),
    ] {
        assert_eq!(got[op], want, "nobody outside the jail, {op}: {got}");
    }
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stderr.contains(&format!(
            "egress floor lets it reach the approval webhook at 127.0.0.1:{port}"
        )),
        "the launcher did not say it opened the webhook: {stderr}"
    );
    assert!(
        stdout.contains("hello from sluice-test-origin\nallowed=0"),
        "the webhook's allow was not honoured: {stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("denied=") && !stdout.contains("denied=0"),
        "the denied name was fetched: {stdout}"
    );
    let records = audit_records(&audit);
    let approval = |name: &str| {
        records
            .iter()
            .find(|l| l["kind"] == "approval" && l["approval"]["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no approval record for {name}: {records:#?}"))
    };
    let allowed = approval(ORIGIN2_NAME);
    assert!(
        allowed["reason"] == "approval_allowed"
            && allowed["approval"]["decision"] == "allow_once"
            && allowed["approval"]["by"] == "webhook: hook",
        "{allowed}"
    );
    let refused = approval(denied_name);
    assert!(
        refused["reason"] == "approval_denied"
            && refused["approval"]["decision"] == "deny_once"
            && refused["approval"]["by"] == "webhook: hook",
        "{refused}"
    );
    let seen = fs::read_to_string(&log).unwrap_or_default();
    assert!(
        seen.lines().count() >= 2
            && seen
                .lines()
                .all(|l| l.contains("\"client\": \"sluice-gateway\"")),
        "the webhook's requests: {seen}"
    );
    assert_no_leftovers(&m, nsenter);
    drop(rw);
}

/// Issue 17, point 3 under `sluice run`: an `always` answer at the `--ask`
/// prompt puts the name into `POLICY.approved.yaml` beside the policy. The
/// gateway's jail keeps the policy's directory read-only, so the launcher
/// writes the file after validating the entry. The file is a valid overlay
/// with the policy's mode, and the running gateway reloads it: later
/// fetches in the same run are allowed as listed (`allowlisted`), not by
/// the approval. A second run with the same policy reaches the name
/// without asking, under `--json`, which would deny any question.
#[test]
#[ignore = "needs root: run via scripts/test"]
fn an_always_answer_writes_the_overlay_beside_the_policy_and_the_next_run_does_not_ask() {
    use std::os::unix::fs::PermissionsExt as _;

    use sluice_e2e::ORIGIN2_NAME;
    let Some(rw) = ask_world() else {
        return;
    };
    let dir = &rw.dir;
    // A directory the jail's uid may search: it is bound whole, so the
    // running gateway sees the overlay appear.
    let policy_dir = dir.join("always-policy");
    fs::create_dir(&policy_dir).unwrap();
    fs::set_permissions(&policy_dir, fs::Permissions::from_mode(0o755)).unwrap();
    let policy = policy_dir.join("policy.yaml");
    write_ask_policy(&policy, "la-vm-always", "always: true\n  ", 300);
    fs::set_permissions(&policy, fs::Permissions::from_mode(0o644)).unwrap();
    let overlay = policy_dir.join("policy.approved.yaml");
    let fetch = format!("curl -sS --max-time 280 --cacert /tmp/ca.pem https://{ORIGIN2_NAME}/");
    let run = |audit: &Path, flags: &[&str], script: String| -> Vec<String> {
        let audit = audit.display().to_string();
        let mut all = vec!["--audit", &audit, "--ask"];
        all.extend(flags);
        rw.env_run_words(&mark(), &all, &policy, script)
    };

    // First run: asked, answered `always` by typing the name in full
    // (a single key is never `always`). The later fetches give the gateway's
    // reload poll (every 500 ms) twenty seconds to load the overlay.
    let audit = dir.join("always-audit.jsonl");
    let script = format!(
        "{fetch}; echo asked=$?; i=0; while [ $i -lt 20 ]; do sleep 1; \
         {fetch} >/dev/null || echo later-failed; i=$((i+1)); done"
    );
    let prompt = format!("wants to reach {ORIGIN2_NAME} (TCP 443)");
    let (output, code) = answer_in_tmux(
        dir,
        "always",
        &run(&audit, &[], script),
        (&prompt, ORIGIN2_NAME),
        None,
    );
    assert_eq!(code, "0", "launcher: {output}");
    assert!(
        output.contains("hello from sluice-test-origin\nasked=0")
            && !output.contains("later-failed"),
        "the approved fetches failed: {output}"
    );
    assert!(
        output.contains(&format!(
            "{ORIGIN2_NAME} approved always: added to {}",
            overlay.display()
        )),
        "the launcher did not say where it wrote: {output}"
    );
    let text_of = fs::read_to_string(&overlay).unwrap();
    assert!(
        text_of.contains(&format!("domain: \"{ORIGIN2_NAME}\""))
            && text_of.contains("ports: [443]"),
        "{text_of}"
    );
    let meta = fs::metadata(&overlay).unwrap();
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o644,
        "the policy's mode"
    );
    let loaded =
        sluice_policy::load_file(&policy, &sluice_policy::CompileOptions::default()).unwrap();
    assert_eq!(
        loaded.check_name(ORIGIN2_NAME).decision,
        sluice_policy::Decision::Allow,
        "the overlay loads with the policy"
    );
    let lines = audit_records(&audit);
    let at = |pred: &dyn Fn(&serde_json::Value) -> bool| lines.iter().position(pred);
    let approved = at(&|l| {
        l["kind"] == "approval"
            && l["approval"]["name"] == ORIGIN2_NAME
            && l["approval"]["decision"] == "allow_always"
            && l["approval"]["lasts"] == "always"
    });
    let reloaded = at(&|l| l["kind"] == "policy_reload" && l["reason"] == "reload_applied");
    assert!(
        approved.is_some() && reloaded.is_some_and(|r| Some(r) > approved),
        "no `always` record followed by the overlay's reload: {lines:#?}"
    );
    assert!(
        lines[reloaded.unwrap_or_default()..]
            .iter()
            .any(|l| l["kind"] == "connection"
                && l["decision"] == "allow"
                && l["reason"] == "allowlisted"
                && l["sni"] == ORIGIN2_NAME),
        "after the reload the name is not allowed as listed: {lines:#?}"
    );

    // Second run, same policy: no question (under --json one would be
    // denied at once), the name is listed.
    let audit = dir.join("always-again-audit.jsonl");
    let words = run(&audit, &["--json"], format!("{fetch}; echo asked=$?"));
    let out = Command::new(&words[0])
        .args(&words[1..])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr: {stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        v["stdout"].as_str().is_some_and(|s| s.contains("asked=0")),
        "the second run did not reach it: {v}\n{stderr}"
    );
    assert!(
        v["approval"]["prompted"] == 0 && v["approval"]["auto_denied"] == 0,
        "the second run asked: {}",
        v["approval"]
    );
    assert!(
        !audit_records(&audit)
            .iter()
            .any(|l| l["kind"] == "approval"),
        "an approval record in the second run"
    );
    drop(rw);
}

/// A question the gateway gives up on (its
/// `approval.timeout`, 8 s here) comes down from the terminal at once,
/// with nobody at the keyboard, and the guest's output it held is
/// released then, not when a key is pressed or the run ends. The guest
/// prints a line while the question is shown (held), waits for its fetch
/// (refused at the timeout), then prints its status. On the pane, after the
/// question: the withdrawal line (the gateway's hang-up or the terminal's
/// own copy of the timeout, whichever is first), then the held line and the
/// status; and the run ends by itself with nothing answered (`by: timeout`).
#[test]
#[ignore = "needs root: run via scripts/test"]
fn a_question_the_gateway_gives_up_on_is_taken_down_and_its_output_released() {
    use sluice_e2e::{ORIGIN2_NAME, wait_until};
    let Some(rw) = ask_world() else {
        return;
    };
    let dir = &rw.dir;
    let policy = dir.join("withdrawn-policy.yaml");
    write_ask_policy(&policy, "la-vm-withdrawn", "", 8);
    let audit = dir.join("withdrawn-audit.jsonl");
    let audit_flag = audit.display().to_string();
    let script = format!(
        "curl -sS --max-time 60 --cacert /tmp/ca.pem https://{ORIGIN2_NAME}/ 2>/dev/null & \
         sleep 3; echo held-during-question; wait $!; echo fetch-status=$?"
    );
    let m = mark();
    let words = rw.env_run_words(&m, &["--audit", &audit_flag, "--ask"], &policy, script);
    let exit = dir.join("withdrawn-exit.txt");
    let sh = dir.join("withdrawn.sh");
    // The launcher writes to the pane (the prompt's terminal); the pane
    // stays after its end until the test has read it.
    fs::write(
        &sh,
        format!(
            "{} </dev/null\necho $? >{}\nsleep 600\n",
            shell_line(&words),
            exit.display()
        ),
    )
    .unwrap();
    let term = Pane::start(&m, &sh);
    // No key is ever sent: the run ends by itself.
    let ended = wait_until("the run's end", Duration::from_secs(400), || exit.exists());
    let pane = term.screen(500);
    drop(term);
    assert!(ended.is_ok(), "the run did not end:\n{pane}");
    assert_eq!(
        fs::read_to_string(&exit).unwrap().trim(),
        "0",
        "launcher:\n{pane}"
    );
    let at = |what: &str| {
        pane.find(what)
            .unwrap_or_else(|| panic!("no {what:?} on the pane:\n{pane}"))
    };
    let asked = at(&format!("wants to reach {ORIGIN2_NAME} (TCP 443)"));
    // The terminal's own copy of the timeout and the gateway's hang-up at
    // that timeout race; either takes the question down, with its line.
    let withdrawn = [
        format!("sluice: {ORIGIN2_NAME}: the gateway withdrew the question (not answered in time), denied"),
        format!("sluice: {ORIGIN2_NAME}: not answered in time, denied"),
    ]
    .iter()
    .find_map(|line| pane.find(line.as_str()))
    .unwrap_or_else(|| panic!("no withdrawal of {ORIGIN2_NAME} on the pane:\n{pane}"));
    let held = at("held-during-question");
    let status = at("fetch-status=");
    assert!(
        asked < withdrawn && withdrawn < held && held < status,
        "out of order:\n{pane}"
    );
    assert!(!pane.contains("the run ended"), "{pane}");
    assert!(!pane.contains("fetch-status=0"), "{pane}");
    assert!(
        !pane.contains(&format!("allow_once {ORIGIN2_NAME}")),
        "{pane}"
    );
    let lines = audit_records(&audit);
    assert!(
        lines.iter().any(|l| l["kind"] == "approval"
            && l["approval"]["name"] == ORIGIN2_NAME
            && l["approval"]["decision"] == "deny_once"
            && l["approval"]["by"] == "timeout"),
        "no approval record denied by the timeout: {lines:#?}"
    );
    drop(rw);
}

//! Policy reload: SIGHUP and changes of the policy file load, validate and
//! swap the policy atomically.
//!
//! # Triggers
//! - `SIGHUP`: reload now.
//! - A change of the policy file or of its approval overlay
//!   (`POLICY.approved.yaml`, docs/approval.md), found by polling the paths every
//!   [`POLL_INTERVAL`]: its metadata (device, inode, size, mtime, ctime;
//!   symlinks followed) and a hash of its content. A change is acted on only
//!   once metadata and content hash have stayed the same over two
//!   consecutive polls *and* the content ends with a newline, so a writer
//!   still filling the file in place is not caught half way (a truncated
//!   file could be more permissive than the whole one). A reload follows
//!   within about two intervals. Limits: an in-place writer that stalls for
//!   a whole interval right after a line end can still be read early, and
//!   a file without a final newline is only loaded by SIGHUP; writers should
//!   replace the file by rename (atomic), which this always handles.
//!   Polling the *path* rather than watching the file's inode is what makes
//!   rename-replace (how editors, `mv`, and Kubernetes ConfigMap symlink
//!   swaps update files) work: the path then names a new inode, which the
//!   next poll sees. A stat per interval costs nothing measurable, needs no
//!   inotify watch budget and behaves the same on every filesystem.
//!
//! # What a reload does
//! The file is read and compiled off the datapath (a blocking task; a
//! 100k-rule policy takes about a second). The outcome goes to the datapath
//! (through the callback [`spawn`] is given: the session's event queue), so
//! it is applied between two frames, on the one task that owns the flows:
//! - **Invalid file**: nothing changes; the old policy keeps running and
//!   every open flow continues. Audit: `policy_reload`, decision deny,
//!   reason `reload_rejected`, `detail` = the trigger and every error as
//!   `file:line:col: message` ([`Rejected::Policy`]).
//! - **Secrets that cannot be read**: when an interception proxy runs, the
//!   new policy's secret values are read in the same blocking task; if one
//!   cannot be (a missing file, an unset variable, a file outside the
//!   directories the gateway's jail kept readable), the reload is rejected
//!   whole like an invalid file: the old policy *and* the old secret store
//!   stay ([`Rejected::Secrets`], `detail` naming the secret and the error,
//!   never a value). Without a proxy no value is read: nothing could use
//!   one (TLS to a secret's host is refused until restart, see below).
//! - **Valid file**: [`PolicyDecider::swap`] installs it; audit
//!   `policy_reload` / `reload_applied` with the *new* policy's reference and
//!   the previous version in `detail`. Then the datapath (see
//!   `revoke.rs`): sets the DNS table's TTL bounds to the new
//!   policy's; purges names the new policy no longer allows from the table
//!   (later connections to their addresses fail `ip_not_resolved_for_name`);
//!   re-checks every TCP flow that is open or connecting with
//!   [`PolicyDecider::recheck_tcp`] against the names it was admitted under
//!   (the SNI/Host for inspected flows, the table's names at open for raw
//!   TCP; an uninspected flow on a TLS/HTTP port needs a CIDR rule:
//!   [`PolicyDecider::recheck_tcp_uninspected`]); flows now denied are reset (RST to the guest, the host socket
//!   closed with RST) and audited `flow_close` / `reload_revoked` with the new
//!   verdict's reason in `detail`. Flows still being inspected are decided
//!   by the new policy when their first bytes are complete. Forwarded UDP
//!   flows are re-checked the same way ([`PolicyDecider::recheck_udp`],
//!   against the table's names for their destination at open); those now
//!   denied lose their host socket and are audited `flow_close` /
//!   `reload_revoked`.
//! - With no guest connected the swap and the audit line happen at once.
//!
//! # Interception and the sandbox CA
//! The sandbox CA is made at start, name-constrained to the hosts the
//! policy inspected then (none when it inspected nothing), and the guest
//! trusts exactly that certificate: a reload cannot change it. On an applied
//! reload, [`reload_interception`] gives the proxy the new policy's secret
//! store (values and bindings: rotation, rebinding, unbinding), which every
//! request from then on uses, on connections already open too (the proxy
//! reads the store at the start of each request), and lists the inspected
//! patterns the running CA does not cover
//! ([`outside_ca`]). Both go into the `reload_applied` record's `detail` (one
//! line each, see docs/audit.md) and a warning. TLS flows to such hosts are
//! refused at once, never spliced uninspected (a bound secret would be
//! missing): the datapath resets them with reason `inspect_failed` and a
//! detail saying the host is outside the CA's constraints (or that there is
//! no CA) and that a restart is needed.
//!
//! Limits: published (inbound) flows are not re-checked (the policy governs
//! egress).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sluice_intercept::Interceptor;
use sluice_policy::{CompileOptions, CompiledPolicy};
use sluice_secrets::{SecretError, SecretStore};
use tokio::signal::unix::{SignalKind, signal};

use crate::audit::{AuditEvent, AuditSink};
use crate::decide::PolicyDecider;

/// How often the policy file's metadata is polled.
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// What started a reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// `SIGHUP`.
    Sighup,
    /// The policy file changed.
    FileChanged,
}

impl Trigger {
    /// The spelling in the audit line's `detail`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sighup => "sighup",
            Self::FileChanged => "file_changed",
        }
    }
}

/// One reload attempt, delivered to the datapath (see [`spawn`]).
#[derive(Debug)]
pub struct PolicyReload {
    /// The decider whose policy is swapped.
    pub decider: Arc<PolicyDecider>,
    /// The new policy and its secrets, or why the reload is rejected.
    pub outcome: Result<Loaded, Rejected>,
    /// What started it.
    pub trigger: Trigger,
}

/// A reloaded policy ready to apply: compiled, its secret values read.
#[derive(Debug)]
pub struct Loaded {
    /// The compiled policy.
    pub policy: Arc<CompiledPolicy>,
    /// Its secret store; `None` when no interception proxy runs (nothing
    /// would use the values, so none are read).
    pub secrets: Option<Arc<SecretStore>>,
}

/// Why a reload was rejected; the old policy and secret store stay. The
/// message is the reload record's `detail` (after the trigger).
#[derive(Debug, thiserror::Error)]
pub enum Rejected {
    /// The policy file is invalid or unreadable: every error, one
    /// `file:line:col: message` per line.
    #[error("{0}")]
    Policy(String),
    /// The policy is valid but a secret value it names cannot be read.
    #[error("secrets not loaded, policy not applied (the previous policy and secrets stay): {0}")]
    Secrets(#[from] SecretError),
    /// The blocking load task failed (panicked or was cancelled).
    #[error("policy load task failed: {0}")]
    Task(String),
}

/// Where a reload comes from: the policy file and the decider enforcing it.
#[derive(Debug, Clone)]
pub struct ReloadSource {
    /// The policy file given with `--policy`.
    pub path: PathBuf,
    /// The decider built from it.
    pub decider: Arc<PolicyDecider>,
    /// Compile options, as at start. Their host addresses are those read at
    /// start (procfs may be closed to the gateway by then, see
    /// `gateway_self_restrict`); the current set is enforced anyway by the
    /// decider's `PlatformDenySet`, which is checked first and kept fresh.
    pub options: CompileOptions,
    /// The metadata poll interval ([`POLL_INTERVAL`] by default).
    pub poll: Duration,
    /// Whether secret values are read with the policy (an interception
    /// proxy runs; `false` by default).
    pub load_secrets: bool,
}

impl ReloadSource {
    /// A source for `path` enforced by `decider`, polled every
    /// [`POLL_INTERVAL`].
    pub fn new(path: PathBuf, decider: Arc<PolicyDecider>, options: CompileOptions) -> Self {
        Self {
            path,
            decider,
            options,
            poll: POLL_INTERVAL,
            load_secrets: false,
        }
    }

    /// Reads and compiles the file and, with [`ReloadSource::load_secrets`],
    /// reads the secret values it names (blocking).
    ///
    /// # Errors
    /// The file is invalid or unreadable, or a secret value cannot be read.
    pub fn load(&self) -> Result<Loaded, Rejected> {
        let policy = sluice_policy::load_file(&self.path, &self.options)
            .map_err(|e| Rejected::Policy(e.to_string()))?;
        let secrets = if self.load_secrets {
            Some(Arc::new(SecretStore::load(&policy)?))
        } else {
            None
        };
        Ok(Loaded {
            policy: Arc::new(policy),
            secrets,
        })
    }
}

/// The file's identity and version as seen by `stat` (following symlinks)
/// plus its content; `None` when it cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileState {
    stat: (u64, u64, u64, i64, i64, i64, i64),
    /// Hash of the whole content (change detection, not security: the
    /// writer is the operator).
    content: u64,
    /// Whether the content ends with a newline (a complete YAML file does;
    /// an in-place write cut mid-line does not).
    complete: bool,
}

/// What a poll sees at the path.
type Signature = Option<FileState>;

fn signature(path: &std::path::Path) -> Signature {
    use std::hash::{Hash, Hasher};
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    let bytes = std::fs::read(path).ok()?;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut hasher);
    Some(FileState {
        stat: (
            m.dev(),
            m.ino(),
            m.size(),
            m.mtime(),
            m.mtime_nsec(),
            m.ctime(),
            m.ctime_nsec(),
        ),
        content: hasher.finish(),
        complete: bytes.last() == Some(&b'\n'),
    })
}

/// What the poll watches: the policy file and its approval overlay
/// (`sluice_policy::overlay::overlay_path`, written by `allow_always`
/// answers), each as a [`Signature`].
#[derive(Debug, Clone, PartialEq, Eq)]
struct Watched {
    policy: Signature,
    overlay: Signature,
}

impl Watched {
    /// Whether both files are complete (or absent).
    fn complete(&self) -> bool {
        [&self.policy, &self.overlay]
            .iter()
            .all(|s| s.as_ref().is_none_or(|s| s.complete))
    }
}

fn watched(path: &std::path::Path) -> Watched {
    Watched {
        policy: signature(path),
        overlay: signature(&sluice_policy::overlay::overlay_path(path)),
    }
}

/// The poll's debounce: a change fires once the same [`Watched`] is seen
/// on two consecutive polls and the file is complete (or gone: the load then
/// fails and is audited `reload_rejected`).
#[derive(Debug)]
struct Debounce {
    /// What was loaded last.
    seen: Watched,
    /// A changed signature seen on the previous poll.
    candidate: Option<Watched>,
}

impl Debounce {
    /// Feeds one poll's observation; `true` when a reload must fire.
    fn observe(&mut self, now: Watched) -> bool {
        if now == self.seen {
            self.candidate = None;
            return false;
        }
        let complete = now.complete();
        if complete && self.candidate.as_ref() == Some(&now) {
            self.candidate = None;
            return true;
        }
        self.candidate = Some(now);
        false
    }
}

/// Starts the reload task: SIGHUP and the file poll (see the module docs).
/// Each attempt is handed to `deliver`; the task ends when it returns false
/// (nobody listens any more).
///
/// # Errors
/// The SIGHUP handler could not be installed.
pub fn spawn(
    source: ReloadSource,
    mut deliver: impl FnMut(PolicyReload) -> bool + Send + 'static,
) -> std::io::Result<()> {
    let mut hup = signal(SignalKind::hangup())?;
    // Taken now, not when the task first runs: a change made in between
    // must not go unseen.
    let mut debounce = Debounce {
        seen: watched(&source.path),
        candidate: None,
    };
    tokio::spawn(async move {
        let source = Arc::new(source);
        let mut ticker = tokio::time::interval(source.poll);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let trigger = tokio::select! {
                _ = hup.recv() => Some(Trigger::Sighup),
                _ = ticker.tick() => {
                    debounce
                        .observe(watched(&source.path))
                        .then_some(Trigger::FileChanged)
                }
            };
            let Some(trigger) = trigger else { continue };
            // What is loaded now is what the next poll compares against.
            debounce.seen = watched(&source.path);
            debounce.candidate = None;
            let loader = Arc::clone(&source);
            let outcome = match tokio::task::spawn_blocking(move || loader.load()).await {
                Ok(outcome) => outcome,
                Err(e) => Err(Rejected::Task(e.to_string())),
            };
            match &outcome {
                Ok(l) => tracing::info!(
                    trigger = trigger.as_str(),
                    version = l.policy.version_hash(),
                    "policy reloaded"
                ),
                Err(e) => tracing::warn!(
                    trigger = trigger.as_str(), errors = %e, "policy reload rejected; old policy stays"
                ),
            }
            let reload = PolicyReload {
                decider: Arc::clone(&source.decider),
                outcome,
                trigger,
            };
            if !deliver(reload) {
                break;
            }
        }
    });
    Ok(())
}

/// The patterns `policy` inspects that the running sandbox CA cannot sign
/// for (all of them when there is no CA: the policy at start inspected
/// nothing), in policy order, as written (`*.x`, `**.x`, `x`).
pub fn outside_ca(policy: &CompiledPolicy, intercept: Option<&Interceptor>) -> Vec<String> {
    policy
        .inspected_patterns()
        .iter()
        .filter(|p| !intercept.is_some_and(|i| i.ca().covers(p)))
        .map(ToString::to_string)
        .collect()
}

/// The interception side of an applied reload: the proxy (if any) gets the
/// new policy's secret store (used from the next request of every
/// connection), and the inspected patterns outside the running CA are found
/// ([`outside_ca`]). Returns the lines for the reload record's `detail`
/// (empty when there is nothing to say); logs a warning for each problem.
pub fn reload_interception(loaded: &Loaded, intercept: Option<&Interceptor>) -> String {
    let policy = &*loaded.policy;
    let mut lines = Vec::new();
    if let (Some(interceptor), Some(store)) = (intercept, &loaded.secrets) {
        interceptor.set_secrets(Arc::clone(store));
    }
    let outside = outside_ca(policy, intercept);
    if !outside.is_empty() {
        let why = if intercept.is_some() {
            "outside the sandbox CA's name constraints"
        } else {
            "no sandbox CA: the policy at start inspected no host"
        };
        tracing::warn!(
            patterns = ?outside,
            "reload: inspected hosts cannot be intercepted until restart ({why}); their TLS flows are refused"
        );
        lines.push(format!(
            "not inspectable until restart ({why}): {}; TLS to them is refused (inspect_failed)",
            outside.join(", ")
        ));
    }
    lines.join("\n")
}

/// Applies a reload while no guest is connected: swap, the interception
/// side ([`reload_interception`]) and audit (there are no flows or DNS table
/// to revisit).
pub fn apply_idle(reload: PolicyReload, intercept: Option<&Interceptor>, audit: &mut AuditSink) {
    match reload.outcome {
        Ok(loaded) => {
            let previous = reload.decider.swap(Arc::clone(&loaded.policy));
            let note = reload_interception(&loaded, intercept);
            audit.set_policy(Some(loaded.policy));
            let mut detail = format!("previous: {}; no guest connected", previous.version_hash());
            if !note.is_empty() {
                detail.push('\n');
                detail.push_str(&note);
            }
            audit.record(&AuditEvent::Reload {
                applied: true,
                trigger: reload.trigger.as_str(),
                detail: &detail,
            });
        }
        Err(why) => audit.record(&AuditEvent::Reload {
            applied: false,
            trigger: reload.trigger.as_str(),
            detail: &why.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::PlatformDenySet;
    use tokio::sync::mpsc;

    const A: &str =
        "version: 1\nid: reload-test\nlabel: A\nallow:\n  - domain: \"a.example.com\"\n";
    const B: &str =
        "version: 1\nid: reload-test\nlabel: B\nallow:\n  - domain: \"b.example.com\"\n";

    async fn next_reload(rx: &mut mpsc::UnboundedReceiver<PolicyReload>) -> PolicyReload {
        tokio::time::timeout(Duration::from_secs(60), rx.recv())
            .await
            .expect("no reload event")
            .expect("reload task ended")
    }

    fn compiled(yaml: &str) -> CompiledPolicy {
        sluice_policy::from_yaml_str(yaml, "p.yaml", &CompileOptions::default()).unwrap()
    }

    /// `policy` with its secret values read, as [`ReloadSource::load`]
    /// gives it.
    fn loaded(policy: CompiledPolicy) -> Loaded {
        let secrets = Some(Arc::new(SecretStore::load(&policy).unwrap()));
        Loaded {
            policy: Arc::new(policy),
            secrets,
        }
    }

    const INSPECT_A: &str = "version: 1\nid: ca\nallow:\n  - domain: \"**.a.example\"\n  - domain: \"**.b.example\"\ninspect:\n  - \"api.a.example\"\n";

    #[test]
    fn reload_names_inspected_patterns_outside_the_running_ca() {
        let start = compiled(INSPECT_A);
        let store = Arc::new(SecretStore::load(&start).unwrap());
        let proxy =
            Interceptor::new(start.inspected_patterns(), store, Default::default()).unwrap();
        assert!(outside_ca(&start, Some(&proxy)).is_empty());
        let start = loaded(start);
        assert_eq!(reload_interception(&start, Some(&proxy)), "");

        // Below the CA's subtree: covered. Another name, a wider pattern, and
        // a secret's host: not.
        let dir = std::env::temp_dir().join(format!("sc-reload-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let secret = dir.join("s");
        std::fs::write(&secret, "value-of-s\n").unwrap();
        let wider = compiled(&format!(
            "{}  - \"v1.api.a.example\"\n  - \"**.a.example\"\n  - \"*.b.example\"\n\
             secrets:\n  - name: s\n    placeholder: sk-sluice-test-ph\n    file: {}\n    hosts: [c.b.example]\n",
            INSPECT_A,
            secret.display()
        ));
        assert_eq!(
            outside_ca(&wider, Some(&proxy)),
            ["**.a.example", "*.b.example", "c.b.example"]
        );
        let note = reload_interception(&loaded(wider), Some(&proxy));
        assert_eq!(
            note,
            "not inspectable until restart (outside the sandbox CA's name constraints): \
             **.a.example, *.b.example, c.b.example; TLS to them is refused (inspect_failed)"
        );
        // The new secret's value reached the proxy.
        assert_eq!(proxy.secrets().names().collect::<Vec<_>>(), ["s"]);

        // No CA at all (nothing inspected at start): every inspected pattern.
        assert_eq!(outside_ca(&start.policy, None), ["api.a.example"]);
        let note = reload_interception(&start, None);
        assert!(
            note.contains("(no sandbox CA: the policy at start inspected no host): api.a.example"),
            "{note}"
        );
        let nothing = compiled("version: 1\nid: ca\nallow:\n  - domain: a.example\n");
        assert_eq!(reload_interception(&loaded(nothing), None), "");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A policy file that compiles but names a secret that cannot be read
    /// is rejected whole: the decider keeps the old policy, the proxy the
    /// old store, and the audit says which secret and why.
    #[test]
    fn a_reload_whose_secrets_cannot_be_read_is_rejected_whole() {
        let dir = std::env::temp_dir().join(format!("sc-reload-sec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let secret = dir.join("s");
        std::fs::write(&secret, "value-of-s\n").unwrap();
        let with_secret = |file: &std::path::Path, label: &str| {
            format!(
                "{INSPECT_A}label: {label}\nsecrets:\n  - name: s\n    placeholder: sk-sluice-test-ph\n    file: {}\n    hosts: [api.a.example]\n",
                file.display()
            )
        };
        let path = dir.join("policy.yaml");
        std::fs::write(&path, with_secret(&secret, "old")).unwrap();
        let start = sluice_policy::load_file(&path, &CompileOptions::default()).unwrap();
        let store = Arc::new(SecretStore::load(&start).unwrap());
        let proxy =
            Interceptor::new(start.inspected_patterns(), store, Default::default()).unwrap();
        let decider = Arc::new(PolicyDecider::new(
            Arc::new(start),
            PlatformDenySet::default(),
        ));
        let mut source = ReloadSource::new(
            path.clone(),
            Arc::clone(&decider),
            CompileOptions::default(),
        );
        source.load_secrets = true;

        // The new policy (another label) names a file that does not exist.
        std::fs::write(&path, with_secret(&dir.join("missing"), "new")).unwrap();
        let outcome = source.load();
        assert!(matches!(outcome, Err(Rejected::Secrets(_))), "{outcome:?}");
        let buf = crate::audit::tests::Shared::default();
        let mut sink = AuditSink::new(Box::new(buf.clone()), "t");
        apply_idle(
            PolicyReload {
                decider: Arc::clone(&decider),
                outcome,
                trigger: Trigger::Sighup,
            },
            Some(&proxy),
            &mut sink,
        );
        assert_eq!(decider.policy().label(), Some("old"));
        assert!(sink.policy().is_none(), "the sink's policy was replaced");
        let lines = crate::audit::tests::parse_all(&buf.text());
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert_eq!(lines[0]["kind"], "policy_reload");
        assert_eq!(lines[0]["reason"], "reload_rejected");
        let detail = lines[0]["detail"].as_str().unwrap();
        assert!(
            detail.contains("secrets not loaded, policy not applied")
                && detail.contains("secret `s`")
                && detail.contains("missing"),
            "{detail}"
        );
        assert!(!detail.contains("value-of-s"), "{detail}");
        // The proxy still holds the old value, bound as before.
        let sub = proxy.secrets().for_host("api.a.example");
        assert_eq!(sub.bound_names().collect::<Vec<_>>(), ["s"]);

        // Readable again: the same file loads, values and all.
        std::fs::write(&path, with_secret(&secret, "new")).unwrap();
        let l = source.load().unwrap();
        assert_eq!(l.policy.label(), Some("new"));
        assert_eq!(l.secrets.unwrap().names().collect::<Vec<_>>(), ["s"]);
        // Without a proxy no value is read: the missing file is no error.
        source.load_secrets = false;
        std::fs::write(&path, with_secret(&dir.join("missing"), "new")).unwrap();
        assert!(source.load().unwrap().secrets.is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_still_being_written_in_place_is_not_loaded() {
        let dir = std::env::temp_dir().join(format!("fx-reload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("policy.yaml");
        std::fs::write(&path, A).unwrap();
        let mut d = Debounce {
            seen: watched(&path),
            candidate: None,
        };
        assert!(!d.observe(watched(&path)));
        // A slow writer has written part of B (cut mid-line) and paused:
        // metadata and content are stable over two polls, but incomplete.
        let cut = &B[..B.len() - 5];
        std::fs::write(&path, cut).unwrap();
        assert!(!d.observe(watched(&path)));
        assert!(!d.observe(watched(&path)));
        assert!(!d.observe(watched(&path)));
        // The whole file: fires on the second identical poll only.
        std::fs::write(&path, B).unwrap();
        assert!(!d.observe(watched(&path)));
        assert!(d.observe(watched(&path)));
        // Same metadata shape but other content is a different signature.
        let a = watched(&path);
        std::fs::write(&path, B.replace('b', "c")).unwrap();
        let c = watched(&path);
        assert_ne!(a.policy.map(|s| s.content), c.policy.map(|s| s.content));
        // A removed file fires (the load then fails and is audited).
        d.seen = watched(&path);
        d.candidate = None;
        std::fs::remove_file(&path).unwrap();
        assert!(!d.observe(watched(&path)));
        assert!(d.observe(watched(&path)));
        // The approval overlay beside it is watched too.
        std::fs::write(&path, A).unwrap();
        d.seen = watched(&path);
        d.candidate = None;
        let overlay = sluice_policy::overlay::overlay_path(&path);
        std::fs::write(&overlay, "version: 1\nid: approved\nallow: []\n").unwrap();
        assert!(!d.observe(watched(&path)));
        assert!(d.observe(watched(&path)));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn file_changes_in_place_and_by_rename_are_reloaded_and_invalid_ones_rejected() {
        let dir = std::env::temp_dir().join(format!("au-reload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("policy.yaml");
        std::fs::write(&path, A).unwrap();
        let initial = sluice_policy::load_file(&path, &CompileOptions::default()).unwrap();
        let decider = Arc::new(PolicyDecider::new(
            Arc::new(initial),
            PlatformDenySet::default(),
        ));
        let mut source = ReloadSource::new(path.clone(), decider, CompileOptions::default());
        source.poll = Duration::from_millis(20);
        let (tx, mut rx) = mpsc::unbounded_channel();
        spawn(source, move |r| tx.send(r).is_ok()).unwrap();

        // Rename-replace, as editors do.
        let tmp = dir.join("policy.yaml.tmp");
        std::fs::write(&tmp, B).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        let r = next_reload(&mut rx).await;
        assert_eq!(r.trigger, Trigger::FileChanged);
        let p = r.outcome.unwrap();
        assert_eq!(p.policy.label(), Some("B"));
        // Applying it swaps the decider's policy.
        let mut sink = AuditSink::new(Box::new(std::io::sink()), "t");
        let decider = Arc::clone(&r.decider);
        apply_idle(
            PolicyReload {
                decider: Arc::clone(&decider),
                outcome: Ok(p),
                trigger: r.trigger,
            },
            None,
            &mut sink,
        );
        assert_eq!(decider.policy().label(), Some("B"));
        assert_eq!(sink.policy().and_then(|p| p.label()), Some("B"));

        // In place, invalid: rejected with the file's position.
        std::fs::write(&path, "version: 1\nid: x\nbogus: 1\n").unwrap();
        let r = next_reload(&mut rx).await;
        let errors = r.outcome.unwrap_err().to_string();
        assert!(errors.contains("policy.yaml:3:"), "{errors}");
        assert!(errors.contains("bogus"), "{errors}");

        // Deleted: rejected (the old policy stays), never a panic.
        std::fs::remove_file(&path).unwrap();
        let r = next_reload(&mut rx).await;
        assert!(r.outcome.is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! Policy reload: SIGHUP and changes of the policy file load, validate and
//! swap the policy atomically.
//!
//! # Triggers
//! - `SIGHUP`: reload now.
//! - A change of the policy file, found by polling the path's metadata
//!   (device, inode, size, mtime, ctime; symlinks followed) every
//!   [`POLL_INTERVAL`]. A change is acted on once the metadata has stayed
//!   the same for one further interval, so an editor still writing the file
//!   is not caught half way (a reload follows within about two intervals).
//!   Polling the *path* rather than watching the file's inode is what makes
//!   rename-replace (how editors, `mv`, and Kubernetes ConfigMap symlink
//!   swaps update files) work: the path then names a new inode, which the
//!   next poll sees. A stat per interval costs nothing measurable, needs no
//!   inotify watch budget and behaves the same on every filesystem.
//!
//! # What a reload does
//! The file is read and compiled off the datapath (a blocking task; a
//! 100k-rule policy takes about a second). The outcome goes to the datapath
//! as [`Event::Reload`], so it is applied between two frames, on the one
//! task that owns the flows:
//! - **Invalid file**: nothing changes; the old policy keeps running and
//!   every open flow continues. Audit: `policy_reload`, decision deny,
//!   reason `reload_rejected`, `detail` = the trigger and every error as
//!   `file:line:col: message`.
//! - **Valid file**: [`PolicyDecider::swap`] installs it; audit
//!   `policy_reload` / `reload_applied` with the *new* policy's reference and
//!   the previous version in `detail`. Then the datapath (see
//!   `datapath/revoke.rs`): sets the DNS table's TTL bounds to the new
//!   policy's; purges names the new policy no longer allows from the table
//!   (later connections to their addresses fail `ip_not_resolved_for_name`);
//!   re-checks every TCP flow that is open or connecting with
//!   [`PolicyDecider::recheck_tcp`] against the names it was admitted under
//!   (the SNI/Host for inspected flows, the table's names at open for raw
//!   TCP); flows now denied are reset (RST to the guest, the host socket
//!   closed with RST) and audited `flow_close` / `reload_revoked` with the new
//!   verdict's reason in `detail`. Flows still being inspected are decided
//!   by the new policy when their first bytes are complete. Forwarded UDP
//!   flows are re-checked the same way ([`PolicyDecider::recheck_udp`],
//!   against the table's names for their destination at open); those now
//!   denied lose their host socket and are audited `flow_close` /
//!   `reload_revoked`.
//! - With no guest connected the swap and the audit line happen at once.
//!
//! Limits: published (inbound) flows are not re-checked (the policy governs
//! egress).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sluice_policy::{CompileOptions, CompiledPolicy};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use crate::audit::{AuditEvent, AuditSink};
use crate::datapath::Event;
use crate::enforce::PolicyDecider;

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

/// One reload attempt, delivered to the datapath as [`Event::Reload`].
#[derive(Debug)]
pub struct PolicyReload {
    /// The decider whose policy is swapped.
    pub decider: Arc<PolicyDecider>,
    /// The compiled new policy, or every error (one per line).
    pub outcome: Result<Arc<CompiledPolicy>, String>,
    /// What started it.
    pub trigger: Trigger,
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
        }
    }

    /// Reads and compiles the file (blocking).
    pub fn load(&self) -> Result<Arc<CompiledPolicy>, String> {
        sluice_policy::load_file(&self.path, &self.options)
            .map(Arc::new)
            .map_err(|e| e.to_string())
    }
}

/// The file's identity and version as seen by `stat` (following symlinks);
/// `None` when it cannot be read.
type Signature = Option<(u64, u64, u64, i64, i64, i64, i64)>;

fn signature(path: &std::path::Path) -> Signature {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
    ))
}

/// Starts the reload task: SIGHUP and the file poll (see the module docs).
/// Each attempt is sent to `events`; the task ends when nobody listens.
///
/// # Errors
/// The SIGHUP handler could not be installed.
pub fn spawn(source: ReloadSource, events: mpsc::UnboundedSender<Event>) -> std::io::Result<()> {
    let mut hup = signal(SignalKind::hangup())?;
    // Taken now, not when the task first runs: a change made in between
    // must not go unseen.
    let mut seen = signature(&source.path);
    tokio::spawn(async move {
        let source = Arc::new(source);
        let mut candidate: Option<Signature> = None;
        let mut ticker = tokio::time::interval(source.poll);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let trigger = tokio::select! {
                _ = hup.recv() => Some(Trigger::Sighup),
                _ = ticker.tick() => {
                    let now = signature(&source.path);
                    if now == seen {
                        candidate = None;
                        None
                    } else if candidate == Some(now) {
                        candidate = None;
                        Some(Trigger::FileChanged)
                    } else {
                        candidate = Some(now);
                        None
                    }
                }
            };
            let Some(trigger) = trigger else { continue };
            // What is loaded now is what the next poll compares against.
            seen = signature(&source.path);
            let loader = Arc::clone(&source);
            let outcome = match tokio::task::spawn_blocking(move || loader.load()).await {
                Ok(outcome) => outcome,
                Err(e) => Err(format!("policy compile task failed: {e}")),
            };
            match &outcome {
                Ok(p) => tracing::info!(
                    trigger = trigger.as_str(),
                    version = p.version_hash(),
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
            if events.send(Event::Reload(Box::new(reload))).is_err() {
                break;
            }
        }
    });
    Ok(())
}

/// Applies a reload while no guest is connected: swap and audit (there are
/// no flows or DNS table to revisit).
pub fn apply_idle(reload: PolicyReload, audit: &mut AuditSink) {
    match reload.outcome {
        Ok(policy) => {
            let previous = reload.decider.swap(Arc::clone(&policy));
            audit.set_policy(Some(policy));
            let detail = format!("previous: {}; no guest connected", previous.version_hash());
            audit.record(&AuditEvent::Reload {
                applied: true,
                trigger: reload.trigger.as_str(),
                detail: &detail,
            });
        }
        Err(errors) => audit.record(&AuditEvent::Reload {
            applied: false,
            trigger: reload.trigger.as_str(),
            detail: &errors,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::PlatformDenySet;

    const A: &str =
        "version: 1\nid: reload-test\nlabel: A\nallow:\n  - domain: \"a.example.com\"\n";
    const B: &str =
        "version: 1\nid: reload-test\nlabel: B\nallow:\n  - domain: \"b.example.com\"\n";

    async fn next_reload(rx: &mut mpsc::UnboundedReceiver<Event>) -> PolicyReload {
        let ev = tokio::time::timeout(Duration::from_secs(60), rx.recv())
            .await
            .expect("no reload event")
            .expect("reload task ended");
        match ev {
            Event::Reload(r) => *r,
            other => panic!("unexpected event {other:?}"),
        }
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
        spawn(source, tx).unwrap();

        // Rename-replace, as editors do.
        let tmp = dir.join("policy.yaml.tmp");
        std::fs::write(&tmp, B).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        let r = next_reload(&mut rx).await;
        assert_eq!(r.trigger, Trigger::FileChanged);
        let p = r.outcome.unwrap();
        assert_eq!(p.label(), Some("B"));
        // Applying it swaps the decider's policy.
        let mut sink = AuditSink::new(Box::new(std::io::sink()), "t");
        let decider = Arc::clone(&r.decider);
        apply_idle(
            PolicyReload {
                decider: Arc::clone(&decider),
                outcome: Ok(p),
                trigger: r.trigger,
            },
            &mut sink,
        );
        assert_eq!(decider.policy().label(), Some("B"));
        assert_eq!(sink.policy().and_then(|p| p.label()), Some("B"));

        // In place, invalid: rejected with the file's position.
        std::fs::write(&path, "version: 1\nid: x\nbogus: 1\n").unwrap();
        let r = next_reload(&mut rx).await;
        let errors = r.outcome.unwrap_err();
        assert!(errors.contains("policy.yaml:3:"), "{errors}");
        assert!(errors.contains("bogus"), "{errors}");

        // Deleted: rejected (the old policy stays), never a panic.
        std::fs::remove_file(&path).unwrap();
        let r = next_reload(&mut rx).await;
        assert!(r.outcome.is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! Runtime approval on the gateway's side (docs/approval.md): the
//! sandbox's [`Broker`] (what was decided, what is being asked), the
//! backend that answers, and the one task per question that asks it.
//!
//! The decider says [`DnsDecision::Ask`](crate::decide::DnsDecision::Ask)
//! for a name the policy would ask about
//! ([`sluice_policy::CompiledPolicy::would_ask`]); the DNS server
//! (`super::server`) then holds the guest's query and asks
//! [`Approvals::ask`]; a new question is sent by [`spawn_question`] off the
//! session's event loop, bounded by the policy's timeout, and its answer
//! comes back as an [`ApprovalReply`] event. The flow decider then consults
//! [`Approvals::opens`] (through `DecideContext::approved`) for a name the
//! policy does not list: an approved name opens exactly the ports the
//! `approval:` section names, for the decision's lifetime. Everything else
//! (the address gate, SNI and Host checks, interception) is the decider's,
//! exactly as for a listed name.
//!
//! An honoured `allow_always` is written to the policy's overlay beside it
//! (`sluice_policy::overlay`), or, under `sluice run`, whose jail keeps the
//! policy's directory read-only, handed to the launcher, which validates it
//! and writes the overlay (`sluice_approval::handoff`). The audit record
//! says `always` only when it was written.
//!
//! A backend that cannot be built (a terminal backend without
//! `--approval-socket`, an unreadable webhook CA) answers every question
//! with an error, hence deny.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_approval::backend::unix::UnixBackend;
use sluice_approval::backend::webhook::{WebhookBackend, WebhookConfig};
use sluice_approval::handoff::{HandoffReply, OverlayEntry, hand_off};
use sluice_approval::{Answer, Asked, Backend, BackendError, Broker, BrokerConfig, Choice, Grant};
use sluice_policy::{ApprovalBackend, ApprovalSpec};
use tokio::sync::mpsc;

use crate::config::ApprovalSetup;
use crate::flow::Transport;
use crate::session::Event;

/// How long a `deny_once` (or a failure) keeps refusing a name without
/// asking again: resolvers retry within seconds, a retry must not ask twice.
pub(crate) const DENY_ONCE_HOLD: Duration = Duration::from_secs(5);

/// The backend in force and the spec it was built for.
struct Asking {
    spec: ApprovalSpec,
    broker: Broker,
    backend: Result<Arc<dyn Backend>, String>,
}

/// One sandbox's approvals: the standing decisions and the questions out.
pub struct Approvals {
    setup: ApprovalSetup,
    sandbox: String,
    asking: Option<Asking>,
}

impl std::fmt::Debug for Approvals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Approvals")
            .field("asking", &self.asking.is_some())
            .finish_non_exhaustive()
    }
}

/// A question to send: what [`spawn_question`] needs.
#[derive(Debug)]
pub(crate) struct Outgoing {
    question: sluice_approval::Question,
    backend: Result<Arc<dyn Backend>, String>,
    timeout: Duration,
    overlay: Option<OverlaySink>,
}

/// Where an honoured `allow_always` goes.
#[derive(Debug, Clone)]
enum OverlaySink {
    /// Written beside this policy file by the gateway itself.
    Beside(PathBuf),
    /// Handed to the launcher listening on this socket, which validates
    /// it and writes the overlay (`--approval-overlay-socket`).
    Launcher(PathBuf),
}

/// How long the launcher may take to prepare an overlay entry (after
/// that, nothing is written and the answer counts as `allow_sandbox`).
const HANDOFF_TIMEOUT: Duration = Duration::from_secs(10);

/// A backend's answer (or its failure) to one question, back on the
/// session's event loop.
#[derive(Debug)]
#[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
pub struct ApprovalReply {
    /// The name asked about.
    pub name: String,
    /// The backend's kind (`webhook`, `unix`, `terminal`).
    pub kind: &'static str,
    /// The answer, or why there is none.
    pub result: Result<Answer, BackendError>,
    /// For an honoured `allow_always`: whether the overlay was written
    /// (`Err` with why not: the answer then counts for this sandbox only).
    pub overlay: Option<Result<(), String>>,
}

impl Approvals {
    /// No approvals yet; a broker is made at the first question.
    pub(crate) fn new(sandbox: &str, setup: ApprovalSetup) -> Self {
        Self {
            setup,
            sandbox: sandbox.to_owned(),
            asking: None,
        }
    }

    /// What to do about a query for `name` (type `qtype`) that the policy
    /// `policy_id`, whose `approval:` section is `spec`, would ask about.
    /// [`Asked::Ask`] comes with the question to send.
    pub(crate) fn ask(
        &mut self,
        spec: &ApprovalSpec,
        policy_id: &str,
        name: &str,
        qtype: &str,
        now: Instant,
    ) -> (Asked, Option<Outgoing>) {
        let overlay = if spec.always {
            self.overlay_sink()
        } else {
            None
        };
        let asking = self.asking_for(spec, policy_id);
        let asked = asking.broker.ask(name, qtype, now);
        let out = match &asked {
            Asked::Ask(q) => Some(Outgoing {
                question: q.clone(),
                backend: asking.backend.clone(),
                timeout: spec.timeout,
                overlay,
            }),
            _ => None,
        };
        (asked, out)
    }

    /// Where `allow_always` entries go: the launcher when it serves them,
    /// else beside the policy file; `None` with no policy file.
    fn overlay_sink(&self) -> Option<OverlaySink> {
        match (&self.setup.overlay_socket, &self.setup.policy_path) {
            (Some(socket), _) => Some(OverlaySink::Launcher(socket.clone())),
            (None, Some(policy)) => Some(OverlaySink::Beside(policy.clone())),
            (None, None) => None,
        }
    }

    /// The broker for `spec`, made anew when the spec changed (a reload
    /// that changes the `approval:` section forgets the decisions taken
    /// under the old one).
    fn asking_for(&mut self, spec: &ApprovalSpec, policy_id: &str) -> &mut Asking {
        if self.asking.as_ref().is_some_and(|a| a.spec != *spec) {
            self.asking = None;
        }
        let can_write = self.overlay_sink().is_some();
        let (sandbox, setup) = (&self.sandbox, &self.setup);
        self.asking.get_or_insert_with(|| Asking {
            spec: spec.clone(),
            broker: Broker::new(BrokerConfig {
                sandbox: sandbox.clone(),
                policy: policy_id.to_owned(),
                tcp_ports: spec.tcp_ports.clone(),
                udp_ports: spec.udp_ports.clone(),
                always_allowed: spec.always && can_write,
                timeout: spec.timeout,
                max_pending: spec.max_pending,
                per_minute: spec.per_minute,
                deny_once_hold: DENY_ONCE_HOLD,
            }),
            backend: backend_for(&spec.backend, setup),
        })
    }

    /// Records a backend's answer and returns the decision that now stands
    /// (`None` when the broker was replaced meanwhile: the answer is moot).
    pub(crate) fn answered(
        &mut self,
        name: &str,
        kind: &str,
        result: Result<Answer, BackendError>,
        now: Instant,
    ) -> Option<Grant> {
        let asking = self.asking.as_mut()?;
        Some(asking.broker.answered(name, kind, result, now))
    }

    /// Whether a standing decision opens `name` at `now` (any port).
    pub fn allows(&self, name: &str, now: Instant) -> bool {
        self.asking
            .as_ref()
            .is_some_and(|a| a.broker.allows(name, now))
    }

    /// Whether a standing decision opens `name` on `port` over `transport`
    /// at `now`: the ports the `approval:` section names, nothing else.
    /// The caller still applies every address and wire check.
    pub fn opens(&self, name: &str, transport: Transport, port: u16, now: Instant) -> bool {
        self.asking.as_ref().is_some_and(|a| {
            let ports = match transport {
                Transport::Tcp => &a.spec.tcp_ports,
                Transport::Udp => &a.spec.udp_ports,
            };
            ports.contains(&port) && a.broker.allows(name, now)
        })
    }

    /// An `allow_once` lasts until the DNS answer handed out ends.
    pub(crate) fn answer_ttl(&mut self, name: &str, ttl: Duration, now: Instant) {
        if let Some(a) = &mut self.asking {
            a.broker.set_answer_ttl(name, ttl, now);
        }
    }

    /// The ports a decision opens (for the audit record).
    pub(crate) fn ports(&self) -> (Vec<u16>, Vec<u16>) {
        self.asking.as_ref().map_or_else(Default::default, |a| {
            (a.spec.tcp_ports.clone(), a.spec.udp_ports.clone())
        })
    }
}

/// The backend for the policy's `approval.backend`; the setup's `socket`
/// (`--approval-socket`) replaces it when given, and its webhook pin (a
/// launcher's resolution) says where a webhook is connected to.
fn backend_for(
    backend: &ApprovalBackend,
    setup: &ApprovalSetup,
) -> Result<Arc<dyn Backend>, String> {
    if let Some(path) = &setup.socket {
        return Ok(Arc::new(TerminalSocket(UnixBackend::new(path.clone()))));
    }
    match backend {
        ApprovalBackend::Terminal => Err(
            "the `terminal` approval backend needs `sluice run --ask` (--approval-socket)".into(),
        ),
        ApprovalBackend::Unix(path) => Ok(Arc::new(UnixBackend::new(path.clone()))),
        ApprovalBackend::Webhook {
            url,
            bearer_token_file,
            client_cert,
            client_key,
            ca,
        } => {
            let hook = WebhookBackend::new(&WebhookConfig {
                url: url.clone(),
                bearer_token_file: bearer_token_file.clone(),
                client_cert: client_cert.clone(),
                client_key: client_key.clone(),
                ca: ca.clone(),
            })
            .map_err(|e| e.to_string())?;
            let hook = match &setup.webhook_pin {
                Some(pin) => {
                    hook.with_addresses(pin.addresses_for(url).map_err(|e| e.to_string())?)
                }
                None => hook,
            };
            Ok(Arc::new(hook))
        }
    }
}

/// The unix backend of `--approval-socket`, audited as `terminal` (the
/// launcher answers it from its terminal).
#[derive(Debug)]
struct TerminalSocket(UnixBackend);

impl Backend for TerminalSocket {
    fn kind(&self) -> &'static str {
        "terminal"
    }

    fn ask<'a>(
        &'a self,
        question: &'a sluice_approval::Question,
    ) -> sluice_approval::backend::AnswerFuture<'a> {
        self.0.ask(question)
    }
}

/// Asks `out`'s backend on a task of its own (the event loop never waits),
/// bounded by the policy's timeout, writes the overlay for an honoured
/// `allow_always`, and sends the reply back as [`Event::Approval`].
pub(crate) fn spawn_question(out: Outgoing, events: mpsc::UnboundedSender<Event>) {
    tokio::spawn(async move {
        let Outgoing {
            question,
            backend,
            timeout,
            overlay,
        } = out;
        let (kind, result) = match &backend {
            Ok(b) => {
                let r = tokio::time::timeout(timeout, b.ask(&question))
                    .await
                    .unwrap_or(Err(BackendError::Timeout));
                (b.kind(), r)
            }
            Err(why) => ("backend", Err(BackendError::Config(why.clone()))),
        };
        if let Err(e) = &result {
            tracing::warn!(name = %question.name, error = %e, "approval question failed: denied");
        }
        let wrote = match (&result, overlay) {
            (Ok(a), Some(sink)) if a.decision == Choice::AllowAlways => {
                let r = match sink {
                    OverlaySink::Beside(policy) => write_overlay(policy, &question, kind, a).await,
                    OverlaySink::Launcher(socket) => {
                        hand_overlay(&socket, &question, kind, a).await
                    }
                };
                if let Err(e) = &r {
                    tracing::warn!(error = %e, "approval overlay not written: allowed for this sandbox only");
                }
                Some(r)
            }
            _ => None,
        };
        let _ = events.send(Event::Approval(Box::new(ApprovalReply {
            name: question.name.clone(),
            kind,
            result,
            overlay: wrote,
        })));
    });
}

/// How long a standalone gateway waits for the overlay's new file to be
/// prepared (the policy's directory locked, the overlay read and written
/// under a temporary name) before it gives up and writes nothing: the
/// approval task must always finish and audit. The writer itself gives up
/// on another writer's lock after a few seconds; this bounds the rest
/// (a stalled file system).
const OVERLAY_WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Appends the approved name to the policy's overlay (blocking file I/O,
/// off the runtime's thread), within [`OVERLAY_WRITE_TIMEOUT`]: past it,
/// nothing is written, so the audit record and the file agree.
async fn write_overlay(
    policy: PathBuf,
    q: &sluice_approval::Question,
    kind: &str,
    a: &Answer,
) -> Result<(), String> {
    let name = q.name.clone();
    let tcp = q.tcp_ports.clone();
    let udp = q.udp_ports.clone();
    let sandbox = q.sandbox.clone();
    let by = decided_by(kind, a);
    let at = sluice_policy::audit::Timestamp::now();
    let at = serde_json::to_value(at)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel();
    let task = tokio::task::spawn_blocking(move || {
        let entry = sluice_policy::overlay::Approved {
            name: &name,
            tcp_ports: &tcp,
            udp_ports: &udp,
            by: &by,
            sandbox: &sandbox,
            at: &at,
        };
        append_when_awaited(&policy, &entry, ready_tx, go_rx)
    });
    match tokio::time::timeout(OVERLAY_WRITE_TIMEOUT, ready_rx).await {
        // Prepared in time: commit (a rename and a sync) and report it.
        Ok(Ok(())) => {
            let _ = go_tx.send(());
        }
        // The writer finished without preparing (listed, or an error).
        Ok(Err(_)) => {}
        // `go_tx` dropped: the writer removes what it prepares, if ever.
        Err(_) => {
            return Err(format!(
                "the overlay was not prepared within {} s: not written",
                OVERLAY_WRITE_TIMEOUT.as_secs()
            ));
        }
    }
    task.await.unwrap_or_else(|e| Err(e.to_string()))
}

/// Prepares `entry` in the overlay of `policy`, says so on `ready`, and
/// commits it only when `go` says the waiting side still waits; dropped
/// uncommitted (nothing written) when `go`'s sender is gone.
fn append_when_awaited(
    policy: &std::path::Path,
    entry: &sluice_policy::overlay::Approved<'_>,
    ready: tokio::sync::oneshot::Sender<()>,
    go: tokio::sync::oneshot::Receiver<()>,
) -> Result<(), String> {
    let Some(prepared) =
        sluice_policy::overlay::prepare(policy, entry).map_err(|e| e.to_string())?
    else {
        return Ok(());
    };
    if ready.send(()).is_err() || go.blocking_recv().is_err() {
        return Err("the approval gave up waiting: not written".to_owned());
    }
    prepared.commit().map_err(|e| e.to_string())
}

/// Who decided, as the overlay's comment records it.
fn decided_by(kind: &str, a: &Answer) -> String {
    match &a.by {
        Some(by) => format!("{kind}: {by}"),
        None => kind.to_owned(),
    }
}

/// Hands the approved name to the launcher on `socket`, which validates it
/// and writes the overlay beside the policy. The launcher must have
/// prepared the file within [`HANDOFF_TIMEOUT`], else nothing is written;
/// once it has, the gateway waits for the rename's outcome
/// (`sluice_approval::handoff`), so that only a `written` counts as
/// written and a `written` is always in the file.
async fn hand_overlay(
    socket: &std::path::Path,
    q: &sluice_approval::Question,
    kind: &str,
    a: &Answer,
) -> Result<(), String> {
    let entry = OverlayEntry {
        name: q.name.clone(),
        tcp_ports: q.tcp_ports.clone(),
        udp_ports: q.udp_ports.clone(),
        by: decided_by(kind, a),
    };
    let deadline = tokio::time::Instant::now() + HANDOFF_TIMEOUT;
    match hand_off(socket, &entry, deadline).await {
        Ok(HandoffReply::Written) => Ok(()),
        Ok(HandoffReply::Refused(why)) => Err(format!("the launcher refused it: {why}")),
        Ok(HandoffReply::Prepared) => Err("the launcher answered out of turn".to_owned()),
        Err(BackendError::Timeout) => Err(format!(
            "the launcher had not prepared it within {} s: nothing written",
            HANDOFF_TIMEOUT.as_secs()
        )),
        Err(e) => Err(format!("handing it to the launcher: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(tag: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt as _;
        let d =
            std::env::temp_dir().join(format!("sluice-gw-overlay-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        let p = d.join("p.yaml");
        std::fs::write(&p, "version: 1\nid: p\n").unwrap();
        p
    }

    fn entry(name: &str) -> sluice_policy::overlay::Approved<'_> {
        sluice_policy::overlay::Approved {
            name,
            tcp_ports: &[443],
            udp_ports: &[],
            by: "test",
            sandbox: "sb",
            at: "2026-11-28T00:00:00Z",
        }
    }

    #[test]
    fn an_overlay_prepared_after_the_approval_gave_up_is_not_written() {
        let p = policy("gaveup");
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
        // The approval task timed out: both of its ends are gone.
        drop((ready_rx, go_tx));
        let r = append_when_awaited(&p, &entry("late.example.org"), ready_tx, go_rx);
        assert!(r.is_err_and(|e| e.contains("not written")));
        let d = p.parent().unwrap();
        let names: Vec<_> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["p.yaml"], "written or left behind");
    }

    #[test]
    fn an_overlay_the_approval_still_waits_for_is_written() {
        let p = policy("waits");
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let (go_tx, go_rx) = tokio::sync::oneshot::channel();
        let writer = {
            let p = p.clone();
            std::thread::spawn(move || {
                append_when_awaited(&p, &entry("kept.example.org"), ready_tx, go_rx)
            })
        };
        ready_rx.blocking_recv().unwrap();
        go_tx.send(()).unwrap();
        writer.join().unwrap().unwrap();
        let text = std::fs::read_to_string(sluice_policy::overlay::overlay_path(&p)).unwrap();
        assert!(text.contains("kept.example.org"), "{text}");
    }
}

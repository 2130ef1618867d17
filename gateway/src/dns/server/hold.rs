//! The hold of `unlisted: ask` (docs/approval.md): a guest query for a name
//! the decider says to ask about ([`DnsDecision::Ask`]) waits here while
//! the approval backend decides, once per name: every query of that name,
//! of any type, joins the one question. The decision then sends each held
//! query on as a listed name's ([`DnsServer::forward`]) or REFUSES it,
//! exactly as if the policy had said so.

use std::time::Instant;

use hickory_proto::op::ResponseCode;
use sluice_approval::{Answer, Asked, BackendError, Grant};
use sluice_policy::Reason;

use super::{
    Asker, DnsServer, MAX_WAITERS_PER_QUESTION, Outcome, Question, Served, Waiter, deliver,
};
use crate::decide::{AskAbout, Decider, DnsDecision, Verdict};

/// The `dns` line's detail for a name a runtime approval opened.
pub(super) const APPROVED: &str = "runtime approval";

/// A REFUSED answer to `question` with `verdict` (an approval's deny, or a
/// refusal without asking).
fn refused(to: Asker, question: Question, verdict: Verdict) -> Served {
    let bytes = sluice_inspect::dns::refused_response(&question);
    let rcode = ResponseCode::Refused;
    Served::Now(deliver(
        to,
        question,
        bytes,
        Outcome::Denied { rcode, verdict },
    ))
}

/// The verdict of a query an approval question refused (a deny, a
/// timeout, a backend failure).
const DENIED: Verdict = Verdict::of(Reason::ApprovalDenied);

impl DnsServer {
    /// A query whose name may be asked about under `about`: `None` when a
    /// standing approval opens it (the caller goes on), else what became
    /// of the query (held, or refused).
    pub(super) fn hold(
        &mut self,
        to: Asker,
        question: Question,
        about: &AskAbout,
        now: Instant,
    ) -> Option<Served> {
        let qtype = question.qtype.to_string();
        let (asked, out) =
            self.approvals
                .ask(&about.spec, &about.policy_id, &question.name, &qtype, now);
        match (asked, out) {
            (Asked::Decided(g), _) if g.choice.allows() => None,
            (Asked::Decided(_), _) => Some(refused(to, question, DENIED)),
            (Asked::Refused(why), _) => Some(refused(
                to,
                question,
                Verdict::explained(Reason::ApprovalLimited, why.as_str()),
            )),
            (Asked::Joined, _) => {
                let waiting = self.held.entry(question.name.clone()).or_default();
                if waiting.len() >= MAX_WAITERS_PER_QUESTION {
                    return Some(refused(
                        to,
                        question,
                        Verdict::explained(Reason::ApprovalLimited, "too_many_waiting"),
                    ));
                }
                waiting.push(Waiter { to, question });
                Some(Served::Joined)
            }
            (Asked::Ask(_), Some(out)) => {
                self.held
                    .entry(question.name.clone())
                    .or_default()
                    .push(Waiter { to, question });
                Some(Served::Approve(Box::new(out)))
            }
            // The broker asked but there is no question to send: fail closed.
            (Asked::Ask(_), None) => Some(refused(to, question, DENIED)),
        }
    }

    /// Records a backend's answer (of `kind`) to the question about `name`,
    /// or its failure; the decision that now stands (`None` when the
    /// `approval:` section changed meanwhile: the answer is moot).
    pub(crate) fn approval_answered(
        &mut self,
        name: &str,
        kind: &str,
        result: Result<Answer, BackendError>,
        now: Instant,
    ) -> Option<Grant> {
        self.approvals.answered(name, kind, result, now)
    }

    /// The queries held on `name`'s question once it is decided: each goes
    /// on as a listed name's would (`allowed`), or is REFUSED. Each is
    /// decided again under the policy in force now: a reload may have
    /// listed or denied the name while it was asked about.
    pub(crate) fn approval_decided(
        &mut self,
        name: &str,
        allowed: bool,
        decider: &dyn Decider,
        can_forward: bool,
        now: Instant,
    ) -> Vec<Served> {
        let held = self.held.remove(name).unwrap_or_default();
        held.into_iter()
            .map(|w| match decider.dns_query(name) {
                DnsDecision::Forward(_) => {
                    self.forward(w.to, w.question, decider, can_forward, now)
                }
                DnsDecision::Answer { rcode, verdict } => {
                    let bytes = sluice_inspect::dns::error_response(&w.question, rcode);
                    let outcome = Outcome::Denied { rcode, verdict };
                    Served::Now(deliver(w.to, w.question, bytes, outcome))
                }
                DnsDecision::Ask(_) if allowed => {
                    self.forward(w.to, w.question, decider, can_forward, now)
                }
                DnsDecision::Ask(_) => refused(w.to, w.question, DENIED),
            })
            .collect()
    }

    /// The ports an approval opens (TCP, UDP), for its audit record.
    pub(crate) fn approval_ports(&self) -> (Vec<u16>, Vec<u16>) {
        self.approvals.ports()
    }
}

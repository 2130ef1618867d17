//! One sandbox's approval questions and the decisions it holds.
//!
//! The broker is a plain state machine, driven by the gateway's DNS server
//! with the current time; it never blocks and never does I/O. For each name
//! the policy would ask about it says one of:
//!
//! - a standing decision answers it now ([`Asked::Decided`]);
//! - the same name is already being asked: wait for that answer
//!   ([`Asked::Joined`]), so a backend is asked once per name, never once
//!   per packet or per retry;
//! - ask the backend this [`Question`] ([`Asked::Ask`]) and hand the result
//!   to [`Broker::answered`];
//! - refuse without asking ([`Asked::Refused`]): too many questions pending,
//!   or the sandbox is asking too fast.
//!
//! Bounds: at most [`BrokerConfig::max_pending`] questions at once and
//! [`BrokerConfig::per_minute`] new questions in any sliding minute;
//! refusals are counted and handed out once as a summary (the next
//! question's [`Question::refused_since`], [`Broker::take_refused`]) so a
//! guest asking about thousands of random
//! names produces one summary line, not a flood. At most [`MAX_GRANTS`]
//! standing decisions are held; beyond it nothing more is asked (deny).
//!
//! A backend failure or a timeout is a `deny_once`, never an allow.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use crate::backend::BackendError;
use crate::wire::{Answer, Choice, Question, WIRE_VERSION};

/// The most standing decisions one sandbox holds.
pub const MAX_GRANTS: usize = 4096;

/// How long an `allow_once` holds before the DNS answer's TTL is known
/// ([`Broker::set_answer_ttl`]); also its lifetime if no answer comes.
pub const ONCE_BEFORE_ANSWER: Duration = Duration::from_secs(30);

/// The broker's limits and the facts every question carries.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// The sandbox's id, sent in every question.
    pub sandbox: String,
    /// The policy's id, sent in every question.
    pub policy: String,
    /// TCP ports an approval opens.
    pub tcp_ports: Vec<u16>,
    /// UDP ports an approval opens.
    pub udp_ports: Vec<u16>,
    /// Whether `allow_always` is honoured; otherwise it counts as
    /// `allow_sandbox`.
    pub always_allowed: bool,
    /// How long the backend has to answer before the answer is deny. The
    /// caller enforces it (it owns the clock of the I/O) and reports a
    /// timeout as [`BackendError::Timeout`].
    pub timeout: Duration,
    /// Questions pending at once; beyond it new names are refused.
    pub max_pending: usize,
    /// New questions in any sliding minute; beyond it new names are refused.
    pub per_minute: usize,
    /// How long a `deny_once` (or a failure) keeps refusing the name without
    /// asking again: resolvers retry, and a retry must not ask twice.
    pub deny_once_hold: Duration,
}

/// How long a standing decision lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// Until this instant.
    Instant(Instant),
    /// Until the sandbox ends.
    SandboxEnd,
}

/// A standing decision about one name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The decision as it stands (after `allow_always` was possibly taken
    /// as `allow_sandbox`, and a failure as `deny_once`).
    pub choice: Choice,
    /// Who decided: the backend's kind, with the answer's `by` if any
    /// (`webhook`, `unix: alice`), or `timeout` / `backend_error`.
    pub by: String,
    /// How long it lasts.
    pub until: Until,
}

impl Grant {
    fn live(&self, now: Instant) -> bool {
        match self.until {
            Until::Instant(t) => now < t,
            Until::SandboxEnd => true,
        }
    }
}

/// Why a name was refused without asking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// [`BrokerConfig::max_pending`] questions were already pending.
    TooManyPending,
    /// [`BrokerConfig::per_minute`] questions were already asked this minute.
    RateLimited,
    /// [`MAX_GRANTS`] standing decisions are held.
    TooManyDecisions,
}

impl Refusal {
    /// The audit spelling.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::TooManyPending => "too_many_pending",
            Self::RateLimited => "rate_limited",
            Self::TooManyDecisions => "too_many_decisions",
        }
    }
}

/// What [`Broker::ask`] says about a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Asked {
    /// A standing decision answers it now.
    Decided(Grant),
    /// The name is being asked already; its answer will do for this query.
    Joined,
    /// Ask the backend this question, then call [`Broker::answered`].
    Ask(Question),
    /// Refused without asking (counted for [`Broker::take_refused`]).
    Refused(Refusal),
}

/// One sandbox's questions and standing decisions.
#[derive(Debug)]
pub struct Broker {
    cfg: BrokerConfig,
    grants: HashMap<String, Grant>,
    pending: HashSet<String>,
    asked_at: VecDeque<Instant>,
    refused: u64,
}

impl Broker {
    /// A broker with no decisions yet.
    #[must_use]
    pub fn new(cfg: BrokerConfig) -> Self {
        Self {
            cfg,
            grants: HashMap::new(),
            pending: HashSet::new(),
            asked_at: VecDeque::new(),
            refused: 0,
        }
    }

    /// The limits and facts in force.
    #[must_use]
    pub fn config(&self) -> &BrokerConfig {
        &self.cfg
    }

    /// Questions waiting for a backend's answer.
    #[must_use]
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// The standing decision about `name`, if one is live at `now`.
    #[must_use]
    pub fn standing(&self, name: &str, now: Instant) -> Option<&Grant> {
        self.grants.get(name).filter(|g| g.live(now))
    }

    /// Whether `name` is open at `now` by an approval (for the connection
    /// checks that follow the DNS answer).
    #[must_use]
    pub fn allows(&self, name: &str, now: Instant) -> bool {
        self.standing(name, now).is_some_and(|g| g.choice.allows())
    }

    /// What to do about a query for `name` (type `qtype`) that the policy
    /// would ask about.
    pub fn ask(&mut self, name: &str, qtype: &str, now: Instant) -> Asked {
        if let Some(g) = self.standing(name, now) {
            return Asked::Decided(g.clone());
        }
        if self.pending.contains(name) {
            return Asked::Joined;
        }
        if let Some(why) = self.refusal(now) {
            self.refused = self.refused.saturating_add(1);
            return Asked::Refused(why);
        }
        self.pending.insert(name.to_owned());
        self.asked_at.push_back(now);
        Asked::Ask(Question {
            version: WIRE_VERSION,
            sandbox: self.cfg.sandbox.clone(),
            policy: self.cfg.policy.clone(),
            name: name.to_owned(),
            qtype: qtype.to_owned(),
            tcp_ports: self.cfg.tcp_ports.clone(),
            udp_ports: self.cfg.udp_ports.clone(),
            always_allowed: self.cfg.always_allowed,
            refused_since: self.take_refused(),
            timeout_ms: u64::try_from(self.cfg.timeout.as_millis()).unwrap_or(u64::MAX),
        })
    }

    fn refusal(&mut self, now: Instant) -> Option<Refusal> {
        if self.pending.len() >= self.cfg.max_pending {
            return Some(Refusal::TooManyPending);
        }
        while self
            .asked_at
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= Duration::from_secs(60))
        {
            self.asked_at.pop_front();
        }
        if self.asked_at.len() >= self.cfg.per_minute {
            return Some(Refusal::RateLimited);
        }
        if self.grants.len() >= MAX_GRANTS {
            self.grants.retain(|_, g| g.live(now));
            if self.grants.len() >= MAX_GRANTS {
                return Some(Refusal::TooManyDecisions);
            }
        }
        None
    }

    /// Records the backend's answer (of `kind`) to the question about
    /// `name`, or its failure, and returns the decision that now stands.
    /// An answer for a name not pending is still recorded (the caller only
    /// reports what it asked).
    pub fn answered(
        &mut self,
        name: &str,
        kind: &str,
        result: Result<Answer, BackendError>,
        now: Instant,
    ) -> Grant {
        self.pending.remove(name);
        let grant = match result {
            Ok(answer) => {
                let choice = match answer.decision {
                    Choice::AllowAlways if !self.cfg.always_allowed => Choice::AllowSandbox,
                    c => c,
                };
                let by = match &answer.by {
                    Some(by) => format!("{kind}: {by}"),
                    None => kind.to_owned(),
                };
                let until = match choice {
                    Choice::AllowOnce => Until::Instant(now + ONCE_BEFORE_ANSWER),
                    Choice::DenyOnce => Until::Instant(now + self.cfg.deny_once_hold),
                    Choice::AllowSandbox | Choice::AllowAlways | Choice::DenySandbox => {
                        Until::SandboxEnd
                    }
                };
                Grant { choice, by, until }
            }
            Err(e) => Grant {
                choice: Choice::DenyOnce,
                by: match e {
                    BackendError::Timeout => "timeout".to_owned(),
                    _ => format!("{kind}: backend_error"),
                },
                until: Until::Instant(now + self.cfg.deny_once_hold),
            },
        };
        self.grants.insert(name.to_owned(), grant.clone());
        grant
    }

    /// An `allow_once` lasts until the DNS answer's TTL ends: called with
    /// that TTL once the answer is handed to the guest. Other decisions are
    /// not changed.
    pub fn set_answer_ttl(&mut self, name: &str, ttl: Duration, now: Instant) {
        if let Some(g) = self.grants.get_mut(name)
            && g.choice == Choice::AllowOnce
        {
            g.until = Until::Instant(now + ttl);
        }
    }

    /// How many names were refused without asking since the last call
    /// (the summary line), resetting the count.
    pub fn take_refused(&mut self) -> u64 {
        std::mem::take(&mut self.refused)
    }

    /// Forgets every standing decision (a reload to a policy that no longer
    /// asks, or a new backend). Pending questions stay pending.
    pub fn forget(&mut self) {
        self.grants.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> BrokerConfig {
        BrokerConfig {
            sandbox: "sb".into(),
            policy: "p".into(),
            tcp_ports: vec![443],
            udp_ports: vec![],
            always_allowed: false,
            timeout: Duration::from_secs(30),
            max_pending: 2,
            per_minute: 3,
            deny_once_hold: Duration::from_secs(5),
        }
    }

    fn ask(b: &mut Broker, name: &str, now: Instant) -> Question {
        match b.ask(name, "A", now) {
            Asked::Ask(q) => q,
            other => panic!("expected a question about {name}, got {other:?}"),
        }
    }

    #[test]
    fn a_name_is_asked_once_while_pending() {
        let mut b = Broker::new(cfg());
        let t = Instant::now();
        let q = ask(&mut b, "a.example", t);
        assert_eq!(q.name, "a.example");
        assert_eq!(q.tcp_ports, vec![443]);
        assert_eq!(b.ask("a.example", "A", t), Asked::Joined);
        assert_eq!(b.ask("a.example", "AAAA", t), Asked::Joined);
        assert_eq!(b.pending(), 1);
    }

    #[test]
    fn pending_and_rate_bounds_refuse_and_count() {
        let mut b = Broker::new(cfg());
        let t = Instant::now();
        ask(&mut b, "a", t);
        ask(&mut b, "b", t);
        assert_eq!(b.ask("c", "A", t), Asked::Refused(Refusal::TooManyPending));
        b.answered("a", "unix", Ok(Answer::of(Choice::DenySandbox)), t);
        // The next question carries the count of names refused before it.
        assert_eq!(ask(&mut b, "c", t).refused_since, 1);
        b.answered("b", "unix", Ok(Answer::of(Choice::DenySandbox)), t);
        assert_eq!(b.ask("d", "A", t), Asked::Refused(Refusal::RateLimited));
        assert_eq!(b.ask("e", "A", t), Asked::Refused(Refusal::RateLimited));
        assert_eq!(b.take_refused(), 2);
        assert_eq!(b.take_refused(), 0);
        // A minute later the window has room again.
        b.answered("c", "unix", Ok(Answer::of(Choice::DenySandbox)), t);
        ask(&mut b, "d", t + Duration::from_secs(60));
    }

    #[test]
    fn decisions_stand_for_their_lifetime() {
        let mut b = Broker::new(BrokerConfig {
            per_minute: 100,
            max_pending: 100,
            ..cfg()
        });
        let t = Instant::now();
        ask(&mut b, "once", t);
        let g = b.answered("once", "webhook", Ok(Answer::of(Choice::AllowOnce)), t);
        assert_eq!(g.choice, Choice::AllowOnce);
        b.set_answer_ttl("once", Duration::from_secs(10), t);
        assert!(b.allows("once", t + Duration::from_secs(9)));
        assert!(!b.allows("once", t + Duration::from_secs(10)));
        // Expired: the next query asks again.
        ask(&mut b, "once", t + Duration::from_secs(10));

        ask(&mut b, "no", t);
        b.answered("no", "webhook", Ok(Answer::of(Choice::DenyOnce)), t);
        assert!(
            matches!(b.ask("no", "A", t + Duration::from_secs(4)), Asked::Decided(g) if g.choice == Choice::DenyOnce)
        );
        ask(&mut b, "no", t + Duration::from_secs(5));

        ask(&mut b, "sb", t);
        b.answered("sb", "webhook", Ok(Answer::of(Choice::AllowSandbox)), t);
        assert!(b.allows("sb", t + Duration::from_secs(86_400)));
    }

    #[test]
    fn always_is_sandbox_unless_the_policy_allows_it() {
        let t = Instant::now();
        let mut b = Broker::new(cfg());
        ask(&mut b, "x", t);
        let g = b.answered("x", "unix", Ok(Answer::of(Choice::AllowAlways)), t);
        assert_eq!(g.choice, Choice::AllowSandbox);

        let mut b = Broker::new(BrokerConfig {
            always_allowed: true,
            ..cfg()
        });
        ask(&mut b, "x", t);
        let g = b.answered("x", "unix", Ok(Answer::of(Choice::AllowAlways)), t);
        assert_eq!(g.choice, Choice::AllowAlways);
        assert_eq!(g.until, Until::SandboxEnd);
    }

    #[test]
    fn failure_and_timeout_deny() {
        let t = Instant::now();
        let mut b = Broker::new(cfg());
        ask(&mut b, "x", t);
        let g = b.answered("x", "webhook", Err(BackendError::Timeout), t);
        assert_eq!((g.choice, g.by.as_str()), (Choice::DenyOnce, "timeout"));
        assert!(!b.allows("x", t));
        ask(&mut b, "y", t);
        let g = b.answered("y", "webhook", Err(BackendError::Status(500)), t);
        assert_eq!(
            (g.choice, g.by.as_str()),
            (Choice::DenyOnce, "webhook: backend_error")
        );
    }

    #[test]
    fn who_decided_is_recorded() {
        let t = Instant::now();
        let mut b = Broker::new(cfg());
        ask(&mut b, "x", t);
        let a = Answer {
            decision: Choice::AllowSandbox,
            by: Some("alice".into()),
        };
        assert_eq!(b.answered("x", "unix", Ok(a), t).by, "unix: alice");
    }
}

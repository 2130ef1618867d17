//! Verdicts: what a check returns. Borrowed from the compiled snapshot and
//! the caller's input, so producing one never allocates.

use crate::reason::{Decision, Reason};

/// The rule that decided a verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatchedRule<'a> {
    /// The rule's id: the `id:` written in the policy, or a generated one
    /// (`allow[3]`, `deny[0]`, `internal[1]`).
    pub id: &'a str,
    /// The rule's normalised pattern: `**.github.com`, `api.openai.com`,
    /// `203.0.113.0/24`.
    pub pattern: &'a str,
    /// The name that matched the pattern, exactly as the caller passed it
    /// (`None` for address-only matches).
    pub name: Option<&'a str>,
}

/// The answer of a check: decision, reason and (when a rule decided) the
/// rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict<'a> {
    /// Allow or deny.
    pub decision: Decision,
    /// Why; always consistent with `decision` (`reason.decision() ==
    /// decision`).
    pub reason: Reason,
    /// The rule that matched, if any. A deny with `reason ==
    /// NotAllowlisted` has none; `PortNotAllowed` carries the allow rule
    /// that matched the name but not the port.
    pub rule: Option<MatchedRule<'a>>,
}

impl<'a> Verdict<'a> {
    /// A verdict for `reason` (decision derived from it), with no rule.
    #[must_use]
    pub const fn of(reason: Reason) -> Self {
        Self {
            decision: reason.decision(),
            reason,
            rule: None,
        }
    }

    /// A verdict for `reason` with the rule that decided it.
    #[must_use]
    pub const fn with_rule(reason: Reason, rule: MatchedRule<'a>) -> Self {
        Self {
            decision: reason.decision(),
            reason,
            rule: Some(rule),
        }
    }

    /// Whether the decision is [`Decision::Allow`].
    #[must_use]
    pub const fn is_allowed(&self) -> bool {
        matches!(self.decision, Decision::Allow)
    }
}

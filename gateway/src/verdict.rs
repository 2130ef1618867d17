//! What a decision says about itself ([`Verdict`]: a typed reason and the
//! rule that decided), made once by the decider and carried with the flow
//! or the DNS answer to every audit record it produces.

use std::borrow::Cow;

use sluice_policy::audit::RuleRef;
use sluice_policy::{MatchedRule, Reason};

/// The rule that decided a verdict, owned so that it travels with the flow
/// (or the DNS answer) to every record it produces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The rule's id (`allow[3]`, or the `id:` written in the policy).
    pub id: Box<str>,
    /// The rule's normalised pattern.
    pub pattern: Box<str>,
    /// The name that matched the pattern, when a name matched.
    pub name: Option<Box<str>>,
}

impl Rule {
    /// The rule as the audit record names it.
    pub fn to_audit(&self) -> RuleRef<'_> {
        RuleRef {
            id: Cow::Borrowed(&self.id),
            pattern: Cow::Borrowed(&self.pattern),
            name: self.name.as_deref().map(Cow::Borrowed),
        }
    }
}

impl From<&MatchedRule<'_>> for Rule {
    fn from(m: &MatchedRule<'_>) -> Self {
        Self {
            id: m.id.into(),
            pattern: m.pattern.into(),
            name: m.name.map(Into::into),
        }
    }
}

/// Why a decision went the way it did: made once, by the decider (or by
/// the datapath for its own refusals), and carried with the flow or the
/// DNS answer to each audit record it produces. The audit sink serialises
/// it as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The audit reason.
    pub reason: Reason,
    /// The rule that decided, when the record names one.
    pub rule: Option<Rule>,
    /// The gateway's explanation, for the reasons it shares with other
    /// causes (`platform_denied` for its own address, `inspect_failed` for a
    /// host the CA cannot sign for, `upstream_error` when busy).
    pub detail: Option<&'static str>,
}

impl Verdict {
    /// A verdict for `reason`, naming no rule.
    pub const fn of(reason: Reason) -> Self {
        Self {
            reason,
            rule: None,
            detail: None,
        }
    }

    /// A verdict for `reason` with its explanation.
    pub const fn explained(reason: Reason, detail: &'static str) -> Self {
        Self {
            reason,
            rule: None,
            detail: Some(detail),
        }
    }

    /// The policy's verdict, with the rule that decided it.
    pub fn of_policy(v: &sluice_policy::Verdict<'_>) -> Self {
        Self {
            reason: v.reason,
            rule: v.rule.as_ref().map(Rule::from),
            detail: None,
        }
    }
}

//! The approval wire format, shared by every backend: one [`Question`] out,
//! one [`Answer`] back, each a JSON object (a single line on a unix socket,
//! the body of a POST and its response for a webhook).
//!
//! Both sides are strict: unknown fields are refused, and a message over
//! [`MAX_MESSAGE_BYTES`] is refused unread, so a confused or hostile
//! backend cannot make the gateway allocate without bound or read a typo'd
//! field as a default.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The version of this format, sent in every question.
pub const WIRE_VERSION: u32 = 1;

/// The largest question or answer accepted, in bytes.
pub const MAX_MESSAGE_BYTES: usize = 4096;

/// What the gateway asks: may this sandbox reach this name?
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Question {
    /// [`WIRE_VERSION`].
    pub version: u32,
    /// The sandbox (gateway) that asks.
    pub sandbox: String,
    /// The `id:` of the policy in force.
    pub policy: String,
    /// The exact name the guest queried, normalised (lower case, no
    /// trailing dot). Never a pattern.
    pub name: String,
    /// The DNS query type that raised the question (`A`, `AAAA`, ...).
    pub qtype: String,
    /// The TCP ports an approval would open for this name.
    pub tcp_ports: Vec<u16>,
    /// The UDP ports an approval would open for this name.
    pub udp_ports: Vec<u16>,
    /// Whether an `allow_always` answer will be honoured (otherwise it is
    /// taken as `allow_sandbox`).
    pub always_allowed: bool,
    /// How many other names this sandbox queried since the previous
    /// question were refused without asking (too many pending, rate
    /// limit): a flood reaches the backend as this one count, never as a
    /// question each. Absent when none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub refused_since: u64,
    /// How long, in milliseconds, the gateway waits for this answer from
    /// when it sent the question; after it the answer is deny whatever
    /// comes. A backend that shows the question to a person takes it down
    /// by then. Absent (0) when not said.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub timeout_ms: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A decision about one name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Choice {
    /// Open the name until the DNS answer's TTL ends.
    AllowOnce,
    /// Open the name until the sandbox ends.
    AllowSandbox,
    /// Open the name for this sandbox and write it to the policy's overlay
    /// file (`*.approved.yaml`), so later sandboxes have it too.
    AllowAlways,
    /// Refuse this query (and repeats within the policy's `ttl_min`).
    DenyOnce,
    /// Refuse the name until the sandbox ends, without asking again.
    DenySandbox,
}

impl Choice {
    /// Whether this choice opens the name.
    #[must_use]
    pub const fn allows(self) -> bool {
        matches!(
            self,
            Self::AllowOnce | Self::AllowSandbox | Self::AllowAlways
        )
    }

    /// The wire and audit spelling.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::AllowOnce => "allow_once",
            Self::AllowSandbox => "allow_sandbox",
            Self::AllowAlways => "allow_always",
            Self::DenyOnce => "deny_once",
            Self::DenySandbox => "deny_sandbox",
        }
    }
}

/// What a backend answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Answer {
    /// The decision.
    pub decision: Choice,
    /// Who decided, for the audit record (a person, a rule engine); the
    /// backend's kind is recorded beside it either way. At most 128 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

/// The longest `by` kept; a longer one is cut (it is only informative).
pub const MAX_BY_BYTES: usize = 128;

/// A message that is not a valid question or answer.
#[derive(Debug, Error)]
pub enum WireError {
    /// More than [`MAX_MESSAGE_BYTES`].
    #[error("approval message over {MAX_MESSAGE_BYTES} bytes")]
    TooLong,
    /// Not the JSON object the format defines.
    #[error("approval message is not valid: {0}")]
    Malformed(#[from] serde_json::Error),
    /// A JSON value other than an object (serde would read a struct from
    /// an array too; the format is objects only).
    #[error("approval message is not a JSON object")]
    NotAnObject,
    /// A question in a version this gateway does not speak.
    #[error("approval question version {0}; this side speaks {WIRE_VERSION}")]
    Version(u32),
}

impl Question {
    /// The question as one JSON line (with the newline).
    ///
    /// # Errors
    /// Only if serialisation fails, which the field types rule out.
    pub fn to_line(&self) -> Result<Vec<u8>, WireError> {
        json_line(self)
    }

    /// Reads a question (one JSON object, surrounding whitespace ignored).
    ///
    /// # Errors
    /// Too long, malformed, or another version.
    pub fn parse(bytes: &[u8]) -> Result<Self, WireError> {
        object(bytes)?;
        let q: Self = serde_json::from_slice(bytes)?;
        if q.version != WIRE_VERSION {
            return Err(WireError::Version(q.version));
        }
        Ok(q)
    }
}

impl Answer {
    /// An answer with no `by`.
    #[must_use]
    pub const fn of(decision: Choice) -> Self {
        Self { decision, by: None }
    }

    /// The answer as one JSON line (with the newline).
    ///
    /// # Errors
    /// Only if serialisation fails, which the field types rule out.
    pub fn to_line(&self) -> Result<Vec<u8>, WireError> {
        json_line(self)
    }

    /// Reads an answer (one JSON object, surrounding whitespace ignored);
    /// a `by` over [`MAX_BY_BYTES`] is cut at a character boundary.
    ///
    /// # Errors
    /// Too long or malformed.
    pub fn parse(bytes: &[u8]) -> Result<Self, WireError> {
        object(bytes)?;
        let mut a: Self = serde_json::from_slice(bytes)?;
        if let Some(by) = &mut a.by
            && by.len() > MAX_BY_BYTES
        {
            let mut cut = MAX_BY_BYTES;
            while !by.is_char_boundary(cut) {
                cut -= 1;
            }
            by.truncate(cut);
        }
        Ok(a)
    }
}

/// The size bound, and the object-only rule.
fn object(bytes: &[u8]) -> Result<(), WireError> {
    if bytes.len() > MAX_MESSAGE_BYTES {
        return Err(WireError::TooLong);
    }
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => Ok(()),
        _ => Err(WireError::NotAnObject),
    }
}

/// `value` as one JSON line (with the newline): the framing of every
/// message between the gateway, the backends and the launcher.
pub(crate) fn json_line<T: Serialize>(value: &T) -> Result<Vec<u8>, WireError> {
    let mut v = serde_json::to_vec(value)?;
    v.push(b'\n');
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn question() -> Question {
        Question {
            version: WIRE_VERSION,
            sandbox: "sb-1".into(),
            policy: "agents".into(),
            name: "example.com".into(),
            qtype: "A".into(),
            tcp_ports: vec![443],
            udp_ports: vec![],
            always_allowed: false,
            refused_since: 0,
            timeout_ms: 30_000,
        }
    }

    #[test]
    fn question_round_trips_as_one_line() {
        let line = question().to_line().unwrap();
        assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
        assert_eq!(Question::parse(&line).unwrap(), question());
    }

    #[test]
    fn every_choice_reads_back() {
        for c in [
            Choice::AllowOnce,
            Choice::AllowSandbox,
            Choice::AllowAlways,
            Choice::DenyOnce,
            Choice::DenySandbox,
        ] {
            let line = format!("{{\"decision\":\"{}\"}}", c.as_str());
            assert_eq!(Answer::parse(line.as_bytes()).unwrap().decision, c);
        }
    }

    #[test]
    fn answers_are_strict() {
        for bad in [
            &b"{}"[..],
            b"{\"decision\":\"allow\"}",
            b"{\"decision\":\"allow_once\",\"decison\":1}",
            b"{\"decision\":\"ALLOW_ONCE\"}",
            b"allow_once",
            b"",
            b"[\"allow_once\"]",
        ] {
            assert!(
                Answer::parse(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let long = vec![b' '; MAX_MESSAGE_BYTES + 1];
        assert!(matches!(Answer::parse(&long), Err(WireError::TooLong)));
    }

    #[test]
    fn a_long_by_is_cut_on_a_character_boundary() {
        let by = "é".repeat(100);
        let line =
            serde_json::to_vec(&serde_json::json!({"decision": "deny_once", "by": by})).unwrap();
        let a = Answer::parse(&line).unwrap();
        let kept = a.by.unwrap();
        assert!(kept.len() <= MAX_BY_BYTES);
        assert!(kept.chars().all(|c| c == 'é'));
    }

    #[test]
    fn another_version_is_refused() {
        let mut q = question();
        q.version = 2;
        let line = serde_json::to_vec(&q).unwrap();
        assert!(matches!(Question::parse(&line), Err(WireError::Version(2))));
    }
}

//! The one domain-name normaliser of sluice.
//!
//! Every check in the gateway rests on one invariant: a name written in the
//! policy and the same name seen on the wire (DNS question, TLS SNI, HTTP
//! `Host` or `:authority`) are equal exactly when both normalise to the same
//! bytes here. Every crate that compares names calls this crate; none keeps a
//! rule of its own.
//!
//! The rule:
//! - ASCII only: internationalised names must arrive as A-labels
//!   (`xn--...`), as DNS, SNI (RFC 6066) and `Host` (RFC 9110) carry them.
//!   The policy language converts U-labels with IDNA before it calls this
//!   crate; a raw UTF-8 byte on the wire is refused.
//! - Labels of 1 to [`MAX_LABEL_LEN`] bytes from `A-Z a-z 0-9 - _`; `_` is
//!   allowed because service names (`_dmarc`, `_acme-challenge`) use it.
//! - At most [`MAX_NAME_LEN`] bytes in all, without the trailing dot.
//! - Exactly one trailing (root) dot is removed; a second one is an empty
//!   label. Upper case is folded to lower case.
//!
//! Anything else (spaces, NUL, `*`, `\`, `%`, `:`, empty labels) is refused
//! with a [`NameError`], never repaired: a name the policy cannot match is a
//! name the guest cannot use. The canonical form ([`NormalName`]) is lower
//! case ASCII without the trailing dot; numeric names such as `10.0.0.1` are
//! names here (the readers and the policy language decide what an IP
//! literal means).
//!
//! No I/O, no allocation: a [`NormalName`] is held inline.
#![forbid(unsafe_code)]

#[cfg(any(test, feature = "corpus"))]
pub mod corpus;

use std::fmt;
use std::hash::{Hash, Hasher};

/// The longest name accepted, in bytes, without the trailing dot (RFC 1035:
/// 255 bytes of wire form).
pub const MAX_NAME_LEN: usize = 253;
/// The longest label accepted, in bytes (RFC 1035).
pub const MAX_LABEL_LEN: usize = 63;

/// Why a name was refused. The union of every rule a name can break.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// The name is empty (or only the root dot).
    #[error("empty name")]
    Empty,
    /// The name is longer than 253 bytes (without the trailing dot).
    #[error("name longer than 253 bytes")]
    TooLong,
    /// A label is empty: two dots in a row, a leading dot, or a second
    /// trailing dot.
    #[error("empty label")]
    EmptyLabel,
    /// A label is longer than 63 bytes.
    #[error("label longer than 63 bytes")]
    LabelTooLong,
    /// A byte other than `A-Z a-z 0-9 - _` in a label (this includes every
    /// non-ASCII byte, white space, NUL, `*`, `\`, `%`, `:` and, in
    /// [`normalize_labels`], a dot inside a label).
    #[error("invalid character: only A-Z a-z 0-9 - _ and . are allowed")]
    InvalidChar,
}

/// A normalised name: lower-case ASCII, no trailing dot, every label valid.
/// Held inline (no heap). Obtain one with [`normalize_name`],
/// [`normalize_bytes`] or [`normalize_labels`].
#[derive(Clone, Copy)]
pub struct NormalName {
    buf: [u8; MAX_NAME_LEN],
    len: u8,
}

impl NormalName {
    /// The normalised name.
    #[must_use]
    pub fn as_str(&self) -> &str {
        // Only ASCII bytes are ever written into `buf`, so this never falls
        // back to the empty default.
        std::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }

    /// The normalised name as bytes.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8] {
        self.buf.get(..usize::from(self.len)).unwrap_or_default()
    }
}

impl PartialEq for NormalName {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for NormalName {}

impl Hash for NormalName {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl PartialEq<str> for NormalName {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for NormalName {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl AsRef<str> for NormalName {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl From<NormalName> for String {
    fn from(n: NormalName) -> Self {
        n.as_str().to_owned()
    }
}

impl fmt::Debug for NormalName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for NormalName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A byte of a label in canonical form: `A-Z` folded to `a-z`; `a-z 0-9 -
/// _` unchanged; `None` for every other byte (the dot included: it separates
/// labels, it is not part of one). For readers that fold while they walk a
/// name (the policy's name table); they must agree with [`normalize_bytes`].
#[must_use]
pub const fn label_byte(b: u8) -> Option<u8> {
    match b {
        b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' => Some(b),
        b'A'..=b'Z' => Some(b.to_ascii_lowercase()),
        _ => None,
    }
}

/// Writes a name into a [`NormalName`] one label byte at a time.
struct Builder {
    out: NormalName,
    /// Bytes of the label being written.
    label_len: usize,
}

impl Builder {
    fn new() -> Self {
        Self {
            out: NormalName {
                buf: [0; MAX_NAME_LEN],
                len: 0,
            },
            label_len: 0,
        }
    }

    fn push(&mut self, c: u8) -> Result<(), NameError> {
        let slot = self
            .out
            .buf
            .get_mut(usize::from(self.out.len))
            .ok_or(NameError::TooLong)?;
        *slot = c;
        // Cannot overflow: `buf` has at most 253 slots.
        self.out.len += 1;
        Ok(())
    }

    fn label_byte(&mut self, b: u8) -> Result<(), NameError> {
        let c = label_byte(b).ok_or(NameError::InvalidChar)?;
        self.label_len += 1;
        if self.label_len > MAX_LABEL_LEN {
            return Err(NameError::LabelTooLong);
        }
        self.push(c)
    }

    fn end_label(&mut self) -> Result<(), NameError> {
        if self.label_len == 0 {
            return Err(NameError::EmptyLabel);
        }
        self.label_len = 0;
        Ok(())
    }

    fn dot(&mut self) -> Result<(), NameError> {
        self.end_label()?;
        self.push(b'.')
    }

    fn finish(mut self) -> Result<NormalName, NameError> {
        if self.out.len == 0 && self.label_len == 0 {
            return Err(NameError::Empty);
        }
        self.end_label()?;
        Ok(self.out)
    }
}

/// Normalises a name given as bytes, as it comes off the wire (SNI, `Host`,
/// `:authority` without its port): one trailing dot removed, upper case
/// folded, every label checked. Never allocates.
///
/// Checks the whole length first ([`NameError::Empty`],
/// [`NameError::TooLong`]), then reports the first broken rule from the left.
///
/// # Errors
/// The [`NameError`] saying which rule the name breaks.
pub fn normalize_bytes(raw: &[u8]) -> Result<NormalName, NameError> {
    let raw = raw.strip_suffix(b".").unwrap_or(raw);
    if raw.is_empty() {
        return Err(NameError::Empty);
    }
    if raw.len() > MAX_NAME_LEN {
        return Err(NameError::TooLong);
    }
    let mut b = Builder::new();
    for &byte in raw {
        if byte == b'.' {
            b.dot()?;
        } else {
            b.label_byte(byte)?;
        }
    }
    b.finish()
}

/// [`normalize_bytes`] for a name held as text (policy names, header values
/// already read as text). The same rule: a non-ASCII character is refused.
///
/// # Errors
/// The [`NameError`] saying which rule the name breaks.
pub fn normalize_name(name: &str) -> Result<NormalName, NameError> {
    normalize_bytes(name.as_bytes())
}

/// Normalises a name given as its labels, as a DNS message carries it
/// (without the empty root label). A dot inside a label is refused
/// ([`NameError::InvalidChar`]): on the wire `a.b` as one label is another
/// name than `a` then `b`, and the policy could only ever see the second.
///
/// # Errors
/// The [`NameError`] saying which rule the name breaks; [`NameError::Empty`]
/// for the root name (no labels).
pub fn normalize_labels<'a>(
    labels: impl IntoIterator<Item = &'a [u8]>,
) -> Result<NormalName, NameError> {
    let mut b = Builder::new();
    for (i, label) in labels.into_iter().enumerate() {
        if i > 0 {
            b.dot()?;
        }
        if label.is_empty() {
            return Err(NameError::EmptyLabel);
        }
        for &byte in label {
            b.label_byte(byte)?;
        }
    }
    b.finish()
}

/// Whether a name seen on the wire normalises to exactly `canonical` (a
/// name already normalised, such as the verified SNI a flow was allowed
/// for). A wire name that does not normalise equals nothing (fail closed),
/// and neither does a `canonical` that is not in canonical form.
#[must_use]
pub fn wire_equals(wire: &[u8], canonical: &str) -> bool {
    normalize_bytes(wire).is_ok_and(|n| n.as_bytes() == canonical.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_and_canonicalises() {
        let ok: &[(&[u8], &str)] = &[
            (b"Example.COM", "example.com"),
            (b"example.com.", "example.com"),
            (b"a-b_c.example.com", "a-b_c.example.com"),
            (b"xn--bcher-kva.example", "xn--bcher-kva.example"),
            (b"_dmarc.example", "_dmarc.example"),
            (b"localhost", "localhost"),
            (b"10.0.0.1", "10.0.0.1"),
        ];
        for (input, want) in ok {
            assert_eq!(normalize_bytes(input).unwrap().as_str(), *want, "{input:?}");
        }
    }

    #[test]
    fn refuses_with_the_rule_broken() {
        let long_label = [b'a'; 64];
        let long_name = b"abcdefghi.".repeat(26);
        let bad: &[(&[u8], NameError)] = &[
            (b"", NameError::Empty),
            (b".", NameError::Empty),
            (b"a..b", NameError::EmptyLabel),
            (b".a", NameError::EmptyLabel),
            (b"a.b..", NameError::EmptyLabel),
            ("bücher.example".as_bytes(), NameError::InvalidChar),
            (b"a b.example", NameError::InvalidChar),
            (b"a\0.example", NameError::InvalidChar),
            (b"*.example.com", NameError::InvalidChar),
            (b"a.com:443", NameError::InvalidChar),
            (&long_label, NameError::LabelTooLong),
            (&long_name, NameError::TooLong),
        ];
        for (input, want) in bad {
            assert_eq!(normalize_bytes(input).unwrap_err(), *want, "{input:?}");
        }
    }

    #[test]
    fn labels_entry_refuses_a_dot_inside_a_label() {
        let n = normalize_labels([&b"WWW"[..], b"Example", b"com"]).unwrap();
        assert_eq!(n.as_str(), "www.example.com");
        assert_eq!(
            normalize_labels([&b"x.Origin"[..], b"test"]),
            Err(NameError::InvalidChar)
        );
        assert_eq!(
            normalize_labels([&b"a"[..], b""]),
            Err(NameError::EmptyLabel)
        );
        assert_eq!(normalize_labels(std::iter::empty()), Err(NameError::Empty));
        let label = [b'a'; 63];
        let five: Vec<&[u8]> = vec![&label; 4];
        // 4 * 63 + 3 dots = 255 bytes.
        assert_eq!(normalize_labels(five), Err(NameError::TooLong));
    }

    #[test]
    fn limits_are_inclusive() {
        let label = "a".repeat(63);
        assert!(normalize_name(&label).is_ok());
        // 63 + 1 + 63 + 1 + 63 + 1 + 61 = 253.
        let name = format!("{label}.{label}.{label}.{}", "b".repeat(61));
        assert_eq!(name.len(), 253);
        assert!(normalize_name(&name).is_ok());
        assert!(normalize_name(&format!("{name}.")).is_ok());
        assert_eq!(normalize_name(&format!("{name}b")), Err(NameError::TooLong));
    }

    #[test]
    fn wire_equals_is_exact_after_normalising() {
        assert!(wire_equals(b"API.Example.com.", "api.example.com"));
        assert!(!wire_equals(b"api.example.com..", "api.example.com"));
        assert!(!wire_equals(b"api.example.com", "API.example.com"));
        assert!(!wire_equals(b"", ""));
    }

    #[test]
    fn label_byte_agrees_with_normalize() {
        for b in 0..=u8::MAX {
            let via_name = normalize_bytes(&[b]).ok().map(|n| n.as_bytes()[0]);
            let expected = if b == b'.' { None } else { label_byte(b) };
            assert_eq!(via_name, expected, "{b:#04x}");
        }
    }
}

#[cfg(test)]
mod corpus_tests {
    use super::*;
    use crate::corpus::{Expect, cases};

    /// The byte and text entries give what the corpus says, error kind
    /// included; the labels entry agrees when the input is split at its dots.
    #[test]
    fn corpus_through_every_entry() {
        let cases = cases().unwrap();
        assert!(cases.len() >= 50, "only {} cases", cases.len());
        for case in &cases {
            let got = match normalize_bytes(&case.input) {
                Ok(n) => Expect::Name(n.as_str().to_owned()),
                Err(e) => Expect::Refused(Some(e)),
            };
            assert_eq!(got, case.wire, "line {}: {:?}", case.line, case.input);
            if let Ok(text) = std::str::from_utf8(&case.input) {
                assert_eq!(
                    normalize_name(text).ok().map(String::from).as_deref(),
                    case.wire.name(),
                    "line {}",
                    case.line
                );
            }
            let input = case.input.strip_suffix(b".").unwrap_or(&case.input);
            let labels =
                normalize_labels(input.split(|&b| b == b'.').filter(|_| !input.is_empty()));
            assert_eq!(
                labels.ok().map(String::from).as_deref(),
                case.wire.name(),
                "line {}: labels",
                case.line
            );
            if let Some(name) = case.wire.name() {
                assert!(wire_equals(&case.input, name), "line {}", case.line);
            }
        }
    }
}

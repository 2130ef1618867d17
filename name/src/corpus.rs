//! The shared corpus of tricky names (`tests/corpus.txt`) and its reader.
//!
//! Every crate that used to normalise names on its own runs this one corpus
//! through its entry points (policy compile and matching, the SNI, `Host`
//! and DNS readers, the interceptors' authority checks, the gateway's DNS
//! table) and demands the result written here, so the paths cannot drift
//! apart again.
//!
//! Format, one case per line (`#` starts a comment line):
//! `INPUT WIRE [policy=POLICY]`, separated by white space.
//! - INPUT is the name's bytes. Escapes: `\s` space, `\t` tab, `\\`
//!   backslash, `\xHH` any byte, `\{` a brace; `{X*N}` is the text X
//!   repeated N times (for long labels); `""` alone is the empty input.
//! - WIRE is what a wire name (SNI, `Host`, DNS question) gives: the
//!   canonical name (same escapes), or `!empty`, `!too_long`,
//!   `!empty_label`, `!label_too_long`, `!invalid_char` for a refusal.
//! - POLICY, only where the policy language differs by design: what
//!   `domain: INPUT` in an allow rule compiles to (the pattern as the
//!   policy displays it), or `!refused`. U-labels are converted with IDNA
//!   there; IP literals and all-numeric last labels are refused there.

use crate::NameError;

/// The corpus text, compiled in.
pub const CORPUS: &str = include_str!("../tests/corpus.txt");

/// What a path must give for an input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Accepted; this is the canonical form (or the compiled pattern).
    Name(String),
    /// Refused; the rule broken, when the column names one.
    Refused(Option<NameError>),
}

impl Expect {
    /// The canonical name, if accepted.
    #[must_use]
    pub fn name(&self) -> Option<&str> {
        match self {
            Self::Name(n) => Some(n),
            Self::Refused(_) => None,
        }
    }
}

/// One line of the corpus.
#[derive(Clone, Debug)]
pub struct Case {
    /// 1-based line number in `tests/corpus.txt`, for failure messages.
    pub line: usize,
    /// The input bytes.
    pub input: Vec<u8>,
    /// What every wire path gives.
    pub wire: Expect,
    /// What compiling `domain: INPUT` gives (the wire result unless the line
    /// says otherwise).
    pub policy: Expect,
}

/// Why the corpus text could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CorpusError {
    /// A line is not `INPUT WIRE [policy=POLICY]`.
    #[error("corpus line {0}: expected `INPUT WIRE [policy=POLICY]`")]
    Shape(usize),
    /// An escape or repetition is malformed.
    #[error("corpus line {0}: bad escape or repetition")]
    Escape(usize),
    /// An expectation names no known refusal.
    #[error("corpus line {0}: unknown refusal")]
    Refusal(usize),
    /// The corpus holds no case at all.
    #[error("the corpus is empty")]
    Empty,
}

/// Every case of the corpus. Fails on a malformed line and on an empty
/// corpus, so a test over it can never pass by running nothing.
///
/// # Errors
/// The first [`CorpusError`] met.
pub fn cases() -> Result<Vec<Case>, CorpusError> {
    let mut out = Vec::new();
    for (i, raw) in CORPUS.lines().enumerate() {
        let line = i + 1;
        let text = raw.trim();
        if text.is_empty() || text.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = text.split_whitespace().collect();
        let (input, wire, policy) = match fields.as_slice() {
            [input, wire] => (*input, *wire, None),
            [input, wire, policy] => (
                *input,
                *wire,
                Some(
                    policy
                        .strip_prefix("policy=")
                        .ok_or(CorpusError::Shape(line))?,
                ),
            ),
            _ => return Err(CorpusError::Shape(line)),
        };
        let input = if input == "\"\"" {
            Vec::new()
        } else {
            decode(input).ok_or(CorpusError::Escape(line))?
        };
        let wire = expect(wire, line)?;
        let policy = match policy {
            Some(p) => expect(p, line)?,
            None => wire.clone(),
        };
        out.push(Case {
            line,
            input,
            wire,
            policy,
        });
    }
    if out.is_empty() {
        return Err(CorpusError::Empty);
    }
    Ok(out)
}

fn expect(field: &str, line: usize) -> Result<Expect, CorpusError> {
    let Some(kind) = field.strip_prefix('!') else {
        let bytes = decode(field).ok_or(CorpusError::Escape(line))?;
        let name = String::from_utf8(bytes).map_err(|_| CorpusError::Escape(line))?;
        return Ok(Expect::Name(name));
    };
    let e = match kind {
        "empty" => Some(NameError::Empty),
        "too_long" => Some(NameError::TooLong),
        "empty_label" => Some(NameError::EmptyLabel),
        "label_too_long" => Some(NameError::LabelTooLong),
        "invalid_char" => Some(NameError::InvalidChar),
        "refused" => None,
        _ => return Err(CorpusError::Refusal(line)),
    };
    Ok(Expect::Refused(e))
}

/// Decodes the escapes and repetitions of one field.
fn decode(field: &str) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let mut rest = field.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        rest = tail;
        match b {
            b'\\' => {
                let (&e, tail) = rest.split_first()?;
                rest = tail;
                match e {
                    b's' => out.push(b' '),
                    b't' => out.push(b'\t'),
                    b'\\' => out.push(b'\\'),
                    b'{' => out.push(b'{'),
                    b'x' => {
                        let hex = rest.get(..2)?;
                        let hex = std::str::from_utf8(hex).ok()?;
                        out.push(u8::from_str_radix(hex, 16).ok()?);
                        rest = rest.get(2..)?;
                    }
                    _ => return None,
                }
            }
            b'{' => {
                let close = rest.iter().position(|&c| c == b'}')?;
                let inner = std::str::from_utf8(rest.get(..close)?).ok()?;
                rest = rest.get(close + 1..)?;
                let (text, count) = inner.rsplit_once('*')?;
                let count: usize = count.parse().ok()?;
                for _ in 0..count {
                    out.extend_from_slice(text.as_bytes());
                }
            }
            _ => out.push(b),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_escapes_and_repetitions() {
        assert_eq!(decode("a\\sb\\x00\\\\c").unwrap(), b"a b\0\\c");
        assert_eq!(decode("{ab*3}.x").unwrap(), b"ababab.x");
        assert_eq!(decode("\\{*").unwrap(), b"{*");
        assert!(decode("\\q").is_none());
        assert!(decode("{a*}").is_none());
        assert!(decode("\\x4").is_none());
    }
}

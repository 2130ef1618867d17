//! Host name normalisation shared by the SNI, Host and DNS readers.
//!
//! One rule for every name the gateway compares with the policy: ASCII only
//! (internationalised names must arrive as A-labels, `xn--...`), lowercased,
//! without the trailing root dot, labels of 1 to 63 characters from
//! `[a-z0-9-_]`, at most 253 characters in all. Anything else is refused
//! rather than repaired: a name the policy cannot match is a name the guest
//! cannot use.

use thiserror::Error;

/// The longest presentation-form name (without the trailing dot).
pub const MAX_NAME_LEN: usize = 253;
/// The longest label.
pub const MAX_LABEL_LEN: usize = 63;

/// Why a name was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum NameError {
    /// The name is empty (or only the root dot).
    #[error("empty name")]
    Empty,
    /// The name is longer than 253 characters.
    #[error("name longer than 253 characters")]
    TooLong,
    /// A label is empty (two dots in a row or a leading dot).
    #[error("empty label")]
    EmptyLabel,
    /// A label is longer than 63 characters.
    #[error("label longer than 63 characters")]
    LabelTooLong,
    /// A byte outside `[A-Za-z0-9-_]` (this includes every non-ASCII byte).
    #[error("invalid character in name")]
    InvalidChar,
}

/// Normalises a host name given as bytes (SNI, Host header, DNS labels joined
/// by dots) into the form the policy matches.
///
/// A single trailing dot is removed; uppercase ASCII is lowercased. Returns
/// the normalised name or the first rule it breaks.
pub fn normalize_host(raw: &[u8]) -> Result<String, NameError> {
    let raw = raw.strip_suffix(b".").unwrap_or(raw);
    if raw.is_empty() {
        return Err(NameError::Empty);
    }
    if raw.len() > MAX_NAME_LEN {
        return Err(NameError::TooLong);
    }
    let mut out = String::with_capacity(raw.len());
    for label in raw.split(|b| *b == b'.') {
        check_label(label)?;
        if !out.is_empty() {
            out.push('.');
        }
        out.extend(label.iter().map(|b| char::from(b.to_ascii_lowercase())));
    }
    Ok(out)
}

/// Checks one label: 1 to 63 bytes from `[A-Za-z0-9-_]`.
pub fn check_label(label: &[u8]) -> Result<(), NameError> {
    if label.is_empty() {
        return Err(NameError::EmptyLabel);
    }
    if label.len() > MAX_LABEL_LEN {
        return Err(NameError::LabelTooLong);
    }
    if label
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_')
    {
        Ok(())
    } else {
        Err(NameError::InvalidChar)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowercases_and_strips_trailing_dot() {
        assert_eq!(
            normalize_host(b"WWW.Example.COM.").as_deref(),
            Ok("www.example.com")
        );
        assert_eq!(
            normalize_host(b"xn--bcher-kva.example").as_deref(),
            Ok("xn--bcher-kva.example")
        );
        assert_eq!(
            normalize_host(b"_dmarc.example").as_deref(),
            Ok("_dmarc.example")
        );
    }

    #[test]
    fn refuses_odd_names() {
        assert_eq!(normalize_host(b""), Err(NameError::Empty));
        assert_eq!(normalize_host(b"."), Err(NameError::Empty));
        assert_eq!(normalize_host(b"a..b"), Err(NameError::EmptyLabel));
        assert_eq!(normalize_host(b".a"), Err(NameError::EmptyLabel));
        assert_eq!(normalize_host(b"a.b.."), Err(NameError::EmptyLabel));
        assert_eq!(
            normalize_host("bücher.example".as_bytes()),
            Err(NameError::InvalidChar)
        );
        assert_eq!(normalize_host(b"a b.example"), Err(NameError::InvalidChar));
        assert_eq!(normalize_host(b"a\0.example"), Err(NameError::InvalidChar));
        let long_label = [b'a'; 64];
        assert_eq!(normalize_host(&long_label), Err(NameError::LabelTooLong));
        let long_name = b"abcdefghi.".repeat(26);
        assert_eq!(normalize_host(&long_name), Err(NameError::TooLong));
    }
}

//! Host names for the SNI, Host and DNS readers: the one normaliser,
//! [`sluice_name`], in the owned form the readers return.
//!
//! The rule is sluice-name's, the same one the policy applies to the names
//! it is written with: ASCII only (A-labels), lowercased, one trailing root
//! dot removed, labels of 1 to 63 bytes from `[A-Za-z0-9-_]`, at most 253
//! bytes in all. Anything else is refused rather than repaired.

pub use sluice_name::{MAX_LABEL_LEN, MAX_NAME_LEN, NameError};

/// Normalises a host name given as bytes (SNI, Host header) with
/// [`sluice_name::normalize_bytes`], as an owned string.
///
/// # Errors
/// The first rule the name breaks.
pub fn normalize_host(raw: &[u8]) -> Result<String, NameError> {
    sluice_name::normalize_bytes(raw).map(String::from)
}

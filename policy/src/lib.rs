//! The sluice policy: the allowlist YAML that operators write, its
//! validation, the compiled snapshot that answers "may this sandbox reach X?",
//! and the audit record schema.
//!
//! Pure logic: no I/O beyond reading the policy file, no unsafe.
#![forbid(unsafe_code)]

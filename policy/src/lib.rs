//! The sluice policy: the allowlist YAML that operators write, its
//! validation, the compiled snapshot that answers "may this sandbox reach X?",
//! and the audit record schema.
//!
//! Pure logic: no I/O beyond reading the policy file, no unsafe.
//!
//! ```
//! use sluice_policy::{CompileOptions, Decision, Reason, from_yaml_str};
//!
//! let policy = from_yaml_str(
//!     "version: 1\nid: demo\nallow:\n  - domain: \"**.example.com\"\n",
//!     "demo.yaml",
//!     &CompileOptions::default(),
//! )
//! .unwrap();
//! let v = policy.check_name("www.Example.com.");
//! assert_eq!(v.decision, Decision::Allow);
//! assert_eq!(v.rule.unwrap().pattern, "**.example.com");
//! assert_eq!(policy.check_name("example.org").reason, Reason::NotAllowlisted);
//! ```
#![forbid(unsafe_code)]

mod approval;
pub mod audit;
mod compile;
mod error;
mod fx;
mod model;
pub mod name;
mod name_table;
pub mod overlay;
pub mod platform;
mod reason;
mod rule_table;
mod verdict;

pub use approval::{
    ApprovalBackend, ApprovalSpec, DEFAULT_APPROVAL_TIMEOUT, DEFAULT_MAX_PENDING,
    DEFAULT_PER_MINUTE, Unlisted,
};
pub use compile::{
    CompileOptions, CompiledPolicy, DEFAULT_TTL_MAX, DEFAULT_TTL_MIN, HTTP_PORT, MAX_POLICY_BYTES,
    PortProtocol, SecretLocations, SecretSource, SecretSpec, TLS_PORT, Transport, TtlBounds,
    Upstream, allow_domains_yaml, from_domains, from_yaml_str, load_file,
};
pub use error::{PolicyError, PolicyErrors};
pub use name::{DomainPattern, NameError, NormalName, PatternKind, normalize_name};
pub use reason::{Decision, Reason};
pub use verdict::{MatchedRule, Verdict};

/// The embedded default policy, used by `sluice run` when no `--policy` is
/// given: it allows nothing on the network. The guest still gets DHCP and a
/// DNS server (the gateway), but every name is refused and every connection
/// denied, so it works offline and leaks nothing. Use `--allow-domain NAME`
/// or `--policy FILE` to open destinations.
pub const DEFAULT_POLICY_YAML: &str = "\
# sluice default policy: no network access.
version: 1
id: sluice-default
label: \"default: deny all egress\"
allow: []
";

/// The origin name used in errors and audit lines for
/// [`DEFAULT_POLICY_YAML`].
pub const DEFAULT_POLICY_ORIGIN: &str = "<embedded default policy>";

/// Compile [`DEFAULT_POLICY_YAML`].
///
/// # Errors
/// Never in practice (a test compiles it); typed for uniformity.
pub fn default_policy(options: &CompileOptions) -> Result<CompiledPolicy, PolicyErrors> {
    from_yaml_str(DEFAULT_POLICY_YAML, DEFAULT_POLICY_ORIGIN, options)
}

//! Secret values and their substitution into inspected HTTP requests.
//!
//! The sandbox only ever holds a placeholder (`sk-sluice-placeholder-openai`);
//! the gateway's TLS-terminating proxy swaps it for the real value on the way
//! out, and only for the hosts the secret is bound to, only in the parts of
//! the request the policy allows. Responses are scrubbed the other way so an
//! upstream that echoes the request cannot hand the value to the sandbox.
//!
//! This crate owns the values and the byte rewriting; it does no I/O but
//! reading the secret sources at load, and knows nothing of TLS or sockets:
//!
//! - [`SecretStore`]: the values, read from the environment variables and
//!   files the policy names ([`SecretStore::load`]); `Debug` shows names only;
//!   values are zeroised on drop. Reload builds a new store.
//! - [`HostSubstituter`]: what one inspected connection to one host may do
//!   ([`SecretStore::for_host`]): request heads, request bodies, response
//!   heads and bodies.
//! - [`StreamReplacer`]: boundary-safe replacement over a body that arrives
//!   in chunks, identical to a one-shot replace however it is split, holding
//!   back at most `longest pattern - 1` bytes.
//! - [`PlaceholderScanner`]: boundary-safe detection, for logging, of the
//!   placeholders a body passes through unchanged.
//!
//! Matching is exact (case-sensitive bytes), leftmost-longest and
//! non-overlapping. The policy guarantees no placeholder contains another,
//! so every occurrence of every placeholder is found.
//!
//! ```
//! use sluice_secrets::SecretStore;
//!
//! let yaml = "version: 1\nid: demo\nallow:\n  - domain: api.example.com\n    ports: [443]\n\
//!             secrets:\n  - name: demo\n    placeholder: sk-sluice-placeholder-demo\n\
//!             \x20   env: DEMO_KEY\n    hosts: [api.example.com]\n";
//! let policy = sluice_policy::from_yaml_str(yaml, "demo.yaml", &Default::default()).unwrap();
//! let store = SecretStore::load_with(&policy, |var| {
//!     (var == "DEMO_KEY").then(|| zeroize::Zeroizing::new(b"real-key".to_vec()))
//! })
//! .unwrap();
//! assert_eq!(format!("{store:?}"), r#"SecretStore { names: ["demo"], hosts: ["api.example.com"] }"#);
//!
//! let sub = store.for_host("API.example.com");
//! let (mut parts, ()) = http::Request::builder()
//!     .uri("/v1/models")
//!     .header("authorization", "Bearer sk-sluice-placeholder-demo")
//!     .body(())
//!     .unwrap()
//!     .into_parts();
//! let subs = sub.request_head(&mut parts).unwrap();
//! assert_eq!(parts.headers["authorization"], "Bearer real-key");
//! assert_eq!(subs.used.len(), 1);
//! ```
#![forbid(unsafe_code)]

mod host;
mod matcher;
mod scan;
mod store;
mod stream;

pub use host::{HostSubstituter, SubstituteError, Substitutions};
pub use scan::PlaceholderScanner;
pub use store::{MAX_SECRET_FILE_BYTES, SecretError, SecretStore};
pub use stream::StreamReplacer;

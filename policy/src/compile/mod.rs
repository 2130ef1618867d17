//! Compiling a policy file into an immutable, allocation-free-to-query
//! snapshot ([`CompiledPolicy`]), and the queries the gateway asks it.
//!
//! `load` reads the text and parses it; `compiler` checks and compiles it,
//! with `ports`, `dns` and `secrets` compiling their sections (and the
//! crate's `approval` its own); `snapshot` is the result and its queries.

mod compiler;
mod dns;
mod load;
mod ports;
mod secrets;
mod snapshot;

pub use compiler::CompileOptions;
pub(crate) use compiler::Compiler;
pub use dns::{DEFAULT_TTL_MAX, DEFAULT_TTL_MIN, TtlBounds, Upstream};
pub(crate) use load::parse_raw;
pub use load::{MAX_POLICY_BYTES, allow_domains_yaml, from_domains, from_yaml_str, load_file};
pub use ports::{HTTP_PORT, PortProtocol, TLS_PORT, Transport};
pub use secrets::{SecretLocations, SecretSource, SecretSpec};
pub use snapshot::CompiledPolicy;

//! The bodies of the fuzz targets, one module per target. Each
//! `fuzz_targets/<name>.rs` is a libFuzzer entry calling `<name>::run`;
//! `tests/replay.rs` runs every file of `corpus/<name>/` through the same
//! function on the stable toolchain (no sanitizers, no libFuzzer), so CI
//! checks that every target builds and that its seeds pass its invariants.

pub mod agent_frame;
pub mod authority;
pub mod dhcp;
pub mod dns_query;
pub mod dns_response;
pub mod dns_tcp_framing;
pub mod guest_frames;
pub mod http_head;
pub mod packet_classify;
pub mod policy_parse;
pub mod substitute;
pub mod tls_client_hello;

/// Every target: its name (the `[[bin]]`, `fuzz_targets/<name>.rs` and
/// `corpus/<name>/`) and its body.
pub const TARGETS: &[(&str, fn(&[u8]))] = &[
    ("agent_frame", agent_frame::run),
    ("authority", authority::run),
    ("dhcp", dhcp::run),
    ("dns_query", dns_query::run),
    ("dns_response", dns_response::run),
    ("dns_tcp_framing", dns_tcp_framing::run),
    ("guest_frames", guest_frames::run),
    ("http_head", http_head::run),
    ("packet_classify", packet_classify::run),
    ("policy_parse", policy_parse::run),
    ("substitute", substitute::run),
    ("tls_client_hello", tls_client_hello::run),
];

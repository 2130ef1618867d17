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
pub mod dns_table;
pub mod dns_tcp_framing;
pub mod dns_upstream;
pub mod guest_frames;
pub mod http_head;
pub mod packet_classify;
pub mod policy_parse;
pub mod substitute;
pub mod tls_client_hello;

/// A fuzz target's body: one input, any outcome but a panic.
pub type Body = fn(&[u8]);

/// Every target: its name (the `[[bin]]`, `fuzz_targets/<name>.rs` and
/// `corpus/<name>/`) and its body.
pub const TARGETS: &[(&str, Body)] = &[
    ("agent_frame", agent_frame::run),
    ("authority", authority::run),
    ("dhcp", dhcp::run),
    ("dns_query", dns_query::run),
    ("dns_response", dns_response::run),
    ("dns_table", dns_table::run),
    ("dns_tcp_framing", dns_tcp_framing::run),
    ("dns_upstream", dns_upstream::run),
    ("guest_frames", guest_frames::run),
    ("http_head", http_head::run),
    ("packet_classify", packet_classify::run),
    ("policy_parse", policy_parse::run),
    ("substitute", substitute::run),
    ("tls_client_hello", tls_client_hello::run),
];

/// The two readings a whole-vs-split target compares. `data` without its
/// first byte is pushed whole into one fresh reader, and in segments of the
/// size that byte gives (at least 1) into another, stopping at the first
/// answer that is not `need_more`. Returns the segment size and both last
/// answers; `None` for empty input.
pub(crate) fn whole_and_split<R, P: PartialEq>(
    data: &[u8],
    new: impl Fn() -> R,
    push: impl Fn(&mut R, &[u8]) -> P,
    need_more: P,
) -> Option<(usize, P, P)> {
    let (&step, rest) = data.split_first()?;
    let step = usize::from(step).max(1);
    let whole = push(&mut new(), rest);
    let mut reader = new();
    let mut last = None;
    for chunk in rest.chunks(step) {
        let answer = push(&mut reader, chunk);
        let settled = answer != need_more;
        last = Some(answer);
        if settled {
            break;
        }
    }
    Some((step, whole, last.unwrap_or(need_more)))
}

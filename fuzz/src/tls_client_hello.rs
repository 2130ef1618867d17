//! Fuzz the ClientHello reader with the gateway's bound
//! (`sluice_gateway::decide::policy::INSPECT_MAX_BYTES`, 16 KiB): the input is
//! pushed whole, and again split into segments of the size given by its
//! first byte, so record and segment boundaries vary.
//!
//! Invariants beyond "no panic": segmentation does not change a completed
//! decision (SNI and ALPN of a `Done`), and an input rejected whole is never
//! accepted when split.

use sluice_gateway::decide::policy::INSPECT_MAX_BYTES;
use sluice_inspect::tls::{ClientHelloReader, Progress};

/// One fuzz input (the libFuzzer target and the corpus replay call this).
pub fn run(data: &[u8]) {
    let Some((step, whole_result, last)) = crate::whole_and_split(
        data,
        || ClientHelloReader::new(INSPECT_MAX_BYTES),
        ClientHelloReader::push,
        Progress::NeedMore,
    ) else {
        return;
    };
    match (&whole_result, &last) {
        // Segmentation must not change a completed decision.
        (Progress::Done(a), Progress::Done(b)) => {
            assert_eq!(a.server_name, b.server_name);
            assert_eq!(a.alpn, b.alpn);
        }
        // Splitting must not turn a refusal into an acceptance.
        (Progress::Reject(r), Progress::Done(b)) => {
            panic!("rejected whole ({r:?}) but accepted in {step}-byte segments: {b:?}")
        }
        _ => {}
    }
}

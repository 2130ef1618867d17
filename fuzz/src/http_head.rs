//! Fuzz the HTTP request head reader with the gateway's bound
//! (`sluice_gateway::decide::policy::INSPECT_MAX_BYTES`), whole and in segments of
//! the size given by the first input byte.
//!
//! Invariants beyond "no panic": Host and port of a `Done` do not depend on
//! segmentation, and an input rejected whole is never accepted when split.

use sluice_gateway::decide::policy::INSPECT_MAX_BYTES;
use sluice_inspect::http::{Progress, RequestHeadReader};

/// One fuzz input (the libFuzzer target and the corpus replay call this).
pub fn run(data: &[u8]) {
    let Some((step, whole_result, last)) = crate::whole_and_split(
        data,
        || RequestHeadReader::new(INSPECT_MAX_BYTES),
        RequestHeadReader::push,
        Progress::NeedMore,
    ) else {
        return;
    };
    match (&whole_result, &last) {
        (Progress::Done(a), Progress::Done(b)) => {
            assert_eq!(a.host, b.host);
            assert_eq!(a.port, b.port);
        }
        (Progress::Reject(r), Progress::Done(b)) => {
            panic!("rejected whole ({r:?}) but accepted in {step}-byte segments: {b:?}")
        }
        _ => {}
    }
}

//! Fuzz the HTTP request head reader with the gateway's bound
//! (`sluice_gateway::enforce::INSPECT_MAX_BYTES`), whole and in segments of
//! the size given by the first input byte.
//!
//! Invariants beyond "no panic": Host and port of a `Done` do not depend on
//! segmentation, and an input rejected whole is never accepted when split.

use sluice_gateway::enforce::INSPECT_MAX_BYTES;
use sluice_inspect::http::{Progress, RequestHeadReader};

/// One fuzz input (the libFuzzer target and the corpus replay call this).
pub fn run(data: &[u8]) {
    let Some((&step, rest)) = data.split_first() else {
        return;
    };
    let step = usize::from(step).max(1);
    let mut whole = RequestHeadReader::new(INSPECT_MAX_BYTES);
    let whole_result = whole.push(rest);
    let mut reader = RequestHeadReader::new(INSPECT_MAX_BYTES);
    let mut last = Progress::NeedMore;
    for chunk in rest.chunks(step) {
        last = reader.push(chunk);
        if last != Progress::NeedMore {
            break;
        }
    }
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

//! Fuzz the HTTP request head reader, whole and in segments.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_inspect::http::{Progress, RequestHeadReader};

fuzz_target!(|data: &[u8]| {
    let Some((&step, rest)) = data.split_first() else {
        return;
    };
    let step = usize::from(step).max(1);
    let mut whole = RequestHeadReader::new(4096);
    let whole_result = whole.push(rest);
    let mut reader = RequestHeadReader::new(4096);
    let mut last = Progress::NeedMore;
    for chunk in rest.chunks(step) {
        last = reader.push(chunk);
        if last != Progress::NeedMore {
            break;
        }
    }
    if let (Progress::Done(a), Progress::Done(b)) = (&whole_result, &last) {
        assert_eq!(a.host, b.host);
        assert_eq!(a.port, b.port);
    }
});

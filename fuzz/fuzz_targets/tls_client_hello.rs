//! Fuzz the ClientHello reader: the input is split into segments at points
//! taken from its first byte, so record and segment boundaries vary.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_inspect::tls::{ClientHelloReader, Progress};

fuzz_target!(|data: &[u8]| {
    let Some((&step, rest)) = data.split_first() else {
        return;
    };
    let step = usize::from(step).max(1);
    let mut whole = ClientHelloReader::new(4096);
    let whole_result = whole.push(rest);
    let mut reader = ClientHelloReader::new(4096);
    let mut last = Progress::NeedMore;
    for chunk in rest.chunks(step) {
        last = reader.push(chunk);
        if last != Progress::NeedMore {
            break;
        }
    }
    // Segmentation must not change a completed decision.
    if let (Progress::Done(a), Progress::Done(b)) = (&whole_result, &last) {
        assert_eq!(a.server_name, b.server_name);
        assert_eq!(a.alpn, b.alpn);
    }
});

//! libFuzzer entry of `sluice_fuzz::packet_classify` (the body and its checks live in
//! `src/packet_classify.rs`, which the stable corpus replay also runs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::packet_classify::run(data));

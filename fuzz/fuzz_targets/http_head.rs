//! libFuzzer entry of `sluice_fuzz::http_head` (the body and its checks live in
//! `src/http_head.rs`, which the stable corpus replay also runs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::http_head::run(data));

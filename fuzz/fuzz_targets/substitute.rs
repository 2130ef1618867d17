//! libFuzzer entry of `sluice_fuzz::substitute` (the body and its checks live in
//! `src/substitute.rs`, which the stable corpus replay also runs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::substitute::run(data));

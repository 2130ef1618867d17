//! libFuzzer entry of `sluice_fuzz::authority` (the body and its checks live
//! in `src/authority.rs`, which the stable corpus replay also runs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::authority::run(data));

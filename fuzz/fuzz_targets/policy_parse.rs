//! libFuzzer entry of `sluice_fuzz::policy_parse` (the body and its checks live in
//! `src/policy_parse.rs`, which the stable corpus replay also runs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::policy_parse::run(data));

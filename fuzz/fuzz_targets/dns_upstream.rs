//! libFuzzer entry of `sluice_fuzz::dns_upstream` (the body and its checks live in
//! `src/dns_upstream.rs`, which the stable corpus replay also runs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::dns_upstream::run(data));

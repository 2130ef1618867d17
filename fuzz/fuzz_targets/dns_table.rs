//! libFuzzer entry of `sluice_fuzz::dns_table` (the body and its checks live in
//! `src/dns_table.rs`, which the stable corpus replay also runs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::dns_table::run(data));

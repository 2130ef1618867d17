//! libFuzzer entry of `sluice_fuzz::dhcp` (the body and its checks live in
//! `src/dhcp.rs`, which the stable corpus replay also runs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::dhcp::run(data));

//! libFuzzer entry of `sluice_fuzz::tls_client_hello` (the body and its checks live in
//! `src/tls_client_hello.rs`, which the stable corpus replay also runs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::tls_client_hello::run(data));

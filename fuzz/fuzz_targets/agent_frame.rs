//! libFuzzer entry of `sluice_fuzz::agent_frame` (the body and its checks live in
//! `src/agent_frame.rs`, which the stable corpus replay also runs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::agent_frame::run(data));

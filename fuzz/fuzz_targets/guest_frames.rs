//! libFuzzer entry of `sluice_fuzz::guest_frames` (the body and its checks live in
//! `src/guest_frames.rs`, which the stable corpus replay also runs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::guest_frames::run(data));

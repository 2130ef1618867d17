//! Fuzz the guest agent protocol decoder: a frame stream as the launcher
//! reads it from the guest. Invariant: no panic, no allocation beyond a
//! checked frame length; a decoded message re-encodes to the same body.

use sluice_agent_proto::{Message, read_frame};

/// One fuzz input (the libFuzzer target and the corpus replay call this).
pub fn run(data: &[u8]) {
    let _ = Message::decode(data).map(|m| assert_eq!(m.encode(), data));
    let mut stream = data;
    while let Ok(Some(_)) = read_frame(&mut stream) {}
}

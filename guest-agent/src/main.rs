//! The sluice guest agent (static binary run inside the VM).

fn main() {}

//! Fuzz the gateway's DNS-over-TCP framing
//! (`sluice_gateway::dns::server::tcp_message`) the way the datapath drives it:
//! the guest's byte stream arrives in chunks into a buffer bounded at
//! `TCP_INBUF_MAX` bytes, and whole messages are taken off its front.
//!
//! Input: byte 0 seeds the chunk sizes, the rest is the stream. Invariants
//! beyond "no panic": the messages taken, and the bytes left over, are
//! exactly those of a plain reference parse, for every chunking; a call that
//! returns nothing leaves the buffer unchanged.

use sluice_gateway::dns::server::{TCP_INBUF_MAX, tcp_message};

/// The reference: every complete length-prefixed message, and the rest.
fn reference(stream: &[u8]) -> (Vec<&[u8]>, &[u8]) {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(p) = stream.get(at..at + 2) {
        let len = usize::from(u16::from_be_bytes([p[0], p[1]]));
        match stream.get(at + 2..at + 2 + len) {
            Some(m) => out.push(m),
            None => break,
        }
        at += 2 + len;
    }
    (out, &stream[at..])
}

/// One fuzz input (the libFuzzer target and the corpus replay call this).
pub fn run(data: &[u8]) {
    let Some((&seed, stream)) = data.split_first() else {
        return;
    };
    let (want, want_rest) = reference(stream);
    for chunk in [1usize, usize::from(seed) + 1, 4096] {
        let mut inbuf = Vec::new();
        let mut got: Vec<Vec<u8>> = Vec::new();
        let mut at = 0;
        let mut step = chunk;
        while at < stream.len() {
            // As the datapath: read only while there is room.
            let room = TCP_INBUF_MAX.saturating_sub(inbuf.len());
            assert!(room > 0, "the buffer filled without a whole message");
            let n = step.min(room).min(stream.len() - at);
            inbuf.extend_from_slice(&stream[at..at + n]);
            at += n;
            step = step % 7 + chunk;
            loop {
                let before = inbuf.clone();
                match tcp_message(&mut inbuf) {
                    Some(m) => got.push(m),
                    None => {
                        assert_eq!(inbuf, before, "a miss changed the buffer");
                        break;
                    }
                }
            }
        }
        assert_eq!(got, want, "chunk {chunk}");
        assert_eq!(inbuf, want_rest, "chunk {chunk}");
    }
}

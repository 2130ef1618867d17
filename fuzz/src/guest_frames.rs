//! Fuzz the QEMU stream framing: `sluice_gateway::frames::FrameReader` fed the
//! input in arbitrary chunkings, as the datapath reads the guest socket.
//!
//! Input: byte 0 picks the maximum frame size, byte 1 seeds the chunk sizes,
//! the rest is the stream. Invariants beyond "no panic": the reader always
//! offers room to read into while input remains (no stall); the frames and the
//! error it yields are exactly those of a straightforward reference parse, for
//! every chunking; every frame is within `[MIN_FRAME, max]`.

use sluice_gateway::frames::{FrameError, FrameReader, MIN_FRAME};

/// The reference: frames (as ranges of `stream`) up to the first bad length.
fn reference(stream: &[u8], max: usize) -> (Vec<&[u8]>, Option<FrameError>) {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(p) = stream.get(at..at + 4) {
        let len = u32::from_be_bytes([p[0], p[1], p[2], p[3]]) as usize;
        if !(MIN_FRAME..=max).contains(&len) {
            return (
                out,
                Some(FrameError::BadLength {
                    len,
                    min: MIN_FRAME,
                    max,
                }),
            );
        }
        match stream.get(at + 4..at + 4 + len) {
            Some(f) => out.push(f),
            None => break,
        }
        at += 4 + len;
    }
    (out, None)
}

/// One fuzz input (the libFuzzer target and the corpus replay call this).
pub fn run(data: &[u8]) {
    let (Some(&a), Some(&b)) = (data.first(), data.get(1)) else {
        return;
    };
    let stream = &data[2..];
    // Small maximum frames exercise the bound; 65535 is the protocol's.
    let max = if a == 0xff {
        65535
    } else {
        MIN_FRAME + usize::from(a) * 7
    };
    let (want, want_err) = reference(stream, max);
    for chunk in [1usize, usize::from(b) + 1, 4096] {
        let mut reader = FrameReader::new(chunk, max);
        let mut got: Vec<Vec<u8>> = Vec::new();
        let mut err = None;
        let mut fed = 0;
        // Chunk sizes vary with the seed so boundaries fall everywhere.
        let mut step = 0usize;
        'feed: while fed < stream.len() {
            let spare = reader.spare();
            assert!(!spare.is_empty(), "reader stalled with input left");
            step = step.wrapping_mul(31).wrapping_add(usize::from(b) + 1);
            let n = (1 + step % chunk).min(spare.len()).min(stream.len() - fed);
            spare[..n].copy_from_slice(&stream[fed..fed + n]);
            reader.filled(n);
            fed += n;
            loop {
                match reader.next_frame() {
                    Ok(Some(f)) => {
                        assert!((MIN_FRAME..=max).contains(&f.len()));
                        got.push(f.to_vec());
                    }
                    Ok(None) => break,
                    Err(e) => {
                        err = Some(e);
                        break 'feed;
                    }
                }
            }
        }
        assert_eq!(err, want_err, "chunk {chunk}");
        assert_eq!(got.len(), want.len(), "chunk {chunk}");
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.as_slice(), *w);
        }
    }
}

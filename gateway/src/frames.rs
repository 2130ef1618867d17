//! The QEMU stream socket framing: each frame is a 4-byte big-endian length
//! followed by one Ethernet frame.
//!
//! [`FrameReader`] splits many frames out of one large read without copying
//! them; [`TxBatch`] gathers outgoing frames so that one `write` carries many.
//! Invariant: a length below [`MIN_FRAME`] or above the configured maximum is
//! a protocol error ([`FrameError`]); the caller ends that guest connection.
//! No input makes these types panic.

use thiserror::Error;

/// The smallest acceptable frame: an Ethernet header.
pub const MIN_FRAME: usize = 14;
/// The largest frame the stream protocol can carry (QEMU and passt agree).
pub const MAX_FRAME: usize = 65535;
/// Length of the big-endian frame length prefix.
const LEN_PREFIX: usize = 4;

/// A malformed stream from the guest side.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum FrameError {
    /// A frame length outside `[MIN_FRAME, max]`: the peer is not speaking the stream protocol.
    #[error("frame length {len} outside {min}..={max}")]
    BadLength {
        /// The length the peer announced.
        len: usize,
        /// The smallest length accepted.
        min: usize,
        /// The largest length accepted.
        max: usize,
    },
}

/// Accumulates stream bytes and yields whole frames as borrowed slices.
///
/// The buffer holds `capacity` bytes plus room for one maximal frame, so a
/// read never needs to grow it. Memory is bounded by construction.
#[derive(Debug)]
pub struct FrameReader {
    buf: Vec<u8>,
    /// Start of unparsed bytes.
    start: usize,
    /// End of valid bytes.
    end: usize,
    max_frame: usize,
}

impl FrameReader {
    /// A reader that reads up to `chunk` bytes per syscall and accepts frames up to `max_frame`.
    pub fn new(chunk: usize, max_frame: usize) -> Self {
        let max_frame = max_frame.clamp(MIN_FRAME, MAX_FRAME);
        Self {
            buf: vec![0; chunk.max(max_frame + LEN_PREFIX) + max_frame + LEN_PREFIX],
            start: 0,
            end: 0,
            max_frame,
        }
    }

    /// The free tail of the buffer to read into; call [`Self::filled`] after the read.
    /// Compacts the buffer first when the unparsed remainder is not at its start.
    pub fn spare(&mut self) -> &mut [u8] {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        &mut self.buf[self.end..]
    }

    /// Records that `n` bytes were read into [`Self::spare`].
    pub fn filled(&mut self, n: usize) {
        self.end = (self.end + n).min(self.buf.len());
    }

    /// The next complete frame, `Ok(None)` when more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<&[u8]>, FrameError> {
        let avail = &self.buf[self.start..self.end];
        let Some(prefix) = avail.get(..LEN_PREFIX) else {
            return Ok(None);
        };
        let len = u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
        if !(MIN_FRAME..=self.max_frame).contains(&len) {
            return Err(FrameError::BadLength {
                len,
                min: MIN_FRAME,
                max: self.max_frame,
            });
        }
        if avail.len() < LEN_PREFIX + len {
            return Ok(None);
        }
        let frame_start = self.start + LEN_PREFIX;
        self.start = frame_start + len;
        Ok(self.buf.get(frame_start..frame_start + len))
    }

    /// Bytes received but not yet returned as frames.
    pub fn pending(&self) -> usize {
        self.end - self.start
    }
}

/// Outgoing frames, length-prefixed back to back, written with as few syscalls as possible.
#[derive(Debug, Default)]
pub struct TxBatch {
    buf: Vec<u8>,
    written: usize,
}

impl TxBatch {
    /// Appends one frame built by `fill` into a `len`-byte slice.
    pub fn push_with<R>(&mut self, len: usize, fill: impl FnOnce(&mut [u8]) -> R) -> R {
        // Lengths are bounded by MAX_FRAME by the callers (MTU); saturate rather than truncate.
        let prefix = u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes();
        self.buf.extend_from_slice(&prefix);
        let at = self.buf.len();
        self.buf.resize(at + len, 0);
        fill(&mut self.buf[at..])
    }

    /// Appends a copy of `frame`.
    pub fn push(&mut self, frame: &[u8]) {
        self.push_with(frame.len(), |b| b.copy_from_slice(frame));
    }

    /// Bytes queued and not yet written.
    pub fn queued(&self) -> usize {
        self.buf.len() - self.written
    }

    /// The unwritten bytes.
    pub fn unwritten(&self) -> &[u8] {
        &self.buf[self.written..]
    }

    /// Records that `n` bytes of [`Self::unwritten`] were written; resets when all were.
    pub fn consume(&mut self, n: usize) {
        self.written = (self.written + n).min(self.buf.len());
        if self.written == self.buf.len() {
            self.buf.clear();
            self.written = 0;
            // Give back memory after a burst so an idle gateway stays small.
            if self.buf.capacity() > 4 << 20 {
                self.buf.shrink_to(1 << 20);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(frames: &[&[u8]]) -> Vec<u8> {
        let mut v = Vec::new();
        for f in frames {
            v.extend_from_slice(&u32::try_from(f.len()).unwrap().to_be_bytes());
            v.extend_from_slice(f);
        }
        v
    }

    fn feed(r: &mut FrameReader, bytes: &[u8]) {
        let spare = r.spare();
        spare[..bytes.len()].copy_from_slice(bytes);
        r.filled(bytes.len());
    }

    #[test]
    fn splits_many_frames_from_one_read_and_keeps_partial_tail() {
        let a = [1u8; 14];
        let b = [2u8; 60];
        let c = [3u8; 100];
        let stream = framed(&[&a, &b, &c]);
        let mut r = FrameReader::new(1024, 1514);
        feed(&mut r, &stream[..stream.len() - 10]);
        assert_eq!(r.next_frame().unwrap(), Some(&a[..]));
        assert_eq!(r.next_frame().unwrap(), Some(&b[..]));
        assert_eq!(r.next_frame().unwrap(), None);
        feed(&mut r, &stream[stream.len() - 10..]);
        assert_eq!(r.next_frame().unwrap(), Some(&c[..]));
        assert_eq!(r.next_frame().unwrap(), None);
        assert_eq!(r.pending(), 0);
    }

    #[test]
    fn too_short_and_too_long_lengths_are_errors() {
        let mut r = FrameReader::new(1024, 1514);
        feed(&mut r, &13u32.to_be_bytes());
        assert!(matches!(
            r.next_frame(),
            Err(FrameError::BadLength { len: 13, .. })
        ));
        let mut r = FrameReader::new(1024, 1514);
        feed(&mut r, &1515u32.to_be_bytes());
        assert!(matches!(
            r.next_frame(),
            Err(FrameError::BadLength { len: 1515, .. })
        ));
        let mut r = FrameReader::new(1024, 1514);
        feed(&mut r, &u32::MAX.to_be_bytes());
        assert!(r.next_frame().is_err());
    }

    #[test]
    fn a_maximal_frame_fits_after_a_partial_one() {
        let big = vec![7u8; 1514];
        let stream = framed(&[&big, &big, &big]);
        let mut r = FrameReader::new(2000, 1514);
        let mut fed = 0;
        let mut got = 0;
        while got < 3 {
            let spare = r.spare();
            let n = spare.len().min(stream.len() - fed).min(1700);
            spare[..n].copy_from_slice(&stream[fed..fed + n]);
            r.filled(n);
            fed += n;
            while let Some(f) = r.next_frame().unwrap() {
                assert_eq!(f, &big[..]);
                got += 1;
            }
        }
    }

    #[test]
    fn tx_batch_prefixes_and_resets() {
        let mut t = TxBatch::default();
        t.push(&[9u8; 20]);
        t.push_with(14, |b| b.fill(1));
        assert_eq!(t.queued(), 4 + 20 + 4 + 14);
        assert_eq!(&t.unwritten()[..4], &20u32.to_be_bytes());
        t.consume(10);
        assert_eq!(t.queued(), 32);
        t.consume(32);
        assert_eq!(t.queued(), 0);
    }
}

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
#[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
pub const MIN_FRAME: usize = 14;
/// The largest frame the stream protocol can carry (QEMU and passt agree).
pub(crate) const MAX_FRAME: usize = 65535;
/// Length of the big-endian frame length prefix.
const LEN_PREFIX: usize = 4;

/// A malformed stream from the guest side.
#[derive(Debug, Error, PartialEq, Eq)]
#[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
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
#[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
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
    #[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
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
    #[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
    pub fn spare(&mut self) -> &mut [u8] {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        &mut self.buf[self.end..]
    }

    /// Records that `n` bytes were read into [`Self::spare`].
    #[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
    pub fn filled(&mut self, n: usize) {
        self.end = (self.end + n).min(self.buf.len());
    }

    /// The next complete frame, `Ok(None)` when more bytes are needed.
    #[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
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
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.end - self.start
    }
}

/// Bytes at the start of each pushed frame that are cleared before the
/// frame is built: every header (Ethernet, IPv4 with options, TCP with
/// options) fits. Builders write every header field, but smoltcp leaves the
/// padding after a TCP option list's end marker unwritten; clearing it keeps
/// bytes of earlier frames out of the padding. Payloads are always written
/// in full (copied), so the rest of a large frame is not cleared.
const CLEARED_PREFIX: usize = 256;

/// Storage kept after a burst when [`TxBatch::trim`] is called: enough for
/// interactive traffic without touching the allocator.
const TRIM_KEEP: usize = 256 * 1024;

/// Outgoing frames, length-prefixed back to back, written with as few syscalls as possible.
///
/// The storage is reused: it grows to the largest backlog seen (bounded by
/// the caller, which stops pushing at its high-water mark) and stays
/// allocated and initialised, so pushing a frame costs no allocation, no
/// page fault and no clearing of the payload area (the previous design
/// zeroed and re-faulted every frame: a third of the gateway's CPU during a
/// download). [`Self::trim`] gives memory back when the datapath is idle.
#[derive(Debug, Default)]
#[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
pub struct TxBatch {
    /// Initialised storage; `buf.len()` is its high-water mark, not the queue.
    buf: Vec<u8>,
    /// End of the queued bytes.
    end: usize,
    /// Start of the unwritten bytes.
    written: usize,
}

impl TxBatch {
    /// Appends one frame built by `fill` into a `len`-byte slice.
    ///
    /// The slice is cleared up to [`CLEARED_PREFIX`] bytes; beyond that it
    /// may hold bytes of earlier frames, so `fill` must write the payload in
    /// full (every builder in the gateway and smoltcp's do).
    pub(crate) fn push_with<R>(&mut self, len: usize, fill: impl FnOnce(&mut [u8]) -> R) -> R {
        // Lengths are bounded by MAX_FRAME by the callers (MTU); saturate rather than truncate.
        let prefix = u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes();
        let at = self.end + prefix.len();
        let need = at + len;
        if need > self.buf.len() {
            self.buf.resize(need, 0);
        }
        self.buf[self.end..at].copy_from_slice(&prefix);
        self.end = need;
        let frame = &mut self.buf[at..need];
        let clear = frame.len().min(CLEARED_PREFIX);
        frame[..clear].fill(0);
        fill(frame)
    }

    /// Appends a copy of `frame`.
    #[cfg(test)]
    pub(crate) fn push(&mut self, frame: &[u8]) {
        self.push_with(frame.len(), |b| b.copy_from_slice(frame));
    }

    /// Bytes queued and not yet written.
    pub(crate) fn queued(&self) -> usize {
        self.end - self.written
    }

    /// The unwritten bytes.
    #[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
    pub fn unwritten(&self) -> &[u8] {
        &self.buf[self.written..self.end]
    }

    /// Records that `n` bytes of [`Self::unwritten`] were written; the
    /// storage is reused from its start once everything was written.
    pub(crate) fn consume(&mut self, n: usize) {
        self.written = (self.written + n).min(self.end);
        if self.written == self.end {
            self.written = 0;
            self.end = 0;
        }
    }

    /// Bytes of storage held (initialised), queued or not.
    #[cfg(test)]
    pub(crate) fn storage(&self) -> usize {
        self.buf.len()
    }

    /// Whether [`Self::trim`] would give storage back once drained.
    pub(crate) fn holds_surplus(&self) -> bool {
        self.buf.len() > TRIM_KEEP
    }

    /// Gives back storage beyond [`TRIM_KEEP`] when nothing is queued (call
    /// it when the datapath has been idle for a while, not per frame: the
    /// next burst pays the allocation and page faults again).
    pub(crate) fn trim(&mut self) {
        if self.end == 0 && self.buf.len() > TRIM_KEEP {
            self.buf.truncate(TRIM_KEEP);
            self.buf.shrink_to_fit();
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

    #[test]
    fn tx_batch_reuses_its_storage_and_clears_headers_of_reused_frames() {
        let mut t = TxBatch::default();
        t.push(&[0xaa; 1000]);
        t.push(&[0xbb; 300]);
        let storage = t.storage();
        assert_eq!(storage, 4 + 1000 + 4 + 300);
        t.consume(t.queued());
        // The next frames land in the same storage: no growth.
        t.push_with(400, |b| {
            assert!(b[..256].iter().all(|&x| x == 0), "header area cleared");
            assert_eq!(
                b[256], 0xaa,
                "payload area not cleared (the builder writes it)"
            );
            b.fill(1);
        });
        t.push_with(600, |b| b.fill(2));
        assert_eq!(t.storage(), storage);
        assert_eq!(&t.unwritten()[..4], &400u32.to_be_bytes());
        assert_eq!(t.unwritten()[4..404], [1u8; 400]);
        assert_eq!(&t.unwritten()[404..408], &600u32.to_be_bytes());
        assert_eq!(t.unwritten()[408..], [2u8; 600]);
        // Partly written: later pushes append after the unwritten rest.
        t.consume(500);
        t.push(&[3u8; 50]);
        assert_eq!(t.queued(), 1008 - 500 + 54);
        assert_eq!(t.unwritten()[t.queued() - 50..], [3u8; 50]);
    }

    #[test]
    fn tx_batch_trim_gives_back_storage_only_when_drained() {
        let mut t = TxBatch::default();
        for _ in 0..8 {
            t.push(&[5u8; 65535]);
        }
        t.trim();
        assert_eq!(t.queued(), 8 * 65539, "trim never drops queued frames");
        t.consume(t.queued());
        assert!(t.holds_surplus());
        t.trim();
        assert_eq!(t.storage(), TRIM_KEEP);
        assert!(!t.holds_surplus());
        t.push(&[6u8; 14]);
        assert_eq!(t.unwritten()[4..], [6u8; 14]);
    }
}

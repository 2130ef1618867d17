//! Streaming replacement for request and response bodies.

use std::fmt;
use std::sync::Arc;

use zeroize::Zeroizing;

use crate::matcher::{Table, secret_bytes};

/// Replaces patterns in a body that arrives in chunks, with exactly the
/// result of replacing them in the whole body at once, however the body is
/// split (a pattern may be cut across any number of chunks, down to one byte
/// each).
///
/// It holds back at most `longest pattern - 1` bytes between calls, and only
/// a tail of the input that could still become a match: a byte is released
/// as soon as no pattern starting at or before it could be completed by
/// later bytes. A chunk that does not end in the beginning of a pattern is
/// released whole (server-sent events are not delayed). The held-back bytes live in a buffer that is
/// zeroised when the replacer drops (in the reflection direction they may be
/// the start of a real secret value). What it appends to `out` is the
/// caller's: in the request direction it contains real secret values.
///
/// Match rule: leftmost-longest, non-overlapping (see the crate docs).
pub struct StreamReplacer {
    table: Arc<Table>,
    /// Bytes received but not yet released (at most `max_len - 1` between
    /// calls).
    pending: Zeroizing<Vec<u8>>,
    replaced: u64,
    /// Replacements per pattern of `table`.
    hits: Vec<u64>,
}

impl StreamReplacer {
    pub(crate) fn new(table: Arc<Table>) -> Self {
        let hits = vec![0; table.len()];
        let pending = Zeroizing::new(Vec::with_capacity(table.max_len()));
        Self {
            table,
            pending,
            replaced: 0,
            hits,
        }
    }

    /// A replacer for arbitrary `(pattern, replacement)` pairs, outside any
    /// store (tests, fuzzing, other rewriters). Empty patterns are ignored;
    /// [`StreamReplacer::used`] reports them by an empty name. The bytes are
    /// copied into zeroising buffers.
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a [u8], &'a [u8])>) -> Self {
        let rows = pairs
            .into_iter()
            .map(|(f, w)| (secret_bytes(f), secret_bytes(w), Arc::from("")))
            .collect();
        Self::new(Arc::new(Table::new(rows)))
    }

    /// Appends the replaced bytes that are final to `out`; keeps at most
    /// (longest pattern - 1) bytes back for the next chunk.
    pub fn feed(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        if chunk.is_empty() {
            return;
        }
        if self.pending.is_empty() {
            let keep = self.release(chunk, false, out);
            self.hold(chunk.get(keep..).unwrap_or_default());
        } else {
            // Join into a fresh zeroising buffer: growing `pending` in place
            // could reallocate and free a copy of its bytes without zeroing.
            let mut joined = Zeroizing::new(Vec::with_capacity(self.pending.len() + chunk.len()));
            joined.extend_from_slice(&self.pending);
            joined.extend_from_slice(chunk);
            let keep = self.release(&joined, false, out);
            self.hold(joined.get(keep..).unwrap_or_default());
        }
    }

    /// Releases everything still held back (the end of the body), replaced.
    /// The replacer is empty afterwards and may be reused for a new body.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        let pending = std::mem::replace(
            &mut self.pending,
            Zeroizing::new(Vec::with_capacity(self.table.max_len())),
        );
        let keep = self.release(&pending, true, out);
        debug_assert_eq!(keep, pending.len());
    }

    /// How many replacements were made so far.
    #[must_use]
    pub fn replaced(&self) -> u64 {
        self.replaced
    }

    /// The names of the secrets replaced at least once so far, each once,
    /// in table order.
    pub fn used(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        for (i, &n) in self.hits.iter().enumerate() {
            let name = self.table.name(i);
            if n > 0 && !names.contains(&name) {
                names.push(name);
            }
        }
        names
    }

    /// How many bytes are held back right now (at most longest pattern - 1
    /// between calls).
    #[must_use]
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Keep `tail` for the next call (into a buffer sized once for it).
    fn hold(&mut self, tail: &[u8]) {
        self.pending.clear();
        if self.pending.capacity() < tail.len() {
            self.pending = Zeroizing::new(Vec::with_capacity(tail.len()));
        }
        self.pending.extend_from_slice(tail);
    }

    /// Append to `out` the replaced prefix of `buf` that is final and return
    /// where the rest (to be held back) starts.
    ///
    /// A match starting at `s` is final once `s + max_len <= buf.len()`:
    /// every pattern that could start at or before `s` ends inside `buf`, so
    /// no later byte can change which match wins there. Likewise a byte at
    /// `q < buf.len() - (max_len - 1)` that starts no match never will. At
    /// the end of the stream everything is final.
    fn release(&mut self, buf: &[u8], at_end: bool, out: &mut Vec<u8>) -> usize {
        let max_len = self.table.max_len();
        if max_len == 0 {
            out.extend_from_slice(buf);
            return buf.len();
        }
        let safe_end = if at_end {
            buf.len()
        } else {
            buf.len().saturating_sub(max_len - 1)
        };
        let mut search = self.table.search(buf);
        let mut at = 0;
        loop {
            match search.find_from(at) {
                Some((start, i)) if start < safe_end => {
                    out.extend_from_slice(buf.get(at..start).unwrap_or_default());
                    out.extend_from_slice(self.table.replacement(i));
                    at = start + self.table.pattern_len(i);
                    self.replaced += 1;
                    if let Some(h) = self.hits.get_mut(i) {
                        *h += 1;
                    }
                }
                _ => {
                    let mut end = safe_end.max(at);
                    if !at_end {
                        end = self.first_live(buf, end);
                    }
                    out.extend_from_slice(buf.get(at..end).unwrap_or_default());
                    return end;
                }
            }
        }
    }
}

impl StreamReplacer {
    /// The first position at or after `from` where a pattern could still
    /// start: the rest of `buf` from there is a prefix of a pattern, or a
    /// pattern starts there. `buf.len()` if none. Called with `from >=
    /// buf.len() - (max_len - 1)`, so this looks at fewer than `max_len`
    /// positions.
    fn first_live(&self, buf: &[u8], from: usize) -> usize {
        (from..buf.len())
            .find(|&q| {
                let rest = buf.get(q..).unwrap_or_default();
                (0..self.table.len()).any(|i| {
                    let p = self.table.pattern(i);
                    if rest.len() >= p.len() {
                        rest.starts_with(p)
                    } else {
                        p.starts_with(rest)
                    }
                })
            })
            .unwrap_or(buf.len())
    }
}

impl fmt::Debug for StreamReplacer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Patterns, replacements and held-back bytes may be secret.
        f.debug_struct("StreamReplacer")
            .field("patterns", &self.table.len())
            .field("pending_len", &self.pending.len())
            .field("replaced", &self.replaced)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The obvious quadratic reference: at each position take the longest
    /// pattern that starts there (first in table order among equals).
    pub(crate) fn reference(rows: &[(Vec<u8>, Vec<u8>)], hay: &[u8]) -> (Vec<u8>, u64) {
        let mut out = Vec::new();
        let mut i = 0;
        let mut n = 0;
        while i < hay.len() {
            let mut best: Option<usize> = None;
            for (k, (f, _)) in rows.iter().enumerate() {
                if !f.is_empty()
                    && hay[i..].starts_with(f)
                    && best.is_none_or(|b| f.len() > rows[b].0.len())
                {
                    best = Some(k);
                }
            }
            match best {
                Some(k) => {
                    out.extend_from_slice(&rows[k].1);
                    i += rows[k].0.len();
                    n += 1;
                }
                None => {
                    out.push(hay[i]);
                    i += 1;
                }
            }
        }
        (out, n)
    }

    fn table(rows: &[(Vec<u8>, Vec<u8>)]) -> Arc<Table> {
        Arc::new(Table::new(
            rows.iter()
                .map(|(f, w)| (secret_bytes(f), secret_bytes(w), Arc::from("s")))
                .collect(),
        ))
    }

    /// xorshift64*: deterministic, dependency-free randomness for tests.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: usize) -> usize {
            usize::try_from(self.next() % n as u64).unwrap()
        }
    }

    fn streamed(t: &Arc<Table>, hay: &[u8], cuts: &[usize]) -> (Vec<u8>, u64, usize) {
        let mut r = StreamReplacer::new(Arc::clone(t));
        let mut out = Vec::new();
        let mut prev = 0;
        let mut max_pending = 0;
        for &c in cuts.iter().chain(std::iter::once(&hay.len())) {
            r.feed(&hay[prev..c], &mut out);
            max_pending = max_pending.max(r.pending_len());
            prev = c;
        }
        r.finish(&mut out);
        assert_eq!(r.pending_len(), 0);
        (out, r.replaced(), max_pending)
    }

    #[test]
    fn placeholder_split_at_every_boundary() {
        let rows = vec![(b"sk-sluice-ph-1".to_vec(), b"REAL-VALUE-123".to_vec())];
        let t = table(&rows);
        let hay = b"xx sk-sluice-ph-1 yy sk-sluice-ph-1";
        let (want, _) = reference(&rows, hay);
        assert_eq!(want, b"xx REAL-VALUE-123 yy REAL-VALUE-123");
        for cut in 0..=hay.len() {
            let (got, n, _) = streamed(&t, hay, &[cut]);
            assert_eq!(got, want, "cut at {cut}");
            assert_eq!(n, 2);
        }
        let every: Vec<usize> = (1..hay.len()).collect();
        let (got, n, held) = streamed(&t, hay, &every);
        assert_eq!(got, want);
        assert_eq!(n, 2);
        assert!(held < rows[0].0.len());
    }

    #[test]
    fn random_chunkings_match_one_shot_reference() {
        let mut rng = Rng(0x5eed_1234_abcd_0001);
        for round in 0..400 {
            // A small alphabet makes partial and overlapping matches common.
            let alphabet = b"abcX";
            let npat = 1 + rng.below(4);
            let mut rows = Vec::new();
            for _ in 0..npat {
                let len = 1 + rng.below(6);
                let f: Vec<u8> = (0..len)
                    .map(|_| alphabet[rng.below(alphabet.len())])
                    .collect();
                let wlen = rng.below(8);
                let w: Vec<u8> = (0..wlen).map(|_| b"0123456789"[rng.below(10)]).collect();
                rows.push((f, w));
            }
            let t = table(&rows);
            let max_len = rows.iter().map(|r| r.0.len()).max().unwrap();
            let hlen = rng.below(200);
            let hay: Vec<u8> = (0..hlen)
                .map(|_| alphabet[rng.below(alphabet.len())])
                .collect();
            let (want, want_n) = reference(&rows, &hay);
            for _ in 0..8 {
                let mut cuts: Vec<usize> = (0..rng.below(hlen + 1))
                    .map(|_| rng.below(hlen + 1))
                    .collect();
                cuts.sort_unstable();
                let (got, n, held) = streamed(&t, &hay, &cuts);
                assert_eq!(got, want, "round {round}: rows {rows:?} cuts {cuts:?}");
                assert_eq!(n, want_n);
                assert!(
                    held < max_len,
                    "held {held} bytes, longest pattern {max_len}"
                );
            }
        }
    }

    #[test]
    fn holds_back_only_a_possible_prefix_length() {
        let rows = vec![(b"PLACEHOLDER".to_vec(), b"v".to_vec())];
        let mut r = StreamReplacer::new(table(&rows));
        let mut out = Vec::new();
        r.feed(b"hello world, this is a body", &mut out);
        assert_eq!(r.pending_len(), 0);
        assert_eq!(out, b"hello world, this is a body");
        r.feed(b" PLA", &mut out);
        assert_eq!(r.pending_len(), 3);
        assert_eq!(out, b"hello world, this is a body ");
        r.feed(b"Z", &mut out);
        assert_eq!(r.pending_len(), 0);
        assert_eq!(out, b"hello world, this is a body PLAZ");
        out.clear();
        r.feed(b"PLACEPLACEHOLDE", &mut out);
        assert_eq!(r.pending_len(), 10);
        assert_eq!(out, b"PLACE");
        out.clear();
        r.feed(b"R!", &mut out);
        r.finish(&mut out);
        assert_eq!(out, b"v!");
        assert_eq!(r.used(), vec!["s"]);
    }

    #[test]
    fn empty_table_passes_through() {
        let mut r = StreamReplacer::new(table(&[]));
        let mut out = Vec::new();
        r.feed(b"abc", &mut out);
        assert_eq!(out, b"abc");
        r.finish(&mut out);
        assert_eq!(out, b"abc");
        assert_eq!(r.replaced(), 0);
    }

    #[test]
    fn debug_shows_no_bytes() {
        let rows = vec![(b"secret-pattern".to_vec(), b"secret-replacement".to_vec())];
        let mut r = StreamReplacer::new(table(&rows));
        let mut out = Vec::new();
        r.feed(b"zzz secret-pat", &mut out);
        let d = format!("{r:?}");
        assert!(!d.contains("secret"), "{d}");
        assert!(!d.contains("zzz"), "{d}");
    }
}

//! Streaming detection of placeholders that are passed through unchanged.

use std::fmt;
use std::sync::Arc;

use memchr::memmem;

use crate::matcher::Table;

/// What a detected placeholder means on this stream.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Not bound to the host (audit reason `secret_host_mismatch`).
    Mismatched,
    /// Bound to the host but not allowed in this part of the request.
    NotAllowed,
}

/// Reports which placeholders occur in a body that arrives in chunks,
/// without changing it: for logging placeholders that are passed through
/// unchanged (another secret's placeholder in a request body, a body-less
/// secret's placeholder in a body, any placeholder over plain HTTP).
///
/// Detection is exact, including occurrences cut across any chunk
/// boundary. It keeps only the last `longest placeholder - 1` bytes between
/// calls. Placeholders are not secret; nothing here holds a value.
pub struct PlaceholderScanner {
    table: Arc<Table>,
    /// Per pattern of `table`: what a hit means.
    kinds: Arc<[Seen]>,
    /// Per pattern: seen so far.
    seen: Vec<bool>,
    /// The last `max_len - 1` bytes of the stream.
    tail: Vec<u8>,
}

impl PlaceholderScanner {
    pub(crate) fn new(table: Arc<Table>, kinds: Arc<[Seen]>) -> Self {
        let seen = vec![false; table.len()];
        Self {
            table,
            kinds,
            seen,
            tail: Vec::new(),
        }
    }

    /// Scan the next chunk.
    pub fn feed(&mut self, chunk: &[u8]) {
        let keep = self.table.max_len().saturating_sub(1);
        if self.table.len() == 0 || chunk.is_empty() {
            return;
        }
        // An occurrence ending in `chunk` lies inside it or starts in the
        // last `keep` bytes before it, so it is inside `tail + chunk[..keep]`.
        let head = chunk.get(..keep.min(chunk.len())).unwrap_or_default();
        let mut joint = Vec::with_capacity(self.tail.len() + head.len());
        joint.extend_from_slice(&self.tail);
        joint.extend_from_slice(head);
        for (i, seen) in self.seen.iter_mut().enumerate() {
            if !*seen {
                let p = self.table.pattern(i);
                *seen = memmem::find(&joint, p).is_some() || memmem::find(chunk, p).is_some();
            }
        }
        // New tail: the last `keep` bytes of tail + chunk.
        if chunk.len() >= keep {
            self.tail.clear();
            self.tail
                .extend_from_slice(chunk.get(chunk.len() - keep..).unwrap_or_default());
        } else {
            self.tail.extend_from_slice(chunk);
            let excess = self.tail.len().saturating_sub(keep);
            self.tail.drain(..excess);
        }
    }

    /// Secrets not bound to the host whose placeholder was seen, each once,
    /// in policy order (audit reason `secret_host_mismatch`).
    #[must_use]
    pub fn mismatched(&self) -> Vec<&str> {
        self.names(Seen::Mismatched)
    }

    /// Secrets bound to the host whose placeholder was seen where their
    /// `locations` do not allow substitution, each once, in policy order.
    #[must_use]
    pub fn not_allowed(&self) -> Vec<&str> {
        self.names(Seen::NotAllowed)
    }

    fn names(&self, kind: Seen) -> Vec<&str> {
        self.seen
            .iter()
            .zip(self.kinds.iter())
            .enumerate()
            .filter(|(_, (s, k))| **s && **k == kind)
            .map(|(i, _)| self.table.name(i))
            .collect()
    }
}

impl fmt::Debug for PlaceholderScanner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlaceholderScanner")
            .field("patterns", &self.table.len())
            .field("mismatched", &self.mismatched())
            .field("not_allowed", &self.not_allowed())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use crate::store::tests::store;

    #[test]
    fn body_scanner_reports_passed_through_placeholders_across_chunks() {
        let s = store();
        // upload.example.com: `bdy` allows body (substituted, not reported);
        // `hdr`, `qry` are bound elsewhere (mismatched).
        let mut sc = s
            .for_host("upload.example.com")
            .request_body_scanner()
            .unwrap();
        let body = b"x PH-body-secret y PH-query-secret z";
        for b in body.chunks(1) {
            sc.feed(b);
        }
        assert_eq!(sc.mismatched(), ["qry"]);
        assert!(sc.not_allowed().is_empty());

        // api.example.com: `hdr` and `qry` bound but not allowed in body.
        let mut sc = s
            .for_host("api.example.com")
            .request_body_scanner()
            .unwrap();
        sc.feed(b"PH-header-sec");
        sc.feed(b"ret and PH-bo");
        sc.feed(b"dy-secret");
        assert_eq!(sc.not_allowed(), ["hdr"]);
        assert_eq!(sc.mismatched(), ["bdy"]);
        let d = format!("{sc:?}");
        assert!(!d.contains("PH-"), "{d}");

        let mut sc = s.placeholder_scanner();
        sc.feed(b"PH-body-secretPH-header-secre");
        sc.feed(b"");
        sc.feed(b"t");
        assert_eq!(sc.mismatched(), ["hdr", "bdy"]);
    }

    #[test]
    fn scanner_matches_substring_search_for_every_split() {
        let s = store();
        let body = b"aaPH-query-secretPH-header-secretbb";
        for cut1 in 0..=body.len() {
            for cut2 in cut1..=body.len() {
                let mut sc = s.placeholder_scanner();
                sc.feed(&body[..cut1]);
                sc.feed(&body[cut1..cut2]);
                sc.feed(&body[cut2..]);
                assert_eq!(sc.mismatched(), s.placeholders_in(body), "{cut1} {cut2}");
            }
        }
    }
}

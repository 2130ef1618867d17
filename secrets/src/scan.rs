//! Streaming detection of placeholders that are passed through unchanged.
//!
//! The set of placeholders to look for ([`ScanSet`]) is built once per
//! store and per host substituter, with one prebuilt `memchr::memmem`
//! searcher per placeholder (placeholders are not secret: owned copies of
//! them are fine, unlike values). A [`PlaceholderScanner`] is the per-body
//! state: which placeholders were seen, and the last few bytes of the
//! previous chunk.

use std::fmt;
use std::sync::Arc;

use memchr::memmem;

/// What a detected placeholder means on this stream.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Not bound to the host (audit reason `secret_host_mismatch`).
    Mismatched,
    /// Bound to the host but not allowed in this part of the request.
    NotAllowed,
}

/// The placeholders one kind of body is scanned for, each with its secret's
/// name and what a hit means. Immutable and shared by every scanner made
/// from it. No `Debug`: it would print placeholders.
pub(crate) struct ScanSet {
    finders: Vec<memmem::Finder<'static>>,
    names: Vec<Arc<str>>,
    kinds: Vec<Seen>,
    /// The longest placeholder's length.
    max_len: usize,
}

impl ScanSet {
    /// A set from `(placeholder, secret name, meaning)` rows, in policy
    /// order. Empty placeholders are dropped (the policy never has one).
    pub(crate) fn new<'a>(rows: impl IntoIterator<Item = (&'a [u8], Arc<str>, Seen)>) -> Self {
        let mut set = Self {
            finders: Vec::new(),
            names: Vec::new(),
            kinds: Vec::new(),
            max_len: 0,
        };
        for (placeholder, name, kind) in rows {
            if placeholder.is_empty() {
                continue;
            }
            set.max_len = set.max_len.max(placeholder.len());
            set.finders
                .push(memmem::Finder::new(placeholder).into_owned());
            set.names.push(name);
            set.kinds.push(kind);
        }
        set
    }

    /// No placeholder to look for.
    pub(crate) fn is_empty(&self) -> bool {
        self.finders.is_empty()
    }
}

/// Reports which placeholders occur in a body that arrives in chunks,
/// without changing it: for logging placeholders that are passed through
/// unchanged (another secret's placeholder in a request body, a body-less
/// secret's placeholder in a body, any placeholder over plain HTTP).
///
/// Detection is exact, including occurrences cut across any chunk
/// boundary (down to one byte per chunk). Between calls it keeps only the
/// last `longest placeholder - 1` bytes. Cost per chunk: one vectorised
/// `memmem` pass over the chunk per placeholder not seen yet, plus the same
/// over at most `2 * (longest - 1)` bytes around the chunk boundary; no
/// allocation once warmed up; nothing at all once every placeholder has been
/// seen. Placeholders are not secret; nothing here holds a value.
pub struct PlaceholderScanner {
    set: Arc<ScanSet>,
    /// Per placeholder of `set`: seen so far.
    seen: Vec<bool>,
    /// Placeholders not seen yet.
    unseen: usize,
    /// The last `max_len - 1` bytes of the stream.
    tail: Vec<u8>,
    /// Scratch: `tail` + the start of the next chunk.
    joint: Vec<u8>,
}

impl PlaceholderScanner {
    pub(crate) fn new(set: Arc<ScanSet>) -> Self {
        let n = set.finders.len();
        let keep = set.max_len.saturating_sub(1);
        Self {
            set,
            seen: vec![false; n],
            unseen: n,
            tail: Vec::with_capacity(keep),
            joint: Vec::with_capacity(2 * keep),
        }
    }

    /// Scan the next chunk.
    pub fn feed(&mut self, chunk: &[u8]) {
        if self.unseen == 0 || chunk.is_empty() {
            return;
        }
        let keep = self.set.max_len.saturating_sub(1);
        // An occurrence ending in `chunk` lies inside it or starts in the
        // last `keep` bytes before it, so it is inside `tail + chunk[..keep]`.
        if !self.tail.is_empty() {
            let head = chunk.get(..keep.min(chunk.len())).unwrap_or_default();
            self.joint.clear();
            self.joint.extend_from_slice(&self.tail);
            self.joint.extend_from_slice(head);
            Self::mark(&self.set, &mut self.seen, &mut self.unseen, &self.joint);
        }
        Self::mark(&self.set, &mut self.seen, &mut self.unseen, chunk);
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

    /// Marks the placeholders not seen yet that occur in `hay`.
    fn mark(set: &ScanSet, seen: &mut [bool], unseen: &mut usize, hay: &[u8]) {
        for (finder, seen) in set.finders.iter().zip(seen.iter_mut()) {
            if !*seen && finder.find(hay).is_some() {
                *seen = true;
                *unseen = unseen.saturating_sub(1);
            }
        }
    }

    /// Whether any placeholder was seen so far.
    #[must_use]
    pub fn any(&self) -> bool {
        self.unseen < self.seen.len()
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
            .zip(self.set.kinds.iter().zip(self.set.names.iter()))
            .filter(|(s, (k, _))| **s && **k == kind)
            .map(|(_, (_, name))| &**name)
            .collect()
    }
}

impl fmt::Debug for PlaceholderScanner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlaceholderScanner")
            .field("patterns", &self.seen.len())
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
        assert!(sc.any());

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
        sc.feed(b"PH-body-secre");
        assert!(!sc.any());
        sc.feed(b"t");
        assert!(sc.any());
        sc.feed(b"PH-body-secretPH-header-secre");
        sc.feed(b"");
        sc.feed(b"t");
        assert_eq!(sc.mismatched(), ["hdr", "bdy"]);
    }

    #[test]
    fn a_scanner_that_saw_every_placeholder_stops_and_empty_sets_scan_nothing() {
        let s = store();
        let mut sc = s.placeholder_scanner();
        sc.feed(b"PH-header-secret PH-query-secret PH-body-secret");
        assert_eq!(sc.mismatched(), ["hdr", "qry", "bdy"]);
        sc.feed(b"more bytes");
        assert_eq!(sc.mismatched(), ["hdr", "qry", "bdy"]);

        let empty = super::ScanSet::new(std::iter::empty());
        assert!(empty.is_empty());
        let mut sc = super::PlaceholderScanner::new(std::sync::Arc::new(empty));
        sc.feed(b"PH-header-secret");
        assert!(!sc.any() && sc.mismatched().is_empty());
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

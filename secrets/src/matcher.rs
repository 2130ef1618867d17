//! Multi-pattern search and replace over byte strings whose patterns may be
//! secret.
//!
//! The patterns are the placeholders (request direction) or the real values
//! (reflection direction). They are kept only in [`SecretBytes`] buffers,
//! which are zeroised when the last reference drops; the search builds no
//! tables from them (a general-purpose automaton would keep copies of the
//! secret bytes in memory that nothing zeroises). Each pattern is searched
//! with `memchr::memmem` and the next occurrence of each is cached, so a scan
//! is linear in the haystack times the (small) number of patterns.
//!
//! Semantics: leftmost-longest, non-overlapping, scanning left to right. At
//! each step the match that starts first wins; of several starting at the
//! same byte, the longest; of equal ones, the first in the table. The
//! policy rejects placeholders that contain one another, so for placeholders
//! this is simply "every occurrence"; real values may overlap and still get a
//! deterministic answer.

use std::sync::Arc;

use memchr::memmem;
use zeroize::Zeroizing;

/// Bytes that are zeroised when the last reference drops.
pub(crate) type SecretBytes = Arc<Zeroizing<Vec<u8>>>;

/// Copy `bytes` into a new [`SecretBytes`].
pub(crate) fn secret_bytes(bytes: &[u8]) -> SecretBytes {
    Arc::new(Zeroizing::new(bytes.to_vec()))
}

/// A replacement table: pattern `i` becomes `with[i]`, and counts for the
/// secret named `names[i]`.
pub(crate) struct Table {
    find: Vec<SecretBytes>,
    with: Vec<SecretBytes>,
    names: Vec<Arc<str>>,
    max_len: usize,
}

impl Table {
    /// Build a table from `(pattern, replacement, secret name)` rows. Empty
    /// patterns are dropped (they would match everywhere); the store never
    /// produces one.
    pub(crate) fn new(rows: Vec<(SecretBytes, SecretBytes, Arc<str>)>) -> Self {
        let mut find = Vec::with_capacity(rows.len());
        let mut with = Vec::with_capacity(rows.len());
        let mut names = Vec::with_capacity(rows.len());
        for (f, w, n) in rows {
            if f.is_empty() {
                continue;
            }
            find.push(f);
            with.push(w);
            names.push(n);
        }
        let max_len = find.iter().map(|p| p.len()).max().unwrap_or(0);
        Self {
            find,
            with,
            names,
            max_len,
        }
    }

    /// The number of patterns.
    pub(crate) fn len(&self) -> usize {
        self.find.len()
    }

    /// The longest pattern's length (0 when empty).
    pub(crate) fn max_len(&self) -> usize {
        self.max_len
    }

    /// The length of pattern `i` (0 if out of range).
    pub(crate) fn pattern_len(&self, i: usize) -> usize {
        self.find.get(i).map_or(0, |p| p.len())
    }

    /// Pattern `i` (empty if out of range).
    pub(crate) fn pattern(&self, i: usize) -> &[u8] {
        self.find.get(i).map_or(&[], |p| p.as_slice())
    }

    /// The replacement of pattern `i` (empty if out of range).
    pub(crate) fn replacement(&self, i: usize) -> &[u8] {
        self.with.get(i).map_or(&[], |w| w.as_slice())
    }

    /// The secret name of pattern `i`.
    pub(crate) fn name(&self, i: usize) -> &str {
        self.names.get(i).map_or("", |n| n)
    }

    /// A search over one fixed haystack.
    pub(crate) fn search<'t, 'h>(&'t self, hay: &'h [u8]) -> Search<'t, 'h> {
        Search {
            table: self,
            hay,
            next: vec![Slot::Unknown; self.find.len()],
        }
    }

    /// Whether some pattern occurs in `hay`, and which: one flag per pattern.
    pub(crate) fn occurrences(&self, hay: &[u8]) -> Vec<bool> {
        self.find
            .iter()
            .map(|p| memmem::find(hay, p).is_some())
            .collect()
    }
}

#[derive(Clone, Copy)]
enum Slot {
    /// Not searched yet.
    Unknown,
    /// The next occurrence starts here.
    At(usize),
    /// No occurrence at or after the last search position.
    Never,
}

/// Leftmost-longest search over one haystack, remembering each pattern's
/// next occurrence so that successive calls with increasing `at` do not
/// rescan.
pub(crate) struct Search<'t, 'h> {
    table: &'t Table,
    hay: &'h [u8],
    next: Vec<Slot>,
}

impl Search<'_, '_> {
    /// The leftmost-longest match starting at or after `at`:
    /// `(start, pattern index)`. Successive calls must not decrease `at`.
    pub(crate) fn find_from(&mut self, at: usize) -> Option<(usize, usize)> {
        let mut best: Option<(usize, usize)> = None;
        for (i, slot) in self.next.iter_mut().enumerate() {
            let pos = match *slot {
                Slot::At(p) if p >= at => Some(p),
                Slot::Never => None,
                Slot::At(_) | Slot::Unknown => {
                    let pat = self.table.find.get(i).map_or(&[][..], |p| p.as_slice());
                    let found = self
                        .hay
                        .get(at..)
                        .and_then(|h| memmem::find(h, pat))
                        .map(|off| off + at);
                    *slot = found.map_or(Slot::Never, Slot::At);
                    found
                }
            };
            let Some(p) = pos else { continue };
            let better = match best {
                None => true,
                Some((bp, bi)) => {
                    p < bp || (p == bp && self.table.pattern_len(i) > self.table.pattern_len(bi))
                }
            };
            if better {
                best = Some((p, i));
            }
        }
        best
    }
}

/// Replace every match in a complete `hay`, appending to `out`. Calls `hit`
/// with each matched pattern index. Returns the number of replacements.
pub(crate) fn replace_all(
    table: &Table,
    hay: &[u8],
    out: &mut Vec<u8>,
    mut hit: impl FnMut(usize),
) -> u64 {
    let mut search = table.search(hay);
    let mut at = 0;
    let mut n = 0;
    while let Some((start, i)) = search.find_from(at) {
        out.extend_from_slice(hay.get(at..start).unwrap_or_default());
        out.extend_from_slice(table.replacement(i));
        at = start + table.pattern_len(i);
        n += 1;
        hit(i);
    }
    out.extend_from_slice(hay.get(at..).unwrap_or_default());
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(rows: &[(&str, &str)]) -> Table {
        Table::new(
            rows.iter()
                .map(|(f, w)| {
                    (
                        secret_bytes(f.as_bytes()),
                        secret_bytes(w.as_bytes()),
                        Arc::from(*f),
                    )
                })
                .collect(),
        )
    }

    fn replaced(t: &Table, hay: &str) -> String {
        let mut out = Vec::new();
        replace_all(t, hay.as_bytes(), &mut out, |_| {});
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn replaces_every_occurrence_left_to_right() {
        let t = table(&[("PH-one", "1"), ("PH-two", "22")]);
        assert_eq!(
            replaced(&t, "a PH-two b PH-one PH-onePH-two"),
            "a 22 b 1 122"
        );
        assert_eq!(replaced(&t, "nothing here"), "nothing here");
        assert_eq!(replaced(&t, ""), "");
        assert_eq!(replaced(&t, "PH-on"), "PH-on");
    }

    #[test]
    fn same_start_prefers_longest_then_earliest_start() {
        let t = table(&[("abc", "X"), ("abcdef", "Y"), ("cdefgh", "Z")]);
        assert_eq!(replaced(&t, "abcdefgh"), "Ygh");
        assert_eq!(replaced(&t, "abcdeXcdefgh"), "XdeXZ");
    }

    #[test]
    fn empty_patterns_are_dropped() {
        let t = table(&[("", "X"), ("ab", "Y")]);
        assert_eq!(t.len(), 1);
        assert_eq!(replaced(&t, "xaby"), "xYy");
        let empty = table(&[]);
        assert_eq!(empty.len(), 0);
        assert_eq!(replaced(&empty, "abc"), "abc");
    }
}

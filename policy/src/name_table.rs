//! The name table: every normalised domain that an allow or deny rule names,
//! with the rules attached to it, laid out so that a lookup neither allocates
//! nor copies the name and touches few cache lines.
//!
//! A lookup reads the name once, right to left. Each byte is checked and
//! ASCII-lower-cased through a 256-entry table and folded into a running
//! hash, so at every label boundary the hash of the suffix to its right
//! (`com`, `example.com`, `www.example.com`) is already known. A suffix is
//! probed only if some key has that many labels: first in a small Bloom
//! filter (most suffixes are named by no rule), then in an open-addressing
//! table of 64-bit slots (a 32-bit hash tag and the offset of the key's
//! record). A record holds the key, its deny rules and its allow rules
//! (each with its port set), back to back, so a hit reads one or two cache
//! lines. Keys are stored lower-case and compared with the input ignoring
//! ASCII case, which is exact because only `A-Z a-z 0-9 - _ .` pass the
//! byte check.
//!
//! The answer is the one [`sluice_name::normalize_name`] (the one
//! normaliser, with its limits) followed by a walk from
//! the full name down to its shortest suffix gives: the full name's node
//! contributes its deny and allow rules for the exact name, every shorter
//! suffix's node its rules for strict subdomains; any deny wins over any
//! allow; the reported rule is the one met first on that walk (the longest
//! suffix; within a node, the rule written first). A name that fails
//! normalisation matches nothing.

use crate::fx::FxMap;
use crate::name::{MAX_LABEL_LEN, MAX_NAME_LEN};

/// "No rule" in a record's deny fields.
const NONE: u32 = u32::MAX;

/// [`FOLD`]'s marker bit: set for `.` and for invalid bytes only.
const SPECIAL: u8 = 0x80;
/// What [`FOLD`] maps `.` to.
const DOT: u8 = SPECIAL | b'.';
/// What [`FOLD`] maps an invalid byte to.
const INVALID: u8 = 0xff;

/// Byte to its lower-case form for `A-Z a-z 0-9 - _`, [`DOT`] for `.`,
/// [`INVALID`] for any other byte: [`sluice_name::label_byte`] as a table.
const FOLD: [u8; 256] = {
    let mut table = [INVALID; 256];
    let mut b: u8 = 0;
    loop {
        // The byte rule is sluice-name's, the one normaliser's; this table
        // only caches it for the walk.
        table[b as usize] = match sluice_name::label_byte(b) {
            Some(c) => c,
            None if b == b'.' => DOT,
            None => INVALID,
        };
        if b == u8::MAX {
            break;
        }
        b += 1;
    }
    table
};

const HASH_SEED: u64 = 0xcbf2_9ce4_8422_2325;
const HASH_MUL: u64 = 0x5851_f42d_4c95_7f2d;
const TAG_MASK: u64 = 0xffff_ffff_0000_0000;

/// One step of the running suffix hash (bytes are fed right to left, passed
/// through [`FOLD`]).
#[inline(always)]
fn hash_step(h: u64, folded: u8) -> u64 {
    (h ^ u64::from(folded)).wrapping_mul(HASH_MUL)
}

/// murmur3's 64-bit finaliser: spreads the running hash over all bits (the
/// low bits pick the slot, the high 32 are the tag).
#[inline(always)]
fn finish(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The hash of a normalised key: the running hash a lookup holds at the
/// label boundary in front of the same bytes.
fn key_hash(key: &[u8]) -> u64 {
    finish(
        key.iter()
            .rev()
            .fold(HASH_SEED, |h, &b| hash_step(h, FOLD[usize::from(b)])),
    )
}

/// A rule as the table lists it: its index in the policy's rules and the
/// index of its port set (so a port filter need not read the rule).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RuleRef {
    /// Index into the policy's rules.
    pub(crate) id: u32,
    /// Index into the policy's port sets.
    pub(crate) ports: u32,
}

/// The rules written for one normalised domain.
#[derive(Debug, Default)]
pub(crate) struct NodeRules {
    /// Allow rules matching exactly this name, in the order written.
    pub(crate) exact: Vec<RuleRef>,
    /// Allow rules matching strict subdomains of this name, in order.
    pub(crate) sub: Vec<RuleRef>,
    /// The first deny rule matching exactly this name.
    pub(crate) deny_exact: Option<u32>,
    /// The first deny rule matching strict subdomains of this name.
    pub(crate) deny_sub: Option<u32>,
}

/// Collects the nodes while a policy compiles.
#[derive(Debug, Default)]
pub(crate) struct NameTableBuilder {
    nodes: FxMap<Box<str>, NodeRules>,
}

/// Record layout: five little-endian u32 (key length, deny exact, deny
/// sub, number of exact allows, number of subdomain allows), the key bytes,
/// then the allows as (rule, port set) u32 pairs.
const HEADER: usize = 20;

impl NameTableBuilder {
    /// The node of a normalised domain, created empty on first use.
    pub(crate) fn node(&mut self, base: String) -> &mut NodeRules {
        self.nodes.entry(base.into_boxed_str()).or_default()
    }

    /// Lay the nodes out for lookups. `None` when the records would not fit
    /// 32-bit offsets (far beyond what the 16 MiB file limit allows).
    pub(crate) fn build(self) -> Option<NameTable> {
        let count = self.nodes.len();
        // Load factor at most 1/2: a probe ends at an empty slot quickly.
        let slot_count = (count.max(8) * 2).next_power_of_two();
        // About 16 filter bits per key.
        let filter_words = (count.max(64) / 4).next_power_of_two();
        let mut table = NameTable {
            slots: vec![0; slot_count].into_boxed_slice(),
            mask: slot_count - 1,
            records: Box::default(),
            depths: 0,
            filter: vec![0; filter_words].into_boxed_slice(),
            filter_shift: 64 - filter_words.trailing_zeros(),
        };
        let mut records: Vec<u8> = Vec::with_capacity(count * 48);
        // The Fx map has no random seed: the layout is the same every time.
        for (key, node) in self.nodes {
            let offset = u32::try_from(records.len()).ok()?;
            let header = [
                u32::try_from(key.len()).ok()?,
                node.deny_exact.unwrap_or(NONE),
                node.deny_sub.unwrap_or(NONE),
                u32::try_from(node.exact.len()).ok()?,
                u32::try_from(node.sub.len()).ok()?,
            ];
            for v in header {
                records.extend_from_slice(&v.to_le_bytes());
            }
            records.extend_from_slice(key.as_bytes());
            for r in node.exact.iter().chain(&node.sub) {
                records.extend_from_slice(&r.id.to_le_bytes());
                records.extend_from_slice(&r.ports.to_le_bytes());
            }
            let labels = key.bytes().filter(|&b| b == b'.').count() + 1;
            table.depths |= depth_bit(labels);
            let hash = key_hash(key.as_bytes());
            table.insert(hash, offset);
            let (word, bits) = table.filter_pos(hash);
            if let Some(w) = table.filter.get_mut(word) {
                *w |= bits;
            }
        }
        u32::try_from(records.len()).ok()?;
        table.records = records.into_boxed_slice();
        Some(table)
    }
}

/// The bit of [`NameTable::depths`] for a name of `labels` labels (a valid
/// name has 1 to 127).
fn depth_bit(labels: usize) -> u128 {
    labels
        .checked_sub(1)
        .and_then(|s| u32::try_from(s).ok())
        .and_then(|s| 1u128.checked_shl(s))
        .unwrap_or(0)
}

/// What walking a name through the table found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NameMatch {
    /// A deny rule matched (wins over any allow).
    Denied(u32),
    /// An allow rule matched and passed the caller's filter.
    Allowed(u32),
    /// Allow rules matched the name, but none passed the filter (e.g. port).
    FilteredOut(u32),
    /// Nothing matched, or the name is not a valid name.
    None,
}

/// The immutable table (see the module documentation).
#[derive(Debug, Default)]
pub(crate) struct NameTable {
    /// `tag << 32 | (record offset + 1)`; 0 is an empty slot.
    slots: Box<[u64]>,
    mask: usize,
    /// The records, back to back (layout at [`HEADER`]).
    records: Box<[u8]>,
    /// Bit `n - 1` is set when some key has `n` labels.
    depths: u128,
    /// A blocked Bloom filter over the keys' hashes (two bits in one word,
    /// about 16 bits per key): small enough to stay in cache, it answers
    /// most probes for suffixes that no rule names (`b.example.com`)
    /// without touching the slots.
    filter: Box<[u64]>,
    /// `64 - log2(filter.len())`: the filter word is the top bits of the
    /// remixed hash.
    filter_shift: u32,
}

impl NameTable {
    fn insert(&mut self, hash: u64, offset: u32) {
        let value = (hash & TAG_MASK) | (u64::from(offset) + 1);
        let mut at = slot_of(hash, self.mask);
        // The builder keeps the table at most half full: an empty slot is
        // always found.
        for _ in 0..self.slots.len() {
            if let Some(slot) = self.slots.get_mut(at)
                && *slot == 0
            {
                *slot = value;
                return;
            }
            at = (at + 1) & self.mask;
        }
    }

    /// The filter word and the two bits a hash sets in it.
    #[inline(always)]
    fn filter_pos(&self, hash: u64) -> (usize, u64) {
        let h = hash.wrapping_mul(HASH_MUL);
        let word = h.checked_shr(self.filter_shift).unwrap_or(0);
        (
            usize::try_from(word).unwrap_or(0),
            (1 << (h & 63)) | (1 << ((h >> 6) & 63)),
        )
    }

    /// The header of the record at `offset`: key length, deny exact, deny
    /// sub, number of exact allows, number of subdomain allows.
    #[inline(always)]
    fn header(&self, offset: usize) -> Option<[u32; 5]> {
        let b: &[u8; HEADER] = self.records.get(offset..offset + HEADER)?.try_into().ok()?;
        let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Some([word(0), word(4), word(8), word(12), word(16)])
    }

    /// The offset and header of the record whose key equals `suffix`
    /// ignoring ASCII case (`suffix` holds only bytes that passed the fold
    /// table).
    #[inline]
    fn find(&self, hash: u64, suffix: &[u8]) -> Option<(usize, [u32; 5])> {
        let (word, bits) = self.filter_pos(hash);
        if self.filter.get(word).is_none_or(|&w| w & bits != bits) {
            return None;
        }
        let tag = hash & TAG_MASK;
        let mut at = slot_of(hash, self.mask);
        loop {
            let slot = *self.slots.get(at)?;
            if slot == 0 {
                return None;
            }
            if slot & TAG_MASK == tag {
                let offset = usize::try_from((slot & !TAG_MASK) - 1).ok()?;
                let header = self.header(offset)?;
                let key_len = header[0] as usize;
                let key = self
                    .records
                    .get(offset + HEADER..offset + HEADER + key_len)?;
                if same_name(key, suffix) {
                    return Some((offset, header));
                }
            }
            at = (at + 1) & self.mask;
        }
    }

    /// A record's allow list (exact or subdomain), given its header.
    #[inline(always)]
    fn allows_of(&self, offset: usize, header: [u32; 5], exact: bool) -> &[u8] {
        let [key_len, _, _, n_exact, n_sub] = header.map(|v| v as usize);
        let (skip, n) = if exact {
            (0, n_exact)
        } else {
            (n_exact, n_sub)
        };
        let start = offset + HEADER + key_len + 8 * skip;
        self.records.get(start..start + 8 * n).unwrap_or_default()
    }

    /// Match `name` as seen on the wire (any ASCII case, one optional
    /// trailing dot). `accept` filters allow rules (e.g. by port); deny
    /// rules always win. `accept` may be called for the rules of several
    /// suffixes and must be a pure test.
    #[inline]
    pub(crate) fn match_name(
        &self,
        name: &str,
        mut accept: impl FnMut(RuleRef) -> bool,
    ) -> NameMatch {
        let bytes = name.as_bytes();
        let bytes = bytes.strip_suffix(b".").unwrap_or(bytes);
        if bytes.is_empty() || bytes.len() > MAX_NAME_LEN {
            return NameMatch::None;
        }
        // Overwritten as ever longer suffixes are met, so what is left is
        // the longest suffix's answer: the walk's first.
        let mut denied = NONE;
        let mut allowed = NONE;
        let mut filtered = NONE;
        let mut visit = |(offset, header): (usize, [u32; 5]), exact: bool| {
            let deny = if exact { header[1] } else { header[2] };
            if deny != NONE {
                denied = deny;
            }
            let items = self.allows_of(offset, header, exact);
            let mut first = NONE;
            for item in items.chunks_exact(8) {
                let &[a, b, c, d, e, f, g, h] = item else {
                    continue;
                };
                let r = RuleRef {
                    id: u32::from_le_bytes([a, b, c, d]),
                    ports: u32::from_le_bytes([e, f, g, h]),
                };
                if accept(r) {
                    allowed = r.id;
                    return;
                }
                if first == NONE {
                    first = r.id;
                }
            }
            if first != NONE {
                filtered = first;
            }
        };
        let mut hash = HASH_SEED;
        // End (exclusive) of the label being read.
        let mut label_end = bytes.len();
        let mut wanted = self.depths;
        for (i, &b) in bytes.iter().enumerate().rev() {
            let c = FOLD[usize::from(b)];
            if c & SPECIAL != 0 {
                if c != DOT {
                    return NameMatch::None;
                }
                let label_len = label_end - i - 1;
                if label_len == 0 || label_len > MAX_LABEL_LEN {
                    return NameMatch::None;
                }
                label_end = i;
                if wanted & 1 != 0 {
                    let suffix = bytes.get(i + 1..).unwrap_or_default();
                    if let Some(found) = self.find(finish(hash), suffix) {
                        visit(found, false);
                    }
                }
                wanted >>= 1;
            }
            hash = hash_step(hash, c);
        }
        if label_end == 0 || label_end > MAX_LABEL_LEN {
            return NameMatch::None;
        }
        if wanted & 1 != 0
            && let Some(found) = self.find(finish(hash), bytes)
        {
            visit(found, true);
        }
        if denied != NONE {
            NameMatch::Denied(denied)
        } else if allowed != NONE {
            NameMatch::Allowed(allowed)
        } else if filtered != NONE {
            NameMatch::FilteredOut(filtered)
        } else {
            NameMatch::None
        }
    }
}

/// The slot a hash starts probing at (the low 32 bits pick the slot; the
/// high 32 are the tag).
#[inline(always)]
fn slot_of(hash: u64, mask: usize) -> usize {
    usize::try_from(hash & !TAG_MASK).unwrap_or(0) & mask
}

/// Whether a stored key (lower case) equals `input` (checked bytes, any
/// case). Setting bit 0x20 folds `A-Z` onto `a-z` and maps no two other
/// allowed bytes together (`_` becomes 0x7f, which nothing else becomes),
/// so comparing eight bytes at a time with the bit set is exact here.
#[inline]
fn same_name(key: &[u8], input: &[u8]) -> bool {
    const CASE: u64 = 0x2020_2020_2020_2020;
    if key.len() != input.len() {
        return false;
    }
    let (mut k, mut n) = (key.chunks_exact(8), input.chunks_exact(8));
    for (a, b) in (&mut k).zip(&mut n) {
        let (Ok(a), Ok(b)) = (<[u8; 8]>::try_from(a), <[u8; 8]>::try_from(b)) else {
            return false;
        };
        if u64::from_le_bytes(a) | CASE != u64::from_le_bytes(b) | CASE {
            return false;
        }
    }
    k.remainder()
        .iter()
        .zip(n.remainder())
        .all(|(a, b)| a | 0x20 == b | 0x20)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(keys: &[(&str, bool, bool)]) -> NameTable {
        // (key, exact allow, subdomain allow); rule id = position.
        let mut b = NameTableBuilder::default();
        for (i, &(key, exact, sub)) in keys.iter().enumerate() {
            let r = RuleRef {
                id: u32::try_from(i).unwrap(),
                ports: 0,
            };
            let node = b.node(key.to_owned());
            if exact {
                node.exact.push(r);
            }
            if sub {
                node.sub.push(r);
            }
        }
        b.build().unwrap()
    }

    #[test]
    fn case_folded_compare_is_exact_on_allowed_bytes() {
        assert!(same_name(b"a_b-c.example", b"A_B-C.EXAMPLE"));
        assert!(same_name(b"abcdefgh.ijklmnop", b"ABCDEFGH.IJKLMNOP"));
        assert!(!same_name(b"a_b", b"a-b"));
        assert!(!same_name(b"a.b", b"a-b"));
        assert!(!same_name(b"abcdefgh.ijk", b"abcdefgh.ijl"));
        assert!(!same_name(b"abc", b"abcd"));
        // Every pair of distinct allowed lower-case bytes stays distinct.
        let allowed: Vec<u8> = (0..=255u8)
            .filter(|&b| FOLD[usize::from(b)] == b || b == b'.')
            .collect();
        for &x in &allowed {
            for &y in &allowed {
                assert_eq!(same_name(&[x], &[y]), x == y, "{x} {y}");
            }
        }
    }

    #[test]
    fn deep_names_and_deep_keys() {
        // A key of 100 labels: beyond 64, where the depth mask needs u128.
        let deep = vec!["a"; 100].join(".") + ".test";
        let t = table(&[(&deep, true, true), ("test", false, true)]);
        assert_eq!(t.match_name(&deep, |_| true), NameMatch::Allowed(0));
        assert_eq!(
            t.match_name(&format!("B.{deep}"), |_| true),
            NameMatch::Allowed(0)
        );
        // 99 labels: only the `test` subdomain rule.
        let shallower = vec!["a"; 99].join(".") + ".test";
        assert_eq!(t.match_name(&shallower, |_| true), NameMatch::Allowed(1));
        assert_eq!(t.match_name("test", |_| true), NameMatch::None);
        // Over 253 bytes: invalid, whatever it ends in.
        let long = vec!["a"; 127].join(".") + ".test";
        assert!(long.len() > MAX_NAME_LEN);
        assert_eq!(t.match_name(&long, |_| true), NameMatch::None);
    }

    #[test]
    fn an_empty_table_matches_nothing() {
        let t = table(&[]);
        assert_eq!(t.match_name("example.com", |_| true), NameMatch::None);
        let t = NameTable::default();
        assert_eq!(t.match_name("example.com", |_| true), NameMatch::None);
    }

    #[test]
    fn many_keys_sharing_a_suffix_all_resolve() {
        let keys: Vec<String> = (0..5000).map(|i| format!("h{i}.example.com")).collect();
        let entries: Vec<(&str, bool, bool)> =
            keys.iter().map(|k| (k.as_str(), true, false)).collect();
        let t = table(&entries);
        for (i, k) in keys.iter().enumerate() {
            let want = NameMatch::Allowed(u32::try_from(i).unwrap());
            assert_eq!(t.match_name(&k.to_uppercase(), |_| true), want);
            assert_eq!(t.match_name(&format!("{k}."), |_| true), want);
        }
        assert_eq!(t.match_name("h5000.example.com", |_| true), NameMatch::None);
        assert_eq!(t.match_name("x.h1.example.com", |_| true), NameMatch::None);
    }
}

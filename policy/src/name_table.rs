//! The name table: every normalised domain that an allow or deny rule names,
//! with the rules attached to it, laid out so that a lookup neither allocates
//! nor copies the name.
//!
//! A lookup reads the name once, right to left. Each byte is checked and
//! ASCII-lower-cased through a 256-entry table and folded into a running
//! hash, so at every label boundary the hash of the suffix to its right
//! (`com`, `example.com`, `www.example.com`) is already known. A suffix is
//! probed only if some key has that many labels, in an open-addressing
//! table of 64-bit slots (a 32-bit hash tag and an entry index); bytes are
//! compared only when the tag matches. Keys are stored lower-case and the
//! input is compared ignoring ASCII case, which is exact because only
//! `A-Z a-z 0-9 - _ .` pass the byte check.
//!
//! The answer is the one [`crate::normalize_name`] followed by a walk from
//! the full name down to its shortest suffix would give (the walk the
//! verdict's rule is defined by): the full name's node contributes its deny
//! and allow rules for the exact name, every shorter suffix's node its deny
//! and allow rules for strict subdomains; any deny wins, and the reported
//! rule is the one met first on that walk (the longest suffix; within a
//! node, the rule written first). A name that fails normalisation matches
//! nothing.

use std::collections::HashMap;

use crate::name::{MAX_LABEL_LEN, MAX_NAME_LEN};

/// "No rule" in the packed entry fields.
const NONE: u32 = u32::MAX;

/// Byte to its lower-case form for `A-Z a-z 0-9 - _ .`; 0 for any other
/// byte (which makes the name invalid).
const FOLD: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut b: u8 = 0;
    loop {
        table[b as usize] = match b {
            b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => b,
            b'A'..=b'Z' => b + (b'a' - b'A'),
            _ => 0,
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

/// One step of the running suffix hash (bytes are fed right to left, already
/// lower-cased).
#[inline(always)]
fn hash_step(h: u64, byte: u8) -> u64 {
    (h ^ u64::from(byte)).wrapping_mul(HASH_MUL)
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

/// The hash of a normalised key, equal to the running hash a lookup has at
/// the boundary in front of the same bytes.
fn key_hash(key: &[u8]) -> u64 {
    finish(key.iter().rev().fold(HASH_SEED, |h, &b| hash_step(h, b)))
}

/// The rules written for one normalised domain.
#[derive(Debug, Default)]
pub(crate) struct NodeRules {
    /// Allow rules matching exactly this name, in the order written.
    pub(crate) exact: Vec<u32>,
    /// Allow rules matching strict subdomains of this name, in order.
    pub(crate) sub: Vec<u32>,
    /// The first deny rule matching exactly this name.
    pub(crate) deny_exact: Option<u32>,
    /// The first deny rule matching strict subdomains of this name.
    pub(crate) deny_sub: Option<u32>,
}

/// Collects the nodes while a policy compiles.
#[derive(Debug, Default)]
pub(crate) struct NameTableBuilder {
    nodes: HashMap<Box<str>, NodeRules>,
}

impl NameTableBuilder {
    /// The node of a normalised domain, created empty on first use.
    pub(crate) fn node(&mut self, base: String) -> &mut NodeRules {
        self.nodes.entry(base.into_boxed_str()).or_default()
    }

    /// Lay the nodes out for lookups. `None` when the table would not fit
    /// the 32-bit indices (more than about two billion rules or key bytes,
    /// which the 16 MiB file limit rules out).
    pub(crate) fn build(self) -> Option<NameTable> {
        let count = self.nodes.len();
        // Load factor at most 1/2: a miss ends at an empty slot after about
        // 1.5 probes on average.
        let slot_count = (count.max(8) * 2).next_power_of_two();
        let mut table = NameTable {
            slots: vec![0; slot_count].into_boxed_slice(),
            mask: slot_count - 1,
            entries: Vec::with_capacity(count).into_boxed_slice(),
            keys: Box::default(),
            rule_lists: Box::default(),
            depths: 0,
            filter: vec![0; (count.max(64) / 4).next_power_of_two()].into_boxed_slice(),
            filter_shift: 0,
        };
        table.filter_shift = 64 - table.filter.len().trailing_zeros();
        let mut entries = Vec::with_capacity(count);
        let mut keys = Vec::new();
        let mut lists = Vec::new();
        // Deterministic layout: key order.
        let mut nodes: Vec<(Box<str>, NodeRules)> = self.nodes.into_iter().collect();
        nodes.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        for (key, node) in nodes {
            let index = u32::try_from(entries.len()).ok()?;
            let entry = Entry {
                key_start: u32::try_from(keys.len()).ok()?,
                key_len: u32::try_from(key.len()).ok()?,
                exact_start: u32::try_from(lists.len()).ok()?,
                exact_len: u32::try_from(node.exact.len()).ok()?,
                sub_len: u32::try_from(node.sub.len()).ok()?,
                deny_exact: node.deny_exact.unwrap_or(NONE),
                deny_sub: node.deny_sub.unwrap_or(NONE),
            };
            keys.extend_from_slice(key.as_bytes());
            lists.extend_from_slice(&node.exact);
            lists.extend_from_slice(&node.sub);
            entries.push(entry);
            let labels = key.bytes().filter(|&b| b == b'.').count() + 1;
            table.depths |= depth_bit(labels);
            let hash = key_hash(key.as_bytes());
            table.insert(hash, index);
            let (word, bits) = table.filter_pos(hash);
            if let Some(w) = table.filter.get_mut(word) {
                *w |= bits;
            }
        }
        table.entries = entries.into_boxed_slice();
        table.keys = keys.into_boxed_slice();
        table.rule_lists = lists.into_boxed_slice();
        Some(table)
    }
}

/// The bit of `depths` for a name of `labels` labels (a valid name has at
/// most 127).
#[inline(always)]
fn depth_bit(labels: usize) -> u128 {
    u32::try_from(labels - 1)
        .ok()
        .and_then(|s| 1u128.checked_shl(s))
        .unwrap_or(0)
}

/// One node, packed: its key and rule lists are ranges of the shared arrays.
#[derive(Clone, Copy, Debug)]
struct Entry {
    key_start: u32,
    key_len: u32,
    /// `rule_lists[exact_start..][..exact_len]` are the exact allows, the
    /// `sub_len` after them the subdomain allows.
    exact_start: u32,
    exact_len: u32,
    sub_len: u32,
    deny_exact: u32,
    deny_sub: u32,
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
    /// `tag << 32 | (entry index + 1)`; 0 is an empty slot.
    slots: Box<[u64]>,
    mask: usize,
    entries: Box<[Entry]>,
    /// Every key's bytes, back to back.
    keys: Box<[u8]>,
    rule_lists: Box<[u32]>,
    /// Bit `n - 1` is set when some key has `n` labels.
    depths: u128,
    /// A blocked Bloom filter over the keys' hashes (two bits in one word,
    /// about 16 bits per key): small enough to stay in cache, it answers
    /// most probes for suffixes that no rule names (`com`, `b.example.com`)
    /// without touching the slots.
    filter: Box<[u64]>,
    /// `64 - log2(filter.len())`: the filter word is the top bits of the
    /// remixed hash.
    filter_shift: u32,
}

impl NameTable {
    fn insert(&mut self, hash: u64, index: u32) {
        let value = (hash & 0xffff_ffff_0000_0000) | (u64::from(index) + 1);
        let mut at = slot_of(hash, self.mask);
        // The builder sized the table to stay at most half full, so an empty
        // slot is always found.
        for _ in 0..self.slots.len() {
            if let Some(slot) = self.slots.get_mut(at) {
                if *slot == 0 {
                    *slot = value;
                    return;
                }
            }
            at = (at + 1) & self.mask;
        }
    }

    /// The filter word and the two bits a hash sets in it.
    #[inline(always)]
    fn filter_pos(&self, hash: u64) -> (usize, u64) {
        let h = hash.wrapping_mul(HASH_MUL);
        let word = usize::try_from(h.checked_shr(self.filter_shift).unwrap_or(0)).unwrap_or(0);
        (word, (1 << (h & 63)) | (1 << ((h >> 6) & 63)))
    }

    /// The entry whose key equals `suffix` ignoring ASCII case (`suffix`
    /// holds only bytes the fold table accepts).
    #[inline]
    fn find(&self, hash: u64, suffix: &[u8]) -> Option<&Entry> {
        let (word, bits) = self.filter_pos(hash);
        if self.filter.get(word).is_none_or(|&w| w & bits != bits) {
            return None;
        }
        let tag = hash & 0xffff_ffff_0000_0000;
        let mut at = slot_of(hash, self.mask);
        loop {
            let slot = *self.slots.get(at)?;
            if slot == 0 {
                return None;
            }
            if slot & 0xffff_ffff_0000_0000 == tag {
                let index = usize::try_from((slot & 0xffff_ffff) - 1).ok()?;
                let entry = self.entries.get(index)?;
                if self.key(entry).eq_ignore_ascii_case(suffix) {
                    return Some(entry);
                }
            }
            at = (at + 1) & self.mask;
        }
    }

    fn key(&self, e: &Entry) -> &[u8] {
        let start = e.key_start as usize;
        self.keys
            .get(start..start + e.key_len as usize)
            .unwrap_or_default()
    }

    fn list(&self, start: u32, len: u32) -> &[u32] {
        let start = start as usize;
        self.rule_lists
            .get(start..start + len as usize)
            .unwrap_or_default()
    }

    /// Match `name` as seen on the wire (any ASCII case, one optional
    /// trailing dot). `accept` filters allow rules (e.g. by port); deny
    /// rules always win. `accept` may be called for rules of several
    /// suffixes; it must be a pure test.
    #[inline]
    pub(crate) fn match_name(&self, name: &str, mut accept: impl FnMut(u32) -> bool) -> NameMatch {
        let bytes = name.as_bytes();
        let bytes = bytes.strip_suffix(b".").unwrap_or(bytes);
        if bytes.is_empty() || bytes.len() > MAX_NAME_LEN {
            return NameMatch::None;
        }
        // Results, overwritten as ever longer suffixes are met, so the
        // longest suffix's answer is the one left (the walk's first).
        let mut denied = NONE;
        let mut allowed = NONE;
        let mut filtered = NONE;
        let mut visit = |entry: &Entry, exact: bool| {
            let (deny, start, len) = if exact {
                (entry.deny_exact, entry.exact_start, entry.exact_len)
            } else {
                (
                    entry.deny_sub,
                    entry.exact_start + entry.exact_len,
                    entry.sub_len,
                )
            };
            if deny != NONE {
                denied = deny;
            }
            let ids = self.list(start, len);
            if let Some(&first) = ids.first() {
                match ids.iter().copied().find(|&id| accept(id)) {
                    Some(id) => allowed = id,
                    None => filtered = first,
                }
            }
        };
        let mut hash = HASH_SEED;
        let mut label_len = 0usize;
        let mut wanted = self.depths;
        let mut i = bytes.len();
        while i > 0 {
            i -= 1;
            let c = FOLD[usize::from(bytes.get(i).copied().unwrap_or(0))];
            if c == b'.' {
                if label_len == 0 {
                    return NameMatch::None;
                }
                label_len = 0;
                if wanted & 1 != 0 {
                    let suffix = bytes.get(i + 1..).unwrap_or_default();
                    if let Some(e) = self.find(finish(hash), suffix) {
                        visit(e, false);
                    }
                }
                wanted >>= 1;
            } else if c == 0 {
                return NameMatch::None;
            } else {
                label_len += 1;
                if label_len > MAX_LABEL_LEN {
                    return NameMatch::None;
                }
            }
            hash = hash_step(hash, c);
        }
        if label_len == 0 {
            return NameMatch::None;
        }
        if wanted & 1 != 0 {
            if let Some(e) = self.find(finish(hash), bytes) {
                visit(e, true);
            }
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

#[inline(always)]
fn slot_of(hash: u64, mask: usize) -> usize {
    // The low 32 bits pick the slot (the high 32 are the tag).
    (hash & 0xffff_ffff) as usize & mask
}

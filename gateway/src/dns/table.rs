//! The sandbox's name-to-address table, filled from the DNS answers the
//! gateway hands the guest and read by every connection decision (a
//! connection must go to an address resolved for the name it is allowed by).
//!
//! Indexed both ways: address -> names (a hash map per address, plus the
//! address's names ordered by expiry) and a global expiry heap, so insert,
//! lookup and eviction cost the same with 10 or 100,000 names on one
//! address.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Default upper bound on TTLs recorded in the table.
pub(crate) const DEFAULT_MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// Default lower bound on TTLs recorded in the table: answers with TTL 0 (common
/// for local resolvers) must still cover the connection that follows them.
pub(crate) const DEFAULT_MIN_TTL: Duration = Duration::from_secs(10);
/// Default bound on the names held for one address. Past it, the address's
/// soonest-expiring name that no live flow was admitted with is evicted.
pub(crate) const DEFAULT_MAX_NAMES_PER_ADDRESS: usize = 4096;

/// The one normalisation of a name before it is stored or compared in the
/// table: the project's one normaliser ([`sluice_name::normalize_name`]:
/// ASCII lower case, one trailing dot removed, DNS limits). `None` for a
/// name it refuses: such a name is never recorded and was resolved for
/// nothing. The result is held inline: lookups do not allocate.
pub(crate) fn normalise(name: &str) -> Option<sluice_name::NormalName> {
    sluice_name::normalize_name(name).ok()
}

/// One (address, name) pair's state.
#[derive(Debug, Clone, Copy)]
struct Entry {
    expires: Instant,
    /// Unique per inserted pair: ties its [`Expiry`] records to it.
    seq: u64,
    /// Live flows admitted with this pair (see [`DnsTable::pin`]).
    pins: u32,
}

/// The names held for one address.
#[derive(Debug, Default)]
struct AddressNames {
    by_name: HashMap<Arc<str>, Entry>,
    /// Every pair of this address, by (expiry, seq): the eviction order and
    /// the order [`DnsTable::names_for`] reads (latest expiry first).
    by_expiry: BTreeMap<(Instant, u64), Arc<str>>,
}

/// The pairs one flow pinned: the address, and each name with its pair's seq.
type PinnedPairs = (IpAddr, Vec<(Arc<str>, u64)>);

/// One record of the expiry heap: the pair `(ip, seq)` expires at `expires`.
/// Stale once the pair is gone or its expiry was extended (lazy deletion:
/// a record counts only if the address still holds `(expires, seq)`).
/// Ordered by expiry, then insertion order.
type Expiry = Reverse<(Instant, u64, IpAddr)>;

/// Rebuild the expiry heap once it holds more than this many records per
/// live pair (plus [`HEAP_SLACK`]): bounds the stale records lazy deletion
/// leaves behind, at amortised O(1) per operation.
const HEAP_STALE_FACTOR: usize = 2;
/// Records the expiry heap may hold beyond `HEAP_STALE_FACTOR * len` before a
/// rebuild (so a small table is not rebuilt on every extension).
const HEAP_SLACK: usize = 64;

/// The sandbox's address-to-names table, filled from DNS answers.
///
/// Bounds: at most `capacity` (address, name) pairs in all and at most
/// [`DnsTable::set_max_names_per_address`] (default
/// [`DEFAULT_MAX_NAMES_PER_ADDRESS`]) names per address. When the table is
/// full, expired pairs are purged and, if still full, the pair expiring
/// soonest (the earliest inserted among equal expiries) is evicted; when one
/// address is full, its soonest-expiring name is evicted. Neither eviction
/// takes a pair a live flow was admitted with ([`DnsTable::pin`]): a
/// connection's own admission never disappears under a flood of other names.
/// Expiry and [`DnsTable::retain_names`] (a reload) do drop pinned pairs:
/// the flow keeps its names itself and is re-checked by them.
/// TTLs are clamped to `[min_ttl, max_ttl]` (defaults [`DEFAULT_MIN_TTL`],
/// [`DEFAULT_MAX_TTL`]).
///
/// Cost: insert, [`DnsTable::resolved_for`] and eviction are O(log n)
/// amortised whatever the number of names per address (hash lookups plus an
/// ordered map per address and a lazy min-heap of expiries); an eviction
/// also steps over the pinned pairs it may not take (at most one per live
/// flow). Purging `k` expired pairs is O(k log n). Lookups do not allocate.
#[derive(Debug)]
pub struct DnsTable {
    by_ip: HashMap<IpAddr, AddressNames>,
    /// Min-heap of expiries, see [`Expiry`].
    expiry: BinaryHeap<Expiry>,
    /// Flow id -> the pairs it pinned (name and the pair's seq, so a pair
    /// dropped and inserted again is not unpinned by an older flow).
    pins: HashMap<u64, PinnedPairs>,
    next_seq: u64,
    len: usize,
    capacity: usize,
    max_per_address: usize,
    min_ttl: Duration,
    max_ttl: Duration,
}

impl DnsTable {
    /// An empty table holding at most `capacity` (address, name) pairs.
    pub fn new(capacity: usize) -> Self {
        Self {
            by_ip: HashMap::new(),
            expiry: BinaryHeap::new(),
            pins: HashMap::new(),
            next_seq: 0,
            len: 0,
            capacity: capacity.max(1),
            max_per_address: DEFAULT_MAX_NAMES_PER_ADDRESS,
            min_ttl: DEFAULT_MIN_TTL,
            max_ttl: DEFAULT_MAX_TTL,
        }
    }

    /// Sets the TTL clamp (the policy's min/max TTL); `min` is capped at `max`.
    pub fn set_ttl_bounds(&mut self, min: Duration, max: Duration) {
        self.max_ttl = max;
        self.min_ttl = min.min(max);
    }

    /// The TTL clamp in force: `(min, max)`.
    pub fn ttl_bounds(&self) -> (Duration, Duration) {
        (self.min_ttl, self.max_ttl)
    }

    /// Bounds the names held for one address (at least 1); applies to
    /// later inserts.
    pub fn set_max_names_per_address(&mut self, max: usize) {
        self.max_per_address = max.max(1);
    }

    /// Records that `name` resolved to `ip` with `ttl` (clamped to the TTL bounds).
    /// Names are stored [`normalise`]d; a name that does not normalise is
    /// not recorded (no connection can be allowed through it). A pair already
    /// held keeps the later of its two expiries.
    pub fn insert(&mut self, ip: IpAddr, name: &str, ttl: Duration, now: Instant) {
        let Some(name) = normalise(name) else {
            return;
        };
        let name = name.as_str();
        let expires = now + ttl.clamp(self.min_ttl, self.max_ttl);
        if let Some(names) = self.by_ip.get_mut(&ip)
            && let Some((key, e)) = names.by_name.get_key_value(name)
        {
            if expires > e.expires {
                let (old, seq, key) = (e.expires, e.seq, Arc::clone(key));
                names.by_expiry.remove(&(old, seq));
                names.by_expiry.insert((expires, seq), Arc::clone(&key));
                if let Some(e) = names.by_name.get_mut(&key) {
                    e.expires = expires;
                }
                // The old heap record is stale from now on.
                self.expiry.push(Reverse((expires, seq, ip)));
                self.compact_heap();
            }
            return;
        }
        if self.len >= self.capacity {
            self.purge_expired(now);
        }
        if self.len >= self.capacity {
            self.evict_soonest();
        }
        let per_address_full = self
            .by_ip
            .get(&ip)
            .is_some_and(|n| n.by_name.len() >= self.max_per_address);
        if per_address_full && !self.evict_from(ip) {
            // Every name of the address is pinned by a live flow: the new
            // one is not recorded (its connection will be refused).
            return;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let name: Arc<str> = Arc::from(name);
        let names = self.by_ip.entry(ip).or_default();
        names.by_expiry.insert((expires, seq), Arc::clone(&name));
        names.by_name.insert(
            name,
            Entry {
                expires,
                seq,
                pins: 0,
            },
        );
        self.expiry.push(Reverse((expires, seq, ip)));
        self.len += 1;
        self.compact_heap();
    }

    /// Names `ip` was resolved for that are still valid at `now`, latest
    /// expiry first. Stops at the first expired pair: O(log n + k) for `k`
    /// names read.
    pub fn names_for(&self, ip: IpAddr, now: Instant) -> impl Iterator<Item = &str> + '_ {
        self.by_ip
            .get(&ip)
            .into_iter()
            .flat_map(|n| n.by_expiry.iter().rev())
            .take_while(move |((expires, _), _)| *expires > now)
            .map(|(_, name)| &**name)
    }

    /// Whether `ip` was resolved for `name` (compared [`normalise`]d) and is
    /// still valid: one hash lookup.
    pub fn resolved_for(&self, ip: IpAddr, name: &str, now: Instant) -> bool {
        self.by_ip
            .get(&ip)
            .zip(normalise(name))
            .and_then(|(names, name)| names.by_name.get(name.as_str()))
            .is_some_and(|e| e.expires > now)
    }

    /// The remaining lifetime of the pair (`ip`, `name`) at `now`, `None`
    /// when not held or expired.
    pub fn remaining(&self, ip: IpAddr, name: &str, now: Instant) -> Option<Duration> {
        let name = normalise(name)?;
        let e = self.by_ip.get(&ip)?.by_name.get(name.as_str())?;
        (e.expires > now).then(|| e.expires - now)
    }

    /// Marks the pairs (`ip`, each of `names`) as admitting live flow `flow`:
    /// until [`DnsTable::unpin`], no capacity eviction takes them. Names the
    /// table does not hold are ignored. Pinning a flow again replaces its pins.
    pub fn pin<'n>(&mut self, flow: u64, ip: IpAddr, names: impl IntoIterator<Item = &'n str>) {
        self.unpin(flow);
        let Some(held) = self.by_ip.get_mut(&ip) else {
            return;
        };
        let mut pinned = Vec::new();
        for name in names {
            let Some(key) = normalise(name)
                .and_then(|n| held.by_name.get_key_value(n.as_str()))
                .map(|(k, _)| Arc::clone(k))
            else {
                continue;
            };
            if let Some(e) = held.by_name.get_mut(&key) {
                e.pins += 1;
                pinned.push((key, e.seq));
            }
        }
        if !pinned.is_empty() {
            self.pins.insert(flow, (ip, pinned));
        }
    }

    /// Releases the pins of flow `flow` (it ended).
    pub fn unpin(&mut self, flow: u64) {
        let Some((ip, names)) = self.pins.remove(&flow) else {
            return;
        };
        let Some(held) = self.by_ip.get_mut(&ip) else {
            return;
        };
        for (name, seq) in names {
            if let Some(e) = held.by_name.get_mut(&name)
                && e.seq == seq
            {
                e.pins = e.pins.saturating_sub(1);
            }
        }
    }

    /// Number of (address, name) pairs held, expired or not.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Drops every expired pair (expiry at or before `now`): O(k log n) for
    /// `k` expired pairs, plus the stale heap records met on the way.
    pub fn purge_expired(&mut self, now: Instant) {
        while let Some(Reverse((expires, _, _))) = self.expiry.peek()
            && *expires <= now
        {
            if let Some(Reverse((expires, seq, ip))) = self.expiry.pop() {
                self.remove_pair(ip, expires, seq);
            }
        }
    }

    /// Keeps only the names `keep` accepts (e.g. those a reloaded policy
    /// still allows); returns how many (address, name) pairs were dropped.
    /// O(n); the heap records of dropped pairs go stale.
    pub fn retain_names(&mut self, mut keep: impl FnMut(&str) -> bool) -> usize {
        let mut removed = 0;
        self.by_ip.retain(|_, names| {
            let before = names.by_name.len();
            names.by_name.retain(|name, _| keep(name));
            let by_name = &names.by_name;
            names.by_expiry.retain(|_, name| by_name.contains_key(name));
            removed += before - names.by_name.len();
            !names.by_name.is_empty()
        });
        self.len -= removed;
        self.compact_heap();
        removed
    }

    /// Evicts the live, unpinned pair expiring soonest in the whole table,
    /// if any.
    fn evict_soonest(&mut self) {
        let mut skipped = Vec::new();
        while let Some(Reverse((expires, seq, ip))) = self.expiry.pop() {
            match self.pinned(ip, expires, seq) {
                // Stale record.
                None => {}
                Some(true) => skipped.push(Reverse((expires, seq, ip))),
                Some(false) => {
                    self.remove_pair(ip, expires, seq);
                    break;
                }
            }
        }
        self.expiry.extend(skipped);
    }

    /// Evicts the soonest-expiring unpinned name of `ip`; false when every
    /// name of the address is pinned.
    fn evict_from(&mut self, ip: IpAddr) -> bool {
        let Some(names) = self.by_ip.get(&ip) else {
            return true;
        };
        let victim = names
            .by_expiry
            .iter()
            .find(|(_, name)| names.by_name.get(*name).is_some_and(|e| e.pins == 0))
            .map(|(k, _)| *k);
        match victim {
            Some((expires, seq)) => {
                // Its heap record goes stale.
                self.remove_pair(ip, expires, seq);
                true
            }
            None => false,
        }
    }

    /// Whether the pair (`ip`, `expires`, `seq`) is pinned; `None` when the
    /// table no longer holds it with that expiry (a stale heap record).
    fn pinned(&self, ip: IpAddr, expires: Instant, seq: u64) -> Option<bool> {
        let names = self.by_ip.get(&ip)?;
        let name = names.by_expiry.get(&(expires, seq))?;
        Some(names.by_name.get(name).is_some_and(|e| e.pins > 0))
    }

    /// Removes the pair (`ip`, `expires`, `seq`) if held with that expiry;
    /// returns whether it was.
    fn remove_pair(&mut self, ip: IpAddr, expires: Instant, seq: u64) -> bool {
        let Some(names) = self.by_ip.get_mut(&ip) else {
            return false;
        };
        let Some(name) = names.by_expiry.remove(&(expires, seq)) else {
            return false;
        };
        names.by_name.remove(&name);
        self.len -= 1;
        if names.by_name.is_empty() {
            self.by_ip.remove(&ip);
        }
        true
    }

    /// Rebuilds the heap from the live pairs when stale records outnumber
    /// them (see [`HEAP_STALE_FACTOR`]).
    fn compact_heap(&mut self) {
        if self.expiry.len() <= HEAP_STALE_FACTOR * self.len + HEAP_SLACK {
            return;
        }
        self.expiry = self
            .by_ip
            .iter()
            .flat_map(|(ip, names)| {
                names
                    .by_expiry
                    .keys()
                    .map(|(expires, seq)| Reverse((*expires, *seq, *ip)))
            })
            .collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_records_expires_and_is_bounded() {
        let now = Instant::now();
        let mut t = DnsTable::new(2);
        t.set_ttl_bounds(Duration::ZERO, DEFAULT_MAX_TTL);
        let ip: IpAddr = "198.51.100.7".parse().unwrap();
        t.insert(ip, "Example.COM.", Duration::from_secs(10), now);
        assert!(t.resolved_for(ip, "example.com", now));
        assert!(t.resolved_for(ip, "EXAMPLE.com.", now));
        assert!(!t.resolved_for(ip, "other.com", now));
        assert!(!t.resolved_for(ip, "example.com", now + Duration::from_secs(11)));
        t.insert(ip, "b.com", Duration::from_secs(100), now);
        t.insert(
            "198.51.100.8".parse().unwrap(),
            "c.com",
            Duration::from_secs(100),
            now,
        );
        assert_eq!(t.len(), 2);
        // The soonest-expiring pair (example.com) was evicted.
        assert!(!t.resolved_for(ip, "example.com", now));
        assert!(t.resolved_for(ip, "b.com", now));
        t.purge_expired(now + Duration::from_secs(1000));
        assert!(t.is_empty());
    }

    #[test]
    fn a_full_table_purges_expired_pairs_then_evicts_the_soonest() {
        let now = Instant::now();
        let secs = Duration::from_secs;
        let mut t = DnsTable::new(8);
        t.set_ttl_bounds(Duration::ZERO, DEFAULT_MAX_TTL);
        let ip = |i: u8| IpAddr::from([198, 51, 100, i]);
        // Eight pairs on four addresses, expiring at 10, 20, ..., 80 s,
        // inserted out of order.
        for (i, ttl) in [(1u8, 50u64), (2, 10), (3, 80), (4, 30), (1, 20), (2, 70)] {
            t.insert(ip(i), &format!("n{ttl}.example"), secs(ttl), now);
        }
        t.insert(ip(3), "n40.example", secs(40), now);
        t.insert(ip(4), "n60.example", secs(60), now);
        assert_eq!(t.len(), 8);
        // Re-inserting a held pair extends it (10 -> 90 s) and adds nothing.
        t.insert(ip(2), "N10.example.", secs(90), now);
        // A shorter TTL never shortens it.
        t.insert(ip(2), "n10.example", secs(1), now);
        assert_eq!(t.len(), 8);
        assert!(t.resolved_for(ip(2), "n10.example", now + secs(85)));

        // Full, nothing expired: each insert evicts the soonest-expiring pair.
        t.insert(ip(9), "a.example", secs(100), now);
        assert!(!t.resolved_for(ip(1), "n20.example", now), "20 s evicted");
        t.insert(ip(9), "b.example", secs(100), now);
        assert!(!t.resolved_for(ip(4), "n30.example", now), "30 s evicted");
        assert_eq!(t.len(), 8);
        let held = |t: &DnsTable| {
            let mut v: Vec<String> = (1..=9)
                .flat_map(|i| {
                    t.names_for(ip(i), now)
                        .map(str::to_owned)
                        .collect::<Vec<_>>()
                })
                .collect();
            v.sort();
            v
        };
        assert_eq!(
            held(&t),
            [
                "a.example",
                "b.example",
                "n10.example",
                "n40.example",
                "n50.example",
                "n60.example",
                "n70.example",
                "n80.example"
            ]
        );

        // At 65 s, 40, 50 and 60 have expired: a full table purges all
        // three at once rather than evicting a live pair.
        let later = now + secs(65);
        t.insert(ip(9), "c.example", secs(100), later);
        assert_eq!(t.len(), 6);
        for (i, n) in [(3, "n40"), (1, "n50"), (4, "n60")] {
            assert_eq!(
                t.names_for(ip(i), now).filter(|x| x.starts_with(n)).count(),
                0
            );
        }
        // Addresses left without names are dropped from the map.
        assert!(!t.by_ip.contains_key(&ip(1)) && !t.by_ip.contains_key(&ip(4)));

        // Pairs dropped by retain_names leave stale heap records behind,
        // which eviction skips: the next victim is the live 70 s pair.
        assert_eq!(t.retain_names(|n| n != "n80.example"), 1);
        t.insert(ip(9), "d.example", secs(100), later);
        t.insert(ip(9), "e.example", secs(100), later);
        t.insert(ip(9), "f.example", secs(100), later);
        assert_eq!(t.len(), 8);
        t.insert(ip(9), "g.example", secs(100), later);
        assert_eq!(t.len(), 8);
        assert!(!t.resolved_for(ip(2), "n70.example", later), "70 s evicted");
        assert!(
            t.resolved_for(ip(2), "n10.example", later),
            "extended pair kept"
        );

        t.purge_expired(now + secs(1000));
        assert!(t.is_empty() && t.by_ip.is_empty());
    }

    #[test]
    fn stale_expiry_records_stay_bounded() {
        let now = Instant::now();
        let mut t = DnsTable::new(16);
        let ip: IpAddr = "198.51.100.7".parse().unwrap();
        // Every insert of the same pair with a later expiry leaves a stale
        // record; the heap is rebuilt before they pile up.
        for i in 0..10_000u64 {
            t.insert(ip, "again.example", Duration::from_secs(60 + i), now);
            assert!(t.expiry.len() <= HEAP_STALE_FACTOR * t.len() + HEAP_SLACK + 1);
        }
        assert_eq!(t.len(), 1);
        assert!(t.resolved_for(ip, "again.example", now + Duration::from_secs(10_058)));
        // Evicting through the stale records still finds the one live pair.
        let mut t1 = DnsTable::new(1);
        for i in 0..200u64 {
            t1.insert(ip, "a.example", Duration::from_secs(60 + i), now);
        }
        t1.insert(ip, "b.example", Duration::from_secs(30), now);
        assert_eq!(t1.len(), 1);
        assert!(t1.resolved_for(ip, "b.example", now));
        assert!(!t1.resolved_for(ip, "a.example", now));
    }

    #[test]
    fn zero_ttls_are_raised_to_the_floor() {
        let now = Instant::now();
        let mut t = DnsTable::new(4);
        let ip: IpAddr = "198.51.100.7".parse().unwrap();
        t.insert(ip, "zero.example", Duration::ZERO, now);
        assert!(t.resolved_for(
            ip,
            "zero.example",
            now + DEFAULT_MIN_TTL - Duration::from_millis(1)
        ));
        assert!(!t.resolved_for(ip, "zero.example", now + DEFAULT_MIN_TTL));
        t.insert(ip, "long.example", Duration::from_secs(u64::MAX / 4), now);
        assert!(!t.resolved_for(
            ip,
            "long.example",
            now + DEFAULT_MAX_TTL + Duration::from_secs(1)
        ));
    }

    #[test]
    fn one_address_is_capped_without_dropping_pinned_names() {
        let now = Instant::now();
        let secs = Duration::from_secs;
        let mut t = DnsTable::new(1000);
        t.set_ttl_bounds(Duration::ZERO, DEFAULT_MAX_TTL);
        t.set_max_names_per_address(3);
        let ip: IpAddr = "198.51.100.7".parse().unwrap();
        let other: IpAddr = "198.51.100.8".parse().unwrap();
        t.insert(ip, "a.example", secs(10), now);
        t.insert(ip, "b.example", secs(20), now);
        t.insert(ip, "c.example", secs(30), now);
        t.insert(other, "z.example", secs(5), now);
        // A live flow was admitted to `ip` by a.example (the soonest to expire).
        t.pin(7, ip, ["A.example."]);
        t.insert(ip, "d.example", secs(40), now);
        assert!(t.resolved_for(ip, "a.example", now), "pinned name kept");
        assert!(
            !t.resolved_for(ip, "b.example", now),
            "next soonest evicted"
        );
        assert!(t.resolved_for(ip, "d.example", now));
        // Other addresses are untouched by one address's cap.
        assert!(t.resolved_for(other, "z.example", now));
        assert_eq!(t.len(), 4);
        // Every name pinned: a new name is not recorded at all.
        t.pin(8, ip, ["c.example", "d.example"]);
        t.insert(ip, "e.example", secs(50), now);
        assert!(!t.resolved_for(ip, "e.example", now));
        assert_eq!(t.names_for(ip, now).count(), 3);
        // Flow 7 ended: a.example may go now.
        t.unpin(7);
        t.insert(ip, "e.example", secs(50), now);
        assert!(t.resolved_for(ip, "e.example", now));
        assert!(!t.resolved_for(ip, "a.example", now));
        // Expiry still drops a pinned pair (the flow keeps its own names).
        t.purge_expired(now + secs(45));
        assert!(!t.resolved_for(ip, "c.example", now));
        assert_eq!(t.names_for(ip, now).collect::<Vec<_>>(), ["e.example"]);
    }

    #[test]
    fn a_full_table_does_not_evict_pinned_pairs() {
        let now = Instant::now();
        let secs = Duration::from_secs;
        let mut t = DnsTable::new(2);
        t.set_ttl_bounds(Duration::ZERO, DEFAULT_MAX_TTL);
        let ip = |i: u8| IpAddr::from([198, 51, 100, i]);
        t.insert(ip(1), "soon.example", secs(10), now);
        t.insert(ip(2), "later.example", secs(20), now);
        t.pin(1, ip(1), ["soon.example"]);
        t.insert(ip(3), "new.example", secs(30), now);
        assert!(t.resolved_for(ip(1), "soon.example", now));
        assert!(!t.resolved_for(ip(2), "later.example", now));
        assert!(t.resolved_for(ip(3), "new.example", now));
        // The skipped record is still in the heap: expiry finds it.
        t.unpin(1);
        t.purge_expired(now + secs(15));
        assert!(!t.resolved_for(ip(1), "soon.example", now));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn names_for_reads_latest_expiry_first_and_stops_at_expired() {
        let now = Instant::now();
        let secs = Duration::from_secs;
        let mut t = DnsTable::new(100);
        t.set_ttl_bounds(Duration::ZERO, DEFAULT_MAX_TTL);
        let ip: IpAddr = "198.51.100.7".parse().unwrap();
        for (n, ttl) in [("b", 20), ("a", 10), ("c", 30)] {
            t.insert(ip, &format!("{n}.example"), secs(ttl), now);
        }
        assert_eq!(
            t.names_for(ip, now).collect::<Vec<_>>(),
            ["c.example", "b.example", "a.example"]
        );
        assert_eq!(
            t.names_for(ip, now + secs(15)).collect::<Vec<_>>(),
            ["c.example", "b.example"]
        );
        assert_eq!(t.remaining(ip, "B.example.", now + secs(15)), Some(secs(5)));
        assert_eq!(t.remaining(ip, "a.example", now + secs(15)), None);
    }

    /// 100,000 names on one address: every one is found, a name not held
    /// is not, and reading the first few names does not walk them all.
    #[test]
    fn one_hundred_thousand_names_on_one_address() {
        let now = Instant::now();
        let mut t = DnsTable::new(200_000);
        t.set_max_names_per_address(100_000);
        let ip: IpAddr = "198.51.100.7".parse().unwrap();
        for i in 0..100_000u32 {
            t.insert(
                ip,
                &format!("n{i}.wild.example"),
                Duration::from_secs(60),
                now,
            );
        }
        assert_eq!(t.len(), 100_000);
        for i in (0..100_000u32).step_by(997) {
            assert!(t.resolved_for(ip, &format!("N{i}.wild.example."), now));
        }
        assert!(!t.resolved_for(ip, "n100000.wild.example", now));
        assert_eq!(t.names_for(ip, now).take(32).count(), 32);
        // One more name past the cap evicts exactly one.
        t.insert(ip, "extra.wild.example", Duration::from_secs(90), now);
        assert_eq!(t.len(), 100_000);
        assert!(t.resolved_for(ip, "extra.wild.example", now));
        assert!(
            !t.resolved_for(ip, "n0.wild.example", now),
            "oldest evicted"
        );
    }

    /// Benchmark driver (not run by default): the cost per insert + lookup
    /// on one address with 10 ... 100,000 names held. Run with
    /// `cargo test --release -p sluice-gateway dns_table_cost -- --ignored --nocapture`.
    #[test]
    #[ignore = "benchmark driver"]
    fn dns_table_cost_per_name_count() {
        let ip: IpAddr = "198.51.100.7".parse().unwrap();
        let mut per_op = Vec::new();
        for held in [10usize, 100, 1_000, 10_000, 100_000] {
            let now = Instant::now();
            let mut t = DnsTable::new(1 << 20);
            t.set_max_names_per_address(held);
            for i in 0..held {
                t.insert(
                    ip,
                    &format!("n{i}.wild.example"),
                    Duration::from_secs(600),
                    now,
                );
            }
            // Steady state: each insert past the cap evicts one name.
            let rounds = 20_000usize;
            let start = Instant::now();
            for i in 0..rounds {
                let name = format!("m{i}.wild.example");
                t.insert(ip, &name, Duration::from_secs(600), now);
                assert!(t.resolved_for(ip, &name, now));
            }
            let ns = start.elapsed().as_nanos() / rounds as u128;
            println!("names on one address: {held:>7}  insert+lookup: {ns:>6} ns");
            per_op.push(ns);
        }
        let (min, max) = (per_op.iter().min().unwrap(), per_op.iter().max().unwrap());
        assert!(*max <= 10 * (*min).max(1), "cost not flat: {per_op:?}");
    }
}

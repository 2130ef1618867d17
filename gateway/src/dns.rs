//! DNS for the guest: the gateway forwards queries to the upstream resolvers
//! and records every returned address in the sandbox's [`DnsTable`] before the
//! answer reaches the guest, so a connection that follows an answer can never
//! race it.
//!
//! Parsing and sanitising are sluice-inspect's ([`sluice_inspect::dns`]), the
//! one DNS reader of the project: queries that do not parse or whose name does
//! not normalise like the policy's (non-ASCII, over-long labels, compression
//! loops) get FORMERR; only A questions are forwarded ([`forwarded_type`]);
//! answers keep only the A records at the end of the question's CNAME chain.
//! IPv6 is off in this gateway: AAAA queries are answered locally with an
//! empty NOERROR answer. A response that does not parse or does not match the
//! query is replaced by SERVFAIL (fail closed).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use std::ops::RangeInclusive;

use hickory_proto::rr::RecordType;
use sluice_inspect::dns::{DnsReject, Sanitized, sanitize_response_clamped};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

/// Largest DNS message accepted over TCP (the 2-byte length prefix allows 65535).
pub const MAX_TCP_MESSAGE: usize = 65535;
/// Default upper bound on TTLs recorded in the table.
pub const DEFAULT_MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// Default lower bound on TTLs recorded in the table: answers with TTL 0 (common
/// for local resolvers) must still cover the connection that follows them.
pub const DEFAULT_MIN_TTL: Duration = Duration::from_secs(10);

/// One name recorded for an address.
#[derive(Debug, Clone)]
struct NameEntry {
    name: Box<str>,
    expires: Instant,
    /// Unique per inserted pair: ties its [`Expiry`] records to it.
    seq: u64,
}

/// One record of the expiry heap: the pair `(ip, seq)` expires at `expires`.
/// Stale once the pair is gone or its expiry was extended (lazy deletion:
/// a record counts only if the table still holds that pair with exactly that
/// expiry). Ordered by expiry, then insertion order.
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
/// Bounded to `capacity` (address, name) pairs: when full, expired entries are
/// purged and, if still full, the pair expiring soonest (the earliest
/// inserted among equal expiries) is evicted. TTLs are clamped to
/// `[min_ttl, max_ttl]` (defaults [`DEFAULT_MIN_TTL`], [`DEFAULT_MAX_TTL`]).
///
/// Cost: a min-heap of expiries (with lazy deletion of records made stale by
/// an extended expiry or [`DnsTable::retain_names`]) makes purging `k`
/// expired pairs O(k log n) and eviction O(log n) amortised; insert and
/// lookup also scan the names already held for the one address (a handful,
/// except for an address shared by many names). Lookups do not allocate.
#[derive(Debug)]
pub struct DnsTable {
    by_ip: HashMap<IpAddr, Vec<NameEntry>>,
    /// Min-heap of expiries, see [`Expiry`].
    expiry: BinaryHeap<Expiry>,
    next_seq: u64,
    len: usize,
    capacity: usize,
    min_ttl: Duration,
    max_ttl: Duration,
}

impl DnsTable {
    /// An empty table holding at most `capacity` (address, name) pairs.
    pub fn new(capacity: usize) -> Self {
        Self {
            by_ip: HashMap::new(),
            expiry: BinaryHeap::new(),
            next_seq: 0,
            len: 0,
            capacity: capacity.max(1),
            min_ttl: DEFAULT_MIN_TTL,
            max_ttl: DEFAULT_MAX_TTL,
        }
    }

    /// Sets the TTL clamp (the policy's min/max TTL); `min` is capped at `max`.
    pub fn set_ttl_bounds(&mut self, min: Duration, max: Duration) {
        self.max_ttl = max;
        self.min_ttl = min.min(max);
    }

    /// Records that `name` resolved to `ip` with `ttl` (clamped to the TTL bounds).
    /// Names are stored lower-case without the trailing dot. A pair already
    /// held keeps the later of its two expiries.
    pub fn insert(&mut self, ip: IpAddr, name: &str, ttl: Duration, now: Instant) {
        let name = normalise(name);
        let expires = now + ttl.clamp(self.min_ttl, self.max_ttl);
        if let Some(list) = self.by_ip.get_mut(&ip)
            && let Some(e) = list.iter_mut().find(|e| *e.name == *name)
        {
            if expires > e.expires {
                e.expires = expires;
                // The old record is stale from now on.
                self.expiry.push(Reverse((expires, e.seq, ip)));
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
        let seq = self.next_seq;
        self.next_seq += 1;
        self.by_ip.entry(ip).or_default().push(NameEntry {
            name: name.into(),
            expires,
            seq,
        });
        self.expiry.push(Reverse((expires, seq, ip)));
        self.len += 1;
        self.compact_heap();
    }

    /// Names `ip` was resolved for that are still valid at `now`.
    pub fn names_for(&self, ip: IpAddr, now: Instant) -> impl Iterator<Item = &str> + '_ {
        self.by_ip
            .get(&ip)
            .into_iter()
            .flatten()
            .filter(move |e| e.expires > now)
            .map(|e| &*e.name)
    }

    /// Whether `ip` was resolved for `name` (normalised comparison) and is still valid.
    pub fn resolved_for(&self, ip: IpAddr, name: &str, now: Instant) -> bool {
        let name = name.trim_end_matches('.');
        self.names_for(ip, now)
            .any(|n| n.eq_ignore_ascii_case(name))
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
            self.pop_soonest();
        }
    }

    /// Keeps only the names `keep` accepts (e.g. those a reloaded policy
    /// still allows); returns how many (address, name) pairs were dropped.
    /// O(n); the heap records of dropped pairs go stale.
    pub fn retain_names(&mut self, mut keep: impl FnMut(&str) -> bool) -> usize {
        let mut removed = 0;
        self.by_ip.retain(|_, list| {
            let before = list.len();
            list.retain(|e| keep(&e.name));
            removed += before - list.len();
            !list.is_empty()
        });
        self.len -= removed;
        self.compact_heap();
        removed
    }

    /// Evicts the live pair expiring soonest, if any.
    fn evict_soonest(&mut self) {
        while !self.expiry.is_empty() {
            if self.pop_soonest() {
                return;
            }
        }
    }

    /// Pops the heap's top record and removes its pair when the record is
    /// live; returns whether a pair was removed.
    fn pop_soonest(&mut self) -> bool {
        let Some(Reverse((expires, seq, ip))) = self.expiry.pop() else {
            return false;
        };
        let Some(list) = self.by_ip.get_mut(&ip) else {
            return false;
        };
        let Some(i) = list
            .iter()
            .position(|e| e.seq == seq && e.expires == expires)
        else {
            return false;
        };
        list.swap_remove(i);
        self.len -= 1;
        if list.is_empty() {
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
            .flat_map(|(ip, list)| list.iter().map(|e| Reverse((e.expires, e.seq, *ip))))
            .collect();
    }
}

fn normalise(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// A validated guest query (sluice-inspect's reader: one IN question, opcode
/// QUERY, the name normalised exactly as the policy normalises names).
pub use sluice_inspect::dns::Query as Question;

/// Whether the gateway asks upstream for `qtype` at all. Only A is answered
/// (IPv6 is off, so AAAA is withheld); every other type (HTTPS/SVCB, which
/// would carry ECH configurations and alternative endpoints, TXT, MX, ...)
/// gets an empty NOERROR answer locally and is audited `dns_type_withheld`.
/// CNAME chains leading to A records are part of A answers.
pub fn forwarded_type(qtype: RecordType) -> bool {
    qtype == RecordType::A
}

/// The query the gateway sends upstream for a validated guest `question`,
/// built afresh rather than forwarding the guest's bytes: the guest's id,
/// RD and CD bits, and one question with the *normalised* name (the name the
/// policy checked: lowercase, so no bits ride in the letter case; labels
/// re-split at dots, so a label holding a dot cannot make upstream resolve
/// another name than the one allowed) and the guest's type, IN class; an
/// EDNS OPT record with the gateway's payload size and no options; nothing
/// else (the guest's other sections, EDNS options such as client subnet or
/// padding, never leave the machine). `None` if it cannot be encoded (a
/// name from `parse_query` always can).
pub fn upstream_query(question: &Question) -> Option<Vec<u8>> {
    use hickory_proto::op::{Edns, Message, Query};
    use hickory_proto::rr::Name;
    let name = Name::from_ascii(format!("{}.", question.name)).ok()?;
    let mut message = Message::query();
    message.metadata.id = question.id;
    message.metadata.recursion_desired = question.rd;
    message.metadata.checking_disabled = question.cd;
    message.add_query(Query::query(name, question.qtype));
    let mut edns = Edns::new();
    edns.set_max_payload(sluice_inspect::dns::EDNS_PAYLOAD);
    message.set_edns(edns);
    message.to_vec().ok()
}

/// Sanitises an upstream answer to `question` with
/// [`sluice_inspect::dns::sanitize_response_clamped`] (IPv6 off; only the A
/// records at the end of the question's CNAME chain survive; TTLs clamped
/// into `ttl`) and records every kept address in `table` before the bytes are
/// returned, under its owner name and under the question's name (the name the
/// guest will send as SNI / Host).
///
/// `keep(ip)` refuses addresses (rebinding defense). When it refused every
/// address, nothing is recorded and [`Sanitized::private_answer`] is true:
/// the caller answers an error instead of [`Sanitized::bytes`] and audits
/// `private_answer`.
pub fn sanitize_and_record(
    question: &Question,
    upstream: &[u8],
    table: &mut DnsTable,
    now: Instant,
    keep: impl Fn(IpAddr) -> bool,
    ttl: RangeInclusive<u32>,
) -> Result<Sanitized, DnsReject> {
    let clean = sanitize(question, upstream, keep, ttl)?;
    record(question, &clean, table, now);
    Ok(clean)
}

/// The sanitising half of [`sanitize_and_record`]: nothing is recorded, so
/// the caller may still refuse the answer (e.g. for its CNAME chain, see
/// [`Sanitized::cname_chain`]) before calling [`record`].
pub fn sanitize(
    question: &Question,
    upstream: &[u8],
    keep: impl Fn(IpAddr) -> bool,
    ttl: RangeInclusive<u32>,
) -> Result<Sanitized, DnsReject> {
    sanitize_response_clamped(question, upstream, |_, ip| keep(ip), false, ttl)
}

/// The recording half of [`sanitize_and_record`]: every kept address under
/// its owner name and the question's name (nothing for a private answer).
pub fn record(question: &Question, clean: &Sanitized, table: &mut DnsTable, now: Instant) {
    if !clean.private_answer() {
        for (owner, ip, ttl) in &clean.answers {
            let ttl = Duration::from_secs(u64::from(*ttl));
            table.insert(*ip, owner, ttl, now);
            table.insert(*ip, &question.name, ttl, now);
        }
    }
}

/// Sends `query` to each upstream in turn over UDP; the first matching reply wins.
pub async fn forward_udp(
    query: &[u8],
    upstreams: &[SocketAddr],
    per_try: Duration,
) -> Option<Vec<u8>> {
    let id = query.get(..2)?;
    for up in upstreams {
        let bind: SocketAddr = if up.is_ipv4() {
            ([0, 0, 0, 0], 0).into()
        } else {
            ([0u16; 8], 0).into()
        };
        let Ok(sock) = UdpSocket::bind(bind).await else {
            continue;
        };
        if sock.connect(up).await.is_err() || sock.send(query).await.is_err() {
            continue;
        }
        let mut buf = vec![0u8; 65535];
        let deadline = tokio::time::Instant::now() + per_try;
        while let Ok(Ok(n)) = tokio::time::timeout_at(deadline, sock.recv(&mut buf)).await {
            if buf.get(..2) == Some(id) {
                buf.truncate(n);
                return Some(buf);
            }
        }
    }
    None
}

/// DNS-over-TCP framing (RFC 1035 4.2.2): when `inbuf` starts with a
/// complete message (2-byte big-endian length, then that many bytes),
/// removes it from `inbuf` and returns the message without its prefix;
/// otherwise leaves `inbuf` unchanged and returns `None` (need more bytes).
/// A zero length yields an empty message. Pure: fuzzed by
/// `fuzz/src/dns_tcp_framing.rs`.
pub fn take_tcp_message(inbuf: &mut Vec<u8>) -> Option<Vec<u8>> {
    let prefix: [u8; 2] = inbuf.get(..2)?.try_into().ok()?;
    let len = usize::from(u16::from_be_bytes(prefix));
    if inbuf.len() < 2 + len {
        return None;
    }
    Some(inbuf.drain(..2 + len).skip(2).collect())
}

/// Sends `query` to each upstream in turn over TCP; the first reply wins.
pub async fn forward_tcp(
    query: &[u8],
    upstreams: &[SocketAddr],
    per_try: Duration,
) -> Option<Vec<u8>> {
    let len = u16::try_from(query.len()).ok()?;
    for up in upstreams {
        let attempt = async {
            let mut s = TcpStream::connect(up).await.ok()?;
            s.write_all(&len.to_be_bytes()).await.ok()?;
            s.write_all(query).await.ok()?;
            let mut l = [0u8; 2];
            s.read_exact(&mut l).await.ok()?;
            let mut buf = vec![0u8; usize::from(u16::from_be_bytes(l))];
            s.read_exact(&mut buf).await.ok()?;
            Some(buf)
        };
        if let Ok(Some(resp)) = tokio::time::timeout(per_try, attempt).await {
            return Some(resp);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{Message, OpCode, Query};
    use hickory_proto::rr::rdata::{A, AAAA, CNAME};
    use hickory_proto::rr::{Name, RData, Record};
    use std::str::FromStr;

    fn query(name: &str, qtype: RecordType) -> Vec<u8> {
        let mut m = Message::query();
        m.metadata.id = 0x1234;
        m.metadata.recursion_desired = true;
        m.add_query(Query::query(Name::from_str(name).unwrap(), qtype));
        m.to_vec().unwrap()
    }

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

    fn question(q: &[u8]) -> Question {
        sluice_inspect::dns::parse_query(q).unwrap()
    }

    /// An upstream answer to `q`: www -> CNAME cdn -> A 198.51.100.9 and an
    /// AAAA, plus an unrelated A record for another owner.
    fn cname_answer(q: &[u8]) -> Vec<u8> {
        let qmsg = Message::from_vec(q).unwrap();
        let mut resp = Message::response(qmsg.metadata.id, OpCode::Query);
        resp.add_queries(qmsg.queries.clone());
        let www = Name::from_str("WWW.example.com.").unwrap();
        let cdn = Name::from_str("cdn.example.net.").unwrap();
        resp.add_answer(Record::from_rdata(
            www,
            300,
            RData::CNAME(CNAME(cdn.clone())),
        ));
        resp.add_answer(Record::from_rdata(
            cdn.clone(),
            60,
            RData::A(A::new(198, 51, 100, 9)),
        ));
        resp.add_answer(Record::from_rdata(
            cdn,
            60,
            RData::AAAA(AAAA::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1)),
        ));
        resp.add_answer(Record::from_rdata(
            Name::from_str("elsewhere.example.").unwrap(),
            60,
            RData::A(A::new(198, 51, 100, 66)),
        ));
        resp.to_vec().unwrap()
    }

    #[test]
    fn sanitised_answer_records_the_chain_end_under_question_and_owner() {
        let q = query("www.EXAMPLE.com.", RecordType::A);
        let question = question(&q);
        assert_eq!(question.name, "www.example.com");
        let bytes = cname_answer(&q);
        let now = Instant::now();
        let mut t = DnsTable::new(16);
        let out =
            sanitize_and_record(&question, &bytes, &mut t, now, |_| true, 0..=u32::MAX).unwrap();
        let ip: IpAddr = "198.51.100.9".parse().unwrap();
        assert_eq!(out.answers.len(), 1);
        assert_eq!(out.answers[0].1, ip);
        assert!(t.resolved_for(ip, "www.example.com", now));
        assert!(t.resolved_for(ip, "cdn.example.net", now));
        // The record off the chain is neither answered nor recorded.
        let stray: IpAddr = "198.51.100.66".parse().unwrap();
        assert_eq!(t.names_for(stray, now).count(), 0);
        let back = Message::from_vec(&out.bytes).unwrap();
        assert_eq!(back.answers.len(), 2, "CNAME + A only: {back:?}");
        assert!(
            back.answers
                .iter()
                .all(|r| matches!(r.record_type(), RecordType::A | RecordType::CNAME))
        );

        // TTLs are clamped into the bounds, in the bytes and in the table.
        let mut t = DnsTable::new(16);
        t.set_ttl_bounds(Duration::ZERO, DEFAULT_MAX_TTL);
        let out = sanitize_and_record(&question, &bytes, &mut t, now, |_| true, 10..=30).unwrap();
        let back = Message::from_vec(&out.bytes).unwrap();
        assert!(back.answers.iter().all(|r| (10..=30).contains(&r.ttl)));
        assert!(t.resolved_for(ip, "www.example.com", now + Duration::from_secs(29)));
        assert!(!t.resolved_for(ip, "www.example.com", now + Duration::from_secs(31)));

        // Every address refused: nothing recorded, private_answer set.
        let mut t = DnsTable::new(16);
        let out =
            sanitize_and_record(&question, &bytes, &mut t, now, |a| a != ip, 0..=u32::MAX).unwrap();
        assert!(out.private_answer());
        assert!(out.answers.is_empty());
        assert!(t.is_empty());
    }

    #[test]
    fn only_a_questions_are_forwarded() {
        assert!(forwarded_type(RecordType::A));
        for t in [
            RecordType::AAAA,
            RecordType::HTTPS,
            RecordType::SVCB,
            RecordType::TXT,
            RecordType::MX,
            RecordType::CNAME,
            RecordType::ANY,
        ] {
            assert!(!forwarded_type(t), "{t}");
        }
    }

    #[test]
    fn mismatched_or_garbage_responses_are_errors() {
        let question = question(&query("a.example.", RecordType::A));
        let mut t = DnsTable::new(4);
        let now = Instant::now();
        assert_eq!(
            sanitize_and_record(&question, b"\x00\x01garbage", &mut t, now, |_| true, 0..=9),
            Err(DnsReject::Malformed)
        );
        let other = Message::response(0x9999, OpCode::Query).to_vec().unwrap();
        assert_eq!(
            sanitize_and_record(&question, &other, &mut t, now, |_| true, 0..=9),
            Err(DnsReject::Mismatch)
        );
        // An answer to another question with the right id.
        let q2 = query("b.example.", RecordType::A);
        let wrong = cname_answer(&q2);
        assert_eq!(
            sanitize_and_record(&question, &wrong, &mut t, now, |_| true, 0..=9),
            Err(DnsReject::Mismatch)
        );
        assert!(t.is_empty());
    }
}

#[cfg(test)]
mod tcp_framing_tests {
    use super::take_tcp_message;

    #[test]
    fn takes_whole_messages_in_order_and_waits_for_the_rest() {
        let mut buf = vec![0, 3, b'a', b'b', b'c', 0, 0, 0, 2, b'x'];
        assert_eq!(take_tcp_message(&mut buf), Some(b"abc".to_vec()));
        assert_eq!(take_tcp_message(&mut buf), Some(Vec::new()));
        assert_eq!(take_tcp_message(&mut buf), None);
        assert_eq!(buf, [0, 2, b'x']);
        let mut one = vec![7];
        assert_eq!(take_tcp_message(&mut one), None);
        assert_eq!(one, [7]);
    }
}

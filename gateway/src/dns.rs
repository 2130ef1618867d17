//! DNS for the guest: the gateway forwards queries to the upstream resolvers
//! and records every returned address in the sandbox's [`DnsTable`] before the
//! answer reaches the guest, so a connection that follows an answer can never
//! race it.
//!
//! IPv6 is off in this gateway: AAAA queries are answered locally with an
//! empty NOERROR answer and AAAA records are stripped from forwarded answers.
//! A response that does not parse is replaced by SERVFAIL (fail closed).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::{RData, RecordType};
use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

/// Largest DNS message accepted over TCP (the 2-byte length prefix allows 65535).
pub const MAX_TCP_MESSAGE: usize = 65535;
/// Default upper bound on TTLs recorded in the table.
pub const DEFAULT_MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// Default lower bound on TTLs recorded in the table: answers with TTL 0 (common
/// for local resolvers) must still cover the connection that follows them.
pub const DEFAULT_MIN_TTL: Duration = Duration::from_secs(10);

/// A DNS message the gateway cannot handle.
#[derive(Debug, Error)]
pub enum DnsError {
    /// The bytes are not a DNS message.
    #[error("malformed DNS message: {0}")]
    Malformed(String),
    /// A query without exactly one question.
    #[error("query has {0} questions, expected 1")]
    QuestionCount(usize),
    /// Re-encoding a filtered answer failed.
    #[error("encoding DNS message: {0}")]
    Encode(String),
}

/// One name recorded for an address.
#[derive(Debug, Clone)]
struct NameEntry {
    name: Box<str>,
    expires: Instant,
}

/// The sandbox's address-to-names table, filled from DNS answers.
///
/// Bounded to `capacity` (address, name) pairs: when full, expired entries are
/// purged and, if still full, the pair expiring soonest is evicted. TTLs are
/// clamped to `[min_ttl, max_ttl]` (defaults [`DEFAULT_MIN_TTL`],
/// [`DEFAULT_MAX_TTL`]). Lookups do not allocate.
#[derive(Debug)]
pub struct DnsTable {
    by_ip: HashMap<IpAddr, Vec<NameEntry>>,
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
    /// Names are stored lower-case without the trailing dot.
    pub fn insert(&mut self, ip: IpAddr, name: &str, ttl: Duration, now: Instant) {
        let name = normalise(name);
        let expires = now + ttl.clamp(self.min_ttl, self.max_ttl);
        if let Some(list) = self.by_ip.get_mut(&ip)
            && let Some(e) = list.iter_mut().find(|e| *e.name == *name)
        {
            e.expires = e.expires.max(expires);
            return;
        }
        if self.len >= self.capacity {
            self.purge_expired(now);
        }
        if self.len >= self.capacity {
            self.evict_soonest();
        }
        self.by_ip.entry(ip).or_default().push(NameEntry {
            name: name.into(),
            expires,
        });
        self.len += 1;
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

    /// Drops every expired pair.
    pub fn purge_expired(&mut self, now: Instant) {
        let mut removed = 0;
        self.by_ip.retain(|_, list| {
            let before = list.len();
            list.retain(|e| e.expires > now);
            removed += before - list.len();
            !list.is_empty()
        });
        self.len -= removed;
    }

    /// Keeps only the names `keep` accepts (e.g. those a reloaded policy
    /// still allows); returns how many (address, name) pairs were dropped.
    pub fn retain_names(&mut self, mut keep: impl FnMut(&str) -> bool) -> usize {
        let mut removed = 0;
        self.by_ip.retain(|_, list| {
            let before = list.len();
            list.retain(|e| keep(&e.name));
            removed += before - list.len();
            !list.is_empty()
        });
        self.len -= removed;
        removed
    }

    fn evict_soonest(&mut self) {
        let victim = self
            .by_ip
            .iter()
            .flat_map(|(ip, list)| {
                list.iter()
                    .enumerate()
                    .map(move |(i, e)| (e.expires, *ip, i))
            })
            .min_by_key(|(exp, _, _)| *exp);
        if let Some((_, ip, i)) = victim
            && let Some(list) = self.by_ip.get_mut(&ip)
        {
            list.swap_remove(i);
            self.len -= 1;
            if list.is_empty() {
                self.by_ip.remove(&ip);
            }
        }
    }
}

fn normalise(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// The question of a guest query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question {
    /// Message id.
    pub id: u16,
    /// Query name, normalised (lower-case, no trailing dot).
    pub name: String,
    /// Query type.
    pub qtype: RecordType,
}

/// Parses a guest query; it must be a query with exactly one question.
pub fn parse_query(bytes: &[u8]) -> Result<(Message, Question), DnsError> {
    let msg = Message::from_vec(bytes).map_err(|e| DnsError::Malformed(e.to_string()))?;
    if msg.metadata.message_type != MessageType::Query {
        return Err(DnsError::Malformed("not a query".into()));
    }
    if msg.queries.len() != 1 {
        return Err(DnsError::QuestionCount(msg.queries.len()));
    }
    let q = &msg.queries[0];
    let question = Question {
        id: msg.metadata.id,
        name: normalise(&q.name().to_ascii()),
        qtype: q.query_type(),
    };
    Ok((msg, question))
}

/// A response to `query` with `rcode` and no records (used for AAAA, errors).
pub fn local_response(query: &Message, rcode: ResponseCode) -> Result<Vec<u8>, DnsError> {
    let mut resp = Message::response(query.metadata.id, query.metadata.op_code);
    resp.metadata.recursion_desired = query.metadata.recursion_desired;
    resp.metadata.recursion_available = true;
    resp.metadata.response_code = rcode;
    resp.add_queries(query.queries.iter().cloned());
    resp.to_vec().map_err(|e| DnsError::Encode(e.to_string()))
}

/// A SERVFAIL for a query id when even the query could not be re-encoded.
pub fn minimal_servfail(query_bytes: &[u8]) -> Option<Vec<u8>> {
    let head = query_bytes.get(..12)?;
    let mut out = head.to_vec();
    out[2] = 0x80 | (head[2] & 0x01); // QR=1, keep RD
    out[3] = 0x82; // RA=1, RCODE=SERVFAIL
    out[4..12].fill(0);
    Some(out)
}

/// A forwarded answer after filtering.
#[derive(Debug)]
pub struct FilteredAnswer {
    /// The bytes to send to the guest.
    pub bytes: Vec<u8>,
    /// Addresses recorded in the table.
    pub addresses: Vec<IpAddr>,
    /// The upstream's response code.
    pub rcode: ResponseCode,
    /// Whether `keep` refused every address the upstream gave: the caller
    /// answers an error instead of `bytes` and audits `private_answer`.
    pub private_answer: bool,
}

/// Filters an upstream response for `question`: the id must match; AAAA
/// records are removed; A records whose address `keep` refuses are removed
/// (rebinding defense); every remaining record's TTL is clamped into `ttl`;
/// each kept A record is recorded in `table` under its owner name and under
/// the question's name (the name the guest will send as SNI / Host, so CNAME
/// chains resolve to it). The table is updated before the bytes are returned.
/// When `keep` refused every address, nothing is recorded and
/// [`FilteredAnswer::private_answer`] is set.
pub fn filter_response(
    bytes: &[u8],
    question: &Question,
    table: &mut DnsTable,
    now: Instant,
    keep: &dyn Fn(IpAddr) -> bool,
    ttl: std::ops::RangeInclusive<u32>,
) -> Result<FilteredAnswer, DnsError> {
    let mut msg = Message::from_vec(bytes).map_err(|e| DnsError::Malformed(e.to_string()))?;
    if msg.metadata.id != question.id || msg.metadata.message_type != MessageType::Response {
        return Err(DnsError::Malformed(
            "response does not match the query".into(),
        ));
    }
    let not_aaaa = |r: &hickory_proto::rr::Record| r.record_type() != RecordType::AAAA;
    msg.answers.retain(not_aaaa);
    msg.additionals.retain(not_aaaa);
    let mut dropped = 0usize;
    msg.answers.retain(|r| match &r.data {
        RData::A(a) if !keep(IpAddr::V4(a.0)) => {
            dropped += 1;
            false
        }
        _ => true,
    });
    // Glue in the additional section is never needed by a stub resolver.
    msg.additionals
        .retain(|r| !matches!(&r.data, RData::A(a) if !keep(IpAddr::V4(a.0))));
    let (lo, hi) = (*ttl.start(), (*ttl.end()).max(*ttl.start()));
    for rec in msg.answers.iter_mut().chain(msg.additionals.iter_mut()) {
        rec.ttl = rec.ttl.clamp(lo, hi);
    }
    let mut addresses = Vec::new();
    for rec in &msg.answers {
        if let RData::A(a) = &rec.data {
            let ip = IpAddr::V4(a.0);
            addresses.push(ip);
        }
    }
    let private_answer = dropped > 0 && addresses.is_empty();
    if !private_answer {
        for rec in &msg.answers {
            if let RData::A(a) = &rec.data {
                let ip = IpAddr::V4(a.0);
                let ttl = Duration::from_secs(u64::from(rec.ttl));
                table.insert(ip, &rec.name.to_ascii(), ttl, now);
                table.insert(ip, &question.name, ttl, now);
            }
        }
    }
    let rcode = msg.metadata.response_code;
    let bytes = msg.to_vec().map_err(|e| DnsError::Encode(e.to_string()))?;
    Ok(FilteredAnswer {
        bytes,
        addresses,
        rcode,
        private_answer,
    })
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
    use hickory_proto::op::{OpCode, Query};
    use hickory_proto::rr::rdata::{A, AAAA, CNAME};
    use hickory_proto::rr::{Name, Record};
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
    fn response_filter_records_a_and_cname_and_strips_aaaa() {
        let q = query("www.example.com.", RecordType::A);
        let (qmsg, question) = parse_query(&q).unwrap();
        assert_eq!(question.name, "www.example.com");
        let mut resp = Message::response(qmsg.metadata.id, OpCode::Query);
        resp.add_queries(qmsg.queries.clone());
        let www = Name::from_str("www.example.com.").unwrap();
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
        let bytes = resp.to_vec().unwrap();
        let now = Instant::now();
        let mut t = DnsTable::new(16);
        let out = filter_response(&bytes, &question, &mut t, now, &|_| true, 0..=u32::MAX).unwrap();
        let ip: IpAddr = "198.51.100.9".parse().unwrap();
        assert_eq!(out.addresses, vec![ip]);
        assert!(t.resolved_for(ip, "www.example.com", now));
        assert!(t.resolved_for(ip, "cdn.example.net", now));
        let back = Message::from_vec(&out.bytes).unwrap();
        assert_eq!(back.answers.len(), 2);
        assert!(
            back.answers
                .iter()
                .all(|r| r.record_type() != RecordType::AAAA)
        );

        // TTLs are clamped into the bounds, in the bytes and in the table.
        let mut t = DnsTable::new(16);
        let out = filter_response(&bytes, &question, &mut t, now, &|_| true, 10..=30).unwrap();
        let back = Message::from_vec(&out.bytes).unwrap();
        assert!(back.answers.iter().all(|r| (10..=30).contains(&r.ttl)));
        assert!(!t.resolved_for(ip, "www.example.com", now + Duration::from_secs(31)));

        // Every address refused: nothing recorded, private_answer set.
        let mut t = DnsTable::new(16);
        let out =
            filter_response(&bytes, &question, &mut t, now, &|a| a != ip, 0..=u32::MAX).unwrap();
        assert!(out.private_answer);
        assert!(out.addresses.is_empty());
        assert!(t.is_empty());
    }

    #[test]
    fn mismatched_or_garbage_responses_are_errors() {
        let (_, question) = parse_query(&query("a.example.", RecordType::A)).unwrap();
        let mut t = DnsTable::new(4);
        assert!(
            filter_response(
                b"\x00\x01garbage",
                &question,
                &mut t,
                Instant::now(),
                &|_| true,
                0..=9
            )
            .is_err()
        );
        let other = Message::response(0x9999, OpCode::Query).to_vec().unwrap();
        assert!(
            filter_response(&other, &question, &mut t, Instant::now(), &|_| true, 0..=9).is_err()
        );
        assert!(parse_query(b"").is_err());
        assert!(parse_query(&other).is_err());
    }

    #[test]
    fn local_responses_keep_id_and_question() {
        let (qmsg, _) = parse_query(&query("v6.example.", RecordType::AAAA)).unwrap();
        let bytes = local_response(&qmsg, ResponseCode::NoError).unwrap();
        let m = Message::from_vec(&bytes).unwrap();
        assert_eq!(m.metadata.id, 0x1234);
        assert_eq!(m.metadata.message_type, MessageType::Response);
        assert_eq!(m.queries.len(), 1);
        assert!(m.answers.is_empty());
        let sf = minimal_servfail(&query("x.example.", RecordType::A)).unwrap();
        let m = Message::from_vec(&sf).unwrap();
        assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
        assert_eq!(m.metadata.id, 0x1234);
    }
}

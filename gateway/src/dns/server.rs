//! The guest side of DNS: a guest query's bytes in, the answer's bytes out
//! with a typed [`Outcome`] for the audit line and the counters.
//!
//! Order for each query: read it (sluice-inspect's reader, FORMERR and
//! friends for what does not read); the policy's decision on the name
//! (denials answered locally; under `unlisted: ask` a plain allowlist miss
//! is held while the approval backend decides, `server/hold.rs`); the type (anything but A answered with an
//! empty NOERROR); the sandbox's answer cache (a repeat within the TTL is
//! answered here, TTLs counted down); else the question goes upstream
//! ([`super::upstream`]), collapsed with an identical question in flight.
//! Every answer handed to the guest, fresh or cached, is sanitised under
//! the policy in force at that moment and recorded in the [`DnsTable`]
//! before its bytes are returned, so a connection that follows an answer
//! can never race it and the table always holds what the guest was told.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::net::{IpAddr, SocketAddrV4};
use std::ops::RangeInclusive;
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::RecordType;
use sluice_inspect::dns::{DnsReject, Sanitized, sanitize_response_clamped};
use smoltcp::socket::tcp;

use super::approval::{Approvals, Outgoing};
use super::table::DnsTable;
use super::upstream::{MAX_TCP_MESSAGE, UpstreamKey, UpstreamReply};
use hold::APPROVED;
use std::borrow::Cow;

use sluice_policy::Reason;

use crate::decide::{Decider, DnsDecision, Verdict};

/// A validated guest query (sluice-inspect's reader: one IN question, opcode
/// QUERY, the name normalised exactly as the policy normalises names).
pub(crate) use sluice_inspect::dns::Query as Question;

/// Distinct questions forwarded at once; beyond it the guest gets SERVFAIL.
pub(crate) const MAX_IN_FLIGHT: usize = 256;
/// Guest queries waiting on one question in flight; beyond it SERVFAIL.
pub(crate) const MAX_WAITERS_PER_QUESTION: usize = 64;
/// Answers cached at once (per sandbox). When full, expired answers are
/// dropped (at most one sweep a second); if none had expired, the answer
/// that expires first is dropped to make room for the new one.
pub(crate) const MAX_CACHED_ANSWERS: usize = 4096;

/// Who asked: where the answer goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Asker {
    /// A UDP query from this guest endpoint.
    Udp(SocketAddrV4),
    /// A query on the DNS-over-TCP flow with this id.
    Tcp(u64),
}

/// What became of one guest query (the audit line and counters follow it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The query could not be read (no name): answered with this code.
    Unreadable(ResponseCode),
    /// The policy refused the name: answered `rcode` locally.
    Denied {
        /// The answer's code.
        rcode: ResponseCode,
        /// The decider's verdict.
        verdict: Verdict,
    },
    /// A type the gateway does not ask upstream for: empty NOERROR.
    TypeWithheld,
    /// No resolver configured, or too many queries in flight: SERVFAIL.
    Busy,
    /// An answer (from upstream or from the cache) handed on.
    Answered {
        /// The answer's code.
        rcode: ResponseCode,
        /// The addresses handed on (and recorded).
        addresses: Vec<IpAddr>,
        /// Served from the sandbox's cache.
        cached: bool,
        /// The decider's verdict on the name (`dns_answered`, the rule
        /// that allowed it).
        verdict: Verdict,
    },
    /// The answer's CNAME chain passes through a name the policy denies.
    ChainDenied {
        /// The decider's verdict on the chain.
        verdict: Verdict,
    },
    /// Every address in the answer was refused (rebinding defense).
    PrivateAnswer {
        /// `private_answer`, with the rule that allowed the name.
        verdict: Verdict,
    },
    /// No usable upstream answer: SERVFAIL.
    Failed,
}

impl Outcome {
    /// Whether the query counts as denied.
    pub(crate) fn is_denial(&self) -> bool {
        matches!(
            self,
            Outcome::Unreadable(_)
                | Outcome::Denied { .. }
                | Outcome::ChainDenied { .. }
                | Outcome::PrivateAnswer { .. }
        )
    }

    /// The verdict the query's `dns` line carries: the decider's, or for
    /// the outcomes no decider is asked about, the gateway's own.
    pub(crate) fn verdict(&self) -> Cow<'_, Verdict> {
        match self {
            Outcome::Denied { verdict, .. }
            | Outcome::Answered { verdict, .. }
            | Outcome::ChainDenied { verdict }
            | Outcome::PrivateAnswer { verdict } => Cow::Borrowed(verdict),
            Outcome::Unreadable(_) => Cow::Owned(Verdict::of(Reason::DnsFormerr)),
            Outcome::TypeWithheld => Cow::Owned(Verdict::of(Reason::DnsTypeWithheld)),
            Outcome::Busy => Cow::Owned(Verdict::explained(
                Reason::UpstreamError,
                "no upstream resolver or too many queries in flight",
            )),
            Outcome::Failed => Cow::Owned(Verdict::of(Reason::UpstreamError)),
        }
    }

    /// The response code the guest was given.
    pub(crate) fn rcode(&self) -> ResponseCode {
        match self {
            Outcome::Unreadable(rcode)
            | Outcome::Denied { rcode, .. }
            | Outcome::Answered { rcode, .. } => *rcode,
            Outcome::TypeWithheld => ResponseCode::NoError,
            Outcome::Busy | Outcome::Failed => ResponseCode::ServFail,
            Outcome::ChainDenied { .. } | Outcome::PrivateAnswer { .. } => ResponseCode::Refused,
        }
    }
}

/// One answer to deliver.
#[derive(Debug)]
pub(crate) struct Delivery {
    /// Where it goes.
    pub to: Asker,
    /// The question, when the query could be read.
    pub question: Option<Question>,
    /// The bytes; `None` when nothing may be answered (a TCP asker's
    /// connection is then aborted).
    pub bytes: Option<Vec<u8>>,
    /// What happened.
    pub outcome: Outcome,
}

/// What [`DnsServer::query`] did with a query.
#[derive(Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "`Now` is the common case and a `Served` is returned and matched once, never stored: boxing it would allocate per answer"
)]
pub(crate) enum Served {
    /// Answered now.
    Now(Delivery),
    /// Waiting on a question already in flight.
    Joined,
    /// Waiting on a new question: the caller sends it upstream
    /// ([`super::upstream::resolve`]) and hands the reply to
    /// [`DnsServer::answered`].
    Ask(UpstreamKey),
    /// Held for a runtime approval: the caller asks the backend
    /// ([`super::approval::spawn_question`]) and hands the answer to
    /// [`DnsServer::approval_answered`], then
    /// [`DnsServer::approval_decided`].
    Approve(Box<Outgoing>),
}

/// A guest query waiting on an upstream answer.
#[derive(Debug)]
struct Waiter {
    to: Asker,
    question: Question,
}

/// A cached upstream answer (id 0, TTLs already clamped).
#[derive(Debug)]
struct Cached {
    message: Message,
    stored: Instant,
    expires: Instant,
}

/// The sandbox's DNS server: its name-to-address table, its answer cache and
/// the questions in flight. One per gateway (one sandbox); never shared.
#[derive(Debug)]
pub(crate) struct DnsServer {
    table: DnsTable,
    cache: HashMap<(String, RecordType), Cached>,
    cache_purged: Option<Instant>,
    pending: HashMap<UpstreamKey, Vec<Waiter>>,
    /// The sandbox's approvals (`unlisted: ask`).
    approvals: Approvals,
    /// Queries held while their name is being asked about, by name (every
    /// query type of a name waits on its one question; `server/hold.rs`).
    held: HashMap<String, Vec<Waiter>>,
}

impl DnsServer {
    /// A server whose table holds at most `table_capacity` pairs and that
    /// asks nothing at run time (no sandbox, no approval socket).
    #[cfg(test)]
    pub(crate) fn new(table_capacity: usize) -> Self {
        Self::with_approvals(table_capacity, Approvals::new("", Default::default()))
    }

    /// A server that asks about unlisted names through `approvals`.
    pub(crate) fn with_approvals(table_capacity: usize, approvals: Approvals) -> Self {
        Self {
            table: DnsTable::new(table_capacity),
            cache: HashMap::new(),
            cache_purged: None,
            pending: HashMap::new(),
            approvals,
            held: HashMap::new(),
        }
    }

    /// The sandbox's runtime approvals (for the flow decider).
    pub(crate) fn approvals(&self) -> &Approvals {
        &self.approvals
    }

    /// Keeps only the table's names that `keep` says the policy allows, or
    /// that a standing approval still opens while `still_asks` says the
    /// policy would still ask about them (a reload).
    pub(crate) fn retain_names(
        &mut self,
        keep: impl Fn(&str) -> bool,
        still_asks: impl Fn(&str) -> bool,
        now: Instant,
    ) -> usize {
        let approvals = &self.approvals;
        self.table
            .retain_names(|name| keep(name) || (still_asks(name) && approvals.allows(name, now)))
    }

    /// The name-to-address table.
    pub(crate) fn table(&self) -> &DnsTable {
        &self.table
    }

    /// The name-to-address table, to pin names, purge and reload it.
    pub(crate) fn table_mut(&mut self) -> &mut DnsTable {
        &mut self.table
    }

    /// Questions in flight upstream.
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Forgets every cached answer (a reload: the next query of each name is
    /// decided and asked afresh).
    pub(crate) fn clear_cache(&mut self) {
        self.cache.clear();
    }

    /// Serves one guest query. `can_forward`: a resolver is configured.
    pub(crate) fn query(
        &mut self,
        bytes: &[u8],
        to: Asker,
        decider: &dyn Decider,
        can_forward: bool,
        now: Instant,
    ) -> Served {
        let question = match sluice_inspect::dns::parse_query(bytes) {
            Ok(q) => q,
            Err(e) => {
                tracing::debug!(error = %e, "bad DNS query from guest");
                return Served::Now(Delivery {
                    to,
                    question: None,
                    bytes: sluice_inspect::dns::reject_response(bytes, &e),
                    outcome: Outcome::Unreadable(e.rcode()),
                });
            }
        };
        match decider.dns_query(&question.name) {
            DnsDecision::Forward(_) => {}
            DnsDecision::Answer { rcode, verdict } => {
                let bytes = sluice_inspect::dns::error_response(&question, rcode);
                return Served::Now(deliver(
                    to,
                    question,
                    bytes,
                    Outcome::Denied { rcode, verdict },
                ));
            }
            // Held until decided; a name a standing decision opens goes on
            // as a listed one.
            DnsDecision::Ask(about) => {
                if let Some(served) = self.hold(to, question.clone(), &about, now) {
                    return served;
                }
            }
        }
        self.forward(to, question, decider, can_forward, now)
    }

    /// The rest of a query's way once its name may be resolved: the type,
    /// the cache, then upstream (collapsed with an identical question).
    fn forward(
        &mut self,
        to: Asker,
        question: Question,
        decider: &dyn Decider,
        can_forward: bool,
        now: Instant,
    ) -> Served {
        if !forwarded_type(question.qtype) {
            let bytes = sluice_inspect::dns::error_response(&question, ResponseCode::NoError);
            return Served::Now(deliver(to, question, bytes, Outcome::TypeWithheld));
        }
        if let Some(delivery) = self.cached_answer(to, &question, decider, now) {
            return Served::Now(delivery);
        }
        let key = UpstreamKey {
            name: question.name.clone(),
            qtype: question.qtype,
            tcp: matches!(to, Asker::Tcp(_)),
        };
        let busy = || {
            let bytes = sluice_inspect::dns::error_response(&question, ResponseCode::ServFail);
            Served::Now(deliver(to, question.clone(), bytes, Outcome::Busy))
        };
        if !can_forward {
            return busy();
        }
        let in_flight = self.pending.len();
        match self.pending.entry(key) {
            Entry::Occupied(mut waiting) => {
                if waiting.get().len() >= MAX_WAITERS_PER_QUESTION {
                    return busy();
                }
                waiting.get_mut().push(Waiter { to, question });
                Served::Joined
            }
            Entry::Vacant(slot) => {
                if in_flight >= MAX_IN_FLIGHT {
                    return busy();
                }
                let key = slot.key().clone();
                slot.insert(vec![Waiter { to, question }]);
                Served::Ask(key)
            }
        }
    }

    /// Hands an upstream reply to every guest query waiting on it, each
    /// with its own id and question, and caches it when it carried addresses.
    pub(crate) fn answered(
        &mut self,
        reply: UpstreamReply,
        decider: &dyn Decider,
        now: Instant,
    ) -> Vec<Delivery> {
        let waiters = self.pending.remove(&reply.key).unwrap_or_default();
        let ttl = ttl_range(decider);
        let mut out = Vec::with_capacity(waiters.len());
        let mut cacheable = false;
        for w in waiters {
            let delivery = match &reply.message {
                Some(message) => {
                    let d =
                        self.finish(w.to, w.question, message, ttl.clone(), decider, now, false);
                    cacheable |= matches!(&d.outcome, Outcome::Answered { addresses, .. } if !addresses.is_empty());
                    d
                }
                None => {
                    let bytes =
                        sluice_inspect::dns::error_response(&w.question, ResponseCode::ServFail);
                    deliver(w.to, w.question, bytes, Outcome::Failed)
                }
            };
            out.push(delivery);
        }
        if cacheable && let Some(message) = &reply.message {
            self.store(&reply.key, message, ttl, now);
        }
        out
    }

    /// The cached answer for `question`, TTLs counted down, re-sanitised and
    /// recorded under the policy in force now; `None` when nothing valid
    /// is cached.
    fn cached_answer(
        &mut self,
        to: Asker,
        question: &Question,
        decider: &dyn Decider,
        now: Instant,
    ) -> Option<Delivery> {
        let key = (question.name.clone(), question.qtype);
        let cached = self.cache.get(&key)?;
        if cached.expires <= now {
            self.cache.remove(&key);
            return None;
        }
        let elapsed =
            u32::try_from(now.duration_since(cached.stored).as_secs()).unwrap_or(u32::MAX);
        let mut message = cached.message.clone();
        for record in &mut message.answers {
            record.ttl = record.ttl.saturating_sub(elapsed);
        }
        let bytes = message.to_vec().ok()?;
        let ttl = 0..=u32::MAX;
        let d = self.finish(to, question.clone(), &bytes, ttl, decider, now, true);
        Some(d)
    }

    /// Caches `message` (the upstream answer to `key`, id 0) with its
    /// answer TTLs clamped into `ttl`, for the shortest of them.
    fn store(&mut self, key: &UpstreamKey, message: &[u8], ttl: RangeInclusive<u32>, now: Instant) {
        let Ok(mut message) = Message::from_vec(message) else {
            return;
        };
        let (lo, hi) = (*ttl.start(), (*ttl.end()).max(*ttl.start()));
        let mut shortest = u32::MAX;
        for record in &mut message.answers {
            record.ttl = record.ttl.clamp(lo, hi);
            shortest = shortest.min(record.ttl);
        }
        if shortest == 0 || shortest == u32::MAX {
            return;
        }
        if self.cache.len() >= MAX_CACHED_ANSWERS {
            // At most one sweep of expired answers a second; when the cache
            // is still full, the answer that expires first makes room, so a
            // sandbox that has asked for many names still has its newest
            // ones answered locally.
            if self
                .cache_purged
                .is_none_or(|t| now.saturating_duration_since(t) >= Duration::from_secs(1))
            {
                self.cache_purged = Some(now);
                self.cache.retain(|_, c| c.expires > now);
            }
            if self.cache.len() >= MAX_CACHED_ANSWERS
                && let Some(first) = self
                    .cache
                    .iter()
                    .min_by_key(|(_, c)| c.expires)
                    .map(|(k, _)| k.clone())
            {
                self.cache.remove(&first);
            }
        }
        self.cache.insert(
            (key.name.clone(), key.qtype),
            Cached {
                message,
                stored: now,
                expires: now + Duration::from_secs(u64::from(shortest)),
            },
        );
    }

    /// Turns an upstream answer (id 0) into `question`'s answer for `to`:
    /// the name re-checked against the policy in force, the bytes sanitised
    /// (TTLs into `ttl`), a CNAME chain through a denied name refused, the
    /// kept addresses recorded, truncation for a UDP asker whose payload
    /// size the answer exceeds.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &mut self,
        to: Asker,
        question: Question,
        message: &[u8],
        ttl: RangeInclusive<u32>,
        decider: &dyn Decider,
        now: Instant,
        cached: bool,
    ) -> Delivery {
        // A reload may have denied the name while the question was in
        // flight; a name asked about goes on only while an approval opens it.
        let allowed = match decider.dns_query(&question.name) {
            DnsDecision::Forward(verdict) => verdict,
            DnsDecision::Ask(_) if self.approvals.allows(&question.name, now) => {
                Verdict::explained(Reason::DnsAnswered, APPROVED)
            }
            DnsDecision::Ask(_) => {
                let bytes = sluice_inspect::dns::refused_response(&question);
                let rcode = ResponseCode::Refused;
                let verdict = Verdict::of(Reason::ApprovalDenied);
                return deliver(to, question, bytes, Outcome::Denied { rcode, verdict });
            }
            DnsDecision::Answer { rcode, verdict } => {
                let bytes = sluice_inspect::dns::error_response(&question, rcode);
                return deliver(to, question, bytes, Outcome::Denied { rcode, verdict });
            }
        };
        let mut message = message.to_vec();
        if let Some(id) = message.get_mut(..2) {
            id.copy_from_slice(&question.id.to_be_bytes());
        }
        let clean = match sanitize(&question, &message, |ip| decider.keep_dns_answer(ip), ttl) {
            Ok(clean) => clean,
            Err(e) => {
                tracing::debug!(error = %e, name = %question.name, "upstream DNS answer rejected");
                let bytes = sluice_inspect::dns::error_response(&question, ResponseCode::ServFail);
                return deliver(to, question, bytes, Outcome::Failed);
            }
        };
        // A chain through a denied name is refused before anything is recorded.
        if let Some(verdict) = clean
            .cname_chain
            .iter()
            .find_map(|target| decider.dns_cname_target(target))
        {
            let bytes = sluice_inspect::dns::refused_response(&question);
            return deliver(to, question, bytes, Outcome::ChainDenied { verdict });
        }
        if clean.private_answer() {
            let bytes = sluice_inspect::dns::refused_response(&question);
            let verdict = Verdict {
                reason: Reason::PrivateAnswer,
                ..allowed
            };
            return deliver(to, question, bytes, Outcome::PrivateAnswer { verdict });
        }
        record(&question, &clean, &mut self.table, now);
        // An `allow_once` lasts as long as the answer the guest holds.
        if let Some(shortest) = clean.answers.iter().map(|(_, _, ttl)| *ttl).min() {
            self.approvals.answer_ttl(
                &question.name,
                Duration::from_secs(u64::from(shortest)),
                now,
            );
        }
        let addresses = clean.answers.iter().map(|(_, ip, _)| *ip).collect();
        let outcome = Outcome::Answered {
            rcode: clean.rcode,
            addresses,
            cached,
            verdict: allowed,
        };
        // Too big for the guest's UDP payload: TC, retry over TCP.
        let bytes = match to {
            Asker::Udp(_) if clean.bytes.len() > question.max_udp_payload() => {
                sluice_inspect::dns::truncated(&question)
            }
            _ => Some(clean.bytes),
        };
        deliver(to, question, bytes, outcome)
    }
}

fn deliver(to: Asker, question: Question, bytes: Option<Vec<u8>>, outcome: Outcome) -> Delivery {
    Delivery {
        to,
        question: Some(question),
        bytes,
        outcome,
    }
}

/// The policy's TTL bounds in seconds (everything without a policy).
fn ttl_range(decider: &dyn Decider) -> RangeInclusive<u32> {
    match decider.dns_ttl_bounds() {
        Some((min, max)) => {
            let secs = |d: Duration| u32::try_from(d.as_secs()).unwrap_or(u32::MAX);
            secs(min)..=secs(max)
        }
        None => 0..=u32::MAX,
    }
}

/// Whether the gateway asks upstream for `qtype` at all. Only A is answered
/// (IPv6 is off, so AAAA is withheld); every other type (HTTPS/SVCB, which
/// would carry ECH configurations and alternative endpoints, TXT, MX, ...)
/// gets an empty NOERROR answer locally and is audited `dns_type_withheld`.
/// CNAME chains leading to A records are part of A answers.
pub(crate) fn forwarded_type(qtype: RecordType) -> bool {
    qtype == RecordType::A
}

/// Sanitises an upstream answer (its id already the guest's) to `question`
/// with [`sluice_inspect::dns::sanitize_response_clamped`]: IPv6 off; only
/// the A records at the end of the question's CNAME chain survive; TTLs
/// clamped into `ttl`; `keep(ip)` refuses addresses (rebinding defense).
/// Nothing is recorded.
pub(crate) fn sanitize(
    question: &Question,
    upstream: &[u8],
    keep: impl Fn(IpAddr) -> bool,
    ttl: RangeInclusive<u32>,
) -> Result<Sanitized, DnsReject> {
    sanitize_response_clamped(question, upstream, |_, ip| keep(ip), false, ttl)
}

/// Records every kept address of `clean` in `table` under its owner name and
/// under the question's name (the name the guest will send as SNI / Host);
/// nothing for a private answer.
pub(crate) fn record(question: &Question, clean: &Sanitized, table: &mut DnsTable, now: Instant) {
    if !clean.private_answer() {
        for (owner, ip, ttl) in &clean.answers {
            let ttl = Duration::from_secs(u64::from(*ttl));
            table.insert(*ip, owner, ttl, now);
            table.insert(*ip, &question.name, ttl, now);
        }
    }
}

/// Takes one complete length-prefixed DNS-over-TCP message off the front of
/// `inbuf` (RFC 1035 4.2.2: a 2-byte big-endian length, then the message);
/// `None` until one has arrived whole. Pure: no I/O, never panics.
#[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
pub fn tcp_message(inbuf: &mut Vec<u8>) -> Option<Vec<u8>> {
    let [hi, lo, ..] = inbuf[..] else {
        return None;
    };
    let len = usize::from(u16::from_be_bytes([hi, lo]));
    if inbuf.len() < 2 + len {
        return None;
    }
    Some(inbuf.drain(..2 + len).skip(2).collect())
}

/// The most a DNS-over-TCP connection buffers from the guest: one whole
/// message and its prefix.
#[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
pub const TCP_INBUF_MAX: usize = MAX_TCP_MESSAGE + 2;

/// Writes `reply` length-prefixed to the guest's DNS-over-TCP socket, whole
/// or not at all: when there is no reply, it is too long for the prefix, or
/// the socket's send buffer cannot take it whole, the connection is aborted.
pub(crate) fn send_tcp_reply(sock: &mut tcp::Socket<'_>, reply: Option<&[u8]>) {
    let framed = reply.and_then(|b| u16::try_from(b.len()).ok().map(|len| (len, b)));
    match framed {
        Some((len, b)) if sock.send_capacity() - sock.send_queue() >= b.len() + 2 => {
            let _ = sock.send_slice(&len.to_be_bytes());
            let _ = sock.send_slice(b);
        }
        _ => sock.abort(),
    }
}

mod hold;
#[cfg(test)]
mod tests;

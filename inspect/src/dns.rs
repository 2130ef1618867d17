//! DNS message sanitising for the gateway's resolver.
//!
//! Pure functions over wire bytes (UDP payloads, or TCP messages without
//! their two-byte length prefix), built on `hickory-proto`:
//!
//! - [`parse_query`] accepts a guest query with exactly one question for the
//!   IN class and opcode QUERY, whose name normalises like the policy's
//!   ([`sluice_name::normalize_labels`], the one normaliser: ASCII
//!   `[a-z0-9-_]` labels, lowercase, no trailing dot; a label holding a dot
//!   is refused). Undecodable input (truncation, compression loops,
//!   over-long names) and odd names get [`DnsReject`] with the response code
//!   to answer ([`DnsReject::rcode`]), built by [`reject_response`] or
//!   [`formerr_response`].
//! - [`refused_response`], [`nxdomain_response`] and [`error_response`] answer
//!   a parsed query locally (denied names never leave the machine).
//! - [`sanitize_response`] turns an upstream answer into what the guest may
//!   see: only A records (and AAAA when IPv6 is on) for the question's name
//!   and the CNAME chain leading to them from the question; every other type
//!   gets an empty NOERROR answer. That includes HTTPS and SVCB (types 65 and
//!   64): they are withheld entirely, so clients never learn ECH
//!   configurations (and so never send an encrypted ClientHello the gateway
//!   could not read) nor alternative endpoints. Addresses the caller's
//!   `keep_addr` refuses are dropped and counted; authority and additional
//!   sections are stripped (this drops the SOA of negative answers, so guests
//!   do not cache NXDOMAIN beyond their own defaults).
//!
//! Responses are encoded with name compression. The caller owns transport
//! limits: a sanitised answer can still exceed the guest's UDP payload size
//! ([`Query::max_udp_payload`]); the caller then answers with TC set (for
//! example [`error_response`] with `ResponseCode::NoError` and
//! [`truncated`]) so the guest retries over TCP.

use std::net::IpAddr;
use std::ops::RangeInclusive;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query as Question, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};

use crate::name::NameError;

/// The EDNS UDP payload size the gateway advertises in its answers.
pub const EDNS_PAYLOAD: u16 = 1232;
/// The longest CNAME chain followed from the question's name.
pub const MAX_CNAME_CHAIN: usize = 16;

/// Why a DNS message was refused. Each variant maps to one audit reason
/// ([`DnsReject::reason`]) and a response code ([`DnsReject::rcode`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DnsReject {
    /// The message cannot be decoded: truncated, a compression loop, a name
    /// longer than 255 octets, bad record data.
    #[error("undecodable DNS message")]
    Malformed,
    /// The message is a response, or its opcode is not QUERY.
    #[error("not a standard query")]
    NotQuery,
    /// The query does not have exactly one question.
    #[error("DNS query with {0} questions")]
    QuestionCount(usize),
    /// The question's class is not IN.
    #[error("DNS query class is not IN")]
    NotInternet,
    /// The question's name does not normalise (non-ASCII, odd characters,
    /// empty labels, the root name).
    #[error("DNS query name refused: {0}")]
    BadName(NameError),
    /// An upstream response whose id or question differs from the query, or
    /// which is not a response.
    #[error("upstream DNS response does not match the query")]
    Mismatch,
    /// An upstream response with a broken CNAME chain (several CNAMEs for
    /// one name, a loop, or a chain longer than [`MAX_CNAME_CHAIN`]).
    #[error("upstream DNS response with an unusable CNAME chain")]
    BadChain,
}

impl DnsReject {
    /// The audit reason string.
    pub fn reason(&self) -> &'static str {
        match self {
            DnsReject::Malformed => "dns_malformed",
            DnsReject::NotQuery => "dns_not_query",
            DnsReject::QuestionCount(_) => "dns_question_count",
            DnsReject::NotInternet => "dns_not_in_class",
            DnsReject::BadName(_) => "dns_bad_name",
            DnsReject::Mismatch => "dns_upstream_mismatch",
            DnsReject::BadChain => "dns_upstream_bad_chain",
        }
    }

    /// The response code to answer the guest with: FORMERR for input the
    /// guest got wrong, NOTIMP for other opcodes, REFUSED for other classes,
    /// SERVFAIL when the upstream answer is unusable.
    pub fn rcode(&self) -> ResponseCode {
        match self {
            DnsReject::Malformed | DnsReject::QuestionCount(_) | DnsReject::BadName(_) => {
                ResponseCode::FormErr
            }
            DnsReject::NotQuery => ResponseCode::NotImp,
            DnsReject::NotInternet => ResponseCode::Refused,
            DnsReject::Mismatch | DnsReject::BadChain => ResponseCode::ServFail,
        }
    }
}

/// The EDNS parameters of a query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EdnsInfo {
    /// The requester's UDP payload size (at least 512).
    pub max_payload: u16,
    /// The DNSSEC OK bit.
    pub dnssec_ok: bool,
}

/// A validated guest query.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Query {
    /// The message id, echoed in every answer.
    pub id: u16,
    /// The question's name, normalised like the policy's names.
    pub name: String,
    /// The question's type.
    pub qtype: RecordType,
    /// The question's class (always IN after [`parse_query`]).
    pub qclass: DNSClass,
    /// Recursion desired.
    pub rd: bool,
    /// Checking disabled.
    pub cd: bool,
    /// The query's EDNS OPT record, if any.
    pub edns: Option<EdnsInfo>,
    /// The question as sent (original letter case), echoed in answers.
    pub question: Question,
}

impl Query {
    /// The largest UDP answer the guest accepts: its EDNS payload size, or
    /// 512 without EDNS.
    pub fn max_udp_payload(&self) -> usize {
        self.edns
            .map_or(512, |e| usize::from(e.max_payload.max(512)))
    }
}

/// Normalises a hickory name with the one normaliser, label by label
/// ([`sluice_name::normalize_labels`]): a label holding a dot is refused,
/// not re-split, since the policy could only ever see the re-split name.
pub fn normalize_name(name: &Name) -> Result<String, NameError> {
    sluice_name::normalize_labels(name.iter()).map(String::from)
}

/// Parses and validates a guest query.
pub fn parse_query(bytes: &[u8]) -> Result<Query, DnsReject> {
    let message = Message::from_vec(bytes).map_err(|_| DnsReject::Malformed)?;
    let meta = &message.metadata;
    if meta.message_type != MessageType::Query || meta.op_code != OpCode::Query {
        return Err(DnsReject::NotQuery);
    }
    let [question] = message.queries.as_slice() else {
        return Err(DnsReject::QuestionCount(message.queries.len()));
    };
    let name = normalize_name(&question.name).map_err(DnsReject::BadName)?;
    if question.query_class != DNSClass::IN {
        return Err(DnsReject::NotInternet);
    }
    Ok(Query {
        id: meta.id,
        name,
        qtype: question.query_type,
        qclass: question.query_class,
        rd: meta.recursion_desired,
        cd: meta.checking_disabled,
        edns: message.edns.as_ref().map(|e| EdnsInfo {
            max_payload: e.max_payload(),
            dnssec_ok: e.flags().dnssec_ok,
        }),
        question: question.clone(),
    })
}

/// A response skeleton for `query`: id, question, RD/CD echoed, RA set, and
/// an OPT record when the query had one.
fn response_for(query: &Query, rcode: ResponseCode) -> Message {
    let mut message = Message::error_msg(query.id, OpCode::Query, rcode);
    message.metadata.recursion_desired = query.rd;
    message.metadata.checking_disabled = query.cd;
    message.metadata.recursion_available = true;
    message.add_query(query.question.clone());
    if query.edns.is_some() {
        let mut edns = Edns::new();
        edns.set_max_payload(EDNS_PAYLOAD);
        message.set_edns(edns);
    }
    message
}

/// Encodes a message; `None` only if hickory cannot encode what we built
/// (a name from a validated query always encodes).
fn encode(message: &Message) -> Option<Vec<u8>> {
    message.to_vec().ok()
}

/// An answer with `rcode` and no records for a parsed query.
pub fn error_response(query: &Query, rcode: ResponseCode) -> Option<Vec<u8>> {
    encode(&response_for(query, rcode))
}

/// REFUSED for a parsed query.
pub fn refused_response(query: &Query) -> Option<Vec<u8>> {
    error_response(query, ResponseCode::Refused)
}

/// NXDOMAIN for a parsed query.
pub fn nxdomain_response(query: &Query) -> Option<Vec<u8>> {
    error_response(query, ResponseCode::NXDomain)
}

/// An empty NOERROR answer with the TC bit set, telling the guest to retry
/// over TCP.
pub fn truncated(query: &Query) -> Option<Vec<u8>> {
    let mut message = response_for(query, ResponseCode::NoError);
    message.metadata.truncation = true;
    encode(&message)
}

/// FORMERR for bytes that did not parse, echoing the id, opcode and RD bit
/// (no question: it could not be read).
///
/// Returns `None` when there is nothing to answer: fewer than 12 bytes (no
/// header), or the QR bit is set (never answer a response: that would let a
/// forged packet start a loop).
pub fn formerr_response(bytes: &[u8]) -> Option<Vec<u8>> {
    header_response(bytes, ResponseCode::FormErr)
}

/// The answer for a [`DnsReject`] from [`parse_query`]: like
/// [`formerr_response`] but with the reject's response code.
pub fn reject_response(bytes: &[u8], reject: &DnsReject) -> Option<Vec<u8>> {
    if let (DnsReject::NotInternet, Ok(message)) = (reject, Message::from_vec(bytes)) {
        // The question was readable: echo it.
        let mut response = Message::error_msg(
            message.metadata.id,
            message.metadata.op_code,
            ResponseCode::Refused,
        );
        response.metadata.recursion_desired = message.metadata.recursion_desired;
        response.add_queries(message.queries);
        return encode(&response);
    }
    header_response(bytes, reject.rcode())
}

fn header_response(bytes: &[u8], rcode: ResponseCode) -> Option<Vec<u8>> {
    let [id_hi, id_lo, flags, ..] = *bytes else {
        return None;
    };
    if bytes.len() < 12 || flags & 0x80 != 0 {
        return None;
    }
    let op_code = OpCode::from_u8((flags >> 3) & 0x0f);
    let mut message = Message::error_msg(u16::from_be_bytes([id_hi, id_lo]), op_code, rcode);
    message.metadata.recursion_desired = flags & 0x01 != 0;
    encode(&message)
}

/// An upstream answer made fit for the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Sanitized {
    /// The wire answer for the guest.
    pub bytes: Vec<u8>,
    /// The upstream response code, passed through (NOERROR, NXDOMAIN,
    /// SERVFAIL, ...).
    pub rcode: ResponseCode,
    /// The addresses kept: owner name (normalised; the end of the CNAME
    /// chain), address, TTL (as upstream gave it, or clamped by
    /// [`sanitize_response_clamped`]).
    pub answers: Vec<(String, IpAddr, u32)>,
    /// The CNAME targets followed from the question's name, in order
    /// (normalised).
    pub cname_chain: Vec<String>,
    /// How many address records `keep_addr` refused.
    pub dropped_private: usize,
}

impl Sanitized {
    /// Whether refusing addresses emptied the answer: the caller answers an
    /// error instead of `bytes` and audits `private_answer`.
    pub fn private_answer(&self) -> bool {
        self.dropped_private > 0 && self.answers.is_empty()
    }
}

/// Sanitises the upstream answer `upstream` to `query` (see the module
/// documentation for the rules).
///
/// `keep_addr(qname, ip)` is asked for every A/AAAA address at the end of the
/// chain, with the question's normalised name; `false` drops the address.
/// `ipv6`: whether AAAA questions are answered at all (when `false` they get
/// an empty NOERROR answer).
pub fn sanitize_response(
    query: &Query,
    upstream: &[u8],
    keep_addr: impl Fn(&str, IpAddr) -> bool,
    ipv6: bool,
) -> Result<Sanitized, DnsReject> {
    sanitize_response_clamped(query, upstream, keep_addr, ipv6, 0..=u32::MAX)
}

/// [`sanitize_response`], with every kept record's TTL (CNAMEs and
/// addresses, in `bytes` and in [`Sanitized::answers`]) clamped into `ttl`.
///
/// The gateway passes the policy's TTL bounds, so the guest re-resolves no
/// later than the gateway's name-to-IP entry expires.
pub fn sanitize_response_clamped(
    query: &Query,
    upstream: &[u8],
    keep_addr: impl Fn(&str, IpAddr) -> bool,
    ipv6: bool,
    ttl: RangeInclusive<u32>,
) -> Result<Sanitized, DnsReject> {
    let clamp = |t: u32| t.clamp(*ttl.start(), (*ttl.end()).max(*ttl.start()));
    let message = Message::from_vec(upstream).map_err(|_| DnsReject::Malformed)?;
    let meta = &message.metadata;
    if meta.message_type != MessageType::Response || meta.id != query.id {
        return Err(DnsReject::Mismatch);
    }
    let [question] = message.queries.as_slice() else {
        return Err(DnsReject::Mismatch);
    };
    if question.query_type != query.qtype
        || question.query_class != query.qclass
        || normalize_name(&question.name).as_deref() != Ok(query.name.as_str())
    {
        return Err(DnsReject::Mismatch);
    }
    let rcode = meta.response_code;
    let mut out = response_for(query, rcode);
    out.metadata.recursion_available = meta.recursion_available;
    out.metadata.truncation = meta.truncation;

    let mut answers = Vec::new();
    let mut cname_chain = Vec::new();
    let mut dropped_private = 0;
    let answered = match query.qtype {
        RecordType::A => true,
        RecordType::AAAA => ipv6,
        _ => false,
    };
    if answered && rcode == ResponseCode::NoError {
        // Index the answer section once by normalised owner name; records
        // whose owner does not normalise can never be on the chain.
        let records: Vec<(String, &Record)> = message
            .answers
            .iter()
            .filter(|r| r.dns_class == DNSClass::IN)
            .filter_map(|r| normalize_name(&r.name).ok().map(|n| (n, r)))
            .collect();
        let mut current = query.name.clone();
        loop {
            let mut cnames = records
                .iter()
                .filter(|(owner, r)| *owner == current && r.record_type() == RecordType::CNAME);
            let Some((_, record)) = cnames.next() else {
                break;
            };
            if cnames.next().is_some() || cname_chain.len() >= MAX_CNAME_CHAIN {
                return Err(DnsReject::BadChain);
            }
            let RData::CNAME(target) = &record.data else {
                return Err(DnsReject::BadChain);
            };
            let target = normalize_name(&target.0).map_err(|_| DnsReject::BadChain)?;
            if target == query.name || cname_chain.contains(&target) {
                return Err(DnsReject::BadChain);
            }
            let mut kept = (*record).clone();
            kept.name = Name::from_ascii(&current).map_err(|_| DnsReject::BadChain)?;
            kept.ttl = clamp(kept.ttl);
            out.add_answer(kept);
            cname_chain.push(target.clone());
            current = target;
        }
        for (owner, record) in records.iter().filter(|(owner, _)| *owner == current) {
            let ip = match (&record.data, query.qtype) {
                (RData::A(a), RecordType::A) => IpAddr::V4(a.0),
                (RData::AAAA(aaaa), RecordType::AAAA) => IpAddr::V6(aaaa.0),
                _ => continue,
            };
            if keep_addr(&query.name, ip) {
                let mut kept = (*record).clone();
                kept.ttl = clamp(kept.ttl);
                answers.push((owner.clone(), ip, kept.ttl));
                out.add_answer(kept);
            } else {
                dropped_private += 1;
            }
        }
    }
    let bytes = encode(&out).ok_or(DnsReject::Malformed)?;
    Ok(Sanitized {
        bytes,
        rcode,
        answers,
        cname_chain,
        dropped_private,
    })
}

#[cfg(test)]
mod tests;

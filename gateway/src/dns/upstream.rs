//! Queries to the upstream resolvers, made by the gateway on the guest's
//! behalf. Nothing the guest chose leaves the machine but the question's
//! (normalised) name and its type:
//!
//! - a fresh id from the system CSPRNG for every query sent (one per
//!   resolver tried), never the guest's;
//! - a fresh socket per query, bound to port 0, so the kernel picks a random
//!   ephemeral source port each time;
//! - header bits set by the gateway: RD=1, CD=0, no other flag; an EDNS OPT
//!   record with the gateway's payload size, no options, DO clear;
//! - the name in random letter case ("0x20": one random bit per letter),
//!   which an answer must echo exactly: extra entropy an off-path spoofer
//!   must guess, and no letter case of the guest's reaches upstream.
//!
//! An answer counts only when it comes from the resolver's address and
//! port, is a response, carries the id sent and echoes exactly the question
//! sent (name in the same case, type, class IN) ([`accept`]). Anything else
//! is dropped and counted, and the query keeps waiting until its deadline.

use std::net::SocketAddr;
use std::time::Duration;

use hickory_proto::op::{Edns, Message, MessageType, Query};
use hickory_proto::rr::{DNSClass, Name, RecordType};
use ring::rand::{SecureRandom, SystemRandom};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

/// Largest DNS message accepted over TCP (the 2-byte length prefix allows 65535).
pub(crate) const MAX_TCP_MESSAGE: usize = 65535;

/// One distinct question asked upstream: guest queries with equal keys
/// while one is in flight share its answer.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
pub struct UpstreamKey {
    /// The normalised name (what the policy checked).
    pub name: String,
    /// The question's type.
    pub qtype: RecordType,
    /// Over TCP (the guest asked over TCP, e.g. after a truncated answer).
    pub tcp: bool,
}

/// The outcome of one [`resolve`].
#[derive(Debug)]
#[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
pub struct UpstreamReply {
    /// The question asked.
    pub key: UpstreamKey,
    /// The first accepted answer, its id set to 0 (the caller writes each
    /// guest's id); `None` when no resolver answered acceptably in time.
    pub message: Option<Vec<u8>>,
    /// Datagrams dropped because [`accept`] refused them.
    pub dropped: u32,
}

/// Why no query could be built: nothing is sent (fail closed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
pub enum QueryError {
    /// The system random number generator failed.
    #[error("the system random number generator failed")]
    Random,
    /// The name does not encode (never for a name from a validated query).
    #[error("the name does not encode")]
    Encode,
}

/// A query as sent upstream: what an answer must match.
#[derive(Debug, Clone)]
#[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
pub struct SentQuery {
    /// The random id.
    pub id: u16,
    /// The name in the random letter case sent.
    pub name: Name,
    /// The question's type.
    pub qtype: RecordType,
    /// The wire bytes.
    pub bytes: Vec<u8>,
}

/// Why an upstream datagram was not taken as the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
pub enum Mismatch {
    /// It came from another address or port than the resolver asked.
    #[error("answer from another address or port")]
    Source,
    /// It does not parse as a DNS message.
    #[error("answer does not parse")]
    Malformed,
    /// It is not a response.
    #[error("not a response")]
    NotResponse,
    /// Its id is not the one sent.
    #[error("wrong id")]
    Id,
    /// Its question is not exactly the one sent (count, name case, type, class).
    #[error("wrong question")]
    Question,
}

/// Random bytes one query takes: 2 for the id, 32 for the case of up to
/// 256 name bytes.
#[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
pub const QUERY_RANDOM_BYTES: usize = 2 + 32;

/// [`build_query`] with fresh bytes from `rng`.
pub(crate) fn random_query(
    name: &str,
    qtype: RecordType,
    rng: &dyn SecureRandom,
) -> Result<SentQuery, QueryError> {
    let mut random = [0u8; QUERY_RANDOM_BYTES];
    rng.fill(&mut random).map_err(|_| QueryError::Random)?;
    build_query(name, qtype, &random)
}

/// Builds the upstream query for (`name`, `qtype`) from `random`: the id
/// is its first two bytes, the letter case of the name's `i`-th byte its
/// bit `i` after those; RD set, CD clear, EDNS with the gateway's payload
/// size and nothing else. `name` is a normalised name (lower case, no
/// trailing dot). Errs only if the name does not encode (never for a name
/// from a validated guest query): nothing is sent then.
#[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
pub fn build_query(
    name: &str,
    qtype: RecordType,
    random: &[u8; QUERY_RANDOM_BYTES],
) -> Result<SentQuery, QueryError> {
    let id = u16::from_be_bytes([random[0], random[1]]);
    let case_bits = &random[2..];
    let cased: String = name
        .bytes()
        .enumerate()
        .map(|(i, b)| {
            let bit = case_bits
                .get((i / 8) % case_bits.len())
                .is_some_and(|byte| (byte >> (i % 8)) & 1 == 1);
            char::from(if bit { b.to_ascii_uppercase() } else { b })
        })
        .collect();
    // A name from the guest's validated query always encodes; fail closed.
    let name = Name::from_ascii(format!("{cased}.")).map_err(|_| QueryError::Encode)?;
    let mut message = Message::query();
    message.metadata.id = id;
    message.metadata.recursion_desired = true;
    message.metadata.checking_disabled = false;
    message.add_query(Query::query(name.clone(), qtype));
    let mut edns = Edns::new();
    edns.set_max_payload(sluice_inspect::dns::EDNS_PAYLOAD);
    message.set_edns(edns);
    let bytes = message.to_vec().map_err(|_| QueryError::Encode)?;
    Ok(SentQuery {
        id,
        name,
        qtype,
        bytes,
    })
}

/// Whether `bytes`, received from `from`, answers `sent`, which was sent to
/// `resolver`: same address and port, a response, the id sent, and exactly
/// one question equal to the one sent with the letter case compared
/// exactly.
#[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
pub fn accept(
    sent: &SentQuery,
    resolver: SocketAddr,
    from: SocketAddr,
    bytes: &[u8],
) -> Result<(), Mismatch> {
    if from != resolver {
        return Err(Mismatch::Source);
    }
    let message = Message::from_vec(bytes).map_err(|_| Mismatch::Malformed)?;
    if message.metadata.message_type != MessageType::Response {
        return Err(Mismatch::NotResponse);
    }
    if message.metadata.id != sent.id {
        return Err(Mismatch::Id);
    }
    let [question] = message.queries.as_slice() else {
        return Err(Mismatch::Question);
    };
    // Label bytes compared as they are: hickory's `Name` equality ignores case.
    if question.query_type != sent.qtype
        || question.query_class != DNSClass::IN
        || !question.name.iter().eq(sent.name.iter())
    {
        return Err(Mismatch::Question);
    }
    Ok(())
}

/// Asks each of `upstreams` in turn (each with a new query, socket and
/// id), `per_try` each, until one answers acceptably.
pub(crate) async fn resolve(
    key: UpstreamKey,
    upstreams: Vec<SocketAddr>,
    per_try: Duration,
) -> UpstreamReply {
    let rng = SystemRandom::new();
    let mut dropped = 0u32;
    for resolver in &upstreams {
        let Ok(sent) = random_query(&key.name, key.qtype, &rng) else {
            break;
        };
        let answer = if key.tcp {
            tokio::time::timeout(per_try, ask_tcp(&sent, *resolver))
                .await
                .ok()
                .flatten()
        } else {
            ask_udp(&sent, *resolver, per_try, &mut dropped).await
        };
        if let Some(mut message) = answer {
            // The guest's id is written per waiter; never ours.
            if let Some(id) = message.get_mut(..2) {
                id.copy_from_slice(&[0, 0]);
            }
            return UpstreamReply {
                key,
                message: Some(message),
                dropped,
            };
        }
    }
    UpstreamReply {
        key,
        message: None,
        dropped,
    }
}

/// One UDP query from a fresh socket; datagrams [`accept`] refuses are
/// counted in `dropped` and the wait goes on until `per_try` is over.
async fn ask_udp(
    sent: &SentQuery,
    resolver: SocketAddr,
    per_try: Duration,
    dropped: &mut u32,
) -> Option<Vec<u8>> {
    let bind: SocketAddr = if resolver.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        ([0u16; 8], 0).into()
    };
    let sock = UdpSocket::bind(bind).await.ok()?;
    // Connected: the kernel drops datagrams from elsewhere; `accept`
    // checks the source again.
    sock.connect(resolver).await.ok()?;
    sock.send(&sent.bytes).await.ok()?;
    let mut buf = vec![0u8; MAX_TCP_MESSAGE];
    let deadline = tokio::time::Instant::now() + per_try;
    while let Ok(Ok((n, from))) = tokio::time::timeout_at(deadline, sock.recv_from(&mut buf)).await
    {
        let bytes = buf.get(..n)?;
        match accept(sent, resolver, from, bytes) {
            Ok(()) => return Some(bytes.to_vec()),
            Err(e) => {
                tracing::debug!(error = %e, %from, "upstream DNS datagram dropped");
                *dropped = dropped.saturating_add(1);
            }
        }
    }
    None
}

/// One TCP query on a fresh connection: one length-prefixed message each way.
async fn ask_tcp(sent: &SentQuery, resolver: SocketAddr) -> Option<Vec<u8>> {
    let len = u16::try_from(sent.bytes.len()).ok()?;
    let mut s = TcpStream::connect(resolver).await.ok()?;
    let from = s.peer_addr().ok()?;
    let mut framed = Vec::with_capacity(sent.bytes.len() + 2);
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(&sent.bytes);
    s.write_all(&framed).await.ok()?;
    let mut l = [0u8; 2];
    s.read_exact(&mut l).await.ok()?;
    let mut buf = vec![0u8; usize::from(u16::from_be_bytes(l))];
    s.read_exact(&mut buf).await.ok()?;
    accept(sent, resolver, from, &buf).ok()?;
    Some(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::OpCode;

    fn answer_to(sent: &SentQuery) -> Message {
        let mut m = Message::response(sent.id, OpCode::Query);
        m.add_query(Query::query(sent.name.clone(), sent.qtype));
        m
    }

    const RESOLVER: &str = "192.0.2.53:53";

    #[test]
    fn queries_carry_fresh_ids_and_case_and_fixed_bits() {
        let rng = SystemRandom::new();
        let a = random_query("www.example.com", RecordType::A, &rng).unwrap();
        let b = random_query("www.example.com", RecordType::A, &rng).unwrap();
        // 16 id bits and 13 case bits: equal by chance once in 2^29.
        assert!(a.id != b.id || a.name.to_ascii() != b.name.to_ascii());
        for q in [&a, &b] {
            let m = Message::from_vec(&q.bytes).unwrap();
            assert_eq!(m.metadata.id, q.id);
            // RD and nothing else: no CD, AD, TC, opcode QUERY.
            assert_eq!(q.bytes[2..4], [0x01, 0x00]);
            assert_eq!(m.queries.len(), 1);
            assert_eq!(
                m.queries[0].name.to_ascii().to_ascii_lowercase(),
                "www.example.com."
            );
            assert!(m.additionals.is_empty());
            let edns = m.edns.unwrap();
            assert!(!edns.flags().dnssec_ok);
            assert_eq!(edns.max_payload(), sluice_inspect::dns::EDNS_PAYLOAD);
        }
        // The case follows the random bits: all ones upper-cases the letters.
        let upper =
            build_query("ab-1.example", RecordType::A, &[0xff; QUERY_RANDOM_BYTES]).unwrap();
        assert_eq!(upper.name.to_ascii(), "AB-1.EXAMPLE.");
        assert_eq!(upper.id, 0xffff);
    }

    #[test]
    fn answers_match_on_source_id_and_exact_question() {
        let resolver: SocketAddr = RESOLVER.parse().unwrap();
        let sent = random_query("www.example.com", RecordType::A, &SystemRandom::new()).unwrap();
        let good = answer_to(&sent).to_vec().unwrap();
        assert_eq!(accept(&sent, resolver, resolver, &good), Ok(()));

        let other_port: SocketAddr = "192.0.2.53:5353".parse().unwrap();
        let other_host: SocketAddr = "192.0.2.54:53".parse().unwrap();
        assert_eq!(
            accept(&sent, resolver, other_port, &good),
            Err(Mismatch::Source)
        );
        assert_eq!(
            accept(&sent, resolver, other_host, &good),
            Err(Mismatch::Source)
        );

        let mut wrong_id = answer_to(&sent);
        wrong_id.metadata.id = sent.id.wrapping_add(1);
        assert_eq!(
            accept(&sent, resolver, resolver, &wrong_id.to_vec().unwrap()),
            Err(Mismatch::Id)
        );
        let mut query = answer_to(&sent);
        query.metadata.message_type = MessageType::Query;
        assert_eq!(
            accept(&sent, resolver, resolver, &query.to_vec().unwrap()),
            Err(Mismatch::NotResponse)
        );
        // Same name in another letter case: a blind guess, refused.
        let mut recased = Message::response(sent.id, OpCode::Query);
        let flipped: String = sent
            .name
            .to_ascii()
            .chars()
            .map(|c| {
                if c.is_ascii_uppercase() {
                    c.to_ascii_lowercase()
                } else {
                    c.to_ascii_uppercase()
                }
            })
            .collect();
        recased.add_query(Query::query(
            Name::from_ascii(&flipped).unwrap(),
            sent.qtype,
        ));
        assert_eq!(
            accept(&sent, resolver, resolver, &recased.to_vec().unwrap()),
            Err(Mismatch::Question)
        );
        let mut other_type = Message::response(sent.id, OpCode::Query);
        other_type.add_query(Query::query(sent.name.clone(), RecordType::AAAA));
        assert_eq!(
            accept(&sent, resolver, resolver, &other_type.to_vec().unwrap()),
            Err(Mismatch::Question)
        );
        let none = Message::response(sent.id, OpCode::Query);
        assert_eq!(
            accept(&sent, resolver, resolver, &none.to_vec().unwrap()),
            Err(Mismatch::Question)
        );
        assert_eq!(
            accept(&sent, resolver, resolver, b"\x00\x01junk"),
            Err(Mismatch::Malformed)
        );
    }

    /// Property: over many random queries and random alterations of their
    /// answers, an answer is accepted exactly when source, id, QR and the
    /// question (case included) are all unchanged.
    #[test]
    fn matching_property_over_random_alterations() {
        let rng = SystemRandom::new();
        let resolver: SocketAddr = RESOLVER.parse().unwrap();
        let names = [
            "a.example",
            "www.example.com",
            "x-y.z.example.net",
            "abcdefghij.example",
        ];
        let mut random = [0u8; 4];
        let mut accepted = 0;
        for round in 0..4000usize {
            let name = names[round % names.len()];
            let sent = random_query(name, RecordType::A, &rng).unwrap();
            rng.fill(&mut random).unwrap();
            let alter_source = random[0] % 4 == 0;
            let alter_id = random[1] % 4 == 0;
            let alter_case = random[2] % 4 == 0
                && sent
                    .name
                    .to_ascii()
                    .bytes()
                    .any(|b| b.is_ascii_alphabetic());
            let alter_qr = random[3] % 8 == 0;
            let mut m = answer_to(&sent);
            if alter_id {
                m.metadata.id ^= 1 << (random[1] % 16);
            }
            if alter_qr {
                m.metadata.message_type = MessageType::Query;
            }
            if alter_case {
                // Flip the case of one letter.
                let mut text: Vec<u8> = sent.name.to_ascii().into_bytes();
                let letters: Vec<usize> = (0..text.len())
                    .filter(|&i| text[i].is_ascii_alphabetic())
                    .collect();
                let i = letters[usize::from(random[2]) % letters.len()];
                text[i] ^= 0x20;
                let flipped = Name::from_ascii(std::str::from_utf8(&text).unwrap()).unwrap();
                m.queries.clear();
                m.add_query(Query::query(flipped, sent.qtype));
            }
            let from: SocketAddr = if alter_source {
                SocketAddr::new(resolver.ip(), 1024 + u16::from(random[0]))
            } else {
                resolver
            };
            let ok = accept(&sent, resolver, from, &m.to_vec().unwrap()).is_ok();
            let expected = !(alter_source || alter_id || alter_case || alter_qr);
            assert_eq!(ok, expected, "round {round}: {m:?} from {from}");
            accepted += usize::from(ok);
        }
        assert!(
            accepted > 500,
            "the property exercised acceptance too: {accepted}"
        );
    }

    #[tokio::test]
    async fn spoofed_datagrams_are_dropped_and_the_real_answer_waited_for() {
        let server = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let spoofer = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let resolver = server.local_addr().unwrap();
        let key = UpstreamKey {
            name: "www.example.com".into(),
            qtype: RecordType::A,
            tcp: false,
        };
        let task = tokio::spawn(resolve(key, vec![resolver], Duration::from_secs(5)));
        let mut buf = vec![0u8; 4096];
        let (n, client) = server.recv_from(&mut buf).await.unwrap();
        let q = Message::from_vec(&buf[..n]).unwrap();
        let mut answer = Message::response(q.metadata.id, OpCode::Query);
        answer.add_query(q.queries[0].clone());
        // Wrong id from the right port; right answer from the wrong port.
        let mut wrong = answer.clone();
        wrong.metadata.id = q.metadata.id.wrapping_add(1);
        server
            .send_to(&wrong.to_vec().unwrap(), client)
            .await
            .unwrap();
        spoofer
            .send_to(&answer.to_vec().unwrap(), client)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        server
            .send_to(&answer.to_vec().unwrap(), client)
            .await
            .unwrap();
        let reply = task.await.unwrap();
        let message = Message::from_vec(&reply.message.unwrap()).unwrap();
        assert_eq!(message.metadata.id, 0, "our id is not handed on");
        // The connected socket drops the wrong port in the kernel; the
        // wrong id reaches `accept` and is counted.
        assert_eq!(reply.dropped, 1);
    }
}

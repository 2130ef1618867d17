//! Fuzz the matching of upstream DNS answers to the gateway's own queries
//! (`sluice_gateway::dns::upstream::{build_query, accept}`).
//!
//! Input: a flag byte, the 34 random bytes of a query (id and letter case),
//! a type, a resolver port and source choice, a name, then either raw
//! answer bytes (flag bit 0 set) or a list of alterations of a well-formed
//! answer. Properties:
//! - a query always builds from a valid name, with the id from the random
//!   bytes and the question in the case they give;
//! - raw bytes are accepted only if they come from the resolver's address
//!   and port, are a response, carry the id sent, have one question and
//!   that question's bytes are exactly those sent (name case included);
//! - a well-formed answer is accepted exactly when no alteration was made,
//!   and refused with the reason of the alteration otherwise.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use hickory_proto::op::{Message, MessageType, OpCode, Query};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType, rdata};
use sluice_gateway::dns::upstream::{Mismatch, QUERY_RANDOM_BYTES, SentQuery, accept, build_query};

const TYPES: [RecordType; 4] = [
    RecordType::A,
    RecordType::AAAA,
    RecordType::HTTPS,
    RecordType::TXT,
];

/// A valid normalised name made of `bytes` (letters, digits, `-` inside a
/// label, a dot every 7 characters), at most 40 characters.
fn name_from(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut name = String::new();
    for (i, &b) in bytes.iter().take(40).enumerate() {
        if i > 0 && i % 7 == 0 {
            name.push('.');
        }
        let in_label = i % 7 != 0 && i % 7 != 6 && i + 1 < bytes.len().min(40);
        let c = if in_label && b >= 250 {
            b'-'
        } else {
            ALPHABET[usize::from(b) % ALPHABET.len()]
        };
        name.push(char::from(c));
    }
    if name.is_empty() {
        name.push('x');
    }
    name
}

/// The question's bytes in a query or answer: the name from offset 12 to
/// its root label, then type and class. `None` if the bytes end first or a
/// label is a compression pointer.
fn question_bytes(msg: &[u8]) -> Option<&[u8]> {
    let mut i = 12;
    loop {
        let len = usize::from(*msg.get(i)?);
        if len == 0 {
            return msg.get(12..i + 5);
        }
        if len > 63 {
            return None;
        }
        i += len + 1;
    }
}

/// One fuzz input (the libFuzzer target and the corpus replay call this).
pub fn run(data: &[u8]) {
    const HEAD: usize = 1 + QUERY_RANDOM_BYTES + 4;
    if data.len() < HEAD + 1 {
        return;
    }
    let (head, rest) = data.split_at(HEAD);
    let flags = head[0];
    let mut random = [0u8; QUERY_RANDOM_BYTES];
    random.copy_from_slice(&head[1..1 + QUERY_RANDOM_BYTES]);
    let tail = &head[1 + QUERY_RANDOM_BYTES..];
    let qtype = TYPES[usize::from(tail[0]) % TYPES.len()];
    let port = u16::from_be_bytes([tail[1], tail[2]]);
    let resolver_ip: IpAddr = if flags & 2 == 0 {
        Ipv4Addr::new(192, 0, 2, 53).into()
    } else {
        Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x53).into()
    };
    let resolver = SocketAddr::new(resolver_ip, port);
    // The source an answer comes from: the resolver, or one port or one
    // address away.
    let from = match tail[3] % 4 {
        0 | 1 => resolver,
        2 => SocketAddr::new(resolver_ip, port.wrapping_add(1)),
        _ => SocketAddr::new(Ipv4Addr::new(192, 0, 2, 54).into(), port),
    };
    let name_len = 1 + usize::from(rest[0]) % 40;
    let name_bytes = rest.get(1..1 + name_len).unwrap_or(&rest[1..]);
    let name = name_from(name_bytes);
    let answer = rest.get(1 + name_len..).unwrap_or_default();

    let Ok(sent) = build_query(&name, qtype, &random) else {
        panic!("a valid name `{name}` did not build a query");
    };
    assert_eq!(sent.id, u16::from_be_bytes([random[0], random[1]]));
    assert_eq!(
        sent.name.to_ascii().to_ascii_lowercase(),
        format!("{name}.")
    );
    assert_eq!(sent.bytes.get(..2), Some(&sent.id.to_be_bytes()[..]));

    if flags & 1 == 1 {
        raw(&sent, resolver, from, answer);
    } else {
        structured(&sent, resolver, from, answer);
    }
}

/// Arbitrary bytes as the answer: accepted only when every part that
/// identifies the query is exactly what was sent.
fn raw(sent: &SentQuery, resolver: SocketAddr, from: SocketAddr, answer: &[u8]) {
    if accept(sent, resolver, from, answer).is_err() {
        return;
    }
    assert_eq!(from, resolver, "accepted from another source");
    assert!(answer.len() >= 12, "accepted a short message");
    assert_eq!(&answer[..2], &sent.id.to_be_bytes(), "accepted another id");
    assert!(answer[2] & 0x80 != 0, "accepted a query");
    assert_eq!(&answer[4..6], &[0, 1], "accepted a question count != 1");
    let asked = question_bytes(&sent.bytes);
    assert!(asked.is_some(), "the query's question does not read");
    assert_eq!(
        question_bytes(answer),
        asked,
        "accepted another question (bytes differ)"
    );
}

/// A well-formed answer, altered as `ops` says: accepted exactly when
/// nothing was altered, else refused for the alteration's reason.
fn structured(sent: &SentQuery, resolver: SocketAddr, from: SocketAddr, ops: &[u8]) {
    let mut m = Message::response(sent.id, OpCode::Query);
    m.add_query(Query::query(sent.name.clone(), sent.qtype));
    if sent.qtype == RecordType::A {
        m.add_answer(Record::from_rdata(
            sent.name.clone(),
            60,
            RData::A(rdata::A::new(192, 0, 2, 1)),
        ));
    }
    let mut expected = (from != resolver).then_some(Mismatch::Source);
    for &op in ops.iter().take(4) {
        let why = match op % 6 {
            0 => {
                // From the id sent, so two alterations never cancel out.
                m.metadata.id = sent.id ^ (1 << (op / 6 % 16));
                Mismatch::Id
            }
            1 => {
                // Flip the case of one letter, if the name has one.
                let text = sent.name.to_ascii();
                let letters: Vec<usize> = text
                    .bytes()
                    .enumerate()
                    .filter(|(_, b)| b.is_ascii_alphabetic())
                    .map(|(i, _)| i)
                    .collect();
                let Some(&i) = letters.get(usize::from(op / 6) % letters.len().max(1)) else {
                    continue;
                };
                let mut bytes = text.into_bytes();
                bytes[i] ^= 0x20;
                let Ok(flipped) = std::str::from_utf8(&bytes).map(Name::from_ascii) else {
                    continue;
                };
                let Ok(flipped) = flipped else {
                    continue;
                };
                m.queries.clear();
                m.add_query(Query::query(flipped, sent.qtype));
                Mismatch::Question
            }
            2 => {
                let other = TYPES[(usize::from(op / 6) % 3 + 1 + type_index(sent.qtype)) % 4];
                let q = Query::query(sent.name.clone(), other);
                m.queries.clear();
                m.add_query(q);
                Mismatch::Question
            }
            3 => {
                m.metadata.message_type = MessageType::Query;
                Mismatch::NotResponse
            }
            4 => {
                m.add_query(Query::query(sent.name.clone(), sent.qtype));
                Mismatch::Question
            }
            _ => {
                let mut q = Query::query(sent.name.clone(), sent.qtype);
                q.set_query_class(DNSClass::CH);
                m.queries.clear();
                m.add_query(q);
                Mismatch::Question
            }
        };
        expected.get_or_insert(why);
    }
    let Ok(bytes) = m.to_vec() else {
        return;
    };
    let got = accept(sent, resolver, from, &bytes);
    match expected {
        None => assert_eq!(got, Ok(()), "an unaltered answer was refused"),
        // The source is checked first; among the others, the first check
        // that fails: not a response, then id, then question.
        Some(Mismatch::Source) => assert_eq!(got, Err(Mismatch::Source)),
        Some(_) => {
            assert!(got.is_err(), "an altered answer was accepted: {m:?}");
            assert_ne!(got, Err(Mismatch::Source));
            assert_ne!(got, Err(Mismatch::Malformed), "{m:?}");
        }
    }
}

fn type_index(t: RecordType) -> usize {
    TYPES.iter().position(|&x| x == t).unwrap_or(0)
}

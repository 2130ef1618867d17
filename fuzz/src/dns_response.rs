//! Fuzz upstream answer sanitising against a fixed query for each type.

use sluice_inspect::dns;

/// Queries for `www.example.com`, id 0x1234: A, AAAA, HTTPS.
const QUERIES: [&[u8]; 3] = [
    b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x03www\x07example\x03com\x00\x00\x01\x00\x01",
    b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x03www\x07example\x03com\x00\x00\x1c\x00\x01",
    b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x03www\x07example\x03com\x00\x00\x41\x00\x01",
];

/// One fuzz input (the libFuzzer target and the corpus replay call this).
pub fn run(data: &[u8]) {
    for (i, raw) in QUERIES.iter().enumerate() {
        let Ok(query) = dns::parse_query(raw) else {
            return;
        };
        let keep = |_: &str, ip: std::net::IpAddr| !ip.is_loopback();
        if let Ok(s) = dns::sanitize_response_clamped(&query, data, keep, i != 0, 30..=600) {
            // The sanitised answer must itself be a valid message, with
            // nothing outside the answer section and every TTL clamped.
            let msg = hickory_proto::op::Message::from_vec(&s.bytes);
            let Ok(msg) = msg else {
                panic!("sanitised answer does not decode");
            };
            assert!(msg.authorities.is_empty() && msg.additionals.is_empty());
            assert!(msg.answers.iter().all(|r| (30..=600).contains(&r.ttl)));
            assert!(s.answers.iter().all(|(_, ip, _)| !ip.is_loopback()));
        }
    }
}

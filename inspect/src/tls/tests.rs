//! ClientHello reader tests: real first flights captured on loopback from
//! curl 7.88 / OpenSSL 3.0 / python3 ssl (see `testdata/tls/README.md`), and
//! crafted hellos for every rejection.

use super::*;

pub(super) const CURL: &[u8] = include_bytes!("../../testdata/tls/curl-https.bin");
pub(super) const CURL_H11: &[u8] = include_bytes!("../../testdata/tls/curl-http11.bin");
pub(super) const OPENSSL_SNI: &[u8] = include_bytes!("../../testdata/tls/openssl-sni.bin");
pub(super) const OPENSSL_NOSNI: &[u8] = include_bytes!("../../testdata/tls/openssl-nosni.bin");
pub(super) const OPENSSL_TLS12: &[u8] = include_bytes!("../../testdata/tls/openssl-tls12.bin");
pub(super) const OPENSSL_GROUPS: &[u8] = include_bytes!("../../testdata/tls/openssl-pq.bin");
pub(super) const OPENSSL_BIG: &[u8] = include_bytes!("../../testdata/tls/openssl-big-alpn.bin");
pub(super) const PYTHON: &[u8] = include_bytes!("../../testdata/tls/python-ssl.bin");

fn read_whole(bytes: &[u8]) -> Progress {
    ClientHelloReader::default().push(bytes)
}

/// Pushes `bytes` in chunks of `step`, stopping at the first answer.
fn read_chunked(bytes: &[u8], step: usize) -> Progress {
    let mut reader = ClientHelloReader::default();
    for chunk in bytes.chunks(step) {
        let progress = reader.push(chunk);
        if progress != Progress::NeedMore {
            return progress;
        }
    }
    Progress::NeedMore
}

fn done(progress: Progress) -> ClientHelloInfo {
    match progress {
        Progress::Done(info) => info,
        other => panic!("expected Done, got {other:?}"),
    }
}

fn rejected(progress: Progress) -> Reject {
    match progress {
        Progress::Reject(reject) => reject,
        other => panic!("expected Reject, got {other:?}"),
    }
}

/// A capture, its expected SNI and ALPN list.
type Capture = (&'static [u8], &'static str, &'static [&'static [u8]]);

#[test]
fn real_client_hellos_are_read() {
    let cases: [Capture; 7] = [
        (CURL, "www.example.com", &[b"h2", b"http/1.1"]),
        (CURL_H11, "api.github.com", &[b"http/1.1"]),
        (OPENSSL_SNI, "example.org", &[]),
        (OPENSSL_TLS12, "tls12.example.net", &[]),
        (OPENSSL_GROUPS, "pq.example.com", &[b"h2", b"http/1.1"]),
        (PYTHON, "python.example.com", &[b"h2", b"http/1.1"]),
        (OPENSSL_BIG, "big.example.com", &[]),
    ];
    for (bytes, name, alpn) in cases {
        let info = done(read_whole(bytes));
        assert_eq!(info.server_name, name);
        if !alpn.is_empty() {
            assert_eq!(
                info.alpn,
                alpn.iter().map(|a| a.to_vec()).collect::<Vec<_>>()
            );
        }
        assert_eq!(info.legacy_version, 0x0303);
        assert!(!info.ech);
        assert_eq!(info.raw, bytes, "raw must be every byte pushed");
    }
}

#[test]
fn real_big_hello_has_all_alpn_names() {
    // OpenSSL with 112 ALPN names: a real 7 KB ClientHello in one record.
    assert!(OPENSSL_BIG.len() > 7000);
    let info = done(read_whole(OPENSSL_BIG));
    assert_eq!(info.alpn.len(), 112);
    assert_eq!(info.alpn.first().map(Vec::as_slice), Some(&b"h2"[..]));
}

#[test]
fn real_hello_without_sni_is_rejected() {
    assert_eq!(rejected(read_whole(OPENSSL_NOSNI)), Reject::SniAbsent);
}

#[test]
fn one_byte_segments_give_the_same_answer() {
    for bytes in [CURL, OPENSSL_SNI, OPENSSL_TLS12, PYTHON, OPENSSL_BIG] {
        let whole = done(read_whole(bytes));
        for step in [1, 2, 3, 5, 7, 100] {
            assert_eq!(done(read_chunked(bytes, step)), whole, "step {step}");
        }
    }
    assert_eq!(rejected(read_chunked(OPENSSL_NOSNI, 1)), Reject::SniAbsent);
}

#[test]
fn partial_hello_needs_more() {
    let mut reader = ClientHelloReader::default();
    assert_eq!(reader.push(&CURL[..CURL.len() - 1]), Progress::NeedMore);
    assert_eq!(reader.push(&[]), Progress::NeedMore);
    assert_eq!(reader.buffered().len(), CURL.len() - 1);
    assert!(matches!(
        reader.push(&CURL[CURL.len() - 1..]),
        Progress::Done(_)
    ));
    // The reader serves one first flight only.
    assert_eq!(reader.push(CURL), Progress::Reject(Reject::NotTls));
}

#[test]
fn bytes_after_the_hello_are_kept_for_replay() {
    let mut flight = CURL.to_vec();
    // A ChangeCipherSpec record, as TLS 1.3 middlebox-compatible clients
    // send before early data.
    flight.extend_from_slice(&[0x14, 0x03, 0x03, 0x00, 0x01, 0x01]);
    let info = done(read_whole(&flight));
    assert_eq!(info.raw, flight);
}

// ---- crafted hellos ----

pub(super) fn u16be(n: usize) -> [u8; 2] {
    u16::try_from(n).unwrap().to_be_bytes()
}

pub(super) fn ext(kind: u16, data: &[u8]) -> Vec<u8> {
    let mut out = kind.to_be_bytes().to_vec();
    out.extend_from_slice(&u16be(data.len()));
    out.extend_from_slice(data);
    out
}

pub(super) fn sni(entries: &[(u8, &[u8])]) -> Vec<u8> {
    let mut list = Vec::new();
    for (kind, name) in entries {
        list.push(*kind);
        list.extend_from_slice(&u16be(name.len()));
        list.extend_from_slice(name);
    }
    let mut data = u16be(list.len()).to_vec();
    data.extend_from_slice(&list);
    ext(EXT_SERVER_NAME, &data)
}

pub(super) fn host(name: &str) -> Vec<u8> {
    sni(&[(0, name.as_bytes())])
}

/// A handshake message (header + ClientHello body) with these extensions.
pub(super) fn handshake(extensions: &[Vec<u8>]) -> Vec<u8> {
    let mut body = vec![0x03, 0x03];
    body.extend_from_slice(&[0x42; 32]);
    body.push(32);
    body.extend_from_slice(&[0x17; 32]);
    body.extend_from_slice(&[0x00, 0x04, 0x13, 0x01, 0x13, 0x02]);
    body.extend_from_slice(&[0x01, 0x00]);
    let exts: Vec<u8> = extensions.concat();
    body.extend_from_slice(&u16be(exts.len()));
    body.extend_from_slice(&exts);
    let len = u32::try_from(body.len()).unwrap().to_be_bytes();
    let mut out = vec![HANDSHAKE_CLIENT_HELLO, len[1], len[2], len[3]];
    out.extend_from_slice(&body);
    out
}

/// Wraps a handshake message into records of at most `fragment` bytes.
pub(super) fn records(message: &[u8], fragment: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for chunk in message.chunks(fragment) {
        out.extend_from_slice(&[CONTENT_HANDSHAKE, 0x03, 0x01]);
        out.extend_from_slice(&u16be(chunk.len()));
        out.extend_from_slice(chunk);
    }
    out
}

pub(super) fn hello(extensions: &[Vec<u8>]) -> Vec<u8> {
    records(&handshake(extensions), MAX_RECORD_LEN)
}

/// A 1216-byte X25519MLKEM768 key share plus an X25519 one.
pub(super) fn pq_key_share() -> Vec<u8> {
    let mut shares = Vec::new();
    shares.extend_from_slice(&[0x11, 0xec]);
    shares.extend_from_slice(&u16be(1216));
    shares.extend_from_slice(&[0xab; 1216]);
    shares.extend_from_slice(&[0x00, 0x1d, 0x00, 0x20]);
    shares.extend_from_slice(&[0xcd; 32]);
    let mut data = u16be(shares.len()).to_vec();
    data.extend_from_slice(&shares);
    ext(51, &data)
}

pub(super) fn alpn(names: &[&[u8]]) -> Vec<u8> {
    let mut list = Vec::new();
    for name in names {
        list.push(u8::try_from(name.len()).unwrap());
        list.extend_from_slice(name);
    }
    let mut data = u16be(list.len()).to_vec();
    data.extend_from_slice(&list);
    ext(EXT_ALPN, &data)
}

#[test]
fn crafted_hello_is_read() {
    let bytes = hello(&[host("Api.Example.COM."), alpn(&[b"h2"]), pq_key_share()]);
    let info = done(read_whole(&bytes));
    assert_eq!(info.server_name, "api.example.com");
    assert_eq!(info.alpn, vec![b"h2".to_vec()]);
}

#[test]
fn hello_split_across_three_records() {
    let message = handshake(&[host("split.example.com"), pq_key_share()]);
    let fragment = message.len() / 3 + 1;
    let bytes = records(&message, fragment);
    assert_eq!(bytes.len(), message.len() + 3 * RECORD_HEADER_LEN);
    assert_eq!(done(read_whole(&bytes)).server_name, "split.example.com");
    assert_eq!(
        done(read_chunked(&bytes, 1)).server_name,
        "split.example.com"
    );
    // Records so small that even the handshake header is split.
    let tiny = records(&message, 1);
    assert_eq!(
        done(read_chunked(&tiny, 3)).server_name,
        "split.example.com"
    );
}

#[test]
fn eight_kilobyte_hello_passes() {
    let padding = ext(21, &vec![0; 7000]);
    let bytes = hello(&[host("big.example.com"), pq_key_share(), padding]);
    assert!(bytes.len() > 8192);
    assert_eq!(
        done(read_chunked(&bytes, 1460)).server_name,
        "big.example.com"
    );
}

#[test]
fn hello_above_the_bound_is_too_large() {
    let padding = ext(21, &vec![0; 6500]);
    let bytes = hello(&[host("big.example.com"), padding]);
    let mut reader = ClientHelloReader::new(4096);
    // The handshake header alone tells: no need to wait for 4 KB.
    assert_eq!(reader.push(&bytes[..9]), Progress::Reject(Reject::TooLarge));
    // A hello that fits exactly is accepted.
    let small = hello(&[host("a.example")]);
    assert!(matches!(
        ClientHelloReader::new(small.len()).push(&small),
        Progress::Done(_)
    ));
    assert_eq!(
        ClientHelloReader::new(small.len() - 1).push(&small),
        Progress::Reject(Reject::TooLarge)
    );
    // A record header declaring more than the bound.
    let mut reader = ClientHelloReader::new(100);
    assert_eq!(
        reader.push(&[0x16, 0x03, 0x01, 0x01, 0x00]),
        Progress::Reject(Reject::TooLarge)
    );
}

#[test]
fn many_records_up_to_the_bound_are_too_large() {
    // Each record adds 5 bytes of framing; a hello in 1-byte records needs
    // six times its size, beyond a tight bound.
    let message = handshake(&[host("a.example")]);
    let bytes = records(&message, 1);
    let mut reader = ClientHelloReader::new(message.len() * 2);
    assert_eq!(
        read_all(&mut reader, &bytes, 7),
        Progress::Reject(Reject::TooLarge)
    );
}

fn read_all(reader: &mut ClientHelloReader, bytes: &[u8], step: usize) -> Progress {
    for chunk in bytes.chunks(step) {
        let progress = reader.push(chunk);
        if progress != Progress::NeedMore {
            return progress;
        }
    }
    Progress::NeedMore
}

#[test]
fn sni_rules() {
    let two_names = sni(&[(0, b"a.example"), (0, b"b.example")]);
    assert_eq!(
        rejected(read_whole(&hello(&[two_names]))),
        Reject::SniMultiple
    );
    let two_kinds = sni(&[(0, b"a.example"), (1, b"b.example")]);
    assert_eq!(
        rejected(read_whole(&hello(&[two_kinds]))),
        Reject::SniMultiple
    );
    let two_exts = [host("a.example"), host("a.example")];
    assert_eq!(rejected(read_whole(&hello(&two_exts))), Reject::SniMultiple);
    assert_eq!(rejected(read_whole(&hello(&[sni(&[])]))), Reject::SniAbsent);
    assert_eq!(
        rejected(read_whole(&hello(&[alpn(&[b"h2"])]))),
        Reject::SniAbsent
    );
    for bad in [
        "b\u{fc}cher.example",
        "a..example",
        "a.example ",
        "",
        ".",
        "a_b$.example",
    ] {
        let bytes = hello(&[host(bad)]);
        assert_eq!(
            rejected(read_whole(&bytes)),
            Reject::SniUnreadable,
            "{bad:?}"
        );
    }
    let other_type = sni(&[(1, b"a.example")]);
    assert_eq!(
        rejected(read_whole(&hello(&[other_type]))),
        Reject::SniUnreadable
    );
}

#[test]
fn hello_without_extensions_has_no_sni() {
    let mut message = handshake(&[]);
    // Drop the (empty) extensions vector entirely and fix the length.
    message.truncate(message.len() - 2);
    let len = u32::try_from(message.len() - 4).unwrap().to_be_bytes();
    message[1..4].copy_from_slice(&len[1..]);
    assert_eq!(
        rejected(read_whole(&records(&message, 4096))),
        Reject::SniAbsent
    );
}

#[test]
fn ech_is_rejected() {
    let ech = ext(EXT_ENCRYPTED_CLIENT_HELLO, &[0; 90]);
    let bytes = hello(&[host("public.example.com"), ech]);
    assert_eq!(rejected(read_whole(&bytes)), Reject::EchPresent);
    assert_eq!(rejected(read_chunked(&bytes, 1)), Reject::EchPresent);
    assert_eq!(Reject::EchPresent.reason(), "ech_present");
    // Opt-in: report the extension and the outer name instead.
    let info = done(
        ClientHelloReader::default()
            .allow_ech_outer(true)
            .push(&bytes),
    );
    assert!(info.ech);
    assert_eq!(info.server_name, "public.example.com");
    // ECH still requires a readable outer SNI.
    let no_sni = hello(&[ext(EXT_ENCRYPTED_CLIENT_HELLO, &[0; 90])]);
    let mut reader = ClientHelloReader::default().allow_ech_outer(true);
    assert_eq!(reader.push(&no_sni), Progress::Reject(Reject::SniAbsent));
}

#[test]
fn esni_and_ech_draft_codepoints_are_rejected() {
    for kind in [0xffce_u16, 0xfe08, 0xfe09, 0xfe0a, 0xfe0b, 0xfe0c] {
        let bytes = hello(&[host("public.example.com"), ext(kind, &[0; 40])]);
        assert_eq!(
            rejected(read_whole(&bytes)),
            Reject::EchPresent,
            "{kind:#x}"
        );
        let info = done(
            ClientHelloReader::default()
                .allow_ech_outer(true)
                .push(&bytes),
        );
        assert!(info.ech, "{kind:#x}");
    }
    // Neighbours of the ranges are ordinary unknown extensions.
    for kind in [0xfe07_u16, 0xfe0e, 0xffcd, 0xffcf] {
        let bytes = hello(&[host("public.example.com"), ext(kind, &[0; 40])]);
        assert!(!done(read_whole(&bytes)).ech, "{kind:#x}");
    }
}

#[test]
fn malformed_extensions_are_unreadable() {
    // An extension whose length runs past the block.
    let mut broken = host("a.example");
    broken[3] = broken[3].wrapping_add(9);
    assert_eq!(
        rejected(read_whole(&hello(&[broken]))),
        Reject::SniUnreadable
    );
    // server_name list length disagreeing with the extension length.
    let mut inner = host("a.example");
    inner[5] = inner[5].wrapping_add(1);
    assert_eq!(
        rejected(read_whole(&hello(&[inner]))),
        Reject::SniUnreadable
    );
    // An empty ALPN name.
    let empty_alpn = alpn(&[b""]);
    let bytes = hello(&[host("a.example"), empty_alpn]);
    assert_eq!(rejected(read_whole(&bytes)), Reject::SniUnreadable);
    // Two extensions of one type.
    let bytes = hello(&[host("a.example"), alpn(&[b"h2"]), alpn(&[b"h2"])]);
    assert_eq!(rejected(read_whole(&bytes)), Reject::SniUnreadable);
}

#[test]
fn not_tls() {
    let cases: [&[u8]; 6] = [
        b"GET / HTTP/1.1\r\nHost: a.example\r\n\r\n",
        b"\x00\x00\x00\x00",
        // SSLv2-compatible ClientHello (two-byte header with the high bit).
        b"\x80\x2e\x01\x00\x02\x00\x15\x00\x00\x00\x10",
        // A handshake record with a bad major version.
        b"\x16\x02\x00\x00\x05",
        // A zero-length handshake record.
        b"\x16\x03\x01\x00\x00",
        // A ServerHello instead of a ClientHello.
        b"\x16\x03\x03\x00\x04\x02\x00\x00\x00",
    ];
    for bytes in cases {
        assert_eq!(rejected(read_whole(bytes)), Reject::NotTls, "{bytes:?}");
        assert_eq!(
            rejected(read_chunked(bytes, 1)),
            Reject::NotTls,
            "{bytes:?}"
        );
    }
    // An alert record in the middle of a fragmented hello.
    let message = handshake(&[host("a.example")]);
    let mut bytes = records(&message[..10], 10);
    bytes.extend_from_slice(&[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28]);
    assert_eq!(rejected(read_whole(&bytes)), Reject::NotTls);
    // A record longer than 2^14.
    assert_eq!(
        rejected(read_whole(b"\x16\x03\x01\x40\x01")),
        Reject::NotTls
    );
    // Truncated body: session id longer than 32.
    let mut message = handshake(&[host("a.example")]);
    message[4 + 34] = 33;
    assert_eq!(
        rejected(read_whole(&records(&message, 4096))),
        Reject::NotTls
    );
}

#[test]
fn garbage_never_panics() {
    // A deterministic sweep of mutations of a real hello: every byte set to
    // a few values, whole and in one-byte pushes. The fuzz target goes further.
    let base = OPENSSL_SNI;
    for i in 0..base.len() {
        for value in [0x00, 0x01, 0x7f, 0xff] {
            let mut bytes = base.to_vec();
            bytes[i] = value;
            let _ = read_whole(&bytes);
            let _ = read_whole(&bytes[..i]);
        }
    }
}

#[test]
fn reasons_are_distinct() {
    let all = [
        Reject::NotTls,
        Reject::SniAbsent,
        Reject::SniMultiple,
        Reject::SniUnreadable,
        Reject::EchPresent,
        Reject::TooLarge,
    ];
    let reasons: HashSet<_> = all.iter().map(|r| r.reason()).collect();
    assert_eq!(reasons.len(), all.len());
}

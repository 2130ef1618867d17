//! Differential test: the reader with the `tls-parser` body parser against
//! the same reader with the hand-written reference parser
//! (`super::reference`), on the fuzz corpus, the test vectors, crafted
//! hellos built from every combination of awkward extensions, and a
//! deterministic set of mutations of all of them. Every input is pushed
//! whole and split into segments; after every push both readers must give
//! the same [`Progress`] (the same `Done` value, or the same [`Reject`]).
//!
//! The mutations come from a fixed-seed generator, so a failure reproduces.

use std::collections::BTreeMap;
use std::path::Path;

use super::tests::{
    CURL, CURL_H11, OPENSSL_BIG, OPENSSL_GROUPS, OPENSSL_NOSNI, OPENSSL_SNI, OPENSSL_TLS12, PYTHON,
    alpn, ext, handshake, hello, host, pq_key_share, records, sni, u16be,
};
use super::*;

/// The TLS fuzz target's seed corpus (fuzz/ is outside the workspace).
const CORPUS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../fuzz/corpus/tls_client_hello"
);

/// The gateway's bound and the fuzz target's.
const BOUNDS: [usize; 2] = [crate::DEFAULT_MAX_BYTES, 4096];

/// A small deterministic generator (SplitMix64): no dependency, and the
/// same sequence on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `0..n` (`n` > 0).
    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % u64::try_from(n).unwrap()).unwrap()
    }

    fn byte(&mut self) -> u8 {
        self.next().to_le_bytes()[0]
    }
}

/// What the two readers said, counted by verdict class, so the test can
/// show it exercised every class.
#[derive(Default)]
struct Tally {
    classes: BTreeMap<&'static str, usize>,
    inputs: usize,
}

impl Tally {
    fn record(&mut self, progress: &Progress) {
        let class = match progress {
            Progress::NeedMore => "need_more",
            Progress::Done(_) => "done",
            Progress::Reject(reject) => reject.reason(),
        };
        *self.classes.entry(class).or_default() += 1;
    }
}

/// Pushes `bytes` cut at the (sorted) offsets `cuts` into a production and
/// a reference reader, and demands equal answers after every push.
fn compare(tally: &mut Tally, label: &str, bytes: &[u8], cuts: &[usize]) {
    for max in BOUNDS {
        for allow_ech in [false, true] {
            let mut ours = ClientHelloReader::new(max).allow_ech_outer(allow_ech);
            let mut reference = ClientHelloReader::new(max)
                .allow_ech_outer(allow_ech)
                .with_body_parser(reference::parse_client_hello);
            let mut start = 0;
            let mut last = Progress::NeedMore;
            for end in cuts.iter().copied().chain([bytes.len()]) {
                let end = end.clamp(start, bytes.len());
                let segment = &bytes[start..end];
                start = end;
                let a = ours.push(segment);
                let b = reference.push(segment);
                assert_eq!(
                    a,
                    b,
                    "{label}: verdicts differ (bound {max}, allow_ech_outer {allow_ech}, \
                     segment ending at {end} of {}, cuts {cuts:?})",
                    bytes.len()
                );
                last = a;
            }
            tally.record(&last);
            tally.inputs += 1;
        }
    }
}

/// Whole, then in fixed steps, then at a few generated cut points.
fn compare_splits(tally: &mut Tally, rng: &mut Rng, label: &str, bytes: &[u8], steps: &[usize]) {
    compare(tally, label, bytes, &[]);
    for &step in steps {
        let cuts: Vec<usize> = (1..bytes.len()).filter(|i| i % step == 0).collect();
        compare(tally, &format!("{label} step {step}"), bytes, &cuts);
    }
    if bytes.len() > 1 {
        for _ in 0..3 {
            let mut cuts: Vec<usize> = (0..1 + rng.below(6))
                .map(|_| 1 + rng.below(bytes.len() - 1))
                .collect();
            cuts.sort_unstable();
            compare(tally, &format!("{label} cut"), bytes, &cuts);
        }
    }
}

/// The fuzz corpus: each file is a segment size (first byte) and an input,
/// as the fuzz target reads it. A missing or empty corpus fails the test.
fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(CORPUS);
    let entries = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("the TLS fuzz corpus {} must exist: {e}", dir.display()));
    let mut files: Vec<(String, Vec<u8>)> = entries
        .map(|entry| {
            let path = entry.expect("a readable corpus entry").path();
            let bytes = std::fs::read(&path)
                .unwrap_or_else(|e| panic!("corpus file {}: {e}", path.display()));
            (path.display().to_string(), bytes)
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "the TLS fuzz corpus {CORPUS} is empty");
    files
}

/// A ClientHello body with every fixed field chosen, for the rules the
/// body parser enforces before the extensions.
fn body(session_id: usize, suites: &[u8], compression: &[u8], tail: &[u8]) -> Vec<u8> {
    let mut body = vec![0x03, 0x03];
    body.extend_from_slice(&[0x42; 32]);
    body.push(u8::try_from(session_id).unwrap());
    body.extend_from_slice(&vec![0x17; session_id]);
    body.extend_from_slice(&u16be(suites.len()));
    body.extend_from_slice(suites);
    body.push(u8::try_from(compression.len()).unwrap());
    body.extend_from_slice(compression);
    body.extend_from_slice(tail);
    body
}

/// A handshake message around a body, in one record.
fn framed(body: &[u8]) -> Vec<u8> {
    let len = u32::try_from(body.len()).unwrap().to_be_bytes();
    let mut message = vec![HANDSHAKE_CLIENT_HELLO, len[1], len[2], len[3]];
    message.extend_from_slice(body);
    records(&message, MAX_RECORD_LEN)
}

/// Bodies that break each fixed-field rule, and each extension-block rule.
fn body_vectors() -> Vec<Vec<u8>> {
    let block = |exts: &[Vec<u8>]| {
        let exts = exts.concat();
        let mut out = u16be(exts.len()).to_vec();
        out.extend_from_slice(&exts);
        out
    };
    let good = block(&[host("a.example")]);
    let suites: &[u8] = &[0x13, 0x01];
    let mut out = Vec::new();
    for session_id in [0, 1, 32, 33, 255] {
        out.push(body(session_id, suites, &[0], &good));
    }
    for bad_suites in [&[][..], &[0x13][..], &[0x13, 0x01, 0x13][..]] {
        out.push(body(32, bad_suites, &[0], &good));
    }
    out.push(body(32, suites, &[], &good));
    out.push(body(32, suites, &[0, 1], &good));
    // No extension block, a lone byte, a block that runs past the body, a
    // block one byte short, and bytes after the block.
    out.push(body(32, suites, &[0], &[]));
    out.push(body(32, suites, &[0], &[0x00]));
    let mut long = good.clone();
    long[1] = long[1].wrapping_add(1);
    out.push(body(32, suites, &[0], &long));
    let mut short = good.clone();
    short[1] = short[1].wrapping_sub(1);
    out.push(body(32, suites, &[0], &short));
    let mut trailing = good.clone();
    trailing.push(0);
    out.push(body(32, suites, &[0], &trailing));
    out.push(body(32, suites, &[0], &block(&[])));
    // Bodies cut short in every fixed field.
    let whole = body(32, suites, &[0], &good);
    for len in [0, 1, 2, 20, 34, 35, 50, 67, 68, 69, 70, 71, 72] {
        out.push(whole[..len.min(whole.len())].to_vec());
    }
    out.into_iter().map(|b| framed(&b)).collect()
}

/// Extensions that each sit at one edge of a rule: well-formed and broken
/// server_name and ALPN data, ECH and ESNI (with contents tls-parser's typed
/// parser would refuse), extensions whose contents we never read, and an
/// extension list cut inside a header.
fn extension_atoms() -> Vec<(&'static str, Vec<u8>)> {
    let sni_data = |data: &[u8]| ext(EXT_SERVER_NAME, data);
    let alpn_data = |data: &[u8]| ext(EXT_ALPN, data);
    let good_list = {
        let mut list = vec![0x00, 0x00, 0x09];
        list.extend_from_slice(b"a.example");
        list
    };
    let with_len = |list: &[u8], delta: i32, trailing: &[u8]| {
        let len = i32::try_from(list.len()).unwrap() + delta;
        let mut out = u16::try_from(len).unwrap().to_be_bytes().to_vec();
        out.extend_from_slice(list);
        out.extend_from_slice(trailing);
        out
    };
    let mut good_then_junk = good_list.clone();
    good_then_junk.push(0x00);
    let mut good_then_short = good_list.clone();
    good_then_short.extend_from_slice(&[0x00, 0x00, 0x05, b'b']);
    vec![
        ("sni", host("a.example")),
        ("sni-upper-dot", host("B.Example.")),
        ("sni-other", host("b.example")),
        ("sni-bad-name", host("a..example")),
        ("sni-empty-name", host("")),
        ("sni-empty-list", sni(&[])),
        ("sni-two", sni(&[(0, b"a.example"), (0, b"b.example")])),
        ("sni-kind1", sni(&[(1, b"a.example")])),
        ("sni-then-kind1", sni(&[(0, b"a.example"), (1, b"x")])),
        ("sni-no-data", sni_data(&[])),
        ("sni-one-byte", sni_data(&[0x00])),
        ("sni-list-long", sni_data(&with_len(&good_list, 1, &[]))),
        ("sni-list-short", sni_data(&with_len(&good_list, -1, &[]))),
        ("sni-trailing", sni_data(&with_len(&good_list, 0, &[0x00]))),
        (
            "sni-entry-junk",
            sni_data(&with_len(&good_then_junk, 0, &[])),
        ),
        (
            "sni-entry-short",
            sni_data(&with_len(&good_then_short, 0, &[])),
        ),
        ("sni-kind1-junk", sni_data(&with_len(&[0x01, 0x00], 0, &[]))),
        ("alpn", alpn(&[b"h2", b"http/1.1"])),
        ("alpn-empty-name", alpn(&[b"h2", b""])),
        ("alpn-empty-list", alpn(&[])),
        ("alpn-no-data", alpn_data(&[])),
        ("alpn-trailing", alpn_data(&with_len(b"\x02h2", 0, &[0x00]))),
        ("alpn-name-long", alpn_data(&with_len(b"\x03h2", 0, &[]))),
        ("alpn-list-long", alpn_data(&with_len(b"\x02h2", 1, &[]))),
        ("ech", ext(EXT_ENCRYPTED_CLIENT_HELLO, &[0; 8])),
        ("ech-draft", ext(0xfe09, &[])),
        ("esni-garbage", ext(EXT_ENCRYPTED_SERVER_NAME, &[1, 2, 3])),
        ("padding", ext(21, &[0; 5])),
        ("grease", ext(0x0a0a, &[])),
        ("max-fragment-empty", ext(1, &[])),
        ("versions-broken", ext(43, &[5])),
        ("key-share", pq_key_share()),
        ("cut-header", vec![0x00, 0x15, 0x00]),
        ("cut-data", vec![0x00, 0x15, 0x00, 0x09, 0x00]),
    ]
}

/// The hellos the unit tests use, and the captures.
fn test_vectors() -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = [
        ("curl", CURL),
        ("curl-h11", CURL_H11),
        ("openssl-sni", OPENSSL_SNI),
        ("openssl-nosni", OPENSSL_NOSNI),
        ("openssl-tls12", OPENSSL_TLS12),
        ("openssl-pq", OPENSSL_GROUPS),
        ("openssl-big", OPENSSL_BIG),
        ("python", PYTHON),
    ]
    .into_iter()
    .map(|(name, bytes)| (name.to_string(), bytes.to_vec()))
    .collect();
    let message = handshake(&[host("split.example.com"), pq_key_share()]);
    out.push((
        "three-records".into(),
        records(&message, message.len() / 3 + 1),
    ));
    out.push(("one-byte-records".into(), records(&message, 1)));
    out.push((
        "8k".into(),
        hello(&[
            host("big.example.com"),
            pq_key_share(),
            ext(21, &vec![0; 7000]),
        ]),
    ));
    out.push((
        "crafted".into(),
        hello(&[host("Api.Example.COM."), alpn(&[b"h2"]), pq_key_share()]),
    ));
    let mut flight = CURL.to_vec();
    flight.extend_from_slice(&[0x14, 0x03, 0x03, 0x00, 0x01, 0x01]);
    out.push(("curl-then-ccs".into(), flight));
    let mut alert = records(&message[..10], 10);
    alert.extend_from_slice(&[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28]);
    out.push(("alert-inside".into(), alert));
    for (i, bytes) in [
        &b"GET / HTTP/1.1\r\nHost: a.example\r\n\r\n"[..],
        b"\x80\x2e\x01\x00\x02\x00\x15\x00\x00\x00\x10",
        b"\x16\x02\x00\x00\x05",
        b"\x16\x03\x01\x00\x00",
        b"\x16\x03\x03\x00\x04\x02\x00\x00\x00",
        b"\x16\x03\x01\x40\x01",
    ]
    .into_iter()
    .enumerate()
    {
        out.push((format!("not-tls-{i}"), bytes.to_vec()));
    }
    for (i, bytes) in body_vectors().into_iter().enumerate() {
        out.push((format!("body-{i}"), bytes));
    }
    out
}

/// Mutations of `base`: every truncation and single-byte change near the
/// front (where the record, handshake and body headers are), generated
/// truncations and byte changes elsewhere, multi-byte changes, and one-byte
/// insertions and deletions that shift every later length field.
fn mutations(rng: &mut Rng, base: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let front = base.len().min(512);
    let mut positions: Vec<usize> = (0..front).collect();
    if base.len() > front {
        positions.extend((0..256).map(|_| front + rng.below(base.len() - front)));
    }
    for &i in &positions {
        out.push(base[..i].to_vec());
        for value in [0x00, 0xff, base[i] ^ 0x01, base[i].wrapping_add(1)] {
            if value != base[i] {
                let mut bytes = base.to_vec();
                bytes[i] = value;
                out.push(bytes);
            }
        }
    }
    if base.is_empty() {
        return out;
    }
    for _ in 0..64 {
        let mut bytes = base.to_vec();
        for _ in 0..1 + rng.below(4) {
            let i = rng.below(bytes.len());
            bytes[i] = rng.byte();
        }
        out.push(bytes);
        let mut bytes = base.to_vec();
        let i = rng.below(bytes.len());
        if rng.below(2) == 0 {
            bytes.remove(i);
        } else {
            bytes.insert(i, rng.byte());
        }
        out.push(bytes);
    }
    out
}

#[test]
fn tls_parser_and_the_reference_agree_on_every_input() {
    let mut rng = Rng(0x5eed_7135);
    let mut tally = Tally::default();
    let steps = [1, 2, 3, 7, 64, 1460];

    let mut bases: Vec<(String, Vec<u8>)> = Vec::new();
    let corpus = corpus();
    for (name, file) in &corpus {
        // As the fuzz target reads it: first byte a segment size.
        let Some((step, input)) = file.split_first() else {
            continue;
        };
        let step = usize::from(*step).max(1);
        let cuts: Vec<usize> = (1..input.len()).filter(|i| i % step == 0).collect();
        compare(&mut tally, name, input, &cuts);
        bases.push((name.clone(), input.to_vec()));
        bases.push((format!("{name} (whole file)"), file.clone()));
    }
    bases.extend(test_vectors());

    for (name, base) in &bases {
        compare_splits(&mut tally, &mut rng, name, base, &steps);
        for (i, mutant) in mutations(&mut rng, base).iter().enumerate() {
            compare(&mut tally, &format!("{name} mutation {i}"), mutant, &[]);
            if i % 16 == 0 && mutant.len() > 1 {
                let cut = 1 + rng.below(mutant.len() - 1);
                compare(&mut tally, &format!("{name} mutation {i}"), mutant, &[cut]);
            }
        }
    }

    // Every ordered choice of up to three awkward extensions.
    let atoms = extension_atoms();
    let mut lists: Vec<Vec<usize>> = vec![vec![]];
    for len in 1..=3 {
        let mut next = Vec::new();
        for list in lists.iter().filter(|l| l.len() == len - 1) {
            for atom in 0..atoms.len() {
                let mut longer = list.clone();
                longer.push(atom);
                next.push(longer);
            }
        }
        lists.extend(next);
    }
    for list in &lists {
        let exts: Vec<Vec<u8>> = list.iter().map(|&i| atoms[i].1.clone()).collect();
        let label: Vec<&str> = list.iter().map(|&i| atoms[i].0).collect();
        let bytes = hello(&exts);
        compare(&mut tally, &format!("extensions {label:?}"), &bytes, &[]);
        if list.len() <= 2 {
            compare_splits(&mut tally, &mut rng, &format!("{label:?}"), &bytes, &[7]);
        }
    }

    eprintln!(
        "differential: {} corpus files, {} inputs, verdicts {:?}",
        corpus.len(),
        tally.inputs,
        tally.classes
    );
    // The inputs reach every verdict, so agreement means something.
    for class in [
        "done",
        "need_more",
        "not_tls",
        "sni_absent",
        "sni_multiple",
        "sni_unreadable",
        "ech_present",
        "too_large",
    ] {
        assert!(
            tally.classes.get(class).is_some_and(|n| *n > 0),
            "no input reached {class}: {:?}",
            tally.classes
        );
    }
}

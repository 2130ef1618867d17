//! Substitution benchmark (not a timed test): throughput of streamed body
//! replacement (request direction and reflection scrubbing), of placeholder
//! scanning of bodies passed through unchanged, and request heads per
//! second.
//!
//! Run: `cargo bench -p sluice-secrets --bench substitute` (optionally
//! `-- MEBIBYTES CHUNK_BYTES`; default 64 and 16384). Prints one line per
//! figure; docs/secrets.md ("Cost") records a run.
#![allow(
    clippy::unwrap_used,
    clippy::cast_precision_loss,
    missing_docs,
    reason = "bench harness"
)]

use std::hint::black_box;
use std::time::Instant;

use sluice_secrets::{SecretStore, Substitutions};
use zeroize::Zeroizing;

const POLICY: &str = "\
version: 1
id: bench
allow:
  - domains: [api.example.com]
secrets:
  - name: one
    placeholder: sk-sluice-placeholder-one
    env: ONE
    hosts: [api.example.com]
    locations: [headers, body]
  - name: two
    placeholder: sk-sluice-placeholder-two
    env: TWO
    hosts: [api.example.com]
    locations: [headers, body]
  - name: three
    placeholder: sk-sluice-placeholder-three
    env: THREE
    hosts: [api.example.com]
    locations: [headers, body]
  - name: four
    placeholder: sk-sluice-placeholder-four
    env: FOUR
    hosts: [api.example.com]
    locations: [headers, body]
";

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let mib: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(64);
    let chunk: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(16384);

    let policy = sluice_policy::from_yaml_str(POLICY, "bench.yaml", &Default::default()).unwrap();
    let store = SecretStore::load_with(&policy, |var| {
        Some(Zeroizing::new(
            format!("real-{var}-0123456789abcdef0123456789abcdef").into_bytes(),
        ))
    })
    .unwrap();
    let sub = store.for_host("api.example.com");

    // A JSON-ish body with one placeholder and one real value every 64 KiB.
    let mut body = Vec::with_capacity(mib << 20);
    let filler = b"{\"id\": 12345, \"text\": \"the quick brown fox jumps over the lazy dog\"},\n";
    while body.len() < mib << 20 {
        if body.len() % 65536 < filler.len() {
            body.extend_from_slice(
                b"sk-sluice-placeholder-two real-THREE-0123456789abcdef0123456789abcdef ",
            );
        }
        body.extend_from_slice(filler);
    }

    for (what, mut rep) in [
        ("request body (4 placeholders)", sub.request_body().unwrap()),
        (
            "response body scrub (4 values)",
            sub.response_body(&Substitutions::default()).unwrap(),
        ),
    ] {
        let mut out = Vec::with_capacity(chunk + 256);
        let start = Instant::now();
        let mut bytes = 0usize;
        for c in body.chunks(chunk) {
            out.clear();
            rep.feed(c, &mut out);
            bytes += out.len();
            black_box(&out);
        }
        out.clear();
        rep.finish(&mut out);
        let secs = start.elapsed().as_secs_f64();
        println!(
            "{what}: {:.0} MiB/s ({} MiB in {chunk}-byte chunks, {} replaced, {bytes} bytes out)",
            mib as f64 / secs,
            mib,
            rep.replaced()
        );
    }

    // Placeholder scanning of request bodies that pass through unchanged
    // (a host none of the four is bound to): the common case has none.
    let clean: Vec<u8> = body
        .split(|&b| b == b'\n')
        .filter(|line| !line.starts_with(b"sk-"))
        .flat_map(|line| line.iter().copied().chain([b'\n']))
        .collect();
    for (what, data) in [
        ("request body scan, no placeholder (4 placeholders)", &clean),
        (
            "request body scan, with placeholders (4 placeholders)",
            &body,
        ),
    ] {
        let mut scan = store
            .for_host("other.example.com")
            .request_body_scanner()
            .unwrap();
        let start = Instant::now();
        for c in data.chunks(chunk) {
            scan.feed(black_box(c));
        }
        let secs = start.elapsed().as_secs_f64();
        println!(
            "{what}: {:.0} MiB/s ({:.0} MiB in {chunk}-byte chunks, seen: {:?})",
            data.len() as f64 / f64::from(1u32 << 20) / secs,
            data.len() as f64 / f64::from(1u32 << 20),
            scan.mismatched()
        );
    }

    let n = 200_000;
    let start = Instant::now();
    for _ in 0..n {
        let (mut parts, ()) = http::Request::builder()
            .method("POST")
            .uri("/v1/chat/completions")
            .header("host", "api.example.com")
            .header("authorization", "Bearer sk-sluice-placeholder-one")
            .header("content-type", "application/json")
            .header("user-agent", "bench/1.0")
            .header("accept", "*/*")
            .header("x-request-id", "0123456789abcdef")
            .body(())
            .unwrap()
            .into_parts();
        let subs = sub.request_head(&mut parts).unwrap();
        black_box((&parts, &subs));
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "request head (6 headers, 1 substitution, incl. building the head): {:.0} heads/s",
        f64::from(n) / secs
    );
}

//! Fuzz secret substitution: streamed bodies and request heads.
//!
//! The first byte picks the mode (its low bit):
//!
//! - stream (even): `n` patterns, each `len, bytes, replacement len, bytes`
//!   (lengths taken modulo small bounds), then `k` chunk sizes, then the
//!   body. The body is fed in chunks of those sizes (cycled; 0 means an
//!   empty feed; no sizes or only zeros: one chunk). Checks: the streamed output equals a one-shot replace and
//!   an independent naive reference; the replacer never holds back
//!   `longest pattern` bytes or more between feeds.
//! - head (odd): the rest is split at `\n`; the first line is the request
//!   target, each further line a header value (names cycle through
//!   authorization, x-a, cookie). Checks: no panic; on error the head is
//!   unchanged; on success no placeholder of a bound header secret is left
//!   outside `authorization`, none of the query secret in the query; if
//!   nothing is reported substituted, nothing changed; and scrubbing the
//!   substituted headers gives back the originals.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use sluice_secrets::{SecretStore, StreamReplacer, Substitutions};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        stream(rest);
    } else {
        head(rest);
    }
});

/// A cursor over the fuzz input.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn byte(&mut self) -> u8 {
        let (&b, rest) = self.0.split_first().unwrap_or((&0, &[]));
        self.0 = rest;
        b
    }
    fn take(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
}

fn stream(data: &[u8]) {
    let mut input = Input(data);
    let npat = 1 + usize::from(input.byte() % 4);
    let mut pairs: Vec<(&[u8], &[u8])> = Vec::new();
    for _ in 0..npat {
        let len = 1 + usize::from(input.byte() % 12);
        let pattern = input.take(len);
        let rlen = usize::from(input.byte() % 16);
        let replacement = input.take(rlen);
        pairs.push((pattern, replacement));
    }
    let nsizes = usize::from(input.byte() % 16);
    let sizes: Vec<usize> = input
        .take(nsizes)
        .iter()
        .map(|&b| usize::from(b % 32))
        .collect();
    // All-zero sizes would never advance: treat them as "one chunk".
    let sizes = if sizes.iter().all(|&s| s == 0) {
        Vec::new()
    } else {
        sizes
    };
    let body = input.0;
    let max_len = pairs.iter().map(|(p, _)| p.len()).max().unwrap_or(0);

    let mut one_shot = StreamReplacer::from_pairs(pairs.iter().copied());
    let mut whole = Vec::new();
    one_shot.feed(body, &mut whole);
    one_shot.finish(&mut whole);

    let mut streamed = StreamReplacer::from_pairs(pairs.iter().copied());
    let mut out = Vec::new();
    let mut at = 0;
    let mut i = 0;
    while at < body.len() {
        let size = if sizes.is_empty() {
            body.len()
        } else {
            sizes[i % sizes.len()]
        };
        i += 1;
        let end = (at + size).min(body.len());
        streamed.feed(&body[at..end], &mut out);
        assert!(
            streamed.pending_len() < max_len.max(1),
            "held back {} bytes, longest pattern {max_len}",
            streamed.pending_len()
        );
        at = end;
    }
    streamed.finish(&mut out);
    assert_eq!(streamed.pending_len(), 0);
    assert_eq!(out, whole, "streamed != one-shot");
    assert_eq!(streamed.replaced(), one_shot.replaced());
    let (reference, count) = naive(&pairs, body);
    assert_eq!(out, reference, "streamed != naive reference");
    assert_eq!(streamed.replaced(), count);
}

/// Leftmost-longest, non-overlapping, written the obvious way.
fn naive(pairs: &[(&[u8], &[u8])], hay: &[u8]) -> (Vec<u8>, u64) {
    let mut out = Vec::new();
    let mut count = 0;
    let mut i = 0;
    while i < hay.len() {
        let mut best: Option<usize> = None;
        for (k, (p, _)) in pairs.iter().enumerate() {
            if !p.is_empty()
                && hay[i..].starts_with(p)
                && best.is_none_or(|b| p.len() > pairs[b].0.len())
            {
                best = Some(k);
            }
        }
        match best {
            Some(k) => {
                out.extend_from_slice(pairs[k].1);
                i += pairs[k].0.len();
                count += 1;
            }
            None => {
                out.push(hay[i]);
                i += 1;
            }
        }
    }
    (out, count)
}

const POLICY: &str = "\
version: 1
id: fuzz
allow:
  - domains: [api.example.com, other.example.com]
secrets:
  - name: hdr
    placeholder: PH-hdr-secret
    env: HDR
    hosts: [api.example.com]
  - name: qry
    placeholder: PH-qry-secret
    env: QRY
    hosts: [api.example.com]
    locations: [headers, query]
  - name: bdy
    placeholder: PH-bdy-secret
    env: BDY
    hosts: [api.example.com]
    locations: [body]
  - name: elsewhere
    placeholder: PH-elsewhere
    env: ELSE
    hosts: [other.example.com]
";

/// Real values: each starts with 0xf0 and has no other 0xf0 byte, and none
/// is a prefix of another, so an occurrence in a substituted value can only
/// be one that substitution put there.
fn store() -> &'static SecretStore {
    static STORE: OnceLock<SecretStore> = OnceLock::new();
    STORE.get_or_init(|| {
        let policy =
            sluice_policy::from_yaml_str(POLICY, "fuzz.yaml", &Default::default()).unwrap();
        SecretStore::load_with(&policy, |var| {
            let v: &[u8] = match var {
                "HDR" => b"\xf0hdr-real",
                "QRY" => b"\xf0qry/real+=",
                "BDY" => b"\xf0bdy-real",
                _ => b"\xf0else-real",
            };
            Some(zeroize::Zeroizing::new(v.to_vec()))
        })
        .unwrap()
    })
}

fn head(data: &[u8]) {
    let store = store();
    let sub = store.for_host("api.example.com");
    let mut lines = data.split(|&b| b == b'\n');
    let target = lines.next().unwrap_or_default();
    let Ok(uri) = http::Uri::try_from(target) else {
        return;
    };
    let names = [
        http::header::AUTHORIZATION,
        http::HeaderName::from_static("x-a"),
        http::header::COOKIE,
    ];
    let mut builder = http::Request::builder().uri(uri);
    for (i, line) in lines.enumerate() {
        let Ok(value) = http::HeaderValue::from_bytes(line) else {
            continue;
        };
        builder = builder.header(names[i % names.len()].clone(), value);
    }
    let Ok(request) = builder.body(()) else {
        return;
    };
    let (mut parts, ()) = request.into_parts();
    let before_headers = parts.headers.clone();
    let before_uri = parts.uri.clone();
    let subs = match sub.request_head(&mut parts) {
        Ok(s) => s,
        Err(_) => {
            assert_eq!(parts.headers, before_headers);
            assert_eq!(parts.uri, before_uri);
            return;
        }
    };
    for (name, value) in &parts.headers {
        if name == http::header::AUTHORIZATION {
            continue;
        }
        let seen = store.placeholders_in(value.as_bytes());
        assert!(
            !seen.contains(&"hdr") && !seen.contains(&"qry"),
            "placeholder left in {name}: {seen:?}"
        );
    }
    if let Some(q) = parts.uri.query() {
        assert!(!store.placeholders_in(q.as_bytes()).contains(&"qry"));
    }

    // Nothing reported as substituted: nothing changed but Accept-Encoding.
    if subs.used.is_empty() {
        let mut after = parts.headers.clone();
        let mut before = before_headers.clone();
        after.remove(http::header::ACCEPT_ENCODING);
        before.remove(http::header::ACCEPT_ENCODING);
        assert_eq!(after, before);
        assert_eq!(parts.uri, before_uri);
    }

    // Reflection: scrubbing the substituted headers restores the originals
    // when the originals held nothing that looks like a real value.
    let looks_real = |v: &[u8]| v.contains(&0xf0) || v.windows(3).any(|w| w == b"%F0");
    if before_headers
        .values()
        .any(|v| looks_real(v.as_bytes()))
    {
        return;
    }
    let mut headers = parts.headers.clone();
    headers.remove(http::header::ACCEPT_ENCODING);
    headers.remove(http::header::AUTHORIZATION);
    let mut want = before_headers.clone();
    want.remove(http::header::ACCEPT_ENCODING);
    want.remove(http::header::AUTHORIZATION);
    sub.response_headers(&Substitutions::default(), &mut headers);
    assert_eq!(headers, want, "scrub(substitute(x)) != x");
}

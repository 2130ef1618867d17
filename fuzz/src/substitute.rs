//! Fuzz secret substitution (streamed bodies, request heads) and the body
//! placeholder scanner.
//!
//! The first byte picks the mode (its low two bits):
//!
//! - stream (`x0`): `n` patterns, each `len, bytes, replacement len, bytes`
//!   (lengths taken modulo small bounds), then `k` chunk sizes, then the
//!   body. The body is fed in chunks of those sizes (cycled; 0 means an
//!   empty feed; no sizes or only zeros: one chunk). Checks: the streamed output equals a one-shot replace and
//!   an independent naive reference; the replacer never holds back
//!   `longest pattern` bytes or more between feeds.
//! - head (`01`): the rest is split at `\n`; the first line is the request
//!   target, each further line a header value (names cycle through
//!   authorization, x-a, cookie). Checks: no panic; on error the head is
//!   unchanged; on success no placeholder of a bound header secret is left
//!   outside `authorization`, none of the query secret in the query; if
//!   nothing is reported substituted, nothing changed; and scrubbing the
//!   substituted headers gives back the originals.
//! - scan (`11`): up to six placeholders (8-16 characters over `ab-_`, each
//!   bound to `api.example.com` with `locations: [body]`, to it with the
//!   default `[headers]`, or to `other.example.com`; one that equals or
//!   contains another, or is contained in one, is dropped as the policy
//!   requires), a compiled policy and store with them, chunk sizes as in
//!   stream mode, then a body built from tokens (whole placeholders, proper
//!   prefixes and suffixes of them, single alphabet bytes, raw bytes).
//!   The same chunks go to three `PlaceholderScanner`s: the request-body
//!   scanner of `api.example.com`, of an unbound host, and
//!   `SecretStore::placeholder_scanner`. Checks, after every chunk: each
//!   reports exactly the secrets whose placeholder a naive search of the
//!   body fed so far finds (`mismatched` for secrets not bound to the host,
//!   `not_allowed` for bound ones not allowing `body`, nothing for bound
//!   ones allowing it), in policy order, and `any()` agrees; at the end,
//!   `SecretStore::placeholders_in` of the whole body says the same.

use std::sync::OnceLock;

use sluice_secrets::{SecretStore, StreamReplacer, Substitutions};

/// One fuzz input (the libFuzzer target and the corpus replay call this).
pub fn run(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode & 3 {
        1 => head(rest),
        3 => scan(rest),
        _ => stream(rest),
    }
}

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
    let sizes = chunk_sizes(&mut input);
    let body = input.0;
    let max_len = pairs.iter().map(|(p, _)| p.len()).max().unwrap_or(0);

    let mut one_shot = StreamReplacer::from_pairs(pairs.iter().copied());
    let mut whole = Vec::new();
    one_shot.feed(body, &mut whole);
    one_shot.finish(&mut whole);

    let mut streamed = StreamReplacer::from_pairs(pairs.iter().copied());
    let mut out = Vec::new();
    for chunk in chunks(body, &sizes) {
        streamed.feed(chunk, &mut out);
        assert!(
            streamed.pending_len() < max_len.max(1),
            "held back {} bytes, longest pattern {max_len}",
            streamed.pending_len()
        );
    }
    streamed.finish(&mut out);
    assert_eq!(streamed.pending_len(), 0);
    assert_eq!(out, whole, "streamed != one-shot");
    assert_eq!(streamed.replaced(), one_shot.replaced());
    let (reference, count) = naive(&pairs, body);
    assert_eq!(out, reference, "streamed != naive reference");
    assert_eq!(streamed.replaced(), count);
}

/// Up to 15 chunk sizes (0..31) from the input. All-zero sizes would never
/// advance: they, like no sizes, mean "one chunk".
fn chunk_sizes(input: &mut Input<'_>) -> Vec<usize> {
    let nsizes = usize::from(input.byte() % 16);
    let sizes: Vec<usize> = input
        .take(nsizes)
        .iter()
        .map(|&b| usize::from(b % 32))
        .collect();
    if sizes.iter().all(|&s| s == 0) {
        Vec::new()
    } else {
        sizes
    }
}

/// `body` cut in pieces of `sizes` (cycled; a 0 gives an empty piece), or
/// whole when `sizes` is empty. The pieces concatenate to `body`.
fn chunks<'a>(body: &'a [u8], sizes: &[usize]) -> Vec<&'a [u8]> {
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
        out.push(&body[at..end]);
        at = end;
    }
    out
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
    if before_headers.values().any(|v| looks_real(v.as_bytes())) {
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

/// How a scan-mode secret is bound.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Binding {
    /// To `api.example.com`, substituted in bodies: never reported there.
    ApiBody,
    /// To `api.example.com`, headers only: `not_allowed` in its bodies.
    ApiHeaders,
    /// To `other.example.com`: `mismatched` in `api.example.com` bodies.
    Other,
}

fn scan(data: &[u8]) {
    const ALPHABET: &[u8] = b"ab-_";
    let mut input = Input(data);
    let n = 1 + usize::from(input.byte() % 6);
    let mut secrets: Vec<(Vec<u8>, Binding)> = Vec::new();
    for _ in 0..n {
        let len = 8 + usize::from(input.byte() % 9);
        let placeholder: Vec<u8> = (0..len)
            .map(|_| ALPHABET[usize::from(input.byte()) % ALPHABET.len()])
            .collect();
        let binding = match input.byte() % 3 {
            0 => Binding::ApiBody,
            1 => Binding::ApiHeaders,
            _ => Binding::Other,
        };
        // The policy rejects placeholders that contain one another.
        if secrets
            .iter()
            .all(|(p, _)| !contains(p, &placeholder) && !contains(&placeholder, p))
        {
            secrets.push((placeholder, binding));
        }
    }
    let sizes = chunk_sizes(&mut input);

    // The body: tokens, each one byte (and a length byte for prefixes and
    // suffixes), so that whole, cut and overlapping placeholders are common.
    let mut body = Vec::new();
    while !input.0.is_empty() {
        let b = input.byte();
        let (p, _) = &secrets[usize::from(b & 0x3f) % secrets.len()];
        match b >> 6 {
            0 => body.extend_from_slice(p),
            1 => {
                let cut = 1 + usize::from(input.byte()) % (p.len() - 1);
                body.extend_from_slice(&p[..cut]);
            }
            2 => {
                let cut = 1 + usize::from(input.byte()) % (p.len() - 1);
                body.extend_from_slice(&p[cut..]);
            }
            _ if b & 0x20 == 0 => body.push(ALPHABET[usize::from(b) % ALPHABET.len()]),
            _ => body.push(b),
        }
    }

    let mut yaml = String::from(
        "version: 1\nid: fuzz\nallow:\n  - domains: [api.example.com, other.example.com]\nsecrets:\n",
    );
    for (i, (p, binding)) in secrets.iter().enumerate() {
        let (host, locations) = match binding {
            Binding::ApiBody => ("api.example.com", "[body]"),
            Binding::ApiHeaders => ("api.example.com", "[headers]"),
            Binding::Other => ("other.example.com", "[headers]"),
        };
        let p = std::str::from_utf8(p).unwrap();
        yaml.push_str(&format!(
            "  - name: s{i}\n    placeholder: \"{p}\"\n    env: S{i}\n    hosts: [{host}]\n    locations: {locations}\n"
        ));
    }
    let policy = sluice_policy::from_yaml_str(&yaml, "fuzz.yaml", &Default::default())
        .unwrap_or_else(|e| panic!("generated policy rejected: {e}\n{yaml}"));
    let store = SecretStore::load_with(&policy, |var| {
        Some(zeroize::Zeroizing::new(format!("value-{var}").into_bytes()))
    })
    .unwrap();
    let names: Vec<String> = (0..secrets.len()).map(|i| format!("s{i}")).collect();

    let api = store.for_host("api.example.com");
    let mut on_api = api.request_body_scanner();
    let unbound_host = store.for_host("unbound.example.com");
    let mut on_unbound = unbound_host
        .request_body_scanner()
        .expect("every placeholder is scanned for on an unbound host");
    let mut all = store.placeholder_scanner();
    // Every secret is body-substituted on api.example.com: nothing to scan.
    assert_eq!(
        on_api.is_none(),
        secrets.iter().all(|(_, b)| *b == Binding::ApiBody)
    );

    // Reference: per secret, whether its placeholder ends at some position
    // of the body fed so far (checked at every new end position).
    let mut found = vec![false; secrets.len()];
    let mut fed = 0;
    for chunk in chunks(&body, &sizes) {
        if let Some(sc) = on_api.as_mut() {
            sc.feed(chunk);
        }
        on_unbound.feed(chunk);
        all.feed(chunk);
        for end in fed + 1..=fed + chunk.len() {
            for (seen, (p, _)) in found.iter_mut().zip(&secrets) {
                *seen |= body[..end].ends_with(p);
            }
        }
        fed += chunk.len();

        let seen_with = |want: &dyn Fn(Binding) -> bool| -> Vec<&str> {
            found
                .iter()
                .zip(&secrets)
                .zip(&names)
                .filter(|((seen, (_, b)), _)| **seen && want(*b))
                .map(|(_, name)| name.as_str())
                .collect()
        };
        let every = seen_with(&|_| true);
        assert_eq!(
            all.mismatched(),
            every,
            "placeholder_scanner after {fed} bytes"
        );
        assert!(all.not_allowed().is_empty());
        assert_eq!(all.any(), !every.is_empty());
        assert_eq!(
            on_unbound.mismatched(),
            every,
            "unbound host after {fed} bytes"
        );
        assert!(on_unbound.not_allowed().is_empty());
        assert_eq!(on_unbound.any(), !every.is_empty());
        if let Some(sc) = &on_api {
            let mismatched = seen_with(&|b| b == Binding::Other);
            let not_allowed = seen_with(&|b| b == Binding::ApiHeaders);
            assert_eq!(
                sc.mismatched(),
                mismatched,
                "api mismatched after {fed} bytes"
            );
            assert_eq!(
                sc.not_allowed(),
                not_allowed,
                "api not_allowed after {fed} bytes"
            );
            assert_eq!(sc.any(), !mismatched.is_empty() || !not_allowed.is_empty());
        }
    }
    assert_eq!(fed, body.len());
    let every: Vec<&str> = found
        .iter()
        .zip(&names)
        .filter(|(seen, _)| **seen)
        .map(|(_, name)| name.as_str())
        .collect();
    assert_eq!(store.placeholders_in(&body), every, "placeholders_in");
}

/// `hay` contains `needle`, the obvious way.
fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

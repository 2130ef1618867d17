use super::*;
use crate::http::ledger::tests::Recorded;
use bytes::Bytes;
use http::HeaderMap;
use hyper::body::{Body, Frame};
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A body that yields the given data frames, one per poll.
struct Frames(std::collections::VecDeque<Bytes>);

impl Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
    }
}

const POLICY: &str = "version: 1\nid: t\nallow:\n  - domains: [a.example.com, b.example.com]\n\
        secrets:\n  - name: tok\n    placeholder: PH-tok-placeholder\n    env: TOK\n    hosts: [a.example.com]\n\
        \x20 - name: bod\n    placeholder: PH-bod-placeholder\n    env: BOD\n    hosts: [a.example.com]\n    locations: [headers, body]\n";

fn store() -> SecretStore {
    let policy = sluice_policy::from_yaml_str(POLICY, "t.yaml", &Default::default()).unwrap();
    SecretStore::load_with(&policy, |var| {
        Some(zeroize::Zeroizing::new(
            format!("REAL-{var}-value").into_bytes(),
        ))
    })
    .unwrap()
}

fn exchange(audit: &Arc<Recorded>, sni: &str) -> Exchange {
    let event = HttpEvent::new(
        Kind::Http,
        Reason::Allowlisted,
        1,
        "10.0.2.15:40000".parse().unwrap(),
        "198.51.100.10:443".parse().unwrap(),
        sni,
    );
    let out: Arc<dyn AuditOut> = audit.clone();
    Exchange::open(out, event, Channel::Tls, Instant::now())
}

/// Streams `chunks` through a request body for `sni` as `prepare` wires
/// it (with `authorization` through the head substitution first), then
/// finishes the exchange; what came out and what was recorded.
async fn send(sni: &str, authorization: &str, chunks: &[&str]) -> (Vec<u8>, Vec<HttpEvent>) {
    let store = store();
    let sub = store.for_host(sni);
    let (mut parts, ()) = Request::builder()
        .uri("/up")
        .header(header::AUTHORIZATION, authorization)
        .body(())
        .unwrap()
        .into_parts();
    let subs = sub.request_head(&mut parts).unwrap();
    let audit = Arc::new(Recorded::default());
    let mut x = exchange(&audit, sni);
    x.head_substituted(&subs);
    let tally = RequestTally::new(sub.request_body_scanner());
    x.forwarded(tally.clone());
    let body = Frames(chunks.iter().map(|c| Bytes::from(c.to_string())).collect());
    let tapped = Tapped::request(body, sub.request_body(), tally);
    let out = tapped.collect().await.unwrap().to_bytes().to_vec();
    x.respond(StatusCode::OK);
    x.finish(Outcome::Completed);
    let mut events = audit.take();
    // The exchange's own record comes last; the rest are mismatches.
    let last = events.pop().unwrap();
    assert_eq!((last.reason, last.status), (Reason::Allowlisted, Some(200)));
    assert_eq!(last.bytes_up, Some(out.len() as u64));
    (out, events)
}

async fn send_body(sni: &str, chunks: &[&str]) -> (Vec<u8>, Vec<HttpEvent>) {
    send(sni, "", chunks).await
}

#[tokio::test]
async fn placeholders_passed_through_in_a_request_body_are_reported_once() {
    // Another host's placeholder, cut across two chunks: passed through
    // byte for byte, one record naming the secrets, never a value.
    let chunks = [
        "x=PH-tok-plac",
        "eholder&y=PH-bod-placeholder&z=PH-tok-placeholder",
    ];
    let (out, events) = send_body("b.example.com", &chunks).await;
    assert_eq!(out, chunks.concat().as_bytes());
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    assert_eq!(e.reason, Reason::SecretHostMismatch);
    assert_eq!(
        e.detail.as_deref(),
        Some(
            "placeholder of secret(s) tok (body), bod (body) sent to b.example.com, \
                 which they are not bound to; passed through unchanged"
        )
    );
    assert!(e.secrets.is_empty());

    // The bound host: `bod` is substituted (not reported), `tok` is bound
    // but not allowed in the body (reported as such).
    let (out, events) = send_body(
        "a.example.com",
        &["PH-tok-placeholder PH-bod-", "placeholder"],
    )
    .await;
    assert_eq!(out, b"PH-tok-placeholder REAL-BOD-value");
    assert_eq!(events.len(), 1, "{events:?}");
    let detail = events[0].detail.clone().unwrap();
    assert!(
            detail.starts_with("placeholder of secret(s) tok (body) sent to a.example.com where their locations do not allow"),
            "{detail}"
        );
    assert!(
        !detail.contains("REAL") && !detail.contains("PH-"),
        "{detail}"
    );

    // In the head and the body of one request: still one record.
    let (_, events) = send(
        "b.example.com",
        "Bearer PH-tok-placeholder",
        &["PH-bod-placeholder"],
    )
    .await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        events[0].detail.as_deref(),
        Some(
            "placeholder of secret(s) tok (head), bod (body) sent to b.example.com, \
                 which they are not bound to; passed through unchanged"
        )
    );
    // Only in the head, no body.
    let (_, events) = send("b.example.com", "Bearer PH-tok-placeholder", &[]).await;
    assert_eq!(events.len(), 1, "{events:?}");

    // No placeholder: no record.
    let (out, events) = send_body("b.example.com", &["PH-tok-", "placeholde", "r-not"]).await;
    assert_eq!(out, b"PH-tok-placeholder-not");
    assert_eq!(
        events.len(),
        1,
        "a placeholder followed by more bytes is still one"
    );
    let (_, events) = send_body("b.example.com", &["nothing ", "to see PH-tok-placeholde"]).await;
    assert!(events.is_empty(), "{events:?}");
}

/// WebSocket to a host with bound secrets needs every one of them opted
/// in; a host without secrets takes it; anything but WebSocket never.
#[test]
fn websocket_needs_every_bound_secret_opted_in() {
    let load = |yaml: &str| {
        let policy = sluice_policy::from_yaml_str(yaml, "t.yaml", &Default::default()).unwrap();
        SecretStore::load_with(&policy, |var| {
            Some(zeroize::Zeroizing::new(
                format!("REAL-{var}-value").into_bytes(),
            ))
        })
        .unwrap()
    };
    let refusal = |store: &SecretStore, sni: &str, ask: Ask| {
        upgrade_refusal(&ask, &store.for_host(sni), sni).map(|r| (r.status, r.reason, r.detail))
    };
    let none = store();
    let (status, reason, detail) = refusal(&none, "a.example.com", Ask::WebSocket).unwrap();
    assert_eq!(
        (status, reason),
        (StatusCode::FORBIDDEN, Reason::UpgradeRefused)
    );
    assert_eq!(
        detail.as_deref(),
        Some(
            "WebSocket refused: secret(s) tok, bod bound to a.example.com not opted in \
                 (`websocket: true`); an upgraded stream is neither substituted nor scrubbed"
        )
    );
    assert!(refusal(&none, "b.example.com", Ask::WebSocket).is_none());
    assert!(refusal(&none, "a.example.com", Ask::None).is_none());

    // One of the two opted in: still refused, naming the other.
    let tok_only = load(&POLICY.replace("    env: TOK\n", "    env: TOK\n    websocket: true\n"));
    let (status, _, detail) = refusal(&tok_only, "a.example.com", Ask::WebSocket).unwrap();
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(detail.unwrap().contains("secret(s) bod bound"));

    let both = load(&POLICY.replace("    env: ", "    websocket: true\n    env: "));
    assert!(refusal(&both, "a.example.com", Ask::WebSocket).is_none());
    let (status, reason, _) = refusal(&both, "a.example.com", Ask::Other("h2c".into())).unwrap();
    assert_eq!(
        (status, reason),
        (StatusCode::NOT_IMPLEMENTED, Reason::UpgradeRefused)
    );
    let (status, _, _) = refusal(&both, "b.example.com", Ask::Other("h2c".into())).unwrap();
    assert_eq!(status, StatusCode::NOT_IMPLEMENTED);
}

/// A scrubbed response body keeps its trailers (scrubbed too), sent
/// after the replacer's held-back tail; the exchange is finished with
/// the bytes the guest got.
#[tokio::test]
async fn scrubbed_body_keeps_scrubbed_trailers() {
    let store = crate::trailers::test_store();
    let sub = store.for_host("api.example.com");
    let subs = Substitutions::default();
    let mut t = HeaderMap::new();
    t.insert("x-echo", HeaderValue::from_static("real-hdr-value"));
    let frames = crate::trailers::Frames(
        [
            Frame::data(Bytes::from_static(b"a real-hdr")),
            Frame::data(Bytes::from_static(b"-value b real-")),
            Frame::trailers(t),
        ]
        .into(),
    );
    let body = TrailerRewrite::new(
        frames,
        TrailerRule::Scrub {
            subst: sub.clone(),
            request: subs.clone(),
        },
    );
    let audit = Arc::new(Recorded::default());
    let mut x = exchange(&audit, "api.example.com");
    x.respond(StatusCode::OK);
    let tapped = Tapped::response(body, sub.response_body(&subs), x);
    let got = tapped.collect().await.unwrap();
    let trailers = got.trailers().cloned().unwrap();
    assert_eq!(trailers["x-echo"], "PH-hdr-secret");
    assert_eq!(&got.to_bytes()[..], b"a PH-hdr-secret b real-");
    let events = audit.take();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].bytes_down, Some(23));
    assert_eq!(events[0].reason, Reason::Allowlisted);
}

/// A response body the guest abandons half way still writes the
/// exchange's one record (the ledger's fallback), and one that breaks
/// writes it with `upstream_error`.
#[tokio::test]
async fn abandoned_and_broken_response_bodies_write_one_record() {
    let audit = Arc::new(Recorded::default());
    let mut x = exchange(&audit, "api.example.com");
    x.respond(StatusCode::OK);
    let body = Frames([Bytes::from_static(b"abc"), Bytes::from_static(b"def")].into());
    let mut tapped = Tapped::response(body, None, x);
    let first = std::future::poll_fn(|cx| Pin::new(&mut tapped).poll_frame(cx)).await;
    assert!(first.is_some());
    assert!(audit.take().is_empty(), "nothing before the end");
    drop(tapped);
    let events = audit.take();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].bytes_down, Some(3));

    struct Broken;
    impl Body for Broken {
        type Data = Bytes;
        type Error = std::io::Error;
        fn poll_frame(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
            Poll::Ready(Some(Err(std::io::Error::other("reset"))))
        }
    }
    let mut x = exchange(&audit, "api.example.com");
    x.respond(StatusCode::OK);
    assert!(Tapped::response(Broken, None, x).collect().await.is_err());
    let events = audit.take();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].reason, Reason::UpstreamError);
}

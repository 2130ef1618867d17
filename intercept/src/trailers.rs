//! Trailers of intercepted messages (HTTP/2 trailing HEADERS, HTTP/1.1
//! chunked trailer fields): treated like the head they follow.
//!
//! - Request trailers go through [`HostSubstituter::request_head`]: the
//!   placeholder of a secret bound to the host is replaced only where that
//!   secret allows `headers`; other placeholders pass unchanged and are
//!   reported like the head's. A substitution that would make a field value
//!   invalid fails the request body (the upstream stream is reset; nothing
//!   half-substituted is sent).
//! - Response trailers go through [`HostSubstituter::response_headers`]:
//!   every real value (and encoded form) becomes what the guest sent.
//!
//! Data frames pass through untouched: body substitution and scrubbing are
//! the `Tapped` body layer (`crate::http::body`), which wraps this one.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{ACCEPT_ENCODING, HeaderMap};
use hyper::body::{Body, Frame, SizeHint};
use sluice_secrets::{HostSubstituter, SubstituteError, Substitutions};

use crate::http::BoxError;
use crate::http::ledger::RequestTally;

/// What to do with a message's trailers.
pub(crate) enum TrailerRule {
    /// Request trailers: substitute as in a request head; what was done and
    /// seen goes to the exchange's `tally` (for the request's audit record).
    Substitute {
        subst: HostSubstituter,
        tally: Arc<RequestTally>,
    },
    /// Response trailers: scrub real values as in a response head.
    /// `request` is what the request head's substitution returned.
    Scrub {
        subst: HostSubstituter,
        request: Substitutions,
    },
}

/// A body whose trailers are rewritten by a [`TrailerRule`].
pub(crate) struct TrailerRewrite<B> {
    inner: B,
    rule: TrailerRule,
}

impl<B> TrailerRewrite<B> {
    pub(crate) fn new(inner: B, rule: TrailerRule) -> Self {
        Self { inner, rule }
    }
}

/// Substitutes placeholders in request trailers as
/// [`HostSubstituter::request_head`] does in a head (headers only: there is
/// no request target here). `Accept-Encoding` is set aside around the call
/// (the substituter forces it to `identity` in heads; in trailers it means
/// nothing and is passed as it came). On error `trailers` is unchanged.
pub(crate) fn substitute_trailers(
    subst: &HostSubstituter,
    trailers: &mut HeaderMap,
) -> Result<Substitutions, SubstituteError> {
    let (mut parts, ()) = http::Request::new(()).into_parts();
    parts.headers = std::mem::take(trailers);
    let kept: Vec<_> = parts
        .headers
        .get_all(ACCEPT_ENCODING)
        .iter()
        .cloned()
        .collect();
    parts.headers.remove(ACCEPT_ENCODING);
    let result = subst.request_head(&mut parts);
    parts.headers.remove(ACCEPT_ENCODING);
    for v in kept {
        parts.headers.append(ACCEPT_ENCODING, v);
    }
    *trailers = parts.headers;
    result
}

impl<B> Body for TrailerRewrite<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(Some(Ok(f))) => f,
        };
        let mut trailers = match frame.into_trailers() {
            Ok(t) => t,
            Err(other) => return Poll::Ready(Some(Ok(other))),
        };
        match &this.rule {
            TrailerRule::Substitute { subst, tally } => {
                match substitute_trailers(subst, &mut trailers) {
                    Ok(subs) => tally.trailers_substituted(subs),
                    Err(e) => {
                        return Poll::Ready(Some(Err(format!("request trailers: {e}").into())));
                    }
                }
            }
            TrailerRule::Scrub { subst, request } => {
                subst.response_headers(request, &mut trailers);
            }
        }
        Poll::Ready(Some(Ok(Frame::trailers(trailers))))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A body of canned frames, for tests here and in [`crate::proxy`].
#[cfg(test)]
pub(crate) struct Frames(pub(crate) std::collections::VecDeque<Frame<Bytes>>);

#[cfg(test)]
impl Body for Frames {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.0.pop_front().map(Ok))
    }
}

/// A store with `hdr` (headers) and `bdy` (body only) bound to
/// `api.example.com` and `far` bound to `far.example.com`.
#[cfg(test)]
pub(crate) fn test_store() -> sluice_secrets::SecretStore {
    let yaml = "version: 1\nid: t\nallow:\n  - domains: [api.example.com, far.example.com]\n\
                secrets:\n\
                \x20 - name: hdr\n    placeholder: PH-hdr-secret\n    env: T_HDR\n    hosts: [api.example.com]\n\
                \x20 - name: bdy\n    placeholder: PH-bdy-secret\n    env: T_BDY\n    hosts: [api.example.com]\n    locations: [body]\n\
                \x20 - name: far\n    placeholder: PH-far-secret\n    env: T_FAR\n    hosts: [far.example.com]\n";
    let policy = sluice_policy::from_yaml_str(yaml, "t.yaml", &Default::default()).unwrap();
    sluice_secrets::SecretStore::load_with(&policy, |var| {
        let v: &[u8] = match var {
            "T_HDR" => b"real-hdr-value",
            "T_BDY" => b"real-bdy-value",
            "T_FAR" => b"real-far-value",
            _ => return None,
        };
        Some(zeroize::Zeroizing::new(v.to_vec()))
    })
    .unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use http_body_util::BodyExt as _;

    fn map(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn request_trailers_are_substituted_where_headers_are_allowed() {
        let store = test_store();
        let sub = store.for_host("api.example.com");
        let mut t = map(&[
            ("x-sig", "Bearer PH-hdr-secret"),
            ("x-body-only", "PH-bdy-secret"),
            ("x-other", "PH-far-secret"),
            ("accept-encoding", "gzip"),
        ]);
        let subs = substitute_trailers(&sub, &mut t).unwrap();
        assert_eq!(t["x-sig"], "Bearer real-hdr-value");
        assert!(t["x-sig"].is_sensitive());
        // `bdy` allows only the body; `far` is bound elsewhere.
        assert_eq!(t["x-body-only"], "PH-bdy-secret");
        assert_eq!(t["x-other"], "PH-far-secret");
        // Not forced to identity: trailers are not a head.
        assert_eq!(t["accept-encoding"], "gzip");
        assert_eq!(t.len(), 4);
        assert_eq!(
            subs.used,
            vec![(
                "hdr".to_owned(),
                sluice_policy::audit::SecretLocation::Header
            )]
        );
        assert_eq!(subs.not_allowed, vec!["bdy".to_owned()]);
        assert_eq!(subs.mismatched, vec!["far".to_owned()]);
    }

    #[tokio::test]
    async fn response_trailers_are_scrubbed_and_data_untouched() {
        let store = test_store();
        let sub = store.for_host("api.example.com");
        let frames = Frames(
            [
                Frame::data(Bytes::from_static(b"real-hdr-value in data")),
                Frame::trailers(map(&[("x-echo", "v=real-hdr-value;b=real-bdy-value")])),
            ]
            .into(),
        );
        let body = TrailerRewrite::new(
            frames,
            TrailerRule::Scrub {
                subst: sub,
                request: Substitutions::default(),
            },
        );
        let got = body.collect().await.unwrap();
        let trailers = got.trailers().cloned().unwrap();
        assert_eq!(trailers["x-echo"], "v=PH-hdr-secret;b=PH-bdy-secret");
        // Data is the Tapped body's business, not this one's.
        assert_eq!(&got.to_bytes()[..], b"real-hdr-value in data");
    }

    #[tokio::test]
    async fn request_trailers_are_rewritten_in_the_body_and_reported() {
        let store = test_store();
        let tally = RequestTally::new(None);
        let frames = Frames(
            [
                Frame::data(Bytes::from_static(b"abc")),
                Frame::trailers(map(&[("x-sig", "PH-hdr-secret"), ("x-o", "PH-far-secret")])),
            ]
            .into(),
        );
        let body = TrailerRewrite::new(
            frames,
            TrailerRule::Substitute {
                subst: store.for_host("api.example.com"),
                tally: tally.clone(),
            },
        );
        let got = body.collect().await.unwrap();
        let trailers = got.trailers().cloned().unwrap();
        assert_eq!(trailers["x-sig"], "real-hdr-value");
        assert_eq!(trailers["x-o"], "PH-far-secret");
        let seen = tally.trailers();
        assert_eq!(seen.used.len(), 1);
        assert_eq!(seen.mismatched, vec!["far".to_owned()]);
    }
}

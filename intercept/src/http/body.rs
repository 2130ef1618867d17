//! The body layer both proxies stream every request and response body
//! through: counted, optionally rewritten by a [`StreamReplacer`]
//! (boundary-safe: it holds back at most the longest pattern minus one
//! byte), trailers held back until the replacer's tail is out, and reporting
//! to the exchange's ledger:
//!
//! - a request body ([`Tapped::request`]) reports bytes sent, secrets the
//!   replacer substituted and the chunks as the guest sent them (for the
//!   placeholder scan) to the exchange's [`RequestTally`];
//! - a response body ([`Tapped::response`]) carries the [`Exchange`] and
//!   finishes it when the body ends ([`Outcome::Completed`]) or breaks
//!   ([`Outcome::UpstreamBroke`]); dropped before either, the exchange
//!   finishes itself as [`Outcome::ClientGone`].

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use hyper::body::{Body, Frame, SizeHint};
use sluice_secrets::StreamReplacer;

use super::BoxError;
use super::ledger::{Exchange, Outcome, RequestTally};

/// Which way the body flows, and whom it reports to.
enum Side {
    Request(Arc<RequestTally>),
    Response(Option<Box<Exchange>>),
}

/// A body passed through, counted, optionally rewritten (module docs).
pub(crate) struct Tapped<B> {
    inner: B,
    replacer: Option<StreamReplacer>,
    side: Side,
    /// Trailers held back while the replacer's tail is sent.
    trailers: Option<HeaderMap>,
    done: bool,
}

impl<B> Tapped<B> {
    /// A request body reporting to `tally`, rewritten by `replacer` if any.
    pub(crate) fn request(
        inner: B,
        replacer: Option<StreamReplacer>,
        tally: Arc<RequestTally>,
    ) -> Self {
        Self::new(inner, replacer, Side::Request(tally))
    }

    /// A response body that finishes `exchange` when it ends. A body that
    /// is empty from the start (HEAD, 204, 304: servers may never poll it)
    /// finishes the exchange at once.
    pub(crate) fn response(inner: B, replacer: Option<StreamReplacer>, exchange: Exchange) -> Self
    where
        B: Body,
    {
        if inner.is_end_stream() {
            exchange.finish(Outcome::Completed);
            return Self::new(inner, replacer, Side::Response(None));
        }
        Self::new(inner, replacer, Side::Response(Some(Box::new(exchange))))
    }

    fn new(inner: B, replacer: Option<StreamReplacer>, side: Side) -> Self {
        Self {
            inner,
            replacer,
            side,
            trailers: None,
            done: false,
        }
    }

    /// The body ended: the replacer's tail (if any, already counted), and
    /// the exchange finished once that tail is counted.
    fn end(&mut self) -> Option<Bytes> {
        self.done = true;
        let tail = self.replacer.as_mut().and_then(|rep| {
            let mut out = Vec::new();
            rep.finish(&mut out);
            (!out.is_empty()).then(|| Bytes::from(out))
        });
        if let Some(rep) = self.replacer.take()
            && let Side::Request(tally) = &self.side
        {
            tally.body_substituted(rep.used());
        }
        if let Some(t) = &tail {
            self.count(t.len());
        }
        if let Side::Response(x) = &mut self.side
            && let Some(x) = x.take()
        {
            x.finish(Outcome::Completed);
        }
        tail
    }

    fn count(&mut self, n: usize) {
        match &mut self.side {
            Side::Request(t) => t.sent(n),
            Side::Response(Some(x)) => x.delivered(n),
            Side::Response(None) => {}
        }
    }

    fn data(&mut self, b: Bytes) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.count(b.len());
        Poll::Ready(Some(Ok(Frame::data(b))))
    }
}

impl<B> Body for Tapped<B>
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
        loop {
            if this.done {
                return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))));
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => {
                    let e: BoxError = e.into();
                    this.done = true;
                    if let Side::Response(x) = &mut this.side
                        && let Some(x) = x.take()
                    {
                        x.finish(Outcome::UpstreamBroke(e.to_string()));
                    }
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => {
                    if let Some(tail) = this.end() {
                        return Poll::Ready(Some(Ok(Frame::data(tail))));
                    }
                }
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        if let Side::Request(t) = &this.side {
                            t.scan(&data);
                        }
                        match this.replacer.as_mut() {
                            None => return this.data(data),
                            Some(rep) => {
                                let mut out = Vec::with_capacity(data.len() + 64);
                                rep.feed(&data, &mut out);
                                if !out.is_empty() {
                                    return this.data(Bytes::from(out));
                                }
                            }
                        }
                    }
                    Err(frame) => {
                        if let Ok(t) = frame.into_trailers() {
                            this.trailers = Some(t);
                        }
                        if let Some(tail) = this.end() {
                            return Poll::Ready(Some(Ok(Frame::data(tail))));
                        }
                    }
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        if self.replacer.is_some() {
            SizeHint::default()
        } else {
            self.inner.size_hint()
        }
    }
}

//! The origin leg of an intercepted connection: the HTTP/1.1 or HTTP/2
//! client connection requests are sent on (or the refusal every request is
//! answered with when there is none), and the watch that tells an HTTP/2
//! extended CONNECT whether the origin's SETTINGS allow it.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::{http1 as client_h1, http2 as client_h2};
use hyper_util::rt::TokioExecutor;
use sluice_policy::Reason;

use super::CONNECT_PROTOCOL_WAIT;
use crate::http::ProxyBody;

/// The upstream leg of one connection.
pub(super) enum Upstream {
    H1(tokio::sync::Mutex<client_h1::SendRequest<ProxyBody>>),
    H2 {
        send: client_h2::SendRequest<ProxyBody>,
        /// Whether the upstream's SETTINGS enable extended CONNECT.
        connect_protocol: tokio::sync::watch::Receiver<bool>,
    },
    /// Never connected (or refused): every request gets 502 with this reason.
    Failed {
        reason: Reason,
        detail: String,
    },
}

impl Upstream {
    /// Sends one request; the error text on failure.
    pub(super) async fn send(&self, req: Request<ProxyBody>) -> Result<Response<Incoming>, String> {
        let res = match self {
            Self::H1(m) => {
                let mut s = m.lock().await;
                match s.ready().await {
                    Ok(()) => s.send_request(req).await,
                    Err(e) => Err(e),
                }
            }
            Self::H2 { send, .. } => {
                let mut s = send.clone();
                match s.ready().await {
                    Ok(()) => s.send_request(req).await,
                    Err(e) => Err(e),
                }
            }
            Self::Failed { detail, .. } => return Err(detail.clone()),
        };
        res.map_err(|e| e.to_string())
    }

    /// Whether an extended CONNECT can be sent upstream: an HTTP/2 upstream
    /// whose SETTINGS enabled the protocol. The first call on a connection
    /// waits up to [`CONNECT_PROTOCOL_WAIT`] for those SETTINGS (`settled`
    /// records that it did). `Err` says why not.
    pub(super) async fn extended_connect_ready(
        &self,
        settled: &AtomicBool,
    ) -> Result<(), &'static str> {
        let Self::H2 {
            connect_protocol, ..
        } = self
        else {
            return Err("extended CONNECT cannot be forwarded on an HTTP/1.1 upstream");
        };
        let mut rx = connect_protocol.clone();
        if *rx.borrow() {
            return Ok(());
        }
        if !settled.swap(true, Ordering::Relaxed)
            && let Ok(Ok(_)) =
                tokio::time::timeout(CONNECT_PROTOCOL_WAIT, rx.wait_for(|on| *on)).await
        {
            return Ok(());
        }
        if *rx.borrow() {
            return Ok(());
        }
        Err(
            "the upstream does not enable extended CONNECT (RFC 8441 SETTINGS_ENABLE_CONNECT_PROTOCOL)",
        )
    }
}

/// Drives the upstream HTTP/2 connection and publishes whether the peer's
/// SETTINGS enable extended CONNECT. hyper processes frames in a task of
/// its own and wakes this one only for requests, so the state is re-read
/// every [`RECHECK`] until it is on or [`CONNECT_PROTOCOL_WAIT`] after the
/// connection started (servers send SETTINGS first).
pub(super) struct WatchConnectProtocol<C> {
    conn: Pin<Box<C>>,
    enabled: tokio::sync::watch::Sender<bool>,
    recheck: Option<Pin<Box<tokio::time::Sleep>>>,
    until: tokio::time::Instant,
}

/// Re-read period of [`WatchConnectProtocol`].
const RECHECK: Duration = Duration::from_millis(10);

impl<C> WatchConnectProtocol<C> {
    pub(super) fn new(conn: C, enabled: tokio::sync::watch::Sender<bool>) -> Self {
        Self {
            conn: Box::pin(conn),
            enabled,
            recheck: None,
            until: tokio::time::Instant::now() + CONNECT_PROTOCOL_WAIT,
        }
    }
}

impl<T> Future for WatchConnectProtocol<client_h2::Connection<T, ProxyBody, TokioExecutor>>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    type Output = hyper::Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let res = this.conn.as_mut().poll(cx);
        let on = this.conn.is_extended_connect_protocol_enabled();
        this.enabled
            .send_if_modified(|v| std::mem::replace(v, on) != on);
        if res.is_ready() {
            return res;
        }
        let now = tokio::time::Instant::now();
        if on || now >= this.until {
            this.recheck = None;
            return Poll::Pending;
        }
        let sleep = this
            .recheck
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(RECHECK)));
        if sleep.as_mut().poll(cx).is_ready() {
            sleep.as_mut().reset(now + RECHECK);
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }
}

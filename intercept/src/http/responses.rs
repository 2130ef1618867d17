//! The proxies' own responses: an empty body and the short `text/plain`
//! answers (`sluice: <why>`) that refusals send the guest.

use std::convert::Infallible;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::BodyExt as _;

use super::{BoxError, ProxyBody};

/// An empty body.
pub(crate) fn empty() -> ProxyBody {
    http_body_util::Empty::new()
        .map_err(|e: Infallible| -> BoxError { match e {} })
        .boxed_unsync()
}

/// A `text/plain` response `sluice: <text>` with `status`; with `close`,
/// `Connection: close` (HTTP/1.1: the guest must reconnect).
pub(crate) fn text(status: StatusCode, text: &str, close: bool) -> Response<ProxyBody> {
    let body = http_body_util::Full::new(Bytes::from(format!("sluice: {text}\n")))
        .map_err(|e: Infallible| -> BoxError { match e {} })
        .boxed_unsync();
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if close {
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

/// Why a proxy answers a request itself instead of forwarding it (or after
/// the upstream failed): the audit reason, the status and text for the
/// guest, and a detail for the audit record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) reason: sluice_policy::Reason,
    pub(crate) status: StatusCode,
    pub(crate) text: String,
    pub(crate) detail: Option<String>,
}

impl Refusal {
    /// A refusal without detail.
    pub(crate) fn new(reason: sluice_policy::Reason, status: StatusCode, text: &str) -> Self {
        Self {
            reason,
            status,
            text: text.to_owned(),
            detail: None,
        }
    }

    /// The same with `detail` for the audit record.
    #[must_use]
    pub(crate) fn detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    /// Finishes `exchange` with this refusal and returns the guest's answer
    /// (with `Connection: close` when `close`).
    pub(crate) fn answer(
        self,
        exchange: super::ledger::Exchange,
        close: bool,
    ) -> Response<ProxyBody> {
        let resp = text(self.status, &self.text, close);
        exchange.finish(super::ledger::Outcome::Refused {
            reason: self.reason,
            status: self.status,
            detail: self.detail,
        });
        resp
    }
}

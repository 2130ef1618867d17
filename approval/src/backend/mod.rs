//! The backends that answer an approval question.
//!
//! - [`webhook::WebhookBackend`]: POST the question as JSON to a URL
//!   (http or https, optional bearer token from a file, optional client
//!   certificate), the answer is the response body;
//! - [`unix::UnixBackend`]: one JSON line each way over a unix stream
//!   socket, for a local UI or an agent harness; [`unix::serve_one`] is the
//!   other side, used by `sluice run --ask`;
//! - [`terminal::prompt`]: the question on a terminal, a key for each
//!   choice (the launcher runs it behind a unix socket).
//!
//! Every failure is a [`BackendError`]; the broker turns it into a deny.

use std::future::Future;
use std::pin::Pin;

use thiserror::Error;

use crate::wire::{Answer, Question, WireError};

pub mod terminal;
pub mod unix;
pub mod webhook;

/// A boxed answer future (the trait is object safe so the gateway can hold
/// any backend).
pub type AnswerFuture<'a> = Pin<Box<dyn Future<Output = Result<Answer, BackendError>> + Send + 'a>>;

/// Something that answers approval questions.
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// The backend's kind for audit records: `webhook`, `unix`, `terminal`.
    fn kind(&self) -> &'static str;

    /// Asks one question. The caller bounds the wait (the policy's
    /// `timeout`); the backend need not.
    fn ask<'a>(&'a self, question: &'a Question) -> AnswerFuture<'a>;
}

/// Why a backend gave no answer. Each is a deny.
#[derive(Debug, Error)]
pub enum BackendError {
    /// No answer within the policy's timeout.
    #[error("no answer within the approval timeout")]
    Timeout,
    /// The backend could not be reached.
    #[error("cannot reach the approval backend: {0}")]
    Connect(#[source] std::io::Error),
    /// Reading or writing the exchange failed.
    #[error("approval exchange failed: {0}")]
    Io(#[source] std::io::Error),
    /// The answer was not a valid answer.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// The webhook answered with a status other than 200.
    #[error("approval webhook answered HTTP {0}")]
    Status(u16),
    /// The HTTP exchange failed.
    #[error("approval webhook: {0}")]
    Http(String),
    /// The TLS handshake or its configuration failed.
    #[error("approval webhook TLS: {0}")]
    Tls(String),
    /// The backend's configuration is unusable (a file that cannot be read).
    #[error("approval backend configuration: {0}")]
    Config(String),
    /// The other side closed before answering (a terminal at end of file).
    #[error("the approval backend closed without answering")]
    Closed,
}

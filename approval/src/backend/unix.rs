//! The unix-socket backend: connect, write the question as one JSON line,
//! read one JSON line back, close. One connection per question, so a
//! backend that hangs on one question holds up no other.

use std::future::Future;
use std::path::{Path, PathBuf};

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use super::{AnswerFuture, Backend, BackendError};
use crate::wire::{Answer, MAX_MESSAGE_BYTES, Question, WireError};

/// Asks over a unix stream socket at a path.
#[derive(Debug, Clone)]
pub struct UnixBackend {
    path: PathBuf,
}

impl UnixBackend {
    /// A backend that connects to `path` for each question.
    #[must_use]
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// The socket's path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Backend for UnixBackend {
    fn kind(&self) -> &'static str {
        "unix"
    }

    fn ask<'a>(&'a self, question: &'a Question) -> AnswerFuture<'a> {
        Box::pin(async move {
            let line = question.to_line()?;
            let stream = UnixStream::connect(&self.path)
                .await
                .map_err(BackendError::Connect)?;
            let (r, mut w) = stream.into_split();
            w.write_all(&line).await.map_err(BackendError::Io)?;
            let mut r = BufReader::new(r);
            let reply = read_line(&mut r).await?;
            Ok(Answer::parse(&reply)?)
        })
    }
}

/// Reads one line of at most [`MAX_MESSAGE_BYTES`] (the newline not
/// included). End of input before a newline is [`BackendError::Closed`]
/// unless some bytes came (a last line without its newline is accepted).
///
/// # Errors
/// Too long, closed, or an I/O error.
pub async fn read_line<R: AsyncBufRead + Unpin>(r: &mut R) -> Result<Vec<u8>, BackendError> {
    let mut line = Vec::new();
    loop {
        let buf = r.fill_buf().await.map_err(BackendError::Io)?;
        if buf.is_empty() {
            return if line.is_empty() {
                Err(BackendError::Closed)
            } else {
                Ok(line)
            };
        }
        let (chunk, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..i], Some(i + 1)),
            None => (buf, None),
        };
        if line.len() + chunk.len() > MAX_MESSAGE_BYTES {
            return Err(WireError::TooLong.into());
        }
        line.extend_from_slice(chunk);
        let used = done.unwrap_or(buf.len());
        r.consume(used);
        if done.is_some() {
            return Ok(line);
        }
    }
}

/// The other side of [`UnixBackend`]: reads one question from `stream`,
/// asks `decide` and writes its answer.
///
/// # Errors
/// The question could not be read, or the answer not written.
pub async fn serve_one<F, Fut>(stream: UnixStream, decide: F) -> Result<(), BackendError>
where
    F: FnOnce(Question) -> Fut,
    Fut: Future<Output = Answer>,
{
    let (r, mut w) = stream.into_split();
    let mut r = BufReader::new(r);
    let line = read_line(&mut r).await?;
    let question = Question::parse(&line)?;
    let answer = decide(question).await;
    w.write_all(&answer.to_line()?)
        .await
        .map_err(BackendError::Io)?;
    w.shutdown().await.map_err(BackendError::Io)
}

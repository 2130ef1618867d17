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

/// How long past a question's `timeout_ms` [`Asked`] waits for the
/// gateway's hang-up before it takes the question down by itself.
pub const WITHDRAW_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Why a question read by [`Asked`] no longer wants an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Withdrawn {
    /// The gateway closed the connection (it gave up: its timeout, a
    /// reload, its end) or sent more than the question.
    HungUp,
    /// The question's own `timeout_ms` passed since it was read.
    TimedOut,
}

/// One question read from the gateway, with the connection its answer
/// goes back on. The gateway keeps that connection open exactly as long as
/// it waits for the answer, so its end (or anything more arriving on it)
/// withdraws the question: [`Asked::hung_up`] says so at once,
/// [`Asked::withdrawn`] waits for it or for the question's deadline.
#[derive(Debug)]
pub struct Asked {
    question: Question,
    r: BufReader<tokio::net::unix::OwnedReadHalf>,
    w: tokio::net::unix::OwnedWriteHalf,
    deadline: Option<tokio::time::Instant>,
}

impl Asked {
    /// Reads one question from `stream`. Its deadline is its
    /// `timeout_ms` from now plus [`WITHDRAW_GRACE`]: the gateway started
    /// counting when it sent it, and its own timeout is the one that
    /// decides (it records `timeout` and hangs up). This deadline is a
    /// backstop for a gateway that never hangs up; were it to come first on
    /// a loaded machine, the closed connection would be recorded as a
    /// backend failure instead of a timeout.
    ///
    /// # Errors
    /// The question could not be read or is not valid.
    pub async fn read(stream: UnixStream) -> Result<Self, BackendError> {
        let (r, w) = stream.into_split();
        let mut r = BufReader::new(r);
        let line = read_line(&mut r).await?;
        let question = Question::parse(&line)?;
        let deadline = (question.timeout_ms > 0).then(|| {
            tokio::time::Instant::now()
                + std::time::Duration::from_millis(question.timeout_ms)
                + WITHDRAW_GRACE
        });
        Ok(Self {
            question,
            r,
            w,
            deadline,
        })
    }

    /// The question.
    #[must_use]
    pub fn question(&self) -> &Question {
        &self.question
    }

    /// Whether the gateway has already hung up (or sent more than the
    /// question), looked at now without waiting: a question that waited
    /// in the socket's backlog past the gateway's timeout is already
    /// answered there (deny) and must not be shown.
    #[must_use]
    pub fn hung_up(&self) -> bool {
        if !self.r.buffer().is_empty() {
            return true;
        }
        let stream: &UnixStream = self.r.get_ref().as_ref();
        let mut byte = [0u8; 1];
        // A peek (nothing consumed) that does not wait: 0 is the end of
        // the stream, a byte is more than the question, "would block" is a
        // gateway still waiting.
        match rustix::net::recv(
            stream,
            &mut byte,
            rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT,
        ) {
            Ok(_) => true,
            Err(e) => e != rustix::io::Errno::AGAIN && e != rustix::io::Errno::INTR,
        }
    }

    /// Resolves when the question is withdrawn: the gateway hung up or
    /// sent more, or the question's deadline passed. Never, for a question
    /// without a deadline whose gateway keeps waiting.
    pub async fn withdrawn(&mut self) -> Withdrawn {
        let closed = async {
            // Anything readable after the question (its end included) is
            // the gateway no longer waiting for this answer.
            let _ = self.r.fill_buf().await;
            Withdrawn::HungUp
        };
        match self.deadline {
            Some(at) => tokio::select! {
                w = closed => w,
                () = tokio::time::sleep_until(at) => Withdrawn::TimedOut,
            },
            None => closed.await,
        }
    }

    /// Writes `answer` back and closes.
    ///
    /// # Errors
    /// The answer could not be written (the gateway is gone).
    pub async fn answer(mut self, answer: &Answer) -> Result<(), BackendError> {
        self.w
            .write_all(&answer.to_line()?)
            .await
            .map_err(BackendError::Io)?;
        self.w.shutdown().await.map_err(BackendError::Io)
    }
}

/// The other side of [`UnixBackend`]: reads one question from `stream`,
/// asks `decide` and writes its answer, unless the question is withdrawn
/// first ([`Asked::withdrawn`]): then `decide` is dropped and nothing is
/// answered.
///
/// # Errors
/// The question could not be read, the answer not written, or
/// [`BackendError::Closed`]: the question was withdrawn.
pub async fn serve_one<F, Fut>(stream: UnixStream, decide: F) -> Result<(), BackendError>
where
    F: FnOnce(Question) -> Fut,
    Fut: Future<Output = Answer>,
{
    let mut asked = Asked::read(stream).await?;
    let question = asked.question().clone();
    let answer = tokio::select! {
        biased;
        _ = asked.withdrawn() => return Err(BackendError::Closed),
        a = decide(question) => a,
    };
    asked.answer(&answer).await
}

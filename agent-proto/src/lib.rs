//! The protocol spoken between the `sluice` launcher (host) and the guest
//! agent over the virtio-serial port named [`PORT_NAME`].
//!
//! # Wire format
//!
//! A session is a sequence of frames in each direction. A frame is a 4-byte
//! big-endian body length (at most [`MAX_FRAME`]) followed by the body. A body
//! is a one-byte tag followed by the message's fields, in order:
//! integers are big-endian, byte strings and UTF-8 strings carry a 4-byte
//! big-endian length, optional fields a one-byte presence flag, lists a 4-byte
//! count. A body must be consumed exactly: trailing bytes are an error.
//!
//! # Session
//!
//! 1. The agent sends [`Message::Hello`] as soon as the port is open; the host
//!    answers with its own `Hello`. A version other than [`VERSION`] ends the
//!    session with [`Message::Error`].
//! 2. The host sends requests one at a time: [`Message::InstallCa`],
//!    [`Message::CopyIn`] (followed by [`Message::FileChunk`]s and
//!    [`Message::FileEnd`]), [`Message::Exec`], [`Message::CopyOut`],
//!    [`Message::Shutdown`]. Each request is answered by [`Message::Ack`] or
//!    [`Message::Error`], except `Exec` (answered by output chunks then
//!    [`Message::Exit`]) and `CopyOut` (answered by [`Message::FileStart`],
//!    chunks and `FileEnd`).
//!
//! A malformed frame ends the session: the receiver logs the
//! [`ProtoError`], sends `Error` when it still can, and closes. It never waits
//! for a message that a broken peer will not send.
//!
//! # Invariant
//!
//! [`Message::decode`] and [`read_frame`] never panic and never allocate more
//! than the frame length that was checked against [`MAX_FRAME`]; this is what
//! the fuzz target and the randomized tests check.

#![forbid(unsafe_code)]

use std::io::{self, Read, Write};

/// The protocol version this crate speaks. Bumped on any wire change.
pub const VERSION: u32 = 1;

/// The virtio-serial port name the agent listens on.
pub const PORT_NAME: &str = "sluice.agent";

/// The kernel modules the guest needs under `-M microvm`, in the order the
/// agent loads them (dependency order, see FIELD-NOTES). The image builder
/// copies exactly these into the image: both sides read this one list.
pub const GUEST_MODULES: [&str; 7] = [
    "virtio_ring",
    "virtio",
    "virtio_mmio",
    "virtio_console",
    "failover",
    "net_failover",
    "virtio_net",
];

/// The largest frame body accepted or sent, in bytes (1 MiB).
pub const MAX_FRAME: usize = 1 << 20;

/// The largest data chunk senders put in one message (64 KiB); receivers
/// accept anything that fits in [`MAX_FRAME`].
pub const CHUNK: usize = 64 * 1024;

/// How a guest command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// The command exited with this code.
    Code(i32),
    /// The command was killed by this signal number.
    Signal(i32),
}

impl ExitStatus {
    /// The shell convention for a process exit code: the code itself, or
    /// 128 + the signal number.
    pub fn shell_code(self) -> i32 {
        match self {
            ExitStatus::Code(c) => c,
            ExitStatus::Signal(s) => 128_i32.saturating_add(s),
        }
    }
}

/// A request to run one command in the guest.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExecRequest {
    /// The program and its arguments; `argv[0]` is looked up in `PATH`.
    pub argv: Vec<String>,
    /// Variables added to (or replacing those in) the agent's environment.
    pub env: Vec<(String, String)>,
    /// The working directory; the agent's own (`/`) when absent.
    pub cwd: Option<String>,
    /// Whether the host streams stdin; when false the command's stdin is
    /// `/dev/null`.
    pub stdin: bool,
}

/// One protocol message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Version handshake; first message in each direction.
    Hello {
        /// The sender's [`VERSION`].
        version: u32,
    },
    /// Run a command (host to guest).
    Exec(ExecRequest),
    /// Bytes for the running command's stdin (host to guest).
    Stdin(Vec<u8>),
    /// Close the running command's stdin (host to guest).
    StdinEof,
    /// Bytes the command wrote to stdout (guest to host).
    Stdout(Vec<u8>),
    /// Bytes the command wrote to stderr (guest to host).
    Stderr(Vec<u8>),
    /// The command ended; sent after all of its output (guest to host).
    Exit(ExitStatus),
    /// Start writing a guest file (host to guest), truncating it.
    CopyIn {
        /// Absolute guest path; parent directories are created.
        path: String,
        /// Unix permission bits.
        mode: u32,
    },
    /// Start reading a guest file (host to guest).
    CopyOut {
        /// Absolute guest path.
        path: String,
    },
    /// A guest file is about to be sent (guest to host, answering `CopyOut`).
    FileStart {
        /// Unix permission bits of the guest file.
        mode: u32,
    },
    /// A piece of file content, in either direction.
    FileChunk(Vec<u8>),
    /// The end of a file's content, in either direction.
    FileEnd,
    /// Install this PEM CA certificate into the guest's trust store.
    InstallCa {
        /// The certificate, PEM encoded.
        pem: Vec<u8>,
    },
    /// The request succeeded (guest to host).
    Ack,
    /// Power the guest off (host to guest).
    Shutdown,
    /// The request failed, or the session is being ended; either direction.
    Error {
        /// Human-readable reason.
        message: String,
    },
}

/// Why a frame could not be read or decoded.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    /// frame length {0} exceeds the limit
    #[error("frame length {0} exceeds the limit of {MAX_FRAME} bytes")]
    TooLarge(usize),
    /// The body ended before a field was complete.
    #[error("message truncated while reading {0}")]
    Truncated(&'static str),
    /// The body had bytes left after the message.
    #[error("{0} trailing bytes after the message")]
    Trailing(usize),
    /// An unknown message tag.
    #[error("unknown message tag {0}")]
    UnknownTag(u8),
    /// A field had an invalid value.
    #[error("invalid {0}")]
    Invalid(&'static str),
    /// The stream ended in the middle of a frame.
    #[error("stream ended in the middle of a frame")]
    UnexpectedEof,
    /// The underlying stream failed.
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
}

mod tag {
    pub(crate) const HELLO: u8 = 1;
    pub(crate) const EXEC: u8 = 2;
    pub(crate) const STDIN: u8 = 3;
    pub(crate) const STDIN_EOF: u8 = 4;
    pub(crate) const STDOUT: u8 = 5;
    pub(crate) const STDERR: u8 = 6;
    pub(crate) const EXIT_CODE: u8 = 7;
    pub(crate) const EXIT_SIGNAL: u8 = 8;
    pub(crate) const COPY_IN: u8 = 9;
    pub(crate) const COPY_OUT: u8 = 10;
    pub(crate) const FILE_START: u8 = 11;
    pub(crate) const FILE_CHUNK: u8 = 12;
    pub(crate) const FILE_END: u8 = 13;
    pub(crate) const INSTALL_CA: u8 = 14;
    pub(crate) const ACK: u8 = 15;
    pub(crate) const SHUTDOWN: u8 = 16;
    pub(crate) const ERROR: u8 = 17;
}

/// A bounds-checked reader over a frame body.
struct Cursor<'a> {
    buf: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], ProtoError> {
        if self.buf.len() < n {
            return Err(ProtoError::Truncated(what));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, ProtoError> {
        Ok(self.take(1, what)?[0])
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, ProtoError> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn i32(&mut self, what: &'static str) -> Result<i32, ProtoError> {
        let b = self.take(4, what)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn bytes(&mut self, what: &'static str) -> Result<Vec<u8>, ProtoError> {
        let len = usize::try_from(self.u32(what)?).map_err(|_| ProtoError::Invalid(what))?;
        Ok(self.take(len, what)?.to_vec())
    }

    fn string(&mut self, what: &'static str) -> Result<String, ProtoError> {
        String::from_utf8(self.bytes(what)?).map_err(|_| ProtoError::Invalid(what))
    }

    fn bool(&mut self, what: &'static str) -> Result<bool, ProtoError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(ProtoError::Invalid(what)),
        }
    }

    /// A list count, checked against the bytes left so that a forged count
    /// cannot make the decoder reserve more than the frame holds.
    fn count(&mut self, what: &'static str, min_item: usize) -> Result<usize, ProtoError> {
        let n = usize::try_from(self.u32(what)?).map_err(|_| ProtoError::Invalid(what))?;
        if n.saturating_mul(min_item) > self.buf.len() {
            return Err(ProtoError::Truncated(what));
        }
        Ok(n)
    }
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_be_bytes());
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    // Encoded frames are checked against MAX_FRAME before sending, so a
    // length that does not fit in u32 can never reach the wire.
    put_u32(out, u32::try_from(b.len()).unwrap_or(u32::MAX));
    out.extend_from_slice(b);
}

fn put_count(out: &mut Vec<u8>, n: usize) {
    put_u32(out, u32::try_from(n).unwrap_or(u32::MAX));
}

impl Message {
    /// Encodes the message body (without the length prefix).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            Message::Hello { version } => {
                out.push(tag::HELLO);
                put_u32(&mut out, *version);
            }
            Message::Exec(req) => {
                out.push(tag::EXEC);
                put_count(&mut out, req.argv.len());
                for a in &req.argv {
                    put_bytes(&mut out, a.as_bytes());
                }
                put_count(&mut out, req.env.len());
                for (k, v) in &req.env {
                    put_bytes(&mut out, k.as_bytes());
                    put_bytes(&mut out, v.as_bytes());
                }
                match &req.cwd {
                    Some(c) => {
                        out.push(1);
                        put_bytes(&mut out, c.as_bytes());
                    }
                    None => out.push(0),
                }
                out.push(u8::from(req.stdin));
            }
            Message::Stdin(d) => {
                out.push(tag::STDIN);
                put_bytes(&mut out, d);
            }
            Message::StdinEof => out.push(tag::STDIN_EOF),
            Message::Stdout(d) => {
                out.push(tag::STDOUT);
                put_bytes(&mut out, d);
            }
            Message::Stderr(d) => {
                out.push(tag::STDERR);
                put_bytes(&mut out, d);
            }
            Message::Exit(ExitStatus::Code(c)) => {
                out.push(tag::EXIT_CODE);
                out.extend_from_slice(&c.to_be_bytes());
            }
            Message::Exit(ExitStatus::Signal(s)) => {
                out.push(tag::EXIT_SIGNAL);
                out.extend_from_slice(&s.to_be_bytes());
            }
            Message::CopyIn { path, mode } => {
                out.push(tag::COPY_IN);
                put_bytes(&mut out, path.as_bytes());
                put_u32(&mut out, *mode);
            }
            Message::CopyOut { path } => {
                out.push(tag::COPY_OUT);
                put_bytes(&mut out, path.as_bytes());
            }
            Message::FileStart { mode } => {
                out.push(tag::FILE_START);
                put_u32(&mut out, *mode);
            }
            Message::FileChunk(d) => {
                out.push(tag::FILE_CHUNK);
                put_bytes(&mut out, d);
            }
            Message::FileEnd => out.push(tag::FILE_END),
            Message::InstallCa { pem } => {
                out.push(tag::INSTALL_CA);
                put_bytes(&mut out, pem);
            }
            Message::Ack => out.push(tag::ACK),
            Message::Shutdown => out.push(tag::SHUTDOWN),
            Message::Error { message } => {
                out.push(tag::ERROR);
                put_bytes(&mut out, message.as_bytes());
            }
        }
        out
    }

    /// Decodes one message body. Never panics; see the crate invariant.
    pub fn decode(body: &[u8]) -> Result<Message, ProtoError> {
        if body.len() > MAX_FRAME {
            return Err(ProtoError::TooLarge(body.len()));
        }
        let mut c = Cursor { buf: body };
        let msg = match c.u8("tag")? {
            tag::HELLO => Message::Hello {
                version: c.u32("version")?,
            },
            tag::EXEC => {
                let n = c.count("argv count", 4)?;
                let mut argv = Vec::with_capacity(n);
                for _ in 0..n {
                    argv.push(c.string("argv")?);
                }
                if argv.is_empty() {
                    return Err(ProtoError::Invalid("empty argv"));
                }
                let n = c.count("env count", 8)?;
                let mut env = Vec::with_capacity(n);
                for _ in 0..n {
                    let k = c.string("env name")?;
                    let v = c.string("env value")?;
                    if k.is_empty() || k.contains('=') || k.contains('\0') {
                        return Err(ProtoError::Invalid("env name"));
                    }
                    env.push((k, v));
                }
                let cwd = if c.bool("cwd flag")? {
                    Some(c.string("cwd")?)
                } else {
                    None
                };
                let stdin = c.bool("stdin flag")?;
                Message::Exec(ExecRequest {
                    argv,
                    env,
                    cwd,
                    stdin,
                })
            }
            tag::STDIN => Message::Stdin(c.bytes("stdin data")?),
            tag::STDIN_EOF => Message::StdinEof,
            tag::STDOUT => Message::Stdout(c.bytes("stdout data")?),
            tag::STDERR => Message::Stderr(c.bytes("stderr data")?),
            tag::EXIT_CODE => Message::Exit(ExitStatus::Code(c.i32("exit code")?)),
            tag::EXIT_SIGNAL => Message::Exit(ExitStatus::Signal(c.i32("signal")?)),
            tag::COPY_IN => Message::CopyIn {
                path: c.string("path")?,
                mode: c.u32("mode")?,
            },
            tag::COPY_OUT => Message::CopyOut {
                path: c.string("path")?,
            },
            tag::FILE_START => Message::FileStart {
                mode: c.u32("mode")?,
            },
            tag::FILE_CHUNK => Message::FileChunk(c.bytes("file data")?),
            tag::FILE_END => Message::FileEnd,
            tag::INSTALL_CA => Message::InstallCa {
                pem: c.bytes("pem")?,
            },
            tag::ACK => Message::Ack,
            tag::SHUTDOWN => Message::Shutdown,
            tag::ERROR => Message::Error {
                message: c.string("error message")?,
            },
            other => return Err(ProtoError::UnknownTag(other)),
        };
        if !c.buf.is_empty() {
            return Err(ProtoError::Trailing(c.buf.len()));
        }
        Ok(msg)
    }
}

/// Writes one frame. Fails with [`ProtoError::TooLarge`] (writing nothing)
/// when the encoded message exceeds [`MAX_FRAME`].
pub fn write_frame<W: Write>(w: &mut W, msg: &Message) -> Result<(), ProtoError> {
    let body = msg.encode();
    if body.len() > MAX_FRAME {
        return Err(ProtoError::TooLarge(body.len()));
    }
    let len = u32::try_from(body.len()).map_err(|_| ProtoError::TooLarge(body.len()))?;
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&body);
    w.write_all(&frame)?;
    w.flush()?;
    Ok(())
}

/// Reads one frame. Returns `Ok(None)` on a clean end of stream (before the
/// first byte of a frame); an end of stream inside a frame is an error.
pub fn read_frame<R: Read>(r: &mut R) -> Result<Option<Message>, ProtoError> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < len.len() {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(ProtoError::UnexpectedEof),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let len = usize::try_from(u32::from_be_bytes(len)).map_err(|_| ProtoError::Invalid("len"))?;
    if len > MAX_FRAME {
        return Err(ProtoError::TooLarge(len));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            ProtoError::UnexpectedEof
        } else {
            ProtoError::Io(e)
        }
    })?;
    Message::decode(&body).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Message> {
        vec![
            Message::Hello { version: VERSION },
            Message::Exec(ExecRequest {
                argv: vec!["sh".into(), "-c".into(), "echo hi".into()],
                env: vec![("A".into(), "b=c".into())],
                cwd: Some("/tmp".into()),
                stdin: true,
            }),
            Message::Exec(ExecRequest {
                argv: vec!["true".into()],
                ..ExecRequest::default()
            }),
            Message::Stdin(b"in".to_vec()),
            Message::StdinEof,
            Message::Stdout(vec![0, 1, 2, 255]),
            Message::Stderr(Vec::new()),
            Message::Exit(ExitStatus::Code(-3)),
            Message::Exit(ExitStatus::Signal(9)),
            Message::CopyIn {
                path: "/a/b".into(),
                mode: 0o755,
            },
            Message::CopyOut { path: "/x".into() },
            Message::FileStart { mode: 0o600 },
            Message::FileChunk(vec![7; 1000]),
            Message::FileEnd,
            Message::InstallCa {
                pem: b"-----BEGIN".to_vec(),
            },
            Message::Ack,
            Message::Shutdown,
            Message::Error {
                message: "nope".into(),
            },
        ]
    }

    #[test]
    fn every_message_round_trips_through_a_stream() {
        let mut wire = Vec::new();
        for m in samples() {
            write_frame(&mut wire, &m).unwrap();
        }
        let mut r = wire.as_slice();
        for m in samples() {
            assert_eq!(read_frame(&mut r).unwrap(), Some(m));
        }
        assert_eq!(read_frame(&mut r).unwrap(), None);
    }

    #[test]
    fn oversized_length_is_rejected_before_allocating() {
        let wire = u32::MAX.to_be_bytes();
        assert!(matches!(
            read_frame(&mut wire.as_slice()),
            Err(ProtoError::TooLarge(_))
        ));
        let big = Message::Stdout(vec![0; MAX_FRAME]);
        assert!(matches!(
            write_frame(&mut Vec::new(), &big),
            Err(ProtoError::TooLarge(_))
        ));
    }

    #[test]
    fn eof_inside_a_frame_is_an_error() {
        let mut wire = Vec::new();
        write_frame(&mut wire, &Message::Stdout(b"hello".to_vec())).unwrap();
        for cut in 1..wire.len() {
            assert!(read_frame(&mut &wire[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn malformed_bodies_are_errors() {
        assert!(matches!(
            Message::decode(&[200]),
            Err(ProtoError::UnknownTag(200))
        ));
        assert!(matches!(
            Message::decode(&[]),
            Err(ProtoError::Truncated(_))
        ));
        let mut ack = Message::Ack.encode();
        ack.push(0);
        assert!(matches!(
            Message::decode(&ack),
            Err(ProtoError::Trailing(1))
        ));
        // An argv count far beyond the body is refused without reserving it.
        let mut forged = vec![tag::EXEC];
        forged.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            Message::decode(&forged),
            Err(ProtoError::Truncated(_))
        ));
        // Empty argv and env names with '=' are invalid.
        let empty = Message::Exec(ExecRequest::default()).encode();
        assert!(matches!(
            Message::decode(&empty),
            Err(ProtoError::Invalid(_))
        ));
        let bad_env = Message::Exec(ExecRequest {
            argv: vec!["x".into()],
            env: vec![("A=B".into(), String::new())],
            ..ExecRequest::default()
        })
        .encode();
        assert!(matches!(
            Message::decode(&bad_env),
            Err(ProtoError::Invalid("env name"))
        ));
        // Invalid UTF-8 in a string field.
        let mut bad_utf8 = vec![tag::COPY_OUT];
        bad_utf8.extend_from_slice(&1u32.to_be_bytes());
        bad_utf8.push(0xff);
        assert!(matches!(
            Message::decode(&bad_utf8),
            Err(ProtoError::Invalid("path"))
        ));
    }

    #[test]
    fn shell_code_follows_the_128_plus_signal_convention() {
        assert_eq!(ExitStatus::Code(3).shell_code(), 3);
        assert_eq!(ExitStatus::Signal(9).shell_code(), 137);
    }

    /// Random and mutated bodies never panic the decoder (a cheap stand-in
    /// for the fuzz target that runs in every `cargo test`).
    #[test]
    #[allow(clippy::cast_possible_truncation)]
    fn decoder_survives_random_and_mutated_input() {
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let seeds: Vec<Vec<u8>> = samples().iter().map(Message::encode).collect();
        for i in 0..20_000 {
            let mut body = seeds[i % seeds.len()].clone();
            let flips = (next() % 4) as usize;
            for _ in 0..=flips {
                if body.is_empty() {
                    break;
                }
                let at = (next() as usize) % body.len();
                body[at] = next() as u8;
            }
            if next() % 3 == 0 {
                body.truncate((next() as usize) % (body.len() + 1));
            }
            let _ = Message::decode(&body);
            let _ = read_frame(&mut body.as_slice());
        }
    }

    /// The fuzz seeds are valid messages (so the fuzzer starts from inputs
    /// that reach every decoder branch, not only the tag check).
    #[test]
    fn fuzz_seeds_decode() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fuzz/corpus/agent_frame");
        // The corpus is checked in: a missing or empty one is a failure.
        let entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{dir}: {e}"))
            .map(|e| e.unwrap())
            .collect();
        assert!(!entries.is_empty(), "{dir} is empty");
        for e in entries {
            let data = std::fs::read(e.path()).unwrap();
            if e.file_name() == "seed-stream" {
                let mut r = data.as_slice();
                let mut n = 0;
                while read_frame(&mut r).unwrap().is_some() {
                    n += 1;
                }
                assert_eq!(n, 4);
            } else {
                let m = Message::decode(&data).unwrap();
                assert_eq!(m.encode(), data);
            }
        }
    }
}

//! The TLS ClientHello reader for TLS ports.
//!
//! The gateway completes the guest's TCP handshake, pushes every segment's
//! payload into a [`ClientHelloReader`] and waits (with its own deadline) for
//! [`Progress::Done`] or [`Progress::Reject`]. The reader:
//!
//! - reassembles the handshake message across TLS records (record-layer
//!   fragmentation) and across TCP segments of any size, down to one byte;
//! - holds at most `max_bytes` (default [`crate::DEFAULT_MAX_BYTES`]) of raw
//!   input, and rejects with [`Reject::TooLarge`] as soon as the ClientHello
//!   (as declared by its handshake header) or the raw input cannot fit;
//! - requires exactly one `host_name` entry in a single server_name
//!   extension, validated and normalised by [`crate::name::normalize_host`];
//! - rejects any ClientHello that carries an `encrypted_client_hello`
//!   extension (0xfe0d, or a draft codepoint 0xfe08..=0xfe0c) or the legacy
//!   `encrypted_server_name` extension (0xffce): the outer SNI of such a
//!   hello is only a public name (or absent), so the real destination cannot
//!   be checked (see [`is_encrypted_hello_extension`]).
//!
//! The parser follows smoltcp's shape: every read goes through a bounds-checked
//! cursor (`Cursor`) that returns `None` past the end, so no length field in
//! the input can cause an out-of-bounds access or a panic. Extensions other
//! than server_name, ALPN and ECH are skipped unread, except that two
//! extensions of the same type make the hello unreadable (RFC 8446 4.2).
//!
//! Assumptions: only TLS 1.0-1.3 record framing (major version 3) is
//! accepted; SSLv2-compatible hellos and any record other than handshake
//! (0x16) before the ClientHello is complete are [`Reject::NotTls`]. A
//! structurally broken ClientHello body (bad vector lengths) is also
//! `NotTls`; a broken extension block is [`Reject::SniUnreadable`].

use std::collections::HashSet;

use crate::name::normalize_host;

/// Record content type of a handshake record.
const CONTENT_HANDSHAKE: u8 = 0x16;
/// Handshake message type of a ClientHello.
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
/// Largest record fragment a peer may send (RFC 8446 5.1: 2^14).
const MAX_RECORD_LEN: usize = 1 << 14;
/// Record header: type (1), version (2), length (2).
const RECORD_HEADER_LEN: usize = 5;
/// Handshake header: type (1), length (3).
const HANDSHAKE_HEADER_LEN: usize = 4;

/// Extension type: server_name (RFC 6066).
const EXT_SERVER_NAME: u16 = 0;
/// Extension type: application_layer_protocol_negotiation (RFC 7301).
const EXT_ALPN: u16 = 16;
/// Extension type: encrypted_client_hello (RFC 9849 / draft-ietf-tls-esni).
pub const EXT_ENCRYPTED_CLIENT_HELLO: u16 = 0xfe0d;
/// Extension type: encrypted_server_name, the pre-ECH "ESNI" design
/// (draft-ietf-tls-esni-01 to -06; never assigned by IANA, but deployed by
/// Firefox and Cloudflare in 2018-2020).
pub const EXT_ENCRYPTED_SERVER_NAME: u16 = 0xffce;
/// Draft codepoints of encrypted_client_hello used by interop builds before
/// the final 0xfe0d (draft-ietf-tls-esni-08 used 0xfe08, drafts -09 to -12
/// 0xfe09..=0xfe0c; draft -13 onward and RFC 9849 use 0xfe0d).
pub const EXT_ECH_DRAFTS: std::ops::RangeInclusive<u16> = 0xfe08..=0xfe0c;
/// server_name entry type host_name.
const NAME_TYPE_HOST_NAME: u8 = 0;

/// Why a first flight was refused. Each variant maps to one audit reason
/// ([`Reject::reason`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Reject {
    /// The bytes are not a TLS handshake: first byte not 0x16, a bad record
    /// header, a non-ClientHello handshake message, or a malformed hello body.
    #[error("not a TLS ClientHello")]
    NotTls,
    /// The ClientHello has no server_name extension or no host_name in it.
    #[error("ClientHello without SNI")]
    SniAbsent,
    /// Several names, or several server_name extensions.
    #[error("ClientHello with several SNI names")]
    SniMultiple,
    /// The extensions are malformed or the name is not a valid DNS name.
    #[error("ClientHello SNI unreadable")]
    SniUnreadable,
    /// The ClientHello carries an encrypted_client_hello extension.
    #[error("ClientHello with Encrypted Client Hello")]
    EchPresent,
    /// The ClientHello does not fit the reader's bound.
    #[error("ClientHello larger than the bound")]
    TooLarge,
}

impl Reject {
    /// The audit reason string for this rejection.
    pub fn reason(self) -> &'static str {
        match self {
            Reject::NotTls => "not_tls",
            Reject::SniAbsent => "sni_absent",
            Reject::SniMultiple => "sni_multiple",
            Reject::SniUnreadable => "sni_unreadable",
            Reject::EchPresent => "ech_present",
            Reject::TooLarge => "too_large",
        }
    }
}

/// What the gateway needs from a ClientHello.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientHelloInfo {
    /// The single host_name SNI, lowercase, without a trailing dot.
    pub server_name: String,
    /// The ALPN protocol names offered, in the client's order.
    pub alpn: Vec<Vec<u8>>,
    /// Whether an encrypted_client_hello extension was present (then
    /// `server_name` is only the outer, public name). Always `false` unless
    /// the reader was built with [`ClientHelloReader::allow_ech_outer`]:
    /// by default such hellos are rejected with [`Reject::EchPresent`].
    pub ech: bool,
    /// The ClientHello's legacy_version (0x0303 for TLS 1.2 and 1.3).
    pub legacy_version: u16,
    /// Every byte pushed into the reader, in order, including any bytes after
    /// the ClientHello (such as early data): the caller replays them upstream.
    pub raw: Vec<u8>,
}

/// The reader's answer after each push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// The ClientHello is not complete yet: push more bytes.
    NeedMore,
    /// The ClientHello is complete and acceptable.
    Done(ClientHelloInfo),
    /// The first flight is refused.
    Reject(Reject),
}

/// Incremental ClientHello reader: push TCP payload as it arrives.
///
/// After `Done` or `Reject` the reader is finished: later pushes return the
/// same rejection, or `Reject(NotTls)` after a `Done` (a reader is used for
/// one flow's first flight only).
#[derive(Debug)]
pub struct ClientHelloReader {
    max_bytes: usize,
    raw: Vec<u8>,
    /// Offset in `raw` of the next record header not yet consumed.
    next_record: usize,
    /// Handshake bytes reassembled from the record payloads so far.
    handshake: Vec<u8>,
    finished: Option<Reject>,
    allow_ech_outer: bool,
}

impl Default for ClientHelloReader {
    fn default() -> Self {
        Self::new(crate::DEFAULT_MAX_BYTES)
    }
}

impl ClientHelloReader {
    /// A reader that buffers at most `max_bytes` of raw input.
    pub fn new(max_bytes: usize) -> Self {
        Self {
            max_bytes,
            raw: Vec::new(),
            next_record: 0,
            handshake: Vec::new(),
            finished: None,
            allow_ech_outer: false,
        }
    }

    /// Accept ClientHellos with an encrypted_client_hello extension,
    /// reporting it in [`ClientHelloInfo::ech`] instead of rejecting with
    /// [`Reject::EchPresent`]. The SNI is then the outer (public) name only.
    pub fn allow_ech_outer(mut self, allow: bool) -> Self {
        self.allow_ech_outer = allow;
        self
    }

    /// The raw bytes pushed so far.
    pub fn buffered(&self) -> &[u8] {
        &self.raw
    }

    /// Feeds the next bytes of the guest's stream.
    pub fn push(&mut self, bytes: &[u8]) -> Progress {
        if let Some(reject) = self.finished {
            return Progress::Reject(reject);
        }
        let mut progress = self.advance(bytes);
        if progress == Progress::NeedMore && self.raw.len() >= self.max_bytes {
            progress = Progress::Reject(Reject::TooLarge);
        }
        match &progress {
            Progress::NeedMore => {}
            Progress::Done(_) => self.finished = Some(Reject::NotTls),
            Progress::Reject(reject) => self.finished = Some(*reject),
        }
        progress
    }

    fn advance(&mut self, bytes: &[u8]) -> Progress {
        // Refuse a non-TLS first byte before buffering anything else.
        if self.raw.is_empty() && bytes.first().is_some_and(|b| *b != CONTENT_HANDSHAKE) {
            return Progress::Reject(Reject::NotTls);
        }
        // Input past the bound is refused outright: the raw bytes must be
        // replayed upstream complete, so none may be dropped.
        if self.raw.len() + bytes.len() > self.max_bytes {
            return Progress::Reject(Reject::TooLarge);
        }
        self.raw.extend_from_slice(bytes);

        loop {
            // Is the handshake message complete?
            if let Some(progress) = self.check_handshake() {
                return match progress {
                    Ok(()) => self.finish(),
                    Err(reject) => Progress::Reject(reject),
                };
            }
            // Consume the next complete record, if any.
            let rest = self.raw.get(self.next_record..).unwrap_or_default();
            let header = match rest.get(..RECORD_HEADER_LEN) {
                Some(h) => h,
                None => {
                    if let Err(reject) = check_record_prefix(rest) {
                        return Progress::Reject(reject);
                    }
                    return Progress::NeedMore;
                }
            };
            let length = match check_record_header(header) {
                Ok(length) => length,
                Err(reject) => return Progress::Reject(reject),
            };
            let end = RECORD_HEADER_LEN + length;
            match rest.get(RECORD_HEADER_LEN..end) {
                Some(fragment) => {
                    self.handshake.extend_from_slice(fragment);
                    self.next_record += end;
                }
                None => {
                    if self.next_record + end > self.max_bytes {
                        return Progress::Reject(Reject::TooLarge);
                    }
                    return Progress::NeedMore;
                }
            }
        }
    }

    /// `None` while the handshake message is incomplete; `Some(Ok)` when it
    /// is complete; `Some(Err)` when its header already rules it out.
    fn check_handshake(&self) -> Option<Result<(), Reject>> {
        let header = self.handshake.get(..HANDSHAKE_HEADER_LEN)?;
        if header[0] != HANDSHAKE_CLIENT_HELLO {
            return Some(Err(Reject::NotTls));
        }
        let length = u24(header[1], header[2], header[3]);
        // The hello needs at least its own bytes plus one record header.
        if length + HANDSHAKE_HEADER_LEN + RECORD_HEADER_LEN > self.max_bytes {
            return Some(Err(Reject::TooLarge));
        }
        if self.handshake.len() >= HANDSHAKE_HEADER_LEN + length {
            Some(Ok(()))
        } else {
            None
        }
    }

    fn finish(&mut self) -> Progress {
        let body = self
            .handshake
            .get(HANDSHAKE_HEADER_LEN..)
            .and_then(|rest| {
                let header = self.handshake.get(..HANDSHAKE_HEADER_LEN)?;
                rest.get(..u24(header[1], header[2], header[3]))
            })
            .unwrap_or_default();
        match parse_client_hello(body, self.allow_ech_outer) {
            Ok(hello) => Progress::Done(ClientHelloInfo {
                server_name: hello.server_name,
                alpn: hello.alpn,
                ech: hello.ech,
                legacy_version: hello.legacy_version,
                raw: std::mem::take(&mut self.raw),
            }),
            Err(reject) => Progress::Reject(reject),
        }
    }
}

fn u24(a: u8, b: u8, c: u8) -> usize {
    (usize::from(a) << 16) | (usize::from(b) << 8) | usize::from(c)
}

/// Checks the bytes of a record header seen so far (fewer than five).
fn check_record_prefix(prefix: &[u8]) -> Result<(), Reject> {
    if prefix.first().is_some_and(|b| *b != CONTENT_HANDSHAKE) {
        return Err(Reject::NotTls);
    }
    if prefix.get(1).is_some_and(|b| *b != 3) {
        return Err(Reject::NotTls);
    }
    Ok(())
}

/// Validates a full record header and returns the fragment length.
fn check_record_header(header: &[u8]) -> Result<usize, Reject> {
    check_record_prefix(header)?;
    let length = match header {
        [_, _, _, hi, lo, ..] => usize::from(u16::from_be_bytes([*hi, *lo])),
        _ => return Err(Reject::NotTls),
    };
    // Zero-length handshake fragments are forbidden (RFC 8446 5.1).
    if length == 0 || length > MAX_RECORD_LEN {
        return Err(Reject::NotTls);
    }
    Ok(length)
}

/// A bounds-checked reader over a byte slice: every accessor returns `None`
/// instead of reading past the end.
struct Cursor<'a> {
    bytes: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Self { bytes }
    }

    fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.bytes.len() {
            return None;
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }

    /// A vector with a one-byte length prefix.
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(usize::from(n))
    }

    /// A vector with a two-byte length prefix.
    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(usize::from(n))
    }
}

/// The parts of a ClientHello body we keep.
struct Hello {
    legacy_version: u16,
    server_name: String,
    alpn: Vec<Vec<u8>>,
    ech: bool,
}

/// Parses a complete ClientHello body (after the handshake header).
fn parse_client_hello(body: &[u8], allow_ech_outer: bool) -> Result<Hello, Reject> {
    let mut c = Cursor::new(body);
    let legacy_version = c.u16().ok_or(Reject::NotTls)?;
    c.take(32).ok_or(Reject::NotTls)?; // random
    let session_id = c.vec8().ok_or(Reject::NotTls)?;
    if session_id.len() > 32 {
        return Err(Reject::NotTls);
    }
    let suites = c.vec16().ok_or(Reject::NotTls)?;
    if suites.is_empty() || suites.len() % 2 != 0 {
        return Err(Reject::NotTls);
    }
    let compression = c.vec8().ok_or(Reject::NotTls)?;
    if compression.is_empty() {
        return Err(Reject::NotTls);
    }
    if c.is_empty() {
        // No extensions at all: no SNI.
        return Err(Reject::SniAbsent);
    }
    let extensions = c.vec16().ok_or(Reject::SniUnreadable)?;
    if !c.is_empty() {
        return Err(Reject::SniUnreadable);
    }

    let mut seen = HashSet::new();
    let mut sni: Option<&[u8]> = None;
    let mut alpn = Vec::new();
    let mut ech = false;
    let mut ext = Cursor::new(extensions);
    while !ext.is_empty() {
        let kind = ext.u16().ok_or(Reject::SniUnreadable)?;
        let data = ext.vec16().ok_or(Reject::SniUnreadable)?;
        if !seen.insert(kind) {
            return Err(if kind == EXT_SERVER_NAME {
                Reject::SniMultiple
            } else {
                Reject::SniUnreadable
            });
        }
        match kind {
            EXT_SERVER_NAME => sni = Some(data),
            EXT_ALPN => alpn = parse_alpn(data)?,
            kind if is_encrypted_hello_extension(kind) => ech = true,
            _ => {}
        }
    }
    if ech && !allow_ech_outer {
        return Err(Reject::EchPresent);
    }
    let server_name = parse_server_name(sni.ok_or(Reject::SniAbsent)?)?;
    Ok(Hello {
        legacy_version,
        server_name,
        alpn,
        ech,
    })
}

/// Whether an extension type hides the real server name: the final
/// `encrypted_client_hello` (0xfe0d), its draft codepoints
/// ([`EXT_ECH_DRAFTS`]) or the legacy ESNI extension
/// ([`EXT_ENCRYPTED_SERVER_NAME`]). Any of them makes the hello
/// [`Reject::EchPresent`] unless ECH outers are allowed.
pub fn is_encrypted_hello_extension(kind: u16) -> bool {
    kind == EXT_ENCRYPTED_CLIENT_HELLO
        || kind == EXT_ENCRYPTED_SERVER_NAME
        || EXT_ECH_DRAFTS.contains(&kind)
}

/// Parses the server_name extension data: exactly one host_name entry.
fn parse_server_name(data: &[u8]) -> Result<String, Reject> {
    let mut c = Cursor::new(data);
    let list = c.vec16().ok_or(Reject::SniUnreadable)?;
    if !c.is_empty() {
        return Err(Reject::SniUnreadable);
    }
    let mut entries = Cursor::new(list);
    let mut name = None;
    while !entries.is_empty() {
        let kind = entries.u8().ok_or(Reject::SniUnreadable)?;
        let value = entries.vec16().ok_or(Reject::SniUnreadable)?;
        if name.is_some() {
            return Err(Reject::SniMultiple);
        }
        if kind != NAME_TYPE_HOST_NAME {
            return Err(Reject::SniUnreadable);
        }
        name = Some(value);
    }
    let name = name.ok_or(Reject::SniAbsent)?;
    // RFC 6066: "The hostname is represented ... without a trailing dot."
    // We tolerate one and normalise it away, as the policy does.
    normalize_host(name).map_err(|_| Reject::SniUnreadable)
}

/// Parses the ALPN extension data: a non-empty list of non-empty names.
fn parse_alpn(data: &[u8]) -> Result<Vec<Vec<u8>>, Reject> {
    let mut c = Cursor::new(data);
    let list = c.vec16().ok_or(Reject::SniUnreadable)?;
    if !c.is_empty() || list.is_empty() {
        return Err(Reject::SniUnreadable);
    }
    let mut names = Cursor::new(list);
    let mut out = Vec::new();
    while !names.is_empty() {
        let name = names.vec8().ok_or(Reject::SniUnreadable)?;
        if name.is_empty() {
            return Err(Reject::SniUnreadable);
        }
        out.push(name.to_vec());
    }
    Ok(out)
}

#[cfg(test)]
mod tests;

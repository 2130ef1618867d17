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
//! Record framing and reassembly are ours (`tls-parser` answers `Incomplete`
//! on a partial record and buffers nothing); the reassembled ClientHello body
//! is parsed by `tls-parser`, and our rules are applied on top of what it
//! returns (`parse_client_hello`): every byte of the body, the extension
//! block, the server_name list and the ALPN list must be accounted for, where
//! `tls-parser` alone would stop silently or ignore trailing bytes.
//! Extensions other than server_name, ALPN and ECH are framed but their
//! contents are not read, except that two extensions of the same type make
//! the hello unreadable (RFC 8446 4.2). The hand-written parser this replaced
//! is kept as a test-only reference, and a differential test (`differential`)
//! holds the two to the same verdict on the fuzz corpus, the test vectors and
//! their mutations.
//!
//! Assumptions: only TLS 1.0-1.3 record framing (major version 3) is
//! accepted; SSLv2-compatible hellos and any record other than handshake
//! (0x16) before the ClientHello is complete are [`Reject::NotTls`]. A
//! structurally broken ClientHello body (bad vector lengths) is also
//! `NotTls`; a broken extension block is [`Reject::SniUnreadable`].

use std::collections::HashSet;

use tls_parser::{SNIType, TlsExtension};

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
    /// The parser of the reassembled body: [`parse_client_hello`], or the
    /// reference parser in the differential test.
    parse_body: BodyParser,
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
            parse_body: parse_client_hello,
        }
    }

    /// The same reader with another body parser (the differential test's
    /// reference).
    #[cfg(test)]
    fn with_body_parser(mut self, parse_body: BodyParser) -> Self {
        self.parse_body = parse_body;
        self
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
        match (self.parse_body)(body, self.allow_ech_outer) {
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

/// The parts of a ClientHello body we keep.
#[derive(Debug)]
struct Hello {
    legacy_version: u16,
    server_name: String,
    alpn: Vec<Vec<u8>>,
    ech: bool,
}

/// A parser of a complete ClientHello body (after the handshake header);
/// the second argument is [`ClientHelloReader::allow_ech_outer`].
type BodyParser = fn(&[u8], bool) -> Result<Hello, Reject>;

/// Parses a complete ClientHello body (after the handshake header) with
/// `tls-parser`, then applies our rules.
///
/// `tls-parser` reads the fixed fields and cuts out the extension block; it
/// tolerates what we refuse (no cipher suite or compression method, bytes
/// after the extension block), so those are checked here. The extension list
/// is read one extension at a time with its framing parser
/// (`parse_tls_extension_unknown`): its typed list parser stops silently at
/// the first extension it cannot read and fails on malformed contents of
/// extensions we never look at, so it could neither prove that every byte
/// was read nor keep accepting hellos we accept today.
fn parse_client_hello(body: &[u8], allow_ech_outer: bool) -> Result<Hello, Reject> {
    let (rest, hello) =
        tls_parser::parse_tls_handshake_client_hello(body).map_err(|_| Reject::NotTls)?;
    if hello.ciphers.is_empty() || hello.comp.is_empty() {
        return Err(Reject::NotTls);
    }
    // The extension block is optional, but nothing may follow it; a block
    // whose length runs past the body is left unparsed in `rest`.
    let extensions = match (hello.ext, rest.is_empty()) {
        (Some(block), true) => block,
        (None, true) => return Err(Reject::SniAbsent),
        (_, false) => return Err(Reject::SniUnreadable),
    };

    let mut seen = HashSet::new();
    let mut sni: Option<&[u8]> = None;
    let mut alpn = Vec::new();
    let mut ech = false;
    let mut rest = extensions;
    while !rest.is_empty() {
        let (tail, kind, data) = match tls_parser::parse_tls_extension_unknown(rest) {
            Ok((tail, TlsExtension::Unknown(kind, data))) => (tail, kind.0, data),
            _ => return Err(Reject::SniUnreadable),
        };
        rest = tail;
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
        legacy_version: hello.version.0,
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

/// How many bytes of a vector's content `tls-parser` left unread, given the
/// extension data and what its parser returned: the data is a two-byte
/// length, the list, then `after` (bytes past the list); `used` is what the
/// parsed entries account for.
fn unread(data: &[u8], after: &[u8], used: usize) -> Option<usize> {
    let list = data.len().checked_sub(2 + after.len())?;
    list.checked_sub(used)
}

/// Parses the server_name extension data: exactly one host_name entry.
///
/// `tls-parser` reads the entries but stops silently at one it cannot
/// read, ignores bytes after the list and takes empty data for an empty
/// list; every byte must be accounted for here, and the first entry that
/// is not a single host_name decides, as RFC 6066 reads.
fn parse_server_name(data: &[u8]) -> Result<String, Reject> {
    // Empty data parses as an empty list; `unread` then finds no room for
    // the list's length and refuses it.
    let (after, entries) = match tls_parser::parse_tls_extension_sni_content(data) {
        Ok((after, TlsExtension::SNI(entries))) => (after, entries),
        _ => return Err(Reject::SniUnreadable),
    };
    if !after.is_empty() {
        return Err(Reject::SniUnreadable);
    }
    let used = entries.iter().map(|(_, name)| 3 + name.len()).sum();
    let left = unread(data, after, used).ok_or(Reject::SniUnreadable)?;
    let name = match entries.as_slice() {
        [] if left == 0 => return Err(Reject::SniAbsent),
        [] => return Err(Reject::SniUnreadable),
        [(kind, _), ..] if *kind != SNIType::HostName => return Err(Reject::SniUnreadable),
        [_, _, ..] => return Err(Reject::SniMultiple),
        // A second entry that does not parse.
        [_] if left != 0 => return Err(Reject::SniUnreadable),
        [(_, name)] => *name,
    };
    // RFC 6066: "The hostname is represented ... without a trailing dot."
    // We tolerate one and normalise it away, as the policy does.
    normalize_host(name).map_err(|_| Reject::SniUnreadable)
}

/// Parses the ALPN extension data: a non-empty list of non-empty names.
///
/// As for server_name, `tls-parser` stops silently at a name it cannot read
/// and ignores trailing bytes; both are refused here.
fn parse_alpn(data: &[u8]) -> Result<Vec<Vec<u8>>, Reject> {
    let (after, names) = match tls_parser::parse_tls_extension_alpn_content(data) {
        Ok((after, TlsExtension::ALPN(names))) => (after, names),
        _ => return Err(Reject::SniUnreadable),
    };
    let used = names.iter().map(|name| 1 + name.len()).sum();
    if !after.is_empty()
        || names.is_empty()
        || names.iter().any(|name| name.is_empty())
        || unread(data, after, used) != Some(0)
    {
        return Err(Reject::SniUnreadable);
    }
    Ok(names.iter().map(|name| name.to_vec()).collect())
}

#[cfg(test)]
mod differential;
#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;

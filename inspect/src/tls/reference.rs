//! The hand-written ClientHello body parser that `tls-parser` replaced,
//! kept as a test-only reference: the differential test
//! (`super::differential`) runs every input through the reader with this
//! body parser and with the production one and demands the same verdict.
//!
//! Only the body parser lives here; reassembly across records and segments
//! is the reader's own and is shared by both.

use std::collections::HashSet;

use super::{Hello, Reject};
use crate::name::normalize_host;

// The reference keeps its own copy of the codepoints and of the ECH test, so
// a change to the production ones shows up as a difference.

/// Extension type: server_name (RFC 6066).
const EXT_SERVER_NAME: u16 = 0;
/// Extension type: application_layer_protocol_negotiation (RFC 7301).
const EXT_ALPN: u16 = 16;
/// server_name entry type host_name.
const NAME_TYPE_HOST_NAME: u8 = 0;

/// Whether an extension type hides the real server name: the final
/// encrypted_client_hello (0xfe0d), its draft codepoints 0xfe08..=0xfe0c, or
/// the legacy ESNI extension 0xffce.
fn is_encrypted_hello_extension(kind: u16) -> bool {
    kind == 0xfe0d || kind == 0xffce || (0xfe08..=0xfe0c).contains(&kind)
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

/// Parses a complete ClientHello body (after the handshake header).
pub(super) fn parse_client_hello(body: &[u8], allow_ech_outer: bool) -> Result<Hello, Reject> {
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

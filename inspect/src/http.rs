//! The HTTP/1 request head reader for plain-HTTP ports.
//!
//! The gateway pushes the guest's first bytes into a [`RequestHeadReader`]
//! until it answers [`Progress::Done`] with the request's method, target and
//! normalised Host, or [`Progress::Reject`]. Parsing is `httparse`'s; this
//! module adds the buffering, the bound (default
//! [`crate::DEFAULT_MAX_BYTES`]) and the rules the gateway enforces:
//!
//! - exactly one `Host` header, whose value is a valid DNS name (normalised
//!   by [`crate::name::normalize_host`]) or an IP literal, with an optional
//!   port; HTTP/1.0 requests without Host are refused too (fail closed);
//! - `CONNECT` is refused: tunnelling would hide the real destination;
//! - an absolute-form target (`GET http://a.example/ HTTP/1.1`) must name the
//!   same host and port as Host, else [`Reject::HostMismatch`];
//! - targets other than origin-form (`/...`), absolute-form with an `http`
//!   or `https` scheme, and `*` for OPTIONS are malformed.
//!
//! To keep one-byte segments cheap, the head is parsed only once the bytes
//! contain an empty line (`\n\r\n` or `\n\n`); each push scans only the new
//! bytes for it.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::name::normalize_host;

/// The most headers a request head may carry.
pub const MAX_HEADERS: usize = 96;

/// Why a request head was refused. Each variant maps to one audit reason
/// ([`Reject::reason`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Reject {
    /// No Host header.
    #[error("request without Host")]
    HostAbsent,
    /// Several Host headers.
    #[error("request with several Host headers")]
    HostMultiple,
    /// A CONNECT request.
    #[error("CONNECT request")]
    Connect,
    /// Not a well-formed HTTP/1 request head, a Host value that is not a
    /// host name or IP literal, or a target form we do not accept.
    #[error("malformed HTTP request head")]
    Malformed,
    /// An absolute-form target whose authority disagrees with Host.
    #[error("request target authority differs from Host")]
    HostMismatch,
    /// The head does not end within the bound.
    #[error("HTTP request head larger than the bound")]
    TooLarge,
}

impl Reject {
    /// The audit reason string for this rejection.
    pub fn reason(self) -> &'static str {
        match self {
            Reject::HostAbsent => "http_host_absent",
            Reject::HostMultiple => "http_host_multiple",
            Reject::Connect => "http_connect",
            Reject::Malformed => "http_malformed",
            Reject::HostMismatch => "http_host_mismatch",
            Reject::TooLarge => "too_large",
        }
    }
}

/// A host as named by a request: a normalised DNS name or an IP literal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// A DNS name, lowercase, without a trailing dot.
    Name(String),
    /// An IPv4 literal.
    V4(Ipv4Addr),
    /// An IPv6 literal (written in brackets on the wire).
    V6(Ipv6Addr),
}

impl std::fmt::Display for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Host::Name(name) => f.write_str(name),
            Host::V4(ip) => write!(f, "{ip}"),
            Host::V6(ip) => write!(f, "[{ip}]"),
        }
    }
}

/// The request head fields the gateway decides on.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RequestHead {
    /// The method token, as sent (`GET`, `POST`, ...).
    pub method: String,
    /// The request target, as sent (lossily decoded as UTF-8).
    pub target: String,
    /// The Host header's host, normalised.
    pub host: Host,
    /// The Host header's port, when it names one.
    pub port: Option<u16>,
    /// The minor version: 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub version: u8,
    /// Length of the head in `raw`, including the empty line.
    pub head_len: usize,
    /// Every byte pushed into the reader (the head and any body bytes that
    /// came with it): the caller replays them upstream.
    pub raw: Vec<u8>,
}

/// The reader's answer after each push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// The head is not complete yet: push more bytes.
    NeedMore,
    /// The head is complete and acceptable.
    Done(RequestHead),
    /// The request is refused.
    Reject(Reject),
}

/// Incremental HTTP/1 request head reader.
///
/// After `Done` or `Reject` the reader is finished; later pushes return
/// `Reject` (the last rejection, or `Malformed` after a `Done`).
#[derive(Debug)]
pub struct RequestHeadReader {
    max_bytes: usize,
    raw: Vec<u8>,
    finished: Option<Reject>,
}

impl Default for RequestHeadReader {
    fn default() -> Self {
        Self::new(crate::DEFAULT_MAX_BYTES)
    }
}

impl RequestHeadReader {
    /// A reader that buffers at most `max_bytes`.
    pub fn new(max_bytes: usize) -> Self {
        Self {
            max_bytes,
            raw: Vec::new(),
            finished: None,
        }
    }

    /// Feeds the next bytes of the guest's stream.
    pub fn push(&mut self, bytes: &[u8]) -> Progress {
        if let Some(reject) = self.finished {
            return Progress::Reject(reject);
        }
        let progress = self.advance(bytes);
        match &progress {
            Progress::NeedMore => {}
            Progress::Done(_) => self.finished = Some(Reject::Malformed),
            Progress::Reject(reject) => self.finished = Some(*reject),
        }
        progress
    }

    fn advance(&mut self, bytes: &[u8]) -> Progress {
        // Scan the new bytes plus the two before them for the empty line.
        let scan_from = self.raw.len().saturating_sub(2);
        if self.raw.len() + bytes.len() > self.max_bytes {
            // The bytes up to the bound may still hold a complete head; the
            // rest must not be dropped, since the caller replays `raw`.
            return Progress::Reject(Reject::TooLarge);
        }
        self.raw.extend_from_slice(bytes);
        let tail = self.raw.get(scan_from..).unwrap_or_default();
        let has_end =
            tail.windows(2).any(|w| w == b"\n\n") || tail.windows(3).any(|w| w == b"\n\r\n");
        if !has_end {
            return if self.raw.len() >= self.max_bytes {
                Progress::Reject(Reject::TooLarge)
            } else {
                Progress::NeedMore
            };
        }
        match parse_head(&self.raw) {
            Ok(Some(mut head)) => {
                head.raw = std::mem::take(&mut self.raw);
                Progress::Done(head)
            }
            // httparse saw no end yet (an empty line inside a partial
            // request line, for example).
            Ok(None) => Progress::NeedMore,
            Err(reject) => Progress::Reject(reject),
        }
    }
}

/// Parses a complete head; `Ok(None)` when httparse wants more bytes.
fn parse_head(buf: &[u8]) -> Result<Option<RequestHead>, Reject> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    let head_len = match request.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(Reject::Malformed),
    };
    let (Some(method), Some(target), Some(version)) =
        (request.method, request.path, request.version)
    else {
        return Err(Reject::Malformed);
    };
    if method.eq_ignore_ascii_case("CONNECT") {
        return Err(Reject::Connect);
    }
    let mut hosts = request
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("host"));
    let host_header = hosts.next().ok_or(Reject::HostAbsent)?;
    if hosts.next().is_some() {
        return Err(Reject::HostMultiple);
    }
    let (host, port) = parse_authority(host_header.value.trim_ascii())?;

    if target == "*" {
        if method != "OPTIONS" {
            return Err(Reject::Malformed);
        }
    } else if !target.starts_with('/') {
        let (authority, default_port) = absolute_authority(target)?;
        let (target_host, target_port) = parse_authority(authority.as_bytes())?;
        let effective = |p: Option<u16>| p.unwrap_or(default_port);
        if target_host != host || effective(target_port) != effective(port) {
            return Err(Reject::HostMismatch);
        }
    }
    Ok(Some(RequestHead {
        method: method.to_owned(),
        target: target.to_owned(),
        host,
        port,
        version,
        head_len,
        raw: Vec::new(),
    }))
}

/// The authority and default port of an absolute-form target.
fn absolute_authority(target: &str) -> Result<(&str, u16), Reject> {
    let (scheme, rest) = target.split_once("://").ok_or(Reject::Malformed)?;
    let default_port = if scheme.eq_ignore_ascii_case("http") {
        80
    } else if scheme.eq_ignore_ascii_case("https") {
        443
    } else {
        return Err(Reject::Malformed);
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = rest.get(..end).ok_or(Reject::Malformed)?;
    Ok((authority, default_port))
}

/// Parses `host[:port]` or `[v6][:port]`; userinfo is refused.
pub fn parse_authority(value: &[u8]) -> Result<(Host, Option<u16>), Reject> {
    if value.contains(&b'@') {
        return Err(Reject::Malformed);
    }
    let (host, port) = if let Some(rest) = value.strip_prefix(b"[") {
        let close = rest
            .iter()
            .position(|b| *b == b']')
            .ok_or(Reject::Malformed)?;
        let (inner, after) = rest.split_at(close);
        let after = after.get(1..).unwrap_or_default();
        let ip = std::str::from_utf8(inner)
            .ok()
            .and_then(|s| s.parse::<Ipv6Addr>().ok())
            .ok_or(Reject::Malformed)?;
        let port = match after {
            [] => None,
            [b':', digits @ ..] => Some(parse_port(digits)?),
            _ => return Err(Reject::Malformed),
        };
        (Host::V6(ip), port)
    } else {
        let (name, port) = match value.iter().rposition(|b| *b == b':') {
            Some(colon) => {
                let (name, digits) = value.split_at(colon);
                (name, Some(parse_port(digits.get(1..).unwrap_or_default())?))
            }
            None => (value, None),
        };
        let host = match std::str::from_utf8(name)
            .ok()
            .and_then(|s| s.parse::<Ipv4Addr>().ok())
        {
            Some(ip) => Host::V4(ip),
            None => Host::Name(normalize_host(name).map_err(|_| Reject::Malformed)?),
        };
        (host, port)
    };
    Ok((host, port))
}

fn parse_port(digits: &[u8]) -> Result<u16, Reject> {
    if digits.is_empty() || digits.len() > 5 || !digits.iter().all(u8::is_ascii_digit) {
        return Err(Reject::Malformed);
    }
    std::str::from_utf8(digits)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(Reject::Malformed)
}

#[cfg(test)]
mod tests;

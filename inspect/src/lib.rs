//! Readers of the first bytes a guest sends, and the DNS message sanitiser.
//!
//! This crate owns the parsing of untrusted guest (and upstream resolver)
//! bytes that the gateway must understand before it decides a flow:
//!
//! - [`tls`]: the TLS ClientHello on TLS ports (single SNI, ALPN, ECH).
//! - [`http`]: the HTTP/1 request head on plain-HTTP ports (Host, CONNECT).
//! - [`dns`]: DNS queries from the guest and answers from upstream.
//!
//! Everything here is pure: no I/O, no clocks, no unsafe. The stream readers
//! take bytes as they arrive in TCP segments ([`tls::ClientHelloReader::push`],
//! [`http::RequestHeadReader::push`]) and hold at most a configured number of
//! bytes; deadlines belong to the caller. Every input, however malformed,
//! yields a value or a closed error enum whose variants map one-to-one to
//! audit reasons; no input panics (each parser has a fuzz target in `fuzz/`).
#![forbid(unsafe_code)]

pub mod dns;
pub mod http;
pub mod name;
pub mod tls;

/// The default bound on the bytes a stream reader buffers (16 KiB).
///
/// Post-quantum ClientHellos (X25519MLKEM768 key shares) are about 1.8 KB;
/// 16 KiB leaves room for several hybrid key shares and padding.
pub const DEFAULT_MAX_BYTES: usize = 16 * 1024;

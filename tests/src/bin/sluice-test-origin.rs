//! `sluice-test-origin`: the HTTP/HTTPS and TCP origin of the fake internet.
//!
//! Serves HTTP/1.1 and HTTP/2 (prior knowledge on plain listeners, ALPN on
//! TLS listeners) with these endpoints:
//! - `GET /bytes/N`: N deterministic bytes ([`sluice_e2e::pattern_byte`]),
//!   streamed, so N may be large;
//! - `POST|PUT /upload`: answers the hex sha256 of the body and its length
//!   (`<hex> <len>\n`);
//! - `ANY /echo...`: a JSON object with the method, path, version, headers
//!   and body (lossy UTF-8) it received;
//! - `GET /ws` with `Connection: upgrade` (HTTP/1.1): `101 Switching
//!   Protocols` (`Upgrade: websocket`), then every byte received is echoed
//!   back raw (no WebSocket framing: enough to prove a proxy splices the
//!   upgraded stream) until the client closes;
//! - `CONNECT /ws` with `:protocol` (HTTP/2 extended CONNECT, RFC 8441):
//!   `200`, then the same raw echo on the stream. Every HTTP/2 connection
//!   advertises `SETTINGS_ENABLE_CONNECT_PROTOCOL`, except TLS connections
//!   whose SNI starts with `noconnect.` (an upstream without RFC 8441 for
//!   the tests);
//! - `/ws-head`: like `/ws` (HTTP/1.1 `Upgrade` or HTTP/2 extended
//!   CONNECT), but for any protocol asked (the `101` names the request's
//!   `Upgrade`), and the upgraded stream starts with the request's header
//!   fields as received (`name: value\r\n` each, then `\r\n`) before the
//!   echo: an origin reflecting the upgrade request into the stream;
//! - `ANY /authorization`: the request's `Authorization` value as the body
//!   (a reflection), honouring `Range: bytes=A-B` (`206` with that slice);
//! - `ANY /trailers...`: reads the request (body and trailers) and answers
//!   `trailers follow\n` with response trailers (declared in `Trailer`,
//!   sent on HTTP/1.1 when the request had `TE: trailers`):
//!   `x-echo-authorization` = the request's `Authorization` and
//!   `x-echo-<name>` = each request trailer's value, i.e. a reflection;
//! - anything else: `hello from sluice-test-origin\n`.
//!
//! TLS uses rustls with the ring provider and a certificate chain made per run
//! by rcgen: a test CA (written to `--ca-out` for clients and the gateway) and
//! one leaf for every `--name` (DNS names and IP literals).
//!
//! Every HTTP request is logged as one JSON line to `--log` (method, path,
//! version, headers, request trailers, `:protocol`, body length, listener,
//! tls): tests assert on what really reached the origin. `--echo ADDR` listeners echo TCP bytes back and
//! half-close after the client does; `--banner ADDR` listeners write one
//! byte and close. When every listener is bound the origin
//! writes `--ready` (an empty file).
use std::convert::Infallible;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};

use anyhow::{Context, Result};
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::{Body, Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

/// Command line.
#[derive(Parser, Debug)]
#[command(about = "HTTP/1.1 + HTTP/2 (+TLS) test origin and TCP echo server for sluice's tests")]
struct Args {
    /// Plain HTTP listener (repeatable).
    #[arg(long)]
    http: Vec<SocketAddr>,
    /// HTTPS listener (repeatable).
    #[arg(long)]
    https: Vec<SocketAddr>,
    /// TCP echo listener (repeatable).
    #[arg(long)]
    echo: Vec<SocketAddr>,
    /// Banner listener: writes one byte (`x`) and closes (repeatable); for
    /// connect + first-byte latency.
    #[arg(long)]
    banner: Vec<SocketAddr>,
    /// Names (DNS names or IP literals) the TLS leaf certificate is valid for.
    #[arg(long = "name")]
    names: Vec<String>,
    /// Where to write the test CA certificate (PEM).
    #[arg(long)]
    ca_out: Option<PathBuf>,
    /// Request log (JSON lines).
    #[arg(long)]
    log: Option<PathBuf>,
    /// File created once every listener is bound.
    #[arg(long)]
    ready: Option<PathBuf>,
}

/// Shared request log.
type Log = Arc<Mutex<Option<std::fs::File>>>;

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let log: Log = Arc::new(Mutex::new(match &args.log {
        Some(p) => {
            Some(std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?)
        }
        None => None,
    }));

    let tls = if args.https.is_empty() {
        None
    } else {
        Some(make_tls(&args.names, args.ca_out.as_ref())?)
    };

    let mut tasks = Vec::new();
    for addr in &args.http {
        let l = TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        tasks.push(tokio::spawn(serve_http(l, None, log.clone())));
    }
    for addr in &args.https {
        let l = TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        tasks.push(tokio::spawn(serve_http(l, tls.clone(), log.clone())));
    }
    for addr in &args.echo {
        let l = TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        tasks.push(tokio::spawn(serve_echo(l)));
    }
    for addr in &args.banner {
        let l = TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        tasks.push(tokio::spawn(serve_banner(l)));
    }
    if let Some(p) = &args.ready {
        std::fs::write(p, b"").with_context(|| format!("writing {}", p.display()))?;
    }
    for t in tasks {
        t.await.context("listener task")?;
    }
    Ok(())
}

/// Makes the per-run CA and leaf, writes the CA PEM, and returns the acceptor.
fn make_tls(names: &[String], ca_out: Option<&PathBuf>) -> Result<TlsAcceptor> {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "sluice test CA");
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, rcgen::KeyPair::generate()?)?;
    if let Some(p) = ca_out {
        std::fs::write(p, ca.pem()).with_context(|| format!("writing {}", p.display()))?;
    }
    let mut leaf_params = rcgen::CertificateParams::new(names.to_vec())?;
    leaf_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "sluice test origin");
    let leaf_key = rcgen::KeyPair::generate()?;
    let leaf = leaf_params.signed_by(&leaf_key, &ca)?;

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let key = rustls::pki_types::PrivateKeyDer::try_from(leaf_key.serialize_der())
        .map_err(|e| anyhow::anyhow!("leaf key: {e}"))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der().clone(), ca.der().clone()], key)?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(cfg)))
}

async fn serve_http(l: TcpListener, tls: Option<TlsAcceptor>, log: Log) {
    loop {
        let (stream, _) = match l.accept().await {
            Ok(x) => x,
            Err(e) => {
                eprintln!("accept: {e}");
                continue;
            }
        };
        let local = stream.local_addr().ok();
        let tls = tls.clone();
        let log = log.clone();
        tokio::spawn(async move {
            let is_tls = tls.is_some();
            let svc =
                hyper::service::service_fn(move |req| handle(req, local, is_tls, log.clone()));
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder.http2().enable_connect_protocol();
            let res = match tls {
                Some(acc) => match acc.accept(stream).await {
                    Ok(s) => {
                        let sni = s.get_ref().1.server_name().unwrap_or_default();
                        if sni.starts_with("noconnect.") {
                            builder = auto::Builder::new(TokioExecutor::new());
                        }
                        builder
                            .serve_connection_with_upgrades(TokioIo::new(s), svc)
                            .await
                    }
                    Err(e) => {
                        eprintln!("tls accept: {e}");
                        return;
                    }
                },
                None => {
                    builder
                        .serve_connection_with_upgrades(TokioIo::new(stream), svc)
                        .await
                }
            };
            if let Err(e) = res {
                eprintln!("connection: {e}");
            }
        });
    }
}

type Resp = Response<BoxBody<Bytes, Infallible>>;

fn text(s: String) -> Resp {
    Response::new(Full::new(Bytes::from(s)).boxed())
}

async fn handle(
    mut req: Request<Incoming>,
    local: Option<SocketAddr>,
    tls: bool,
    log: Log,
) -> Result<Resp, Infallible> {
    let method = req.method().to_string();
    let path = req.uri().path().to_string();
    let version = format!("{:?}", req.version());
    let headers: Vec<(String, String)> = req
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let authority = req.uri().authority().map(|a| a.to_string());
    let protocol = req
        .extensions()
        .get::<hyper::ext::Protocol>()
        .map(|p| p.as_str().to_owned());
    // HTTP/2 extended CONNECT answers 200, HTTP/1.1 Upgrade 101.
    let ws_path = path == "/ws" || path == "/ws-head";
    let h2_ws = ws_path && req.method() == hyper::Method::CONNECT && protocol.is_some();
    let upgrade_ws = h2_ws || (ws_path && req.headers().contains_key(hyper::header::UPGRADE));
    let upgrade_asked = req.headers().get(hyper::header::UPGRADE).cloned();
    // `/ws-head` writes the request's head into the upgraded stream first.
    let head_echo: Option<Vec<u8>> = (path == "/ws-head").then(|| {
        let mut h: Vec<u8> = headers
            .iter()
            .flat_map(|(k, v)| format!("{k}: {v}\r\n").into_bytes())
            .collect();
        h.extend_from_slice(b"\r\n");
        h
    });
    let range = req
        .headers()
        .get(hyper::header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("bytes="))
        .and_then(|v| v.split_once('-'))
        .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)));
    let on_upgrade = upgrade_ws.then(|| hyper::upgrade::on(&mut req));
    let authorization = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .map(|v| v.as_bytes().to_vec());
    let te_trailers = req
        .headers()
        .get(hyper::header::TE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));

    let mut body = req.into_body();
    let mut hasher = Sha256::new();
    let mut len: u64 = 0;
    let mut kept = Vec::new();
    let mut trailers = hyper::HeaderMap::new();
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else { break };
        match frame.into_data() {
            Ok(data) => {
                hasher.update(&data);
                len += data.len() as u64;
                if kept.len() < 1 << 20 {
                    kept.extend_from_slice(&data);
                }
            }
            Err(frame) => {
                if let Ok(t) = frame.into_trailers() {
                    trailers.extend(t);
                }
            }
        }
    }
    let trailer_list: Vec<(String, String)> = trailers
        .iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();

    let line = serde_json::json!({
        "listener": local.map(|a| a.to_string()),
        "tls": tls,
        "method": method,
        "path": path,
        "authority": authority,
        "version": version,
        "headers": headers,
        "trailers": trailer_list,
        "protocol": protocol,
        "body_len": len,
    });
    if let Ok(mut g) = log.lock()
        && let Some(f) = g.as_mut()
    {
        let _ = writeln!(f, "{line}");
    }

    let resp = if let Some(on_upgrade) = on_upgrade {
        tokio::spawn(async move {
            if let Ok(upgraded) = on_upgrade.await {
                let mut io = TokioIo::new(upgraded);
                if let Some(head) = head_echo
                    && io.write_all(&head).await.is_err()
                {
                    return;
                }
                let mut buf = vec![0u8; 16 * 1024];
                loop {
                    match io.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if io.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    }
                }
                let _ = io.shutdown().await;
            }
        });
        let mut r = Response::new(Full::new(Bytes::new()).boxed());
        if !h2_ws {
            *r.status_mut() = hyper::StatusCode::SWITCHING_PROTOCOLS;
            r.headers_mut().insert(
                hyper::header::UPGRADE,
                upgrade_asked
                    .unwrap_or_else(|| hyper::header::HeaderValue::from_static("websocket")),
            );
            r.headers_mut().insert(
                hyper::header::CONNECTION,
                hyper::header::HeaderValue::from_static("upgrade"),
            );
        }
        r
    } else if path == "/authorization" {
        let value = authorization.unwrap_or_default();
        match range {
            Some((a, b)) if a <= b && b < value.len() => {
                let mut r = Response::new(Full::new(Bytes::copy_from_slice(&value[a..=b])).boxed());
                *r.status_mut() = hyper::StatusCode::PARTIAL_CONTENT;
                if let Ok(v) =
                    hyper::header::HeaderValue::from_str(&format!("bytes {a}-{b}/{}", value.len()))
                {
                    r.headers_mut().insert(hyper::header::CONTENT_RANGE, v);
                }
                r
            }
            _ => Response::new(Full::new(Bytes::from(value)).boxed()),
        }
    } else if path.starts_with("/trailers") {
        trailers_response(authorization, &trailers, te_trailers)
    } else if let Some(n) = path.strip_prefix("/bytes/") {
        match n.parse::<u64>() {
            Ok(n) => Response::new(PatternBody { pos: 0, len: n }.boxed()),
            Err(_) => text(format!("bad length {n}\n")),
        }
    } else if path == "/upload" {
        let digest = hasher.finalize();
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        text(format!("{hex} {len}\n"))
    } else if path.starts_with("/echo") {
        let v = serde_json::json!({
            "method": method,
            "path": path,
            "authority": authority,
            "version": version,
            "headers": headers,
            "body": String::from_utf8_lossy(&kept),
        });
        text(format!("{v}\n"))
    } else {
        text("hello from sluice-test-origin\n".to_string())
    };
    Ok(resp)
}

/// `trailers follow\n`, then trailers reflecting the request's
/// `Authorization` and trailers (see the module docs).
fn trailers_response(
    authorization: Option<Vec<u8>>,
    request_trailers: &hyper::HeaderMap,
    te_trailers: bool,
) -> Resp {
    use hyper::header::{HeaderName, HeaderValue};
    let mut out = hyper::HeaderMap::new();
    if let Some(a) = authorization
        && let Ok(v) = HeaderValue::from_bytes(&a)
    {
        out.insert("x-echo-authorization", v);
    }
    for (k, v) in request_trailers {
        if let Ok(n) = HeaderName::try_from(format!("x-echo-{k}")) {
            out.append(n, v.clone());
        }
    }
    let declared: Vec<&str> = out.keys().map(|k| k.as_str()).collect();
    let declared = declared.join(", ");
    let mut r = Response::new(
        TrailerBody {
            data: Some(Bytes::from_static(b"trailers follow\n")),
            trailers: Some(out),
        }
        .boxed(),
    );
    if let Ok(v) = HeaderValue::from_str(&declared)
        && !declared.is_empty()
    {
        r.headers_mut().insert(hyper::header::TRAILER, v);
    }
    r.headers_mut().insert(
        "x-te-trailers",
        HeaderValue::from_static(if te_trailers { "yes" } else { "no" }),
    );
    r
}

/// One data frame, then trailers; no exact length (so HTTP/1.1 is chunked
/// and can carry the trailers).
struct TrailerBody {
    data: Option<Bytes>,
    trailers: Option<hyper::HeaderMap>,
}

impl Body for TrailerBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(d) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(d))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }
}

/// A streamed body of `len` pattern bytes.
/// The pattern's bytes come in 64 KiB blocks: within one, `i >> 16` is
/// fixed ([`sluice_e2e::pattern_byte`]).
const PATTERN_BLOCK: u64 = 64 * 1024;

/// `n` pattern bytes from `start`, sliced without a copy from one of
/// seven precomputed cycles when `start` begins a block (as every chunk
/// of a body does): computing each byte (two divisions) made this server
/// the largest CPU user of the interception benchmark.
fn pattern_chunk(start: u64, n: u64) -> Bytes {
    // Cycle c holds (j % 251) ^ c for j < one block + 251: byte `start + t`
    // of block k is cycle (k % 7)'s byte (start % 251) + t.
    static CYCLES: std::sync::OnceLock<Vec<Bytes>> = std::sync::OnceLock::new();
    let cycles = CYCLES.get_or_init(|| {
        (0..7u8)
            .map(|c| {
                (0..PATTERN_BLOCK + 251)
                    .map(|j| u8::try_from(j % 251).unwrap_or(0) ^ c)
                    .collect::<Vec<u8>>()
                    .into()
            })
            .collect()
    });
    let aligned = start.is_multiple_of(PATTERN_BLOCK) && n <= PATTERN_BLOCK;
    let cycle = usize::try_from((start >> 16) % 7)
        .ok()
        .and_then(|c| cycles.get(c));
    match (cycle, usize::try_from(start % 251), usize::try_from(n)) {
        (Some(cycle), Ok(off), Ok(len)) if aligned => cycle.slice(off..off + len),
        _ => Bytes::from(
            (start..start + n)
                .map(sluice_e2e::pattern_byte)
                .collect::<Vec<u8>>(),
        ),
    }
}

struct PatternBody {
    pos: u64,
    len: u64,
}

impl Body for PatternBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.pos >= self.len {
            return Poll::Ready(None);
        }
        let n = (self.len - self.pos).min(PATTERN_BLOCK);
        let chunk = pattern_chunk(self.pos, n);
        self.pos += n;
        Poll::Ready(Some(Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.pos >= self.len
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.len - self.pos)
    }
}

async fn serve_echo(l: TcpListener) {
    loop {
        match l.accept().await {
            Ok((s, _)) => {
                tokio::spawn(echo(s));
            }
            Err(e) => eprintln!("accept: {e}"),
        }
    }
}

async fn serve_banner(l: TcpListener) {
    loop {
        match l.accept().await {
            Ok((mut s, _)) => {
                tokio::spawn(async move {
                    let _ = s.write_all(b"x").await;
                    let _ = s.shutdown().await;
                });
            }
            Err(e) => eprintln!("accept: {e}"),
        }
    }
}

/// Echoes until the client half-closes, then half-closes too.
async fn echo(mut s: TcpStream) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match s.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => {
                if s.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
            Err(_) => return,
        }
    }
    let _ = s.shutdown().await;
}

#[cfg(test)]
mod pattern_tests {
    use super::*;

    #[test]
    fn precomputed_chunks_are_the_pattern() {
        for k in [0u64, 1, 6, 7, 13, 1000] {
            let start = k * PATTERN_BLOCK;
            for n in [1, 250, 251, 4096, PATTERN_BLOCK] {
                let want: Vec<u8> = (start..start + n).map(sluice_e2e::pattern_byte).collect();
                assert_eq!(
                    pattern_chunk(start, n).as_ref(),
                    want.as_slice(),
                    "block {k}, {n} bytes"
                );
            }
        }
        let odd: Vec<u8> = (5..105).map(sluice_e2e::pattern_byte).collect();
        assert_eq!(pattern_chunk(5, 100).as_ref(), odd.as_slice());
    }
}

//! The TLS-terminating proxy for one intercepted connection.
//!
//! Order of operations for a connection ([`Interceptor::serve`]):
//! 1. Read the guest's ClientHello (rustls, lazily): its SNI must equal the
//!    one enforcement verified, else the connection is dropped
//!    (`inspect_failed`).
//! 2. Connect to the validated destination IP and handshake TLS with the
//!    guest's SNI, offering the ALPN protocols the guest offered among `h2`
//!    and `http/1.1`. The chain is verified against the webpki roots plus
//!    the operator's extra CAs. A refused chain is `upstream_tls_failed`: the
//!    upstream connection is dropped at once and never carries a byte of
//!    the guest's; the guest's handshake is completed so that every request
//!    it sends is answered `502` with the reason (one `http` line each).
//! 3. Complete the guest's handshake with a leaf for the SNI
//!    ([`crate::SandboxCa::leaf`]) and exactly the ALPN protocol the
//!    upstream chose, so both legs speak the same HTTP version.
//! 4. Serve HTTP (hyper): each request is checked, substituted, forwarded and
//!    its response scrubbed, streaming both ways (no body is buffered whole):
//!    - its Host / `:authority` (and an absolute-form target's authority)
//!      must name the SNI (case-insensitive, trailing dot ignored, the
//!      destination port optional); else `421` and `host_sni_mismatch`;
//!    - secrets bound to the SNI are substituted in the head and, where
//!      allowed, the body ([`sluice_secrets::HostSubstituter`]); other
//!      secrets' placeholders are passed through unchanged and reported
//!      (`secret_host_mismatch`);
//!    - the response head and body are scrubbed of the real values; a
//!      content-encoded response on a host with bound secrets cannot be
//!      scrubbed and is answered `502` instead (`upstream_error`);
//!    - hop-by-hop headers are dropped both ways; `Content-Length` is
//!      dropped where a body is rewritten (it is re-framed);
//!    - trailers are substituted (request) and scrubbed (response) like
//!      heads (module `trailers`);
//!    - an HTTP/1.1 `Upgrade` (WebSocket) is forwarded with its headers;
//!      after `101` the two upgraded streams are spliced byte for byte (no
//!      substitution inside WebSocket frames);
//!    - an HTTP/2 extended CONNECT (RFC 8441, `:protocol`, e.g. WebSocket
//!      over h2; the guest-facing server advertises
//!      `SETTINGS_ENABLE_CONNECT_PROTOCOL`) is checked and substituted like
//!      any request and forwarded as an extended CONNECT on the HTTP/2
//!      upstream; after a `2xx` the two streams are spliced byte for byte.
//!      An upstream that does not enable the protocol gets nothing: the
//!      guest is answered `502` (`upstream_error`). A plain CONNECT (a
//!      tunnel, no `:protocol`) is refused with `405`
//!      (`http_connect_denied`) on both HTTP versions.
//!
//! Limits: ALPN protocols other than `h2` and `http/1.1` are not offered
//! upstream. Both legs always speak the same HTTP version, so an extended
//! CONNECT never meets an HTTP/1.1 upstream (it would be answered `502`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::hop::{authority_host, strip_hop_by_hop};
use arc_swap::ArcSwap;
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt as _;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::{http1 as client_h1, http2 as client_h2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::server::{Acceptor, ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use sluice_policy::Reason;
use sluice_policy::audit::{Kind, SecretLocation};
use sluice_secrets::{PlaceholderScanner, SecretStore, StreamReplacer, Substitutions};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::{LazyConfigAcceptor, TlsConnector};

use crate::ca::{CaError, CaOptions, SandboxCa};
use crate::event::{AuditOut, HttpEvent};
use crate::trailers::{TrailerRewrite, TrailerRule};

/// Default bound on the upstream TCP connect.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on the guest's ClientHello and the two TLS handshakes.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the first extended CONNECT on a connection waits for the HTTP/2
/// upstream's SETTINGS to enable the protocol (hyper gives no signal when
/// the peer's SETTINGS arrive; a server sends them first thing, so they are
/// normally in before the guest's request). Later requests do not wait.
pub const CONNECT_PROTOCOL_WAIT: Duration = Duration::from_secs(1);

const H2: &[u8] = b"h2";
const H1: &[u8] = b"http/1.1";

type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The body type both legs are driven with.
type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// Why the interceptor could not be built.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum InterceptError {
    /// The CA could not be made.
    #[error(transparent)]
    Ca(#[from] CaError),
    /// An extra upstream CA certificate was refused.
    #[error("extra upstream CA: {0}")]
    ExtraRoot(String),
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
}

/// Configuration of an [`Interceptor`].
#[derive(Debug, Clone, Default)]
pub struct InterceptorConfig {
    /// CA and leaf lifetimes.
    pub ca: CaOptions,
    /// CA certificates trusted for upstreams besides the webpki roots
    /// (`--upstream-ca`).
    pub extra_roots: Vec<CertificateDer<'static>>,
    /// Bound on the upstream TCP connect ([`DEFAULT_CONNECT_TIMEOUT`] if zero).
    pub connect_timeout: Duration,
}

/// An intercepted flow as the datapath hands it over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowInfo {
    /// The gateway's flow id.
    pub id: u64,
    /// Guest endpoint.
    pub src: SocketAddr,
    /// Validated destination (connect here, nowhere else).
    pub dst: SocketAddr,
    /// The SNI enforcement verified (normalised).
    pub sni: String,
}

/// The proxy shared by every intercepted connection: CA, upstream TLS
/// configuration and the secret store (swapped on reload).
pub struct Interceptor {
    ca: SandboxCa,
    upstream: Arc<rustls::ClientConfig>,
    provider: Arc<rustls::crypto::CryptoProvider>,
    /// Shared with every open connection, which reads it per request.
    secrets: Arc<ArcSwap<SecretStore>>,
    connect_timeout: Duration,
}

impl std::fmt::Debug for Interceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interceptor")
            .field("ca", &self.ca)
            .finish_non_exhaustive()
    }
}

/// Serves the one leaf minted for the connection's SNI.
#[derive(Debug)]
struct OneCert(Arc<CertifiedKey>);

impl ResolvesServerCert for OneCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

impl Interceptor {
    /// A proxy whose CA is constrained to `inspected` (normally
    /// [`sluice_policy::CompiledPolicy::inspected_patterns`]) with the
    /// secret values of `secrets`.
    pub fn new(
        inspected: &[sluice_policy::DomainPattern],
        secrets: Arc<SecretStore>,
        config: InterceptorConfig,
    ) -> Result<Self, InterceptError> {
        let ca = SandboxCa::generate(inspected, config.ca)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        for der in config.extra_roots {
            roots
                .add(der)
                .map_err(|e| InterceptError::ExtraRoot(e.to_string()))?;
        }
        let upstream = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connect_timeout = if config.connect_timeout.is_zero() {
            DEFAULT_CONNECT_TIMEOUT
        } else {
            config.connect_timeout
        };
        Ok(Self {
            ca,
            upstream: Arc::new(upstream),
            provider,
            secrets: Arc::new(ArcSwap::new(secrets)),
            connect_timeout,
        })
    }

    /// The sandbox CA (its certificate goes to the guest).
    pub fn ca(&self) -> &SandboxCa {
        &self.ca
    }

    /// The secret store in force now (for placeholder detection elsewhere,
    /// e.g. on plain HTTP, where nothing is ever substituted).
    pub fn secrets(&self) -> Arc<SecretStore> {
        self.secrets.load_full()
    }

    /// Installs the secret values and bindings of a reloaded policy. Every
    /// request from now on uses them, on connections already open too (each
    /// request reads the store in force when it starts; a request already
    /// under way finishes with the store it started with).
    pub fn set_secrets(&self, secrets: Arc<SecretStore>) {
        self.secrets.store(secrets);
    }

    /// Proxies one intercepted connection until either side ends it.
    /// `guest` delivers the guest's bytes starting with its ClientHello.
    pub async fn serve<S>(self: Arc<Self>, guest: S, flow: FlowInfo, audit: Arc<dyn AuditOut>)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let fail = |reason: Reason, detail: String| {
            let mut e = HttpEvent::new(
                Kind::Connection,
                reason,
                flow.id,
                flow.src,
                flow.dst,
                &flow.sni,
            );
            e.detail = Some(detail);
            audit.record(e);
        };
        // 1. The guest's ClientHello.
        let start = match tokio::time::timeout(
            HANDSHAKE_TIMEOUT,
            LazyConfigAcceptor::new(Acceptor::default(), guest),
        )
        .await
        {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return fail(Reason::InspectFailed, format!("guest ClientHello: {e}")),
            Err(_) => return fail(Reason::InspectFailed, "guest ClientHello timed out".into()),
        };
        let hello = start.client_hello();
        let sni_ok = hello
            .server_name()
            .is_some_and(|n| sluice_name::wire_equals(n.as_bytes(), &flow.sni));
        if !sni_ok {
            return fail(
                Reason::InspectFailed,
                "ClientHello SNI differs from the verified one".into(),
            );
        }
        let offered: Vec<Vec<u8>> = hello
            .alpn()
            .map(|it| {
                it.filter(|p| *p == H2 || *p == H1)
                    .map(<[u8]>::to_vec)
                    .collect()
            })
            .unwrap_or_default();
        let leaf = match self.ca.leaf(&flow.sni) {
            Ok(l) => l,
            Err(e) => return fail(Reason::InspectFailed, e.to_string()),
        };

        // 2. Upstream TCP + TLS.
        let (upstream, alpn) = match self.connect_upstream(&flow, &offered).await {
            Ok((tls, alpn)) => (Some(tls), alpn),
            Err((reason, detail)) => {
                fail(reason, detail.clone());
                // Answer the guest's requests with 502: prefer HTTP/1.1.
                let alpn = if offered.iter().any(|p| p == H1) {
                    Some(H1.to_vec())
                } else {
                    offered.first().cloned()
                };
                let guest_tls = match self.accept_guest(start, leaf, alpn.clone()).await {
                    Ok(s) => s,
                    Err(_) => return,
                };
                let conn = Arc::new(Conn {
                    flow: flow.clone(),
                    upstream: Upstream::Failed { reason, detail },
                    secrets: Arc::clone(&self.secrets),
                    audit: audit.clone(),
                    connect_protocol_settled: AtomicBool::new(false),
                });
                serve_guest(conn, guest_tls, alpn.as_deref() == Some(H2)).await;
                return;
            }
        };
        let Some(upstream) = upstream else { return };

        // 3. The guest's handshake, with the upstream's ALPN choice.
        let guest_tls = match self.accept_guest(start, leaf, alpn.clone()).await {
            Ok(s) => s,
            Err(e) => return fail(Reason::InspectFailed, format!("guest handshake: {e}")),
        };

        // 4. HTTP on both legs.
        let h2 = alpn.as_deref() == Some(H2);
        let io = TokioIo::new(upstream);
        let upstream = if h2 {
            match client_h2::Builder::new(TokioExecutor::new())
                .handshake(io)
                .await
            {
                Ok((send, conn)) => {
                    let (tx, connect_protocol) = tokio::sync::watch::channel(false);
                    tokio::spawn(async move {
                        let conn = WatchConnectProtocol::new(conn, tx);
                        if let Err(e) = conn.await {
                            tracing::debug!(error = %e, "upstream h2 connection ended");
                        }
                    });
                    Upstream::H2 {
                        send,
                        connect_protocol,
                    }
                }
                Err(e) => Upstream::Failed {
                    reason: Reason::UpstreamError,
                    detail: format!("upstream HTTP/2 handshake: {e}"),
                },
            }
        } else {
            match client_h1::Builder::new().handshake(io).await {
                Ok((send, conn)) => {
                    tokio::spawn(async move {
                        if let Err(e) = conn.with_upgrades().await {
                            tracing::debug!(error = %e, "upstream h1 connection ended");
                        }
                    });
                    Upstream::H1(tokio::sync::Mutex::new(send))
                }
                Err(e) => Upstream::Failed {
                    reason: Reason::UpstreamError,
                    detail: format!("upstream HTTP/1.1 handshake: {e}"),
                },
            }
        };
        let conn = Arc::new(Conn {
            secrets: Arc::clone(&self.secrets),
            flow,
            upstream,
            audit,
            connect_protocol_settled: AtomicBool::new(false),
        });
        serve_guest(conn, guest_tls, h2).await;
    }

    /// Connects and handshakes upstream; the ALPN protocol it chose.
    async fn connect_upstream(
        &self,
        flow: &FlowInfo,
        offered: &[Vec<u8>],
    ) -> Result<(tokio_rustls::client::TlsStream<TcpStream>, Option<Vec<u8>>), (Reason, String)>
    {
        let tcp =
            match tokio::time::timeout(self.connect_timeout, TcpStream::connect(flow.dst)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    return Err((Reason::ConnectFailed, format!("connect {}: {e}", flow.dst)));
                }
                Err(_) => {
                    return Err((
                        Reason::ConnectFailed,
                        format!("connect {}: timed out", flow.dst),
                    ));
                }
            };
        let _ = tcp.set_nodelay(true);
        let mut cfg = (*self.upstream).clone();
        cfg.alpn_protocols = offered.to_vec();
        let name = ServerName::try_from(flow.sni.clone())
            .map_err(|e| (Reason::InspectFailed, format!("SNI {}: {e}", flow.sni)))?;
        let connector = TlsConnector::from(Arc::new(cfg));
        let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, connector.connect(name, tcp)).await
        {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                let cert = e
                    .get_ref()
                    .and_then(|i| i.downcast_ref::<rustls::Error>())
                    .is_some_and(|r| {
                        matches!(
                            r,
                            rustls::Error::InvalidCertificate(_)
                                | rustls::Error::NoCertificatesPresented
                        )
                    });
                let reason = if cert {
                    Reason::UpstreamTlsFailed
                } else {
                    Reason::UpstreamError
                };
                return Err((reason, format!("upstream TLS with {}: {e}", flow.sni)));
            }
            Err(_) => {
                return Err((
                    Reason::UpstreamError,
                    format!("upstream TLS with {}: timed out", flow.sni),
                ));
            }
        };
        let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
        Ok((tls, alpn))
    }

    async fn accept_guest<S>(
        &self,
        start: tokio_rustls::StartHandshake<S>,
        leaf: Arc<CertifiedKey>,
        alpn: Option<Vec<u8>>,
    ) -> Result<tokio_rustls::server::TlsStream<S>, std::io::Error>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let mut cfg = rustls::ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(std::io::Error::other)?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(OneCert(leaf)));
        cfg.alpn_protocols = alpn.into_iter().collect();
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, start.into_stream(Arc::new(cfg))).await {
            Ok(r) => r,
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "guest handshake timed out",
            )),
        }
    }
}

/// The upstream leg of one connection.
enum Upstream {
    H1(tokio::sync::Mutex<client_h1::SendRequest<ProxyBody>>),
    H2 {
        send: client_h2::SendRequest<ProxyBody>,
        /// Whether the upstream's SETTINGS enable extended CONNECT.
        connect_protocol: tokio::sync::watch::Receiver<bool>,
    },
    /// Never connected (or refused): every request gets 502 with this reason.
    Failed {
        reason: Reason,
        detail: String,
    },
}

impl Upstream {
    /// Sends one request; the error text on failure.
    async fn send(&self, req: Request<ProxyBody>) -> Result<Response<Incoming>, String> {
        let res = match self {
            Self::H1(m) => {
                let mut s = m.lock().await;
                match s.ready().await {
                    Ok(()) => s.send_request(req).await,
                    Err(e) => Err(e),
                }
            }
            Self::H2 { send, .. } => {
                let mut s = send.clone();
                match s.ready().await {
                    Ok(()) => s.send_request(req).await,
                    Err(e) => Err(e),
                }
            }
            Self::Failed { detail, .. } => return Err(detail.clone()),
        };
        res.map_err(|e| e.to_string())
    }

    /// Whether an extended CONNECT can be sent upstream: an HTTP/2 upstream
    /// whose SETTINGS enabled the protocol. The first call on a connection
    /// waits up to [`CONNECT_PROTOCOL_WAIT`] for those SETTINGS (`settled`
    /// records that it did). `Err` says why not.
    async fn extended_connect_ready(&self, settled: &AtomicBool) -> Result<(), &'static str> {
        let Self::H2 {
            connect_protocol, ..
        } = self
        else {
            return Err("extended CONNECT cannot be forwarded on an HTTP/1.1 upstream");
        };
        let mut rx = connect_protocol.clone();
        if *rx.borrow() {
            return Ok(());
        }
        if !settled.swap(true, Ordering::Relaxed)
            && let Ok(Ok(_)) =
                tokio::time::timeout(CONNECT_PROTOCOL_WAIT, rx.wait_for(|on| *on)).await
        {
            return Ok(());
        }
        if *rx.borrow() {
            return Ok(());
        }
        Err(
            "the upstream does not enable extended CONNECT (RFC 8441 SETTINGS_ENABLE_CONNECT_PROTOCOL)",
        )
    }
}

/// Drives the upstream HTTP/2 connection and publishes whether the peer's
/// SETTINGS enable extended CONNECT. hyper processes frames in a task of
/// its own and wakes this one only for requests, so the state is re-read
/// every [`RECHECK`] until it is on or [`CONNECT_PROTOCOL_WAIT`] after the
/// connection started (servers send SETTINGS first).
struct WatchConnectProtocol<C> {
    conn: Pin<Box<C>>,
    enabled: tokio::sync::watch::Sender<bool>,
    recheck: Option<Pin<Box<tokio::time::Sleep>>>,
    until: tokio::time::Instant,
}

/// Re-read period of [`WatchConnectProtocol`].
const RECHECK: Duration = Duration::from_millis(10);

impl<C> WatchConnectProtocol<C> {
    fn new(conn: C, enabled: tokio::sync::watch::Sender<bool>) -> Self {
        Self {
            conn: Box::pin(conn),
            enabled,
            recheck: None,
            until: tokio::time::Instant::now() + CONNECT_PROTOCOL_WAIT,
        }
    }
}

impl<T> Future for WatchConnectProtocol<client_h2::Connection<T, ProxyBody, TokioExecutor>>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    type Output = hyper::Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let res = this.conn.as_mut().poll(cx);
        let on = this.conn.is_extended_connect_protocol_enabled();
        this.enabled
            .send_if_modified(|v| std::mem::replace(v, on) != on);
        if res.is_ready() {
            return res;
        }
        let now = tokio::time::Instant::now();
        if on || now >= this.until {
            this.recheck = None;
            return Poll::Pending;
        }
        let sleep = this
            .recheck
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(RECHECK)));
        if sleep.as_mut().poll(cx).is_ready() {
            sleep.as_mut().reset(now + RECHECK);
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }
}

/// Per-connection state shared by its requests.
struct Conn {
    flow: FlowInfo,
    upstream: Upstream,
    /// The proxy's secret store, read at the start of every request so a
    /// reload's bindings apply to open connections too.
    secrets: Arc<ArcSwap<SecretStore>>,
    audit: Arc<dyn AuditOut>,
    /// An extended CONNECT already waited for the upstream's SETTINGS.
    connect_protocol_settled: AtomicBool,
}

async fn serve_guest<S>(conn: Arc<Conn>, guest: S, h2: bool)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req| {
        let conn = conn.clone();
        async move { Ok::<_, Infallible>(handle(conn, req).await) }
    });
    let io = TokioIo::new(guest);
    let res = if h2 {
        hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .enable_connect_protocol()
            .serve_connection(io, svc)
            .await
    } else {
        hyper::server::conn::http1::Builder::new()
            .serve_connection(io, svc)
            .with_upgrades()
            .await
    };
    if let Err(e) = res {
        tracing::debug!(error = %e, "guest connection ended");
    }
}

fn empty() -> ProxyBody {
    http_body_util::Empty::new()
        .map_err(|e: Infallible| -> BoxError { match e {} })
        .boxed_unsync()
}

fn text_response(status: StatusCode, text: &str) -> Response<ProxyBody> {
    let body = http_body_util::Full::new(Bytes::from(format!("sluice: {text}\n")))
        .map_err(|e: Infallible| -> BoxError { match e {} })
        .boxed_unsync();
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// The request's authority if it names the SNI: every Host header and an
/// absolute target's authority must. `Err` carries what was sent instead.
fn check_authority(req: &Request<Incoming>, sni: &str, port: u16) -> Result<String, String> {
    let mut seen: Vec<String> = Vec::new();
    if let Some(a) = req.uri().authority() {
        seen.push(a.as_str().to_owned());
    }
    for v in req.headers().get_all(header::HOST) {
        seen.push(String::from_utf8_lossy(v.as_bytes()).into_owned());
    }
    if seen.is_empty() {
        return Err(String::new());
    }
    for s in &seen {
        if authority_host(s, port).as_deref() != Some(sni) {
            return Err(s.clone());
        }
    }
    Ok(seen.swap_remove(0))
}

/// `TE` names `trailers` (the client accepts trailer fields).
fn wants_trailers(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::TE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| {
            t.split(';')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case("trailers"))
        })
}

/// `secrets` plus the secrets request trailers substituted (header
/// location), each once.
fn merged_secrets(
    secrets: &[(String, SecretLocation)],
    trailer_subs: &Mutex<Substitutions>,
) -> Vec<(String, SecretLocation)> {
    let mut out = secrets.to_vec();
    if let Ok(t) = trailer_subs.lock() {
        for u in &t.used {
            if !out.contains(u) {
                out.push(u.clone());
            }
        }
    }
    out
}

fn wants_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// Emits the request's `http` event when the response body ends (or is
/// dropped: guest gone, stream reset).
struct Finish {
    audit: Arc<dyn AuditOut>,
    event: Option<HttpEvent>,
    started: Instant,
    up: Arc<AtomicU64>,
    down: Arc<AtomicU64>,
    body_secrets: Arc<Mutex<Vec<String>>>,
    /// What request trailers substituted and carried (filled when the
    /// request body ended; empty if it had not ended by then).
    trailer_subs: Arc<Mutex<Substitutions>>,
}

impl Drop for Finish {
    fn drop(&mut self) {
        if let Some(mut e) = self.event.take() {
            e.bytes_up = Some(self.up.load(Ordering::Relaxed));
            e.bytes_down = Some(self.down.load(Ordering::Relaxed));
            e.duration_ms =
                Some(u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX));
            if let Ok(names) = self.body_secrets.lock() {
                for n in names.iter() {
                    if !e
                        .secrets
                        .iter()
                        .any(|(s, l)| s == n && *l == SecretLocation::Body)
                    {
                        e.secrets.push((n.clone(), SecretLocation::Body));
                    }
                }
            }
            e.secrets = merged_secrets(&e.secrets, &self.trailer_subs);
            if let Ok(t) = self.trailer_subs.lock()
                && !t.mismatched.is_empty()
            {
                let mut m = e.clone();
                m.reason = Reason::SecretHostMismatch;
                m.secrets.clear();
                m.detail = Some(format!(
                    "placeholder of secret(s) {} in request trailers to {}, which they are not bound to; passed through unchanged",
                    t.mismatched.join(", "),
                    e.sni
                ));
                self.audit.record(m);
            }
            self.audit.record(e);
        }
    }
}

/// A body passed through, counted, and optionally rewritten by a
/// [`StreamReplacer`] (boundary-safe: it holds back at most the longest
/// pattern minus one byte).
struct Tapped<B> {
    inner: B,
    replacer: Option<StreamReplacer>,
    count: Arc<AtomicU64>,
    /// Secret names the replacer substituted, filled when the body ends.
    used: Option<Arc<Mutex<Vec<String>>>>,
    /// Trailers held back while the replacer's tail is sent.
    trailers: Option<HeaderMap>,
    /// Request bodies: placeholders passed through unchanged, scanned as
    /// the guest sent them and reported when the body ends.
    passed: Option<PassedThrough>,
    done: bool,
    _finish: Option<Finish>,
}

impl<B> Tapped<B> {
    fn new(inner: B, replacer: Option<StreamReplacer>, count: Arc<AtomicU64>) -> Self {
        Self {
            inner,
            replacer,
            count,
            used: None,
            trailers: None,
            passed: None,
            done: false,
            _finish: None,
        }
    }

    /// The body ended: report what passed through.
    fn ended(&mut self) {
        if let Some(p) = self.passed.as_mut() {
            p.report();
        }
    }

    fn finish_replacer(&mut self) -> Option<Bytes> {
        let rep = self.replacer.as_mut()?;
        let mut out = Vec::new();
        rep.finish(&mut out);
        if let Some(used) = &self.used
            && let Ok(mut u) = used.lock()
        {
            u.extend(rep.used().into_iter().map(str::to_owned));
        }
        self.replacer = None;
        (!out.is_empty()).then(|| Bytes::from(out))
    }

    fn data(&self, b: Bytes) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.count.fetch_add(b.len() as u64, Ordering::Relaxed);
        Poll::Ready(Some(Ok(Frame::data(b))))
    }
}

impl<B> Body for Tapped<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            if this.done {
                return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))));
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
                Poll::Ready(None) => {
                    this.done = true;
                    this.ended();
                    if let Some(tail) = this.finish_replacer() {
                        return this.data(tail);
                    }
                }
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        if let Some(p) = this.passed.as_mut() {
                            p.feed(&data);
                        }
                        match this.replacer.as_mut() {
                            None => return this.data(data),
                            Some(rep) => {
                                let mut out = Vec::with_capacity(data.len() + 64);
                                rep.feed(&data, &mut out);
                                if !out.is_empty() {
                                    return this.data(Bytes::from(out));
                                }
                            }
                        }
                    }
                    Err(frame) => {
                        this.done = true;
                        this.ended();
                        if let Ok(t) = frame.into_trailers() {
                            this.trailers = Some(t);
                        }
                        if let Some(tail) = this.finish_replacer() {
                            return this.data(tail);
                        }
                    }
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        if self.replacer.is_some() {
            SizeHint::default()
        } else {
            self.inner.size_hint()
        }
    }
}

/// One request: check, substitute, forward, scrub.
async fn handle(conn: Arc<Conn>, mut req: Request<Incoming>) -> Response<ProxyBody> {
    let started = Instant::now();
    let flow = &conn.flow;
    // The bindings in force now: the request, its response and trailers
    // use this one snapshot.
    let subst = conn.secrets.load().for_host(&flow.sni);
    let mut event = HttpEvent::new(
        Kind::Http,
        Reason::Allowlisted,
        flow.id,
        flow.src,
        flow.dst,
        &flow.sni,
    );
    event.method = Some(req.method().as_str().to_owned());
    event.path = Some(req.uri().path().to_owned());
    let reply_now = |mut event: HttpEvent, reason: Reason, status: StatusCode, text: &str| {
        event.reason = reason;
        event.status = Some(status.as_u16());
        event.duration_ms = Some(u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX));
        conn.audit.record(event);
        text_response(status, text)
    };

    // Host / :authority must name the SNI.
    match check_authority(&req, &flow.sni, flow.dst.port()) {
        Ok(host) => event.host = Some(host),
        Err(sent) => {
            event.host = (!sent.is_empty()).then_some(sent);
            return reply_now(
                event,
                Reason::HostSniMismatch,
                StatusCode::MISDIRECTED_REQUEST,
                "request authority does not match the TLS server name",
            );
        }
    }
    if let Upstream::Failed { reason, detail } = &conn.upstream {
        event.detail = Some(detail.clone());
        return reply_now(event, *reason, StatusCode::BAD_GATEWAY, detail);
    }

    // CONNECT: only the extended form (HTTP/2 `:protocol`, RFC 8441) is
    // proxied; a tunnel to wherever the upstream would take it is not.
    let protocol = req.extensions().get::<hyper::ext::Protocol>().cloned();
    let ext_connect = req.method() == Method::CONNECT && protocol.is_some();
    if req.method() == Method::CONNECT && !ext_connect {
        return reply_now(
            event,
            Reason::HttpConnectDenied,
            StatusCode::METHOD_NOT_ALLOWED,
            "CONNECT tunnels are not proxied on an inspected connection",
        );
    }
    if let Some(p) = &protocol {
        let p: String = p.as_str().chars().take(64).collect();
        event.detail = Some(format!("extended CONNECT, protocol {p}"));
        if let Err(why) = conn
            .upstream
            .extended_connect_ready(&conn.connect_protocol_settled)
            .await
        {
            event.detail = Some(why.to_owned());
            return reply_now(event, Reason::UpstreamError, StatusCode::BAD_GATEWAY, why);
        }
    }

    let h1_upgrade = req.version() < http::Version::HTTP_2 && wants_upgrade(req.headers());
    let guest_upgrade = (h1_upgrade || ext_connect).then(|| hyper::upgrade::on(&mut req));
    let te_trailers = wants_trailers(req.headers());
    let (mut parts, body) = req.into_parts();
    strip_hop_by_hop(&mut parts.headers, h1_upgrade);
    if te_trailers {
        // The one TE an end-to-end client needs passed on: without it an
        // HTTP/1.1 origin sends no trailers.
        parts
            .headers
            .insert(header::TE, HeaderValue::from_static("trailers"));
    }
    // `Expect: 100-continue` was answered by this leg's server when the body
    // was first read; upstream gets the body without waiting.
    parts.headers.remove(header::EXPECT);

    let subs = match subst.request_head(&mut parts) {
        Ok(s) => s,
        Err(e) => {
            event.detail = Some(e.to_string());
            return reply_now(
                event,
                Reason::InspectFailed,
                StatusCode::BAD_REQUEST,
                "secret substitution would make the request invalid",
            );
        }
    };
    event.secrets = subs.used.clone();
    // A request without a body (most GETs) is not scanned at all.
    let scanner = if body.is_end_stream() {
        None
    } else {
        subst.request_body_scanner()
    };
    let passed = PassedThrough::new(&conn.audit, &event, &subs, scanner);

    let up = Arc::new(AtomicU64::new(0));
    let body_secrets = Arc::new(Mutex::new(Vec::new()));
    let replacer = subst.request_body();
    if replacer.is_some() {
        parts.headers.remove(header::CONTENT_LENGTH);
    }
    let trailer_subs = Arc::new(Mutex::new(Substitutions::default()));
    let body = TrailerRewrite::new(
        body,
        TrailerRule::Substitute {
            subst: subst.clone(),
            seen: trailer_subs.clone(),
        },
    );
    let mut req_body = Tapped::new(body, replacer, up.clone());
    req_body.used = Some(body_secrets.clone());
    req_body.passed = passed;
    let head_only = parts.method == Method::HEAD;
    let upstream_req = if ext_connect {
        // No request body on a CONNECT: the stream itself is the payload
        // once the upstream accepts.
        Request::from_parts(parts, empty())
    } else {
        Request::from_parts(parts, req_body.boxed_unsync())
    };

    let resp = match conn.upstream.send(upstream_req).await {
        Ok(r) => r,
        Err(e) => {
            event.detail = Some(format!("upstream: {e}"));
            return reply_now(
                event,
                Reason::UpstreamError,
                StatusCode::BAD_GATEWAY,
                "upstream request failed",
            );
        }
    };
    let (mut rparts, rbody) = resp.into_parts();
    let status = rparts.status;

    let switched = if ext_connect {
        status.is_success()
    } else {
        status == StatusCode::SWITCHING_PROTOCOLS
    };
    if switched {
        let Some(guest_upgrade) = guest_upgrade else {
            return reply_now(
                event,
                Reason::UpstreamError,
                StatusCode::BAD_GATEWAY,
                "upstream switched protocols unasked",
            );
        };
        let mut resp = Response::from_parts(rparts, rbody);
        let upstream_upgrade = hyper::upgrade::on(&mut resp);
        let (mut rparts, _) = resp.into_parts();
        strip_hop_by_hop(&mut rparts.headers, h1_upgrade);
        // A 2xx to CONNECT carries no body and no length.
        rparts.headers.remove(header::CONTENT_LENGTH);
        subst.response_head(&subs, &mut rparts);
        event.status = Some(status.as_u16());
        let audit = conn.audit.clone();
        tokio::spawn(async move {
            let (mut up_total, mut down_total) = (0, 0);
            match tokio::try_join!(guest_upgrade, upstream_upgrade) {
                Ok((g, u)) => {
                    let (mut g, mut u) = (TokioIo::new(g), TokioIo::new(u));
                    if let Ok((a, b)) = tokio::io::copy_bidirectional(&mut g, &mut u).await {
                        (up_total, down_total) = (a, b);
                    }
                }
                Err(e) => event.detail = Some(format!("upgrade: {e}")),
            }
            event.bytes_up = Some(up_total);
            event.bytes_down = Some(down_total);
            event.duration_ms =
                Some(u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX));
            audit.record(event);
        });
        return Response::from_parts(rparts, empty());
    }

    strip_hop_by_hop(&mut rparts.headers, false);
    subst.response_head(&subs, &mut rparts);
    let no_body = head_only
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
        || status.is_informational();
    let replacer = if no_body {
        None
    } else {
        subst.response_body(&subs)
    };
    if replacer.is_some() {
        let encoded = rparts
            .headers
            .get(header::CONTENT_ENCODING)
            .is_some_and(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"));
        if encoded {
            // Cannot be scrubbed: never hand it to the guest.
            drop(rbody);
            event.detail = Some("content-encoded response from a host with bound secrets".into());
            return reply_now(
                event,
                Reason::UpstreamError,
                StatusCode::BAD_GATEWAY,
                "upstream response is content-encoded and cannot be scrubbed of secrets",
            );
        }
        rparts.headers.remove(header::CONTENT_LENGTH);
    }
    event.status = Some(status.as_u16());
    let down = Arc::new(AtomicU64::new(0));
    let rbody = TrailerRewrite::new(
        rbody,
        TrailerRule::Scrub {
            subst: subst.clone(),
            request: subs,
        },
    );
    let mut body = Tapped::new(rbody, replacer, down.clone());
    body._finish = Some(Finish {
        audit: conn.audit.clone(),
        event: Some(event),
        started,
        up,
        down,
        body_secrets,
        trailer_subs,
    });
    Response::from_parts(rparts, body.boxed_unsync())
}

/// The request's `secret_host_mismatch` record: the placeholders it passed
/// through unchanged, from its head (known at once) and from its body
/// (scanned as the guest sent it, exact across chunk boundaries, without
/// holding the body). Written at most once per request, when the request body
/// ends or is dropped (whichever comes first); nothing when no placeholder
/// was seen. Names only, never values.
struct PassedThrough {
    audit: Arc<dyn AuditOut>,
    /// The request's event (method, host, path); `None` once reported.
    event: Option<HttpEvent>,
    /// Secrets not bound to the SNI whose placeholder was in the head.
    head_mismatched: Vec<String>,
    /// Bound secrets whose placeholder was in the head where their
    /// `locations` do not allow substitution (the path, query or a header).
    head_not_allowed: Vec<String>,
    /// The body scanner (`None` when no placeholder can pass in a body).
    body: Option<PlaceholderScanner>,
}

impl PassedThrough {
    /// `None` when nothing can be reported: no placeholder in the head and no
    /// body scanner.
    fn new(
        audit: &Arc<dyn AuditOut>,
        event: &HttpEvent,
        subs: &Substitutions,
        body: Option<PlaceholderScanner>,
    ) -> Option<Self> {
        if subs.mismatched.is_empty() && subs.not_allowed.is_empty() && body.is_none() {
            return None;
        }
        let mut event = event.clone();
        event.reason = Reason::SecretHostMismatch;
        event.secrets.clear();
        Some(Self {
            audit: Arc::clone(audit),
            event: Some(event),
            head_mismatched: subs.mismatched.clone(),
            head_not_allowed: subs.not_allowed.clone(),
            body,
        })
    }

    fn feed(&mut self, chunk: &[u8]) {
        if let Some(scan) = self.body.as_mut() {
            scan.feed(chunk);
        }
    }

    /// Writes the record (once) if any placeholder passed through.
    fn report(&mut self) {
        let Some(mut event) = self.event.take() else {
            return;
        };
        let (body_mismatched, body_not_allowed) = self
            .body
            .as_ref()
            .map(|s| (s.mismatched(), s.not_allowed()))
            .unwrap_or_default();
        let head_mismatched: Vec<&str> = self.head_mismatched.iter().map(|n| &**n).collect();
        let head_not_allowed: Vec<&str> = self.head_not_allowed.iter().map(|n| &**n).collect();
        let detail = passed_through_detail(
            &event.sni,
            [(&head_mismatched, "head"), (&body_mismatched, "body")],
            [(&head_not_allowed, "head"), (&body_not_allowed, "body")],
        );
        if let Some(detail) = detail {
            event.detail = Some(detail);
            self.audit.record(event);
        }
    }
}

impl Drop for PassedThrough {
    fn drop(&mut self) {
        self.report();
    }
}

/// The `detail` of a `secret_host_mismatch` record: each secret once, with
/// where its placeholder was seen (`head`, `body`); `None` when there is
/// nothing to report. `mismatched`: secrets not bound to `sni`;
/// `not_allowed`: bound secrets seen where their `locations` forbid.
fn passed_through_detail(
    sni: &str,
    mismatched: [(&[&str], &str); 2],
    not_allowed: [(&[&str], &str); 2],
) -> Option<String> {
    fn list<'a>(groups: [(&[&'a str], &'a str); 2]) -> String {
        let mut names: Vec<(&str, Vec<&str>)> = Vec::new();
        for (group, place) in groups {
            for &name in group {
                match names.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, places)) => places.push(place),
                    None => names.push((name, vec![place])),
                }
            }
        }
        names
            .iter()
            .map(|(n, places)| format!("{n} ({})", places.join(", ")))
            .collect::<Vec<_>>()
            .join(", ")
    }
    let mut parts = Vec::new();
    let mismatched_list = list(mismatched);
    if !mismatched_list.is_empty() {
        parts.push(format!(
            "placeholder of secret(s) {mismatched_list} sent to {sni}, which they are not bound to"
        ));
    }
    let not_allowed_list = list(not_allowed);
    if !not_allowed_list.is_empty() {
        parts.push(format!(
            "placeholder of secret(s) {not_allowed_list} sent to {sni} where their locations do not allow substitution"
        ));
    }
    if parts.is_empty() {
        return None;
    }
    parts.push("passed through unchanged".to_owned());
    Some(parts.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records every event (tests).
    #[derive(Default)]
    struct Recorded(Mutex<Vec<HttpEvent>>);

    impl AuditOut for Recorded {
        fn record(&self, event: HttpEvent) {
            self.0.lock().unwrap().push(event);
        }
    }

    /// A body that yields the given data frames, one per poll.
    struct Frames(std::collections::VecDeque<Bytes>);

    impl Body for Frames {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
        }
    }

    const POLICY: &str = "version: 1\nid: t\nallow:\n  - domains: [a.example.com, b.example.com]\n\
        secrets:\n  - name: tok\n    placeholder: PH-tok-placeholder\n    env: TOK\n    hosts: [a.example.com]\n\
        \x20 - name: bod\n    placeholder: PH-bod-placeholder\n    env: BOD\n    hosts: [a.example.com]\n    locations: [headers, body]\n";

    fn store() -> SecretStore {
        let policy = sluice_policy::from_yaml_str(POLICY, "t.yaml", &Default::default()).unwrap();
        SecretStore::load_with(&policy, |var| {
            Some(zeroize::Zeroizing::new(
                format!("REAL-{var}-value").into_bytes(),
            ))
        })
        .unwrap()
    }

    /// Streams `chunks` through a request-direction [`Tapped`] for `sni`,
    /// as `handle` wires it; what came out and what was recorded.
    async fn send_body(sni: &str, chunks: &[&str]) -> (Vec<u8>, Vec<HttpEvent>) {
        send(sni, "", chunks).await
    }

    /// [`send_body`] with `authorization` as a header (through the head
    /// substitution first).
    async fn send(sni: &str, authorization: &str, chunks: &[&str]) -> (Vec<u8>, Vec<HttpEvent>) {
        let store = store();
        let sub = store.for_host(sni);
        let (mut parts, ()) = Request::builder()
            .uri("/up")
            .header(header::AUTHORIZATION, authorization)
            .body(())
            .unwrap()
            .into_parts();
        let subs = sub.request_head(&mut parts).unwrap();
        let audit = Arc::new(Recorded::default());
        let event = HttpEvent::new(
            Kind::Http,
            Reason::Allowlisted,
            1,
            "10.0.2.15:40000".parse().unwrap(),
            "198.51.100.10:443".parse().unwrap(),
            sni,
        );
        let body = Frames(chunks.iter().map(|c| Bytes::from(c.to_string())).collect());
        let mut tapped = Tapped::new(body, sub.request_body(), Arc::new(AtomicU64::new(0)));
        let out_audit: Arc<dyn AuditOut> = audit.clone();
        tapped.passed = PassedThrough::new(&out_audit, &event, &subs, sub.request_body_scanner());
        let out = tapped.collect().await.unwrap().to_bytes().to_vec();
        let events = std::mem::take(&mut *audit.0.lock().unwrap());
        (out, events)
    }

    #[tokio::test]
    async fn placeholders_passed_through_in_a_request_body_are_reported_once() {
        // Another host's placeholder, cut across two chunks: passed through
        // byte for byte, one record naming the secrets, never a value.
        let chunks = [
            "x=PH-tok-plac",
            "eholder&y=PH-bod-placeholder&z=PH-tok-placeholder",
        ];
        let (out, events) = send_body("b.example.com", &chunks).await;
        assert_eq!(out, chunks.concat().as_bytes());
        assert_eq!(events.len(), 1, "{events:?}");
        let e = &events[0];
        assert_eq!(e.reason, Reason::SecretHostMismatch);
        assert_eq!(
            e.detail.as_deref(),
            Some(
                "placeholder of secret(s) tok (body), bod (body) sent to b.example.com, \
                 which they are not bound to; passed through unchanged"
            )
        );
        assert!(e.secrets.is_empty());

        // The bound host: `bod` is substituted (not reported), `tok` is bound
        // but not allowed in the body (reported as such).
        let (out, events) = send_body(
            "a.example.com",
            &["PH-tok-placeholder PH-bod-", "placeholder"],
        )
        .await;
        assert_eq!(out, b"PH-tok-placeholder REAL-BOD-value");
        assert_eq!(events.len(), 1, "{events:?}");
        let detail = events[0].detail.clone().unwrap();
        assert!(
            detail.starts_with("placeholder of secret(s) tok (body) sent to a.example.com where their locations do not allow"),
            "{detail}"
        );
        assert!(
            !detail.contains("REAL") && !detail.contains("PH-"),
            "{detail}"
        );

        // In the head and the body of one request: still one record.
        let (_, events) = send(
            "b.example.com",
            "Bearer PH-tok-placeholder",
            &["PH-bod-placeholder"],
        )
        .await;
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(
            events[0].detail.as_deref(),
            Some(
                "placeholder of secret(s) tok (head), bod (body) sent to b.example.com, \
                 which they are not bound to; passed through unchanged"
            )
        );
        // Only in the head, no body: reported when the (empty) body ends.
        let (_, events) = send("b.example.com", "Bearer PH-tok-placeholder", &[]).await;
        assert_eq!(events.len(), 1, "{events:?}");

        // No placeholder: no record.
        let (out, events) = send_body("b.example.com", &["PH-tok-", "placeholde", "r-not"]).await;
        assert_eq!(out, b"PH-tok-placeholder-not");
        assert_eq!(
            events.len(),
            1,
            "a placeholder followed by more bytes is still one"
        );
        let (_, events) =
            send_body("b.example.com", &["nothing ", "to see PH-tok-placeholde"]).await;
        assert!(events.is_empty(), "{events:?}");
    }

    #[test]
    fn passed_through_detail_names_each_secret_once_with_its_places() {
        let d = passed_through_detail(
            "x.test",
            [(&["a", "b"], "head"), (&["b", "c"], "body")],
            [(&[], "head"), (&["d"], "body")],
        )
        .unwrap();
        assert_eq!(
            d,
            "placeholder of secret(s) a (head), b (head, body), c (body) sent to x.test, which they \
             are not bound to; placeholder of secret(s) d (body) sent to x.test where their \
             locations do not allow substitution; passed through unchanged"
        );
        assert_eq!(
            passed_through_detail(
                "x.test",
                [(&[], "head"), (&[], "body")],
                [(&[], "head"), (&[], "body")]
            ),
            None
        );
    }

    #[test]
    fn authority_normalisation() {
        assert_eq!(
            authority_host("API.Example.com.", 443).as_deref(),
            Some("api.example.com")
        );
        assert_eq!(
            authority_host("api.example.com:443", 443).as_deref(),
            Some("api.example.com")
        );
        assert_eq!(authority_host("api.example.com:8443", 443), None);
        assert_eq!(
            authority_host("api.example.com:8443", 8443).as_deref(),
            Some("api.example.com")
        );
        assert_eq!(authority_host("", 443), None);
    }

    #[test]
    fn te_trailers_is_recognised() {
        let mut h = HeaderMap::new();
        h.insert(header::TE, HeaderValue::from_static("gzip, Trailers;q=1"));
        assert!(wants_trailers(&h));
        h.insert(header::TE, HeaderValue::from_static("gzip"));
        assert!(!wants_trailers(&h));
        assert!(!wants_trailers(&HeaderMap::new()));
    }

    /// A scrubbed response body keeps its trailers (scrubbed too), sent
    /// after the replacer's held-back tail.
    #[tokio::test]
    async fn scrubbed_body_keeps_scrubbed_trailers() {
        let store = crate::trailers::test_store();
        let sub = store.for_host("api.example.com");
        let subs = Substitutions::default();
        let mut t = HeaderMap::new();
        t.insert("x-echo", HeaderValue::from_static("real-hdr-value"));
        let frames = crate::trailers::Frames(
            [
                Frame::data(Bytes::from_static(b"a real-hdr")),
                Frame::data(Bytes::from_static(b"-value b real-")),
                Frame::trailers(t),
            ]
            .into(),
        );
        let body = TrailerRewrite::new(
            frames,
            TrailerRule::Scrub {
                subst: sub.clone(),
                request: subs.clone(),
            },
        );
        let count = Arc::new(AtomicU64::new(0));
        let tapped = Tapped::new(body, sub.response_body(&subs), count.clone());
        let got = tapped.collect().await.unwrap();
        let trailers = got.trailers().cloned().unwrap();
        assert_eq!(trailers["x-echo"], "PH-hdr-secret");
        assert_eq!(&got.to_bytes()[..], b"a PH-hdr-secret b real-");
        assert_eq!(count.load(Ordering::Relaxed), 23);
    }

    #[test]
    fn hop_by_hop_headers_are_removed() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-foo"),
        );
        h.insert("x-foo", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer x"));
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h.len(), 1, "{h:?}");
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert!(wants_upgrade(&h));
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h.get(header::UPGRADE).unwrap(), "websocket");
        assert_eq!(h.get(header::CONNECTION).unwrap(), "upgrade");
    }
}

//! The TLS-terminating proxy for one intercepted connection.
//!
//! Order of operations for a connection ([`Interceptor::serve`]):
//! 1. Read the guest's ClientHello (rustls, lazily): its SNI must equal the
//!    one enforcement verified, else the connection is dropped
//!    (`inspect_failed`).
//! 2. Connect to the validated destination IP (refused when the kernel
//!    routes it locally: `crate::http::upstream`) and handshake TLS with the
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
//!      content-encoded response (any coding in any `Content-Encoding`
//!      field) on a host with bound secrets cannot be scrubbed and is
//!      answered `502` instead (`upstream_error`); requests to such a host
//!      lose `Range` / `If-Range` (a part of an echoed value would not be
//!      recognised), and a `206` from it is answered `502`;
//!    - hop-by-hop headers are dropped both ways; `Content-Length` is
//!      dropped where a body is rewritten (it is re-framed);
//!    - trailers are substituted (request) and scrubbed (response) like
//!      heads (module `trailers`);
//!    - upgrades: only WebSocket (`crate::http::upgrade`), and to a host
//!      with bound secrets only when the policy opted every one of them in
//!      (`websocket: true`): anything else is `501`, WebSocket to a host
//!      with a bound secret not opted in `403`, both `upgrade_refused` (an
//!      upgraded stream is spliced, never substituted or scrubbed, so an
//!      echo would reach the guest; opting in accepts that for the secret);
//!      the upgrade request's head is substituted and the switching
//!      response's head scrubbed like any other;
//!    - an allowed HTTP/1.1 `Upgrade: websocket` is forwarded with its
//!      headers; after `101` the two upgraded streams are spliced byte for
//!      byte;
//!    - an allowed HTTP/2 extended CONNECT (RFC 8441, `:protocol websocket`;
//!      the guest-facing server advertises
//!      `SETTINGS_ENABLE_CONNECT_PROTOCOL`) is checked and substituted like
//!      any request and forwarded as an extended CONNECT on the HTTP/2
//!      upstream; after a `2xx` the two streams are spliced byte for byte.
//!      An upstream that does not enable the protocol gets nothing: the
//!      guest is answered `502` (`upstream_error`). A plain CONNECT (a
//!      tunnel, no `:protocol`) is refused with `405`
//!      (`http_connect_denied`) on both HTTP versions.
//!
//! Each request is one [`Exchange`] (`crate::http::ledger`): its `http`
//! record is written once, by an explicit finish, whatever path it takes.
//!
//! Limits: ALPN protocols other than `h2` and `http/1.1` are not offered
//! upstream. Both legs always speak the same HTTP version, so an extended
//! CONNECT never meets an HTTP/1.1 upstream (it would be answered `502`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt as _;
use hyper::body::{Body as _, Incoming};
use hyper::client::conn::{http1 as client_h1, http2 as client_h2};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::server::{Acceptor, ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use sluice_policy::Reason;
use sluice_policy::audit::Kind;
use sluice_secrets::{HostSubstituter, SecretStore, Substitutions};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncWrite, BufReader};
use tokio::net::TcpStream;
use tokio_rustls::{LazyConfigAcceptor, TlsConnector};

use crate::ca::{CaError, CaOptions, SandboxCa};
use crate::event::{AuditOut, HttpEvent};
use crate::http::body::Tapped;
use crate::http::ledger::{Channel, Exchange, Outcome, RequestTally};
use crate::http::responses::{self, Refusal};
use crate::http::upgrade::{self, Ask};
use crate::http::{ProxyBody, authority, hop, upstream};
use crate::trailers::{TrailerRewrite, TrailerRule};

mod origin;
use origin::{Upstream, WatchConnectProtocol};

/// The upstream connection as the TLS client reads it. rustls asks for 4 KiB
/// per read, so a 16 KiB record took four system calls and the kernel
/// answered each drained read with a window update; through this buffer one
/// read takes what the socket holds, up to [`UPSTREAM_READ`].
type UpstreamIo = BufReader<TcpStream>;

/// The upstream read buffer: a few TLS records.
const UPSTREAM_READ: usize = 64 * 1024;

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
            .is_some_and(|n| authority::names_host(n, &flow.sni));
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
    ) -> Result<(tokio_rustls::client::TlsStream<UpstreamIo>, Option<Vec<u8>>), (Reason, String)>
    {
        let tcp = upstream::connect(flow.dst, self.connect_timeout)
            .await
            .map_err(|e| (e.reason, e.detail))?;
        let tcp = BufReader::with_capacity(UPSTREAM_READ, tcp);
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

/// The request's authority if it names the SNI: every Host header and an
/// absolute target's authority must. `Err` carries what was sent instead
/// (empty when nothing was).
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
        if authority::parse(s, port).ok().as_deref() != Some(sni) {
            return Err(s.clone());
        }
    }
    Ok(seen.swap_remove(0))
}

/// What a request asks beyond a plain exchange, decided before it goes
/// upstream.
struct Plan {
    /// An HTTP/2 extended CONNECT (`:protocol`, RFC 8441).
    ext_connect: bool,
    /// An HTTP/1.1 WebSocket upgrade.
    h1_upgrade: bool,
    /// The guest's side of an allowed upgrade.
    guest_upgrade: Option<OnUpgrade>,
    /// A HEAD request (no response body).
    head_only: bool,
}

/// One request: admit, substitute, forward, then relay (scrubbed) or splice.
/// Every path finishes the request's [`Exchange`] exactly once.
async fn handle(conn: Arc<Conn>, mut req: Request<Incoming>) -> Response<ProxyBody> {
    let flow = &conn.flow;
    // The bindings in force now: the request, its response and trailers use
    // this one snapshot; the next request on this connection reads again.
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
    let mut x = Exchange::open(conn.audit.clone(), event, Channel::Tls, Instant::now());

    let plan = match admit(&conn, &subst, &mut req, &mut x).await {
        Ok(plan) => plan,
        Err(refusal) => return refusal.answer(x, false),
    };
    let (upstream_req, subs) = match prepare(&subst, req, &plan, &mut x) {
        Ok(r) => r,
        Err(refusal) => return refusal.answer(x, false),
    };
    let resp = match conn.upstream.send(upstream_req).await {
        Ok(r) => r,
        Err(e) => {
            return Refusal::new(
                Reason::UpstreamError,
                StatusCode::BAD_GATEWAY,
                "upstream request failed",
            )
            .detail(format!("upstream: {e}"))
            .answer(x, false);
        }
    };
    let status = resp.status();
    let switched = if plan.ext_connect {
        status.is_success()
    } else {
        status == StatusCode::SWITCHING_PROTOCOLS
    };
    if switched {
        splice_response(&subst, x, plan, resp, &subs)
    } else {
        relay_response(&subst, x, &plan, resp, subs)
    }
}

/// Checks a request before anything of it goes upstream: Host /
/// `:authority` = SNI, an upstream to send it to, no CONNECT tunnel, and an
/// upgrade only to WebSocket, and on a host with bound secrets only when
/// every one of them opted in.
async fn admit(
    conn: &Conn,
    subst: &HostSubstituter,
    req: &mut Request<Incoming>,
    x: &mut Exchange,
) -> Result<Plan, Refusal> {
    let flow = &conn.flow;
    match check_authority(req, &flow.sni, flow.dst.port()) {
        Ok(host) => x.host(Some(host)),
        Err(sent) => {
            x.host((!sent.is_empty()).then_some(sent));
            return Err(Refusal::new(
                Reason::HostSniMismatch,
                StatusCode::MISDIRECTED_REQUEST,
                "request authority does not match the TLS server name",
            ));
        }
    }
    if let Upstream::Failed { reason, detail } = &conn.upstream {
        return Err(Refusal::new(*reason, StatusCode::BAD_GATEWAY, detail).detail(detail.clone()));
    }

    // CONNECT: only the extended form (HTTP/2 `:protocol`, RFC 8441) is
    // proxied; a tunnel to wherever the upstream would take it is not.
    let protocol = req.extensions().get::<hyper::ext::Protocol>().cloned();
    let ext_connect = req.method() == Method::CONNECT && protocol.is_some();
    if req.method() == Method::CONNECT && !ext_connect {
        return Err(Refusal::new(
            Reason::HttpConnectDenied,
            StatusCode::METHOD_NOT_ALLOWED,
            "CONNECT tunnels are not proxied on an inspected connection",
        ));
    }
    let ask = match &protocol {
        Some(p) => {
            let p: String = p.as_str().chars().take(64).collect();
            x.note(format!("extended CONNECT, protocol {p}"));
            upgrade::h2_protocol(&p)
        }
        None if req.version() < http::Version::HTTP_2 => upgrade::h1_request(req.headers()),
        None => Ask::None,
    };
    if let Some(refusal) = upgrade_refusal(&ask, subst, &flow.sni) {
        return Err(refusal);
    }
    if ext_connect
        && let Err(why) = conn
            .upstream
            .extended_connect_ready(&conn.connect_protocol_settled)
            .await
    {
        return Err(Refusal::new(Reason::UpstreamError, StatusCode::BAD_GATEWAY, why).detail(why));
    }
    let h1_upgrade = !ext_connect && ask == Ask::WebSocket;
    let guest_upgrade = (ask == Ask::WebSocket).then(|| hyper::upgrade::on(&mut *req));
    Ok(Plan {
        ext_connect,
        h1_upgrade,
        guest_upgrade,
        head_only: req.method() == Method::HEAD,
    })
}

/// The upgrade rule: only WebSocket (`501` otherwise), and to a host with
/// bound secrets only when every one of them opted in (`403` otherwise,
/// naming the secrets that did not); both `upgrade_refused`.
fn upgrade_refusal(ask: &Ask, subst: &HostSubstituter, sni: &str) -> Option<Refusal> {
    match ask {
        Ask::None => None,
        Ask::Other(p) => Some(
            Refusal::new(
                Reason::UpgradeRefused,
                StatusCode::NOT_IMPLEMENTED,
                "only WebSocket upgrades are proxied",
            )
            .detail(format!("upgrade to {p} refused: only WebSocket is proxied")),
        ),
        Ask::WebSocket => {
            let refused_by: Vec<&str> = subst.websocket_refused_by().collect();
            (!refused_by.is_empty()).then(|| {
                Refusal::new(
                    Reason::UpgradeRefused,
                    StatusCode::FORBIDDEN,
                    "WebSocket is not proxied to a host with bound secrets the policy did not opt in",
                )
                .detail(format!(
                    "WebSocket refused: secret(s) {} bound to {sni} not opted in (`websocket: true`); an upgraded stream is neither substituted nor scrubbed",
                    refused_by.join(", ")
                ))
            })
        }
    }
}

/// The request as it goes upstream: hop-by-hop headers dropped (an allowed
/// upgrade's kept), `TE: trailers` kept, `Expect` answered here, `Range`
/// dropped on a host with bound secrets, the head substituted, and the body
/// substituted (where allowed) and scanned as it streams. Returns the head's
/// substitutions, which the response is scrubbed with.
fn prepare(
    subst: &HostSubstituter,
    req: Request<Incoming>,
    plan: &Plan,
    x: &mut Exchange,
) -> Result<(Request<ProxyBody>, Substitutions), Refusal> {
    let te_trailers = hop::wants_trailers(req.headers());
    let (mut parts, body) = req.into_parts();
    hop::strip_hop_by_hop(&mut parts.headers, plan.h1_upgrade);
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
    if !subst.is_empty() {
        // A part of an echoed secret could cut a value where the scrubber no
        // longer recognises it: a bound host always sends whole bodies.
        parts.headers.remove(header::RANGE);
        parts.headers.remove(header::IF_RANGE);
    }

    let subs = subst.request_head(&mut parts).map_err(|e| {
        Refusal::new(
            Reason::InspectFailed,
            StatusCode::BAD_REQUEST,
            "secret substitution would make the request invalid",
        )
        .detail(e.to_string())
    })?;
    x.head_substituted(&subs);
    // A request without a body (most GETs) is not scanned at all.
    let scanner = if body.is_end_stream() {
        None
    } else {
        subst.request_body_scanner()
    };
    let tally = RequestTally::new(scanner);
    x.forwarded(tally.clone());
    let replacer = subst.request_body();
    if replacer.is_some() {
        parts.headers.remove(header::CONTENT_LENGTH);
    }
    let body = TrailerRewrite::new(
        body,
        TrailerRule::Substitute {
            subst: subst.clone(),
            tally: tally.clone(),
        },
    );
    let body = Tapped::request(body, replacer, tally);
    let upstream_req = if plan.ext_connect {
        // No request body on a CONNECT: the stream itself is the payload
        // once the upstream accepts.
        Request::from_parts(parts, responses::empty())
    } else {
        Request::from_parts(parts, body.boxed_unsync())
    };
    Ok((upstream_req, subs))
}

/// The upstream switched protocols (`101`, or `2xx` to an extended
/// CONNECT): the scrubbed head goes to the guest and both upgraded streams
/// are spliced; the exchange is finished when the splice ends.
fn splice_response(
    subst: &HostSubstituter,
    mut x: Exchange,
    plan: Plan,
    mut resp: Response<Incoming>,
    subs: &Substitutions,
) -> Response<ProxyBody> {
    let Some(guest_upgrade) = plan.guest_upgrade else {
        return Refusal::new(
            Reason::UpstreamError,
            StatusCode::BAD_GATEWAY,
            "upstream switched protocols unasked",
        )
        .answer(x, false);
    };
    let status = resp.status();
    let upstream_upgrade = hyper::upgrade::on(&mut resp);
    let (mut rparts, _) = resp.into_parts();
    hop::strip_hop_by_hop(&mut rparts.headers, plan.h1_upgrade);
    // A 2xx to CONNECT carries no body and no length.
    rparts.headers.remove(header::CONTENT_LENGTH);
    subst.response_head(subs, &mut rparts);
    x.respond(status);
    tokio::spawn(async move {
        let spliced = upgrade::splice(guest_upgrade, upstream_upgrade).await;
        x.finish(Outcome::Spliced(spliced));
    });
    Response::from_parts(rparts, responses::empty())
}

/// An ordinary response: head scrubbed, body scrubbed as it streams (a
/// bound host's content-encoded or partial response is refused: it could
/// not be scrubbed); the exchange is finished when the body ends.
fn relay_response(
    subst: &HostSubstituter,
    mut x: Exchange,
    plan: &Plan,
    resp: Response<Incoming>,
    subs: Substitutions,
) -> Response<ProxyBody> {
    let (mut rparts, rbody) = resp.into_parts();
    let status = rparts.status;
    hop::strip_hop_by_hop(&mut rparts.headers, false);
    subst.response_head(&subs, &mut rparts);
    if !subst.is_empty() && status == StatusCode::PARTIAL_CONTENT {
        // Never asked for (Range is dropped): refused rather than relayed.
        drop(rbody);
        return Refusal::new(
            Reason::UpstreamError,
            StatusCode::BAD_GATEWAY,
            "partial content from a host with bound secrets cannot be scrubbed",
        )
        .detail("partial content (206) from a host with bound secrets")
        .answer(x, false);
    }
    let no_body = plan.head_only
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
        || status.is_informational();
    let replacer = if no_body {
        None
    } else {
        subst.response_body(&subs)
    };
    if replacer.is_some() {
        if hop::content_encoded(&rparts.headers) {
            // Cannot be scrubbed: never hand it to the guest.
            drop(rbody);
            return Refusal::new(
                Reason::UpstreamError,
                StatusCode::BAD_GATEWAY,
                "upstream response is content-encoded and cannot be scrubbed of secrets",
            )
            .detail("content-encoded response from a host with bound secrets")
            .answer(x, false);
        }
        rparts.headers.remove(header::CONTENT_LENGTH);
    }
    x.respond(status);
    let rbody = TrailerRewrite::new(
        rbody,
        TrailerRule::Scrub {
            subst: subst.clone(),
            request: subs,
        },
    );
    Response::from_parts(rparts, Tapped::response(rbody, replacer, x).boxed_unsync())
}

#[cfg(test)]
mod tests;

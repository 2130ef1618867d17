//! The plain-HTTP proxy: every request on an enforced plain-HTTP connection
//! is checked, not only the first.
//!
//! Enforcement admits a plain-HTTP flow on its first request head (Host
//! allowed on the port and resolved to the destination). A kept-alive or
//! pipelined connection could then send further requests naming another
//! virtual host on the same address (fronting on a shared CDN address), and
//! placeholders in those requests would go unseen. So an enforcing gateway
//! hands plain-HTTP flows to [`PlainProxy::serve`] instead of splicing them:
//!
//! - hyper's HTTP/1.1 server reads the guest's requests (the first one is the
//!   head enforcement already read, replayed by the datapath);
//! - each request must carry exactly one `Host` naming the validated host
//!   (case-insensitive, trailing dot ignored, `:port` allowed only when it is
//!   the destination port), and an absolute-form target's authority must name
//!   it too: otherwise `421 Misdirected Request` and an `http` record with
//!   reason `host_mismatch`; nothing of that request goes upstream. No `Host`
//!   is `400` (`http_host_absent`), several are `400` (`http_unreadable`),
//!   `CONNECT` is `405` (`http_connect_denied`). The connection stays open;
//!   later requests are checked on their own;
//! - a request hyper cannot parse gets hyper's automatic `400` (`431` for a
//!   head over its limits) and the connection closes, audited
//!   `http_unreadable`;
//! - allowed requests go to the validated destination only, over one plain
//!   TCP connection (hyper's HTTP/1.1 client) opened at the first request and
//!   reopened if the upstream closed it between requests; connect failures
//!   are `502` (`connect_failed`), upstream failures `502` (`upstream_error`),
//!   both closing the guest connection;
//! - nothing is ever substituted on plain HTTP. Placeholders of the sandbox's
//!   secrets in a request's target, headers or body are passed unchanged and
//!   reported in one `http` record per request with reason
//!   `secret_host_mismatch` (names only, never values); bodies are scanned as
//!   they stream ([`sluice_secrets::PlaceholderScanner`]), never buffered;
//! - one `http` record per request (method, host, path without the query,
//!   status, body bytes each way, duration, flow) when its response body ends
//!   (or is abandoned);
//! - hop-by-hop headers are dropped both ways and requests are re-framed by
//!   hyper's client (so a smuggled second request inside an ambiguous body
//!   cannot reach the upstream unchecked); header case is preserved;
//! - `Upgrade: websocket` is forwarded; after `101` the two upgraded streams
//!   are spliced byte for byte and the request's record is written when the
//!   splice ends. A request asking to upgrade to anything else (notably
//!   `h2c`, which would open an unchecked HTTP/2 connection) is answered
//!   `501`, reason `upgrade_refused`, and not forwarded;
//! - upstream connects refuse a destination the kernel routes locally
//!   (`crate::http::upstream`, shared with the TLS proxy);
//! - each request is one `Exchange` (`crate::http::ledger`) whose explicit
//!   finish writes its records once.
//!
//! It needs no CA and no TLS: it serves policies that inspect nothing.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::{self, HeaderMap};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper::client::conn::http1 as client_h1;
use hyper_util::rt::TokioIo;
use sluice_policy::Reason;
use sluice_policy::audit::Kind;
use sluice_secrets::SecretStore;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::event::{AuditOut, HttpEvent};
use crate::http::body::Tapped;
use crate::http::ledger::{Channel, Exchange, Outcome, RequestTally};
use crate::http::responses::{self, Refusal};
use crate::http::upgrade::{self, Ask};
use crate::http::{ProxyBody, authority, hop, upstream};

/// A plain-HTTP flow as the datapath hands it over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlainFlow {
    /// The gateway's flow id.
    pub id: u64,
    /// Guest endpoint.
    pub src: SocketAddr,
    /// Validated destination (connect here, nowhere else).
    pub dst: SocketAddr,
    /// The Host enforcement validated for this connection (from its first
    /// request head: a name, lowercase, without port).
    pub host: String,
}

/// The plain-HTTP proxy (module docs). Cheap to copy; holds no state shared
/// between connections.
#[derive(Debug, Clone, Copy)]
pub struct PlainProxy {
    connect_timeout: Duration,
}

impl PlainProxy {
    /// A proxy whose upstream connects give up after `connect_timeout`.
    #[must_use]
    pub fn new(connect_timeout: Duration) -> Self {
        Self { connect_timeout }
    }

    /// Proxies one plain-HTTP connection until either side ends it. `guest`
    /// delivers the guest's bytes from the connection's first byte on.
    /// `secrets` is the store whose placeholders are reported (`None` or an
    /// empty store: nothing is scanned). Events go to `audit`.
    pub async fn serve<S>(
        self,
        guest: S,
        flow: PlainFlow,
        secrets: Option<Arc<SecretStore>>,
        audit: Arc<dyn AuditOut>,
    ) where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let conn = Arc::new(Conn {
            host: authority::normalise_host(&flow.host),
            flow,
            secrets: secrets.filter(|s| !s.is_empty()),
            audit,
            connect_timeout: self.connect_timeout,
            upstream: tokio::sync::Mutex::new(None),
        });
        let svc_conn = conn.clone();
        let svc = hyper::service::service_fn(move |req| {
            let conn = svc_conn.clone();
            async move { Ok::<_, Infallible>(handle(conn, req).await) }
        });
        let res = hyper::server::conn::http1::Builder::new()
            .half_close(true)
            .preserve_header_case(true)
            .serve_connection(TokioIo::new(guest), svc)
            .with_upgrades()
            .await;
        if let Err(e) = res {
            if e.is_parse() {
                conn.audit.record(unparsable(&conn.flow, &e));
            } else {
                tracing::debug!(flow = conn.flow.id, error = %e, "plain HTTP connection ended");
            }
        }
    }
}

/// The `http` record for a request hyper could not parse (it answered
/// 400/431/414 itself, except to an HTTP/2 preface, and closed).
fn unparsable(flow: &PlainFlow, e: &hyper::Error) -> HttpEvent {
    let mut event = HttpEvent::new(
        Kind::Http,
        Reason::HttpUnreadable,
        flow.id,
        flow.src,
        flow.dst,
        "",
    );
    event.status = if e.is_parse_version_h2() {
        None
    } else if e.is_parse_too_large() {
        // hyper's one accessor covers both; its message tells them apart.
        let uri = e.to_string().starts_with("URI too long");
        Some(if uri { 414 } else { 431 })
    } else {
        Some(StatusCode::BAD_REQUEST.as_u16())
    };
    event.detail = Some(format!("request unreadable: {e}; connection closed"));
    event
}

/// Per-connection state shared by its requests.
struct Conn {
    flow: PlainFlow,
    /// `flow.host`, normalised for comparison.
    host: String,
    secrets: Option<Arc<SecretStore>>,
    audit: Arc<dyn AuditOut>,
    connect_timeout: Duration,
    /// The upstream connection, opened at the first forwarded request.
    /// Requests on one guest connection are sequential: never contended.
    upstream: tokio::sync::Mutex<Option<client_h1::SendRequest<ProxyBody>>>,
}

impl Conn {
    /// Opens the upstream connection to the validated destination
    /// ([`upstream::connect`]: a local route is refused).
    async fn connect(&self) -> Result<client_h1::SendRequest<ProxyBody>, Refusal> {
        let refused = |reason: Reason, detail: String| {
            Refusal::new(
                reason,
                StatusCode::BAD_GATEWAY,
                "upstream connection failed",
            )
            .detail(detail)
        };
        let tcp = upstream::connect(self.flow.dst, self.connect_timeout)
            .await
            .map_err(|e| refused(e.reason, e.detail))?;
        let (send, conn) = client_h1::Builder::new()
            .preserve_header_case(true)
            .handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| refused(Reason::UpstreamError, format!("upstream HTTP/1.1: {e}")))?;
        let id = self.flow.id;
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(flow = id, error = %e, "plain HTTP upstream ended");
            }
        });
        Ok(send)
    }

    /// Sends one request upstream, (re)connecting when there is no open
    /// upstream connection.
    async fn send(&self, req: Request<ProxyBody>) -> Result<Response<Incoming>, Refusal> {
        let failed = |detail: String| {
            Refusal::new(
                Reason::UpstreamError,
                StatusCode::BAD_GATEWAY,
                "upstream request failed",
            )
            .detail(detail)
        };
        let mut slot = self.upstream.lock().await;
        let reusable = match slot.as_mut() {
            Some(s) if !s.is_closed() => s.ready().await.is_ok(),
            _ => false,
        };
        if !reusable {
            *slot = None;
            *slot = Some(self.connect().await?);
        }
        let Some(s) = slot.as_mut() else {
            return Err(failed("no upstream connection".into()));
        };
        let sent = match s.ready().await {
            Ok(()) => s.send_request(req).await,
            Err(e) => Err(e),
        };
        sent.map_err(|e| {
            *slot = None;
            failed(format!("upstream: {e}"))
        })
    }
}

/// Checks the request's authority against the validated host: `Ok` with the
/// Host as sent, or the refusal (and the Host as sent, if any).
fn check_host(
    req: &Request<Incoming>,
    host: &str,
    port: u16,
) -> Result<String, (Refusal, Option<String>)> {
    if req.method() == Method::CONNECT {
        return Err((
            Refusal::new(
                Reason::HttpConnectDenied,
                StatusCode::METHOD_NOT_ALLOWED,
                "CONNECT is not allowed",
            ),
            None,
        ));
    }
    let mut hosts = req.headers().get_all(header::HOST).iter();
    let (Some(sent), None) = (hosts.next(), hosts.next()) else {
        let absent = !req.headers().contains_key(header::HOST);
        let (reason, text) = if absent {
            (Reason::HttpHostAbsent, "a Host header is required")
        } else {
            (Reason::HttpUnreadable, "several Host headers")
        };
        return Err((Refusal::new(reason, StatusCode::BAD_REQUEST, text), None));
    };
    let sent_text = String::from_utf8_lossy(sent.as_bytes()).into_owned();
    let mismatch = |shown: String| {
        Err((
            Refusal::new(
                Reason::HostMismatch,
                StatusCode::MISDIRECTED_REQUEST,
                "request host differs from the host this connection was allowed for",
            ),
            Some(shown),
        ))
    };
    let header_ok = sent
        .to_str()
        .ok()
        .and_then(|v| authority::parse(v, port).ok())
        .is_some_and(|h| h == host);
    if !header_ok {
        return mismatch(sent_text);
    }
    if let Some(a) = req.uri().authority()
        && authority::parse(a.as_str(), port).ok().as_deref() != Some(host)
    {
        return mismatch(a.as_str().to_owned());
    }
    Ok(sent_text)
}

/// Removes hop-by-hop headers ([`hop::strip_hop_by_hop`]) and `Trailer`:
/// plain HTTP carries no trailers.
fn strip_hop_by_hop(headers: &mut HeaderMap, upgrade: bool) {
    hop::strip_hop_by_hop(headers, upgrade);
    headers.remove(header::TRAILER);
}

/// The placeholders of `store`'s secrets in a request head: its target
/// (path and query) and every header.
fn head_placeholders(store: &SecretStore, parts: &http::request::Parts) -> Vec<String> {
    let mut scan = store.placeholder_scanner();
    if let Some(pq) = parts.uri.path_and_query() {
        scan.feed(pq.as_str().as_bytes());
    }
    for (name, value) in &parts.headers {
        // A separator placeholders cannot contain: no match spans two fields.
        scan.feed(b"\n");
        scan.feed(name.as_str().as_bytes());
        scan.feed(b": ");
        scan.feed(value.as_bytes());
    }
    scan.mismatched().into_iter().map(str::to_owned).collect()
}

/// Answers a request the proxy does not forward; after an upstream failure
/// the guest must reconnect to retry (`Connection: close`).
fn refuse(refusal: Refusal, x: Exchange) -> Response<ProxyBody> {
    let close = refusal.status == StatusCode::BAD_GATEWAY;
    refusal.answer(x, close)
}

/// One request: check, forward, report. Every path finishes the request's
/// [`Exchange`] exactly once.
async fn handle(conn: Arc<Conn>, mut req: Request<Incoming>) -> Response<ProxyBody> {
    let flow = &conn.flow;
    let mut event = HttpEvent::new(
        Kind::Http,
        Reason::Allowlisted,
        flow.id,
        flow.src,
        flow.dst,
        "",
    );
    event.method = Some(req.method().as_str().to_owned());
    event.path = Some(req.uri().path().to_owned());
    let mut x = Exchange::open(conn.audit.clone(), event, Channel::Plain, Instant::now());

    match check_host(&req, &conn.host, flow.dst.port()) {
        Ok(sent) => x.host(Some(sent)),
        Err((r, sent)) => {
            x.host(sent);
            return refuse(r, x);
        }
    }
    let websocket = match upgrade::h1_request(req.headers()) {
        Ask::None => false,
        Ask::WebSocket => true,
        Ask::Other(p) => {
            let r = Refusal::new(
                Reason::UpgradeRefused,
                StatusCode::NOT_IMPLEMENTED,
                "only WebSocket upgrades are proxied",
            )
            .detail(format!("upgrade to {p} refused: only WebSocket is proxied"));
            return refuse(r, x);
        }
    };
    let guest_upgrade = websocket.then(|| hyper::upgrade::on(&mut req));
    let (mut parts, body) = req.into_parts();
    strip_hop_by_hop(&mut parts.headers, websocket);
    // `Expect: 100-continue` is answered by this leg's server when the body
    // is first read; upstream gets the body without waiting.
    parts.headers.remove(header::EXPECT);
    // Origin-form upstream: the authority (checked above) is in Host.
    if parts.uri.authority().is_some() {
        let pq = parts
            .uri
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str);
        parts.uri = pq.parse::<Uri>().unwrap_or_else(|_| Uri::from_static("/"));
    }

    let scanner = conn.secrets.as_ref().map(|store| {
        x.head_placeholders(head_placeholders(store, &parts));
        store.placeholder_scanner()
    });
    let tally = RequestTally::new(scanner);
    x.forwarded(tally.clone());
    let req_body = Tapped::request(body, None, tally);
    let resp = match conn
        .send(Request::from_parts(parts, req_body.boxed_unsync()))
        .await
    {
        Ok(r) => r,
        Err(r) => return refuse(r, x),
    };
    let status = resp.status();

    if status == StatusCode::SWITCHING_PROTOCOLS {
        let Some(guest_upgrade) = guest_upgrade else {
            let r = Refusal::new(
                Reason::UpstreamError,
                StatusCode::BAD_GATEWAY,
                "upstream switched protocols unasked",
            )
            .detail("101 to a request without an allowed upgrade");
            return refuse(r, x);
        };
        let mut resp = resp;
        let upstream_upgrade = hyper::upgrade::on(&mut resp);
        let (mut rparts, _) = resp.into_parts();
        strip_hop_by_hop(&mut rparts.headers, true);
        x.respond(status);
        tokio::spawn(async move {
            let spliced = upgrade::splice(guest_upgrade, upstream_upgrade).await;
            x.finish(Outcome::Spliced(spliced));
        });
        return Response::from_parts(rparts, responses::empty());
    }

    let (mut rparts, rbody) = resp.into_parts();
    strip_hop_by_hop(&mut rparts.headers, false);
    x.respond(status);
    Response::from_parts(rparts, Tapped::response(rbody, None, x).boxed_unsync())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use std::sync::Mutex;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpListener;

    /// Collects the proxy's events.
    #[derive(Default)]
    struct Collect(Mutex<Vec<HttpEvent>>);

    impl AuditOut for Arc<Collect> {
        fn record(&self, event: HttpEvent) {
            self.0.lock().unwrap().push(event);
        }
    }

    impl Collect {
        fn events(&self) -> Vec<HttpEvent> {
            self.0.lock().unwrap().clone()
        }
    }

    /// What the upstream received: (path, Host, headers, body).
    type Seen = Arc<Mutex<Vec<(String, String, HeaderMap, Vec<u8>)>>>;

    /// An HTTP/1.1 upstream on loopback that logs each request and answers
    /// `ok <path>`; `/ws` with an upgrade is answered 101 and echoed.
    async fn upstream() -> (SocketAddr, Seen) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Seen = Arc::default();
        let log = seen.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let log = log.clone();
                let svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
                    let log = log.clone();
                    async move {
                        let path = req.uri().path().to_owned();
                        let host = req
                            .headers()
                            .get(header::HOST)
                            .map(|h| h.to_str().unwrap().to_owned())
                            .unwrap_or_default();
                        let headers = req.headers().clone();
                        if path == "/ws" && headers.contains_key(header::UPGRADE) {
                            let on = hyper::upgrade::on(&mut req);
                            tokio::spawn(async move {
                                let mut io = TokioIo::new(on.await.unwrap());
                                let mut buf = [0u8; 1024];
                                loop {
                                    match io.read(&mut buf).await {
                                        Ok(0) | Err(_) => break,
                                        Ok(n) => io.write_all(&buf[..n]).await.unwrap(),
                                    }
                                }
                            });
                            log.lock().unwrap().push((path, host, headers, Vec::new()));
                            let mut resp = Response::new(responses::empty());
                            *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
                            resp.headers_mut()
                                .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
                            resp.headers_mut()
                                .insert(header::UPGRADE, HeaderValue::from_static("websocket"));
                            return Ok::<_, Infallible>(resp);
                        }
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        log.lock()
                            .unwrap()
                            .push((path.clone(), host, headers, body.to_vec()));
                        Ok(responses::text(
                            StatusCode::OK,
                            &format!("ok {path}"),
                            false,
                        ))
                    }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc)
                        .with_upgrades(),
                );
            }
        });
        (addr, seen)
    }

    /// Runs the proxy for a connection validated for `origin.test` to
    /// `dst`; returns the guest's end, the proxy task and the events.
    fn proxy(
        dst: SocketAddr,
        secrets: Option<Arc<SecretStore>>,
    ) -> (
        tokio::io::DuplexStream,
        tokio::task::JoinHandle<()>,
        Arc<Collect>,
    ) {
        let (guest, theirs) = tokio::io::duplex(1 << 16);
        let events = Arc::new(Collect::default());
        let flow = PlainFlow {
            id: 7,
            src: "10.0.2.15:40000".parse().unwrap(),
            dst,
            host: "origin.test".into(),
        };
        let audit: Arc<dyn AuditOut> = Arc::new(events.clone());
        let task = tokio::spawn(
            PlainProxy::new(Duration::from_secs(5)).serve(theirs, flow, secrets, audit),
        );
        (guest, task, events)
    }

    /// Writes `input`, reads everything until the proxy closes.
    async fn exchange(mut guest: tokio::io::DuplexStream, input: &str) -> String {
        guest.write_all(input.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        guest.read_to_end(&mut out).await.unwrap();
        String::from_utf8_lossy(&out).into_owned()
    }

    /// The status codes of the responses in `out`, in order.
    fn statuses(out: &str) -> Vec<u16> {
        out.split("HTTP/1.1 ")
            .skip(1)
            .filter_map(|r| r.get(..3)?.parse().ok())
            .collect()
    }

    /// Waits until `pred` holds for the collected events (events are sent
    /// by the proxy's task, possibly after the client saw its response).
    /// The bound is generous, 60 s, for a loaded machine: it only stops a
    /// hung test; the caller's assertions then show what was collected.
    async fn until(events: &Collect, pred: impl Fn(&[HttpEvent]) -> bool) -> Vec<HttpEvent> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while tokio::time::Instant::now() < deadline {
            let e = events.events();
            if pred(&e) {
                return e;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        events.events()
    }

    #[tokio::test]
    async fn every_pipelined_request_is_checked() {
        let (dst, seen) = upstream().await;
        let (guest, task, events) = proxy(dst, None);
        let port = dst.port();
        let input = format!(
            "GET /a?q=1 HTTP/1.1\r\nHost: origin.test\r\n\r\n\
             GET /b HTTP/1.1\r\nHost: other.test\r\n\r\n\
             GET http://other.test/c HTTP/1.1\r\nHost: origin.test\r\n\r\n\
             GET /d HTTP/1.1\r\nHost: origin.test:1\r\n\r\n\
             GET /e HTTP/1.1\r\n\r\n\
             CONNECT origin.test:80 HTTP/1.1\r\nHost: origin.test\r\n\r\n\
             GET http://Origin.Test.:{port}/f HTTP/1.1\r\nHost: ORIGIN.test:{port}\r\nConnection: close\r\n\r\n"
        );
        let out = exchange(guest, &input).await;
        task.await.unwrap();
        assert_eq!(statuses(&out), [200, 421, 421, 421, 400, 405, 200], "{out}");
        let paths: Vec<String> = seen.lock().unwrap().iter().map(|r| r.0.clone()).collect();
        assert_eq!(paths, ["/a", "/f"]);
        let hosts: Vec<String> = seen.lock().unwrap().iter().map(|r| r.1.clone()).collect();
        assert_eq!(
            hosts,
            ["origin.test", format!("ORIGIN.test:{port}").as_str()]
        );

        let events = until(&events, |e| e.len() >= 7).await;
        type Row<'a> = (Reason, Option<&'a str>, Option<&'a str>, Option<u16>);
        let got: Vec<Row<'_>> = events
            .iter()
            .map(|e| (e.reason, e.path.as_deref(), e.host.as_deref(), e.status))
            .collect();
        let f_host = format!("ORIGIN.test:{port}");
        assert_eq!(
            got,
            [
                (
                    Reason::Allowlisted,
                    Some("/a"),
                    Some("origin.test"),
                    Some(200)
                ),
                (
                    Reason::HostMismatch,
                    Some("/b"),
                    Some("other.test"),
                    Some(421)
                ),
                (
                    Reason::HostMismatch,
                    Some("/c"),
                    Some("other.test"),
                    Some(421)
                ),
                (
                    Reason::HostMismatch,
                    Some("/d"),
                    Some("origin.test:1"),
                    Some(421)
                ),
                (Reason::HttpHostAbsent, Some("/e"), None, Some(400)),
                (Reason::HttpConnectDenied, Some(""), None, Some(405)),
                (
                    Reason::Allowlisted,
                    Some("/f"),
                    Some(f_host.as_str()),
                    Some(200)
                ),
            ]
        );
        let a = &events[0];
        assert_eq!((a.flow, a.sni.as_str(), a.bytes_up), (7, "", Some(0)));
        assert_eq!(a.bytes_down, Some("sluice: ok /a\n".len() as u64));
    }

    #[tokio::test]
    async fn unparsable_request_gets_400_and_closes() {
        let (dst, seen) = upstream().await;
        let (guest, task, events) = proxy(dst, None);
        let out = exchange(
            guest,
            "GET /ok HTTP/1.1\r\nHost: origin.test\r\n\r\n\
             GET /bad HTTP/1.1\r\nHost: origin.test\r\nno colon here\r\n\r\n\
             GET /never HTTP/1.1\r\nHost: origin.test\r\n\r\n",
        )
        .await;
        task.await.unwrap();
        assert_eq!(statuses(&out), [200, 400], "{out}");
        assert_eq!(seen.lock().unwrap().len(), 1);
        let events = until(&events, |e| e.len() >= 2).await;
        assert_eq!(events[1].reason, Reason::HttpUnreadable);
        assert_eq!(events[1].status, Some(400));
    }

    #[tokio::test]
    async fn head_over_the_limits_gets_431() {
        let (dst, seen) = upstream().await;
        let (guest, task, events) = proxy(dst, None);
        let many: String = (0..120).map(|i| format!("X-H{i}: v\r\n")).collect();
        let out = exchange(
            guest,
            &format!("GET /big HTTP/1.1\r\nHost: origin.test\r\n{many}\r\n"),
        )
        .await;
        task.await.unwrap();
        assert_eq!(statuses(&out), [431], "{out}");
        assert!(seen.lock().unwrap().is_empty());
        let events = until(&events, |e| !e.is_empty()).await;
        assert_eq!(events[0].reason, Reason::HttpUnreadable);
        assert_eq!(events[0].status, Some(431));
    }

    #[tokio::test]
    async fn bodies_stream_through_unchanged_and_hop_by_hop_headers_go() {
        let (dst, seen) = upstream().await;
        let (guest, task, events) = proxy(dst, None);
        let out = exchange(
            guest,
            "POST /up HTTP/1.1\r\nHost: origin.test\r\nTransfer-Encoding: chunked\r\n\
             Connection: keep-alive, x-hop\r\nX-Hop: 1\r\nUpgrade: h2c\r\n\r\n\
             3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n\
             POST /up2 HTTP/1.1\r\nHost: origin.test\r\nContent-Length: 5\r\n\
             Connection: close\r\n\r\nhello",
        )
        .await;
        task.await.unwrap();
        assert_eq!(statuses(&out), [200, 200], "{out}");
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen[0].3, b"abcdefg");
        assert!(!seen[0].2.contains_key("x-hop"), "{:?}", seen[0].2);
        assert!(!seen[0].2.contains_key(header::UPGRADE), "{:?}", seen[0].2);
        assert_eq!(seen[1].3, b"hello");
        assert_eq!(seen[1].2[header::CONTENT_LENGTH], "5");
        let events = until(&events, |e| e.len() >= 2).await;
        assert_eq!(events[0].bytes_up, Some(7));
        assert_eq!(events[1].bytes_up, Some(5));
    }

    #[tokio::test]
    async fn websocket_upgrade_is_spliced_after_101() {
        let (dst, _seen) = upstream().await;
        let (mut guest, task, events) = proxy(dst, None);
        guest
            .write_all(
                b"GET /ws HTTP/1.1\r\nHost: origin.test\r\nConnection: Upgrade\r\n\
                  Upgrade: websocket\r\n\r\n",
            )
            .await
            .unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 1];
            assert_eq!(guest.read(&mut b).await.unwrap(), 1);
            head.push(b[0]);
        }
        let head = String::from_utf8_lossy(&head).into_owned();
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        guest
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut echo = [0u8; 27];
        guest.read_exact(&mut echo).await.unwrap();
        assert_eq!(&echo, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        drop(guest);
        task.await.unwrap();
        let events = until(&events, |e| !e.is_empty()).await;
        assert_eq!(events[0].status, Some(101));
        assert_eq!(events[0].bytes_up, Some(27));
    }

    #[tokio::test]
    async fn placeholders_are_reported_and_passed_unchanged() {
        let yaml = "version: 1\nid: t\nallow:\n  - domain: api.example.com\n    ports: [443]\n\
                    secrets:\n  - name: tok\n    placeholder: sk-sluice-placeholder-tok\n\
                    \x20   env: TOK\n    hosts: [api.example.com]\n";
        let policy = sluice_policy::from_yaml_str(yaml, "t.yaml", &Default::default()).unwrap();
        let store = SecretStore::load_with(&policy, |_| {
            Some(zeroize::Zeroizing::new(b"real-value".to_vec()))
        })
        .unwrap();
        let (dst, seen) = upstream().await;
        let (guest, task, events) = proxy(dst, Some(Arc::new(store)));
        let out = exchange(
            guest,
            "GET /clean HTTP/1.1\r\nHost: origin.test\r\n\r\n\
             GET /h HTTP/1.1\r\nHost: origin.test\r\nX-Key: sk-sluice-placeholder-tok\r\n\r\n\
             POST /b HTTP/1.1\r\nHost: origin.test\r\nTransfer-Encoding: chunked\r\n\
             Connection: close\r\n\r\n8\r\nsk-sluic\r\n11\r\ne-placeholder-tok\r\n0\r\n\r\n",
        )
        .await;
        task.await.unwrap();
        assert_eq!(statuses(&out), [200, 200, 200], "{out}");
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen[1].2["x-key"], "sk-sluice-placeholder-tok");
        assert_eq!(seen[2].3, b"sk-sluice-placeholder-tok");
        let events = until(&events, |e| e.len() >= 5).await;
        let mism: Vec<(Option<&str>, &str)> = events
            .iter()
            .filter(|e| e.reason == Reason::SecretHostMismatch)
            .map(|e| (e.path.as_deref(), e.detail.as_deref().unwrap_or_default()))
            .collect();
        assert_eq!(mism.len(), 2, "{events:?}");
        assert_eq!(mism[0].0, Some("/h"));
        assert!(mism[0].1.contains("tok (head)"), "{}", mism[0].1);
        assert_eq!(mism[1].0, Some("/b"));
        assert!(mism[1].1.contains("tok (body)"), "{}", mism[1].1);
        assert!(
            events
                .iter()
                .all(|e| !format!("{e:?}").contains("real-value"))
        );
    }

    #[tokio::test]
    async fn connect_failure_is_502_and_closes() {
        // A port nothing listens on (bound, then closed).
        let dst = {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            l.local_addr().unwrap()
        };
        let (guest, task, events) = proxy(dst, None);
        let out = exchange(
            guest,
            "GET /x HTTP/1.1\r\nHost: origin.test\r\n\r\nGET /y HTTP/1.1\r\nHost: origin.test\r\n\r\n",
        )
        .await;
        task.await.unwrap();
        assert_eq!(statuses(&out), [502], "{out}");
        let events = until(&events, |e| !e.is_empty()).await;
        assert_eq!(events[0].reason, Reason::ConnectFailed);
    }

    #[test]
    fn upgrade_headers_are_kept_only_for_websocket() {
        let h = |conn: &'static str, up: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::CONNECTION, HeaderValue::from_static(conn));
            h.insert(header::UPGRADE, HeaderValue::from_static(up));
            h
        };
        let mut headers = h("Upgrade, HTTP2-Settings", "h2c");
        headers.insert(
            "http2-settings",
            HeaderValue::from_static("AAMAAABkAAQAAP__"),
        );
        headers.insert(header::TRAILER, HeaderValue::from_static("x-t"));
        strip_hop_by_hop(&mut headers, false);
        assert!(headers.is_empty(), "{headers:?}");
        let mut headers = h("Upgrade", "websocket");
        strip_hop_by_hop(&mut headers, true);
        assert_eq!(headers[header::UPGRADE], "websocket");
        assert_eq!(headers[header::CONNECTION], "upgrade");
    }

    /// An upgrade to anything but WebSocket (h2c here) is answered 501 and
    /// recorded `upgrade_refused`; the upstream never sees it, and the
    /// connection serves the next request.
    #[tokio::test]
    async fn an_upgrade_to_another_protocol_is_refused() {
        let (dst, seen) = upstream().await;
        let (guest, task, events) = proxy(dst, None);
        let out = exchange(
            guest,
            "GET /ws HTTP/1.1\r\nHost: origin.test\r\nConnection: Upgrade, HTTP2-Settings\r\n\
             Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n\
             GET /after HTTP/1.1\r\nHost: origin.test\r\nConnection: close\r\n\r\n",
        )
        .await;
        task.await.unwrap();
        assert_eq!(statuses(&out), [501, 200], "{out}");
        let paths: Vec<String> = seen.lock().unwrap().iter().map(|r| r.0.clone()).collect();
        assert_eq!(paths, ["/after"]);
        let events = until(&events, |e| e.len() >= 2).await;
        assert_eq!(events.len(), 2, "{events:?}");
        assert_eq!(events[0].reason, Reason::UpgradeRefused);
        assert_eq!(events[0].status, Some(501));
        assert!(
            events[0].detail.as_deref().unwrap().contains("h2c"),
            "{events:?}"
        );
    }
}

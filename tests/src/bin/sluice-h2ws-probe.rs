//! `sluice-h2ws-probe`: an HTTPS client for the interception tests of
//! WebSocket over HTTP/2 (RFC 8441 extended CONNECT) and of trailers, run
//! inside the guest namespace: curl can do neither.
//!
//! One TLS connection to `--connect HOST:PORT` (resolved by the system
//! resolver, i.e. the gateway's DNS) with SNI = HOST, trusting only
//! `--cacert`, offering `--alpn` (`h2` or `http/1.1`), with the extra
//! request headers `--header`. Modes:
//! - `--websocket MSG` (HTTP/2 only): waits for the server's SETTINGS to
//!   enable extended CONNECT (prints `CONNECT_PROTOCOL on`, or fails), sends
//!   `CONNECT /ws` with `:protocol websocket`, prints `STATUS <code>`; on a
//!   2xx sends MSG, half-closes, reads the stream to its end and prints
//!   `WS <what came back>`; otherwise prints the response body;
//! - `--trailer 'Name: value'` (repeatable; also with none): `POST --path`
//!   with a small body followed by these request trailers (declared in
//!   `Trailer`, with `TE: trailers`); prints `STATUS <code>`, the body, and
//!   `TRAILER <name>: <value>` per response trailer.
//!
//! Exit code 0 when the request got a response (whatever its status); TLS,
//! connection or protocol failures print the error and exit 1.
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Empty};
use hyper::body::{Body, Frame};
use hyper::client::conn::http2;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Version};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Command line.
#[derive(Parser, Debug)]
#[command(about = "WebSocket-over-HTTP/2 and trailers probe for sluice's interception tests")]
struct Args {
    /// HOST:PORT to connect to (HOST is the SNI and the authority).
    #[arg(long)]
    connect: String,
    /// The only CA trusted (PEM).
    #[arg(long)]
    cacert: std::path::PathBuf,
    /// ALPN to offer: h2 or http/1.1.
    #[arg(long, default_value = "h2")]
    alpn: String,
    /// Request path (trailers mode).
    #[arg(long, default_value = "/trailers")]
    path: String,
    /// Extra request header `Name: value` (repeatable).
    #[arg(long)]
    header: Vec<String>,
    /// Request trailer `Name: value` (repeatable).
    #[arg(long)]
    trailer: Vec<String>,
    /// WebSocket over HTTP/2 to `--ws-path`: send this message, print the
    /// echo.
    #[arg(long)]
    websocket: Option<String>,
    /// Path of the extended CONNECT (`--websocket` mode).
    #[arg(long, default_value = "/ws")]
    ws_path: String,
    /// `:protocol` of the extended CONNECT (`--websocket` mode).
    #[arg(long, default_value = "websocket")]
    protocol: String,
}

fn parse_header(h: &str) -> Result<(HeaderName, HeaderValue)> {
    let (k, v) = h.split_once(':').context("expected `Name: value`")?;
    Ok((
        HeaderName::try_from(k.trim())?,
        HeaderValue::try_from(v.trim())?,
    ))
}

/// A request body: one data frame, then trailers.
struct WithTrailers {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl Body for WithTrailers {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
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

/// Drives the HTTP/2 connection and publishes whether the server's SETTINGS
/// enable extended CONNECT (hyper handles frames in a task of its own, so
/// the state is re-read every 10 ms until it is on).
struct Watch<C> {
    conn: Pin<Box<C>>,
    enabled: tokio::sync::watch::Sender<bool>,
    recheck: Pin<Box<tokio::time::Sleep>>,
}

impl<T, B> Future for Watch<http2::Connection<T, B, TokioExecutor>>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    B: Body + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Output = hyper::Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let res = this.conn.as_mut().poll(cx);
        let on = this.conn.is_extended_connect_protocol_enabled();
        this.enabled
            .send_if_modified(|v| std::mem::replace(v, on) != on);
        if res.is_pending() && !on && this.recheck.as_mut().poll(cx).is_ready() {
            this.recheck
                .as_mut()
                .reset(tokio::time::Instant::now() + Duration::from_millis(10));
            cx.waker().wake_by_ref();
        }
        res
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args = Args::parse();
    let host = args
        .connect
        .rsplit_once(':')
        .map(|(h, _)| h.to_owned())
        .context("--connect HOST:PORT")?;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&args.cacert).context("--cacert")? {
        roots.add(c.context("--cacert")?)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![args.alpn.as_bytes().to_vec()];
    let tcp = TcpStream::connect(&args.connect)
        .await
        .with_context(|| format!("connect {}", args.connect))?;
    tcp.set_nodelay(true)?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(ServerName::try_from(host.clone())?, tcp)
        .await
        .context("TLS handshake")?;
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    let io = TokioIo::new(tls);
    let mut headers = HeaderMap::new();
    for h in &args.header {
        let (k, v) = parse_header(h).context("--header")?;
        headers.append(k, v);
    }

    if let Some(msg) = &args.websocket {
        if !h2 {
            bail!("--websocket needs HTTP/2 (ALPN h2)");
        }
        let (mut send, conn) = http2::handshake(TokioExecutor::new(), io).await?;
        let (tx, mut enabled) = tokio::sync::watch::channel(false);
        tokio::spawn(Watch {
            conn: Box::pin(conn),
            enabled: tx,
            recheck: Box::pin(tokio::time::sleep(Duration::from_millis(10))),
        });
        // RFC 8441: no extended CONNECT before the server's SETTINGS say so.
        match tokio::time::timeout(Duration::from_secs(60), enabled.wait_for(|on| *on)).await {
            Ok(Ok(_)) => println!("CONNECT_PROTOCOL on"),
            _ => bail!("the server's SETTINGS do not enable extended CONNECT"),
        }
        let mut req = Request::builder()
            .method(Method::CONNECT)
            .version(Version::HTTP_2)
            .uri(format!("https://{host}{}", args.ws_path))
            .header("sec-websocket-version", "13")
            .body(Empty::<Bytes>::new())?;
        req.headers_mut().extend(headers);
        req.extensions_mut()
            .insert(hyper::ext::Protocol::from(args.protocol.as_str()));
        send.ready().await?;
        let resp = send.send_request(req).await?;
        println!("STATUS {}", resp.status().as_u16());
        if !resp.status().is_success() {
            let body = resp.into_body().collect().await?.to_bytes();
            println!("{}", String::from_utf8_lossy(&body));
            return Ok(());
        }
        let mut up = TokioIo::new(hyper::upgrade::on(resp).await?);
        up.write_all(msg.as_bytes()).await?;
        up.shutdown().await?;
        let mut got = Vec::new();
        up.read_to_end(&mut got).await?;
        println!("WS {}", String::from_utf8_lossy(&got));
        return Ok(());
    }

    // Trailers.
    let mut trailers = HeaderMap::new();
    for t in &args.trailer {
        let (k, v) = parse_header(t).context("--trailer")?;
        trailers.append(k, v);
    }
    let declared: Vec<&str> = trailers.keys().map(HeaderName::as_str).collect();
    let mut b = if h2 {
        Request::builder()
            .version(Version::HTTP_2)
            .uri(format!("https://{host}{}", args.path))
    } else {
        Request::builder().uri(&args.path).header("host", &host)
    };
    b = b.method(Method::POST).header("te", "trailers");
    if !declared.is_empty() {
        b = b.header("trailer", declared.join(", "));
    }
    let mut req = b.body(WithTrailers {
        data: Some(Bytes::from_static(b"body before the trailers\n")),
        trailers: Some(trailers),
    })?;
    req.headers_mut().extend(headers);
    let resp = if h2 {
        let (mut send, conn) = http2::handshake(TokioExecutor::new(), io).await?;
        tokio::spawn(conn);
        send.ready().await?;
        send.send_request(req).await?
    } else {
        let (mut send, conn) = hyper::client::conn::http1::handshake(io).await?;
        tokio::spawn(conn);
        send.ready().await?;
        send.send_request(req).await?
    };
    println!("STATUS {}", resp.status().as_u16());
    let got = resp.into_body().collect().await?;
    let trailers = got.trailers().cloned().unwrap_or_default();
    println!("{}", String::from_utf8_lossy(&got.to_bytes()));
    for (k, v) in &trailers {
        println!("TRAILER {k}: {}", String::from_utf8_lossy(v.as_bytes()));
    }
    Ok(())
}

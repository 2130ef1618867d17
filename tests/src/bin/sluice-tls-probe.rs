//! `sluice-tls-probe`: an HTTPS client for the interception tests and the
//! inspection benchmark, run inside the guest namespace. It does what curl
//! cannot: several requests with chosen `:authority` values on ONE HTTP/2
//! connection, a raw echo over an HTTP/1.1 `Upgrade`, and a timed loop of
//! requests on one kept-alive connection.
//!
//! One TLS connection to `--connect HOST:PORT` (resolved by the system
//! resolver, i.e. the gateway's DNS) with SNI `--sni` (default: HOST),
//! trusting only `--cacert`, offering `--alpn` (`h2` or `http/1.1`). Modes:
//! - default: one `GET --path` per `--authority` (default: the SNI), in
//!   order; prints `STATUS <code> <authority>` and then the body per request;
//! - `--websocket MSG`: `GET /ws` with `Upgrade: websocket`, then sends MSG
//!   and prints `WS <what came back>`;
//! - `--count N`: N sequential `GET --path` requests; prints
//!   `REQS <n> <seconds> <handshake seconds>`.
//!
//! Exit code 0 when every request got a response (whatever its status);
//! TLS or connection failures print the error and exit 1.
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Empty};
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Command line.
#[derive(Parser, Debug)]
#[command(about = "HTTPS probe for sluice's interception tests")]
struct Args {
    /// HOST:PORT to connect to.
    #[arg(long)]
    connect: String,
    /// SNI (default: the host part of --connect).
    #[arg(long)]
    sni: Option<String>,
    /// The only CA trusted (PEM).
    #[arg(long)]
    cacert: std::path::PathBuf,
    /// ALPN to offer: h2 or http/1.1.
    #[arg(long, default_value = "h2")]
    alpn: String,
    /// Request path.
    #[arg(long, default_value = "/echo")]
    path: String,
    /// `:authority` / Host of each request, in order (default: the SNI once).
    #[arg(long)]
    authority: Vec<String>,
    /// Extra request header `Name: value` (repeatable).
    #[arg(long)]
    header: Vec<String>,
    /// Upgrade to a raw echo at /ws and send this message.
    #[arg(long)]
    websocket: Option<String>,
    /// Timed loop: this many sequential requests on the one connection.
    #[arg(long)]
    count: Option<u64>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args = Args::parse();
    let host = args
        .connect
        .rsplit_once(':')
        .map(|(h, _)| h.to_owned())
        .context("--connect HOST:PORT")?;
    let sni = args.sni.clone().unwrap_or(host);
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
    let started = Instant::now();
    let tcp = TcpStream::connect(&args.connect)
        .await
        .with_context(|| format!("connect {}", args.connect))?;
    tcp.set_nodelay(true)?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(ServerName::try_from(sni.clone())?, tcp)
        .await
        .context("TLS handshake")?;
    let handshake = started.elapsed();
    let negotiated = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    let h2 = negotiated.as_deref() == Some(b"h2");
    eprintln!(
        "ALPN {}",
        negotiated
            .as_deref()
            .map(String::from_utf8_lossy)
            .unwrap_or_default()
    );

    let authorities = if args.authority.is_empty() {
        vec![sni.clone()]
    } else {
        args.authority.clone()
    };
    let build = |authority: &str, path: &str| -> Result<Request<Empty<Bytes>>> {
        let mut b = if h2 {
            Request::builder().uri(format!("https://{authority}{path}"))
        } else {
            Request::builder().uri(path).header("host", authority)
        };
        for h in &args.header {
            let (k, v) = h.split_once(':').context("--header NAME: VALUE")?;
            b = b.header(k.trim(), v.trim());
        }
        Ok(b.body(Empty::new())?)
    };
    let io = TokioIo::new(tls);

    if let Some(msg) = &args.websocket {
        let (mut send, conn) = hyper::client::conn::http1::handshake(io).await?;
        tokio::spawn(async move {
            let _ = conn.with_upgrades().await;
        });
        let mut req = build(&sni, "/ws")?;
        req.headers_mut().insert("connection", "upgrade".parse()?);
        req.headers_mut().insert("upgrade", "websocket".parse()?);
        req.headers_mut()
            .insert("sec-websocket-version", "13".parse()?);
        req.headers_mut()
            .insert("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==".parse()?);
        let resp = send.send_request(req).await?;
        println!("STATUS {} {sni}", resp.status().as_u16());
        if resp.status() != hyper::StatusCode::SWITCHING_PROTOCOLS {
            bail!("no upgrade");
        }
        let mut up = TokioIo::new(hyper::upgrade::on(resp).await?);
        up.write_all(msg.as_bytes()).await?;
        let mut got = vec![0u8; msg.len()];
        up.read_exact(&mut got).await?;
        println!("WS {}", String::from_utf8_lossy(&got));
        return Ok(());
    }

    enum Sender {
        H1(hyper::client::conn::http1::SendRequest<Empty<Bytes>>),
        H2(hyper::client::conn::http2::SendRequest<Empty<Bytes>>),
    }
    let mut sender = if h2 {
        let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await?;
        tokio::spawn(conn);
        Sender::H2(send)
    } else {
        let (send, conn) = hyper::client::conn::http1::handshake(io).await?;
        tokio::spawn(conn);
        Sender::H1(send)
    };
    let mut one = async |authority: &str, print: bool| -> Result<()> {
        let req = build(authority, &args.path)?;
        let resp = match &mut sender {
            Sender::H1(s) => {
                s.ready().await?;
                s.send_request(req).await?
            }
            Sender::H2(s) => {
                s.ready().await?;
                s.send_request(req).await?
            }
        };
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await?.to_bytes();
        if print {
            println!("STATUS {status} {authority}");
            println!("{}", String::from_utf8_lossy(&body));
        }
        Ok(())
    };
    if let Some(n) = args.count {
        let t = Instant::now();
        for _ in 0..n {
            one(&sni, false).await?;
        }
        println!(
            "REQS {n} {:.6} {:.6}",
            t.elapsed().as_secs_f64(),
            handshake.as_secs_f64()
        );
        return Ok(());
    }
    for a in &authorities {
        one(a, true).await?;
    }
    Ok(())
}

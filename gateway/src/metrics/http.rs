//! The `/metrics` endpoint: a minimal HTTP/1.1 server (hyper) on a TCP or
//! unix socket, on the gateway's runtime.
//!
//! The listener is bound before the gateway restricts itself (its Landlock
//! ruleset allows no later bind); [`serve`] only accepts. The guest never
//! reaches it: guest traffic leaves through host sockets only where the
//! decider allows, and the platform deny set refuses loopback, the host's
//! own addresses and the gateway address whatever the policy says.

use std::convert::Infallible;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Semaphore;

use super::Metrics;

/// Concurrent scrape connections; more wait in the listen backlog.
const MAX_CONNECTIONS: usize = 8;

/// A client must send its request head within this time.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Where `/metrics` is served (`--metrics`): `[HOST:]PORT` (TCP; the host
/// defaults to 127.0.0.1), `unix:PATH`, or `fd:N`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetricsAddr {
    /// A TCP address; port 0 picks a free one (logged when bound).
    Tcp(SocketAddr),
    /// A unix socket path (a stale socket there is replaced).
    Unix(PathBuf),
    /// An inherited listening socket, TCP or unix (`sluice run` binds
    /// `--metrics` outside the gateway's jail and passes it in).
    Fd(i32),
}

/// A `--metrics` value that is neither `[HOST:]PORT` nor `unix:PATH`.
#[derive(Debug, Error)]
#[error("{0:?}: expected [HOST:]PORT, unix:PATH or fd:N")]
pub struct MetricsAddrError(String);

impl FromStr for MetricsAddr {
    type Err = MetricsAddrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(MetricsAddrError(s.to_owned()));
            }
            return Ok(Self::Unix(PathBuf::from(path)));
        }
        if let Some(fd) = s.strip_prefix("fd:") {
            return match fd.parse::<i32>() {
                Ok(fd) if fd >= 3 => Ok(Self::Fd(fd)),
                _ => Err(MetricsAddrError(s.to_owned())),
            };
        }
        if let Ok(port) = s.parse::<u16>() {
            return Ok(Self::Tcp(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::LOCALHOST),
                port,
            )));
        }
        s.parse::<SocketAddr>()
            .map(Self::Tcp)
            .map_err(|_| MetricsAddrError(s.to_owned()))
    }
}

impl fmt::Display for MetricsAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tcp(a) => write!(f, "{a}"),
            Self::Unix(p) => write!(f, "unix:{}", p.display()),
            Self::Fd(fd) => write!(f, "fd:{fd}"),
        }
    }
}

/// A bound `/metrics` listener, not yet serving.
#[derive(Debug)]
pub enum MetricsListener {
    /// TCP.
    Tcp(std::net::TcpListener),
    /// Unix socket.
    Unix(std::os::unix::net::UnixListener),
}

impl MetricsListener {
    /// Binds `addr` (non-blocking, for the runtime). A stale unix socket at
    /// the path is removed first; any other file there is an error.
    ///
    /// # Errors
    /// The bind's, a non-socket file at the unix path, or
    /// [`MetricsAddr::Fd`] (adopt it with [`MetricsListener::adopt`]).
    pub fn bind(addr: &MetricsAddr) -> std::io::Result<Self> {
        let l = match addr {
            MetricsAddr::Fd(fd) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("fd:{fd} is adopted, not bound"),
                ));
            }
            MetricsAddr::Tcp(a) => Self::Tcp(std::net::TcpListener::bind(a)?),
            MetricsAddr::Unix(path) => {
                use std::os::unix::fs::FileTypeExt as _;
                match std::fs::symlink_metadata(path) {
                    Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path)?,
                    Ok(_) => {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::AlreadyExists,
                            format!("{} exists and is not a socket", path.display()),
                        ));
                    }
                    Err(_) => {}
                }
                Self::Unix(std::os::unix::net::UnixListener::bind(path)?)
            }
        };
        match &l {
            Self::Tcp(t) => t.set_nonblocking(true)?,
            Self::Unix(u) => u.set_nonblocking(true)?,
        }
        Ok(l)
    }

    /// A listening TCP or unix socket inherited as `fd` (non-blocking from
    /// now on).
    ///
    /// # Errors
    /// `fd` is not a listening socket of either family.
    pub fn adopt(fd: std::os::fd::OwnedFd) -> std::io::Result<Self> {
        use rustix::net::{AddressFamily, sockopt};
        let not_listening = || {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not a listening TCP or unix socket",
            )
        };
        if !sockopt::socket_acceptconn(&fd)? {
            return Err(not_listening());
        }
        let l = match sockopt::socket_domain(&fd)? {
            AddressFamily::INET | AddressFamily::INET6 => Self::Tcp(fd.into()),
            AddressFamily::UNIX => Self::Unix(fd.into()),
            _ => return Err(not_listening()),
        };
        match &l {
            Self::Tcp(t) => t.set_nonblocking(true)?,
            Self::Unix(u) => u.set_nonblocking(true)?,
        }
        Ok(l)
    }

    /// The bound address as `--metrics` spells it (TCP: with the port the
    /// kernel picked for port 0).
    pub fn local_addr(&self) -> std::io::Result<MetricsAddr> {
        Ok(match self {
            Self::Tcp(t) => MetricsAddr::Tcp(t.local_addr()?),
            Self::Unix(u) => MetricsAddr::Unix(
                u.local_addr()?
                    .as_pathname()
                    .map(PathBuf::from)
                    .unwrap_or_default(),
            ),
        })
    }
}

impl std::os::fd::AsFd for MetricsListener {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            Self::Tcp(t) => t.as_fd(),
            Self::Unix(u) => u.as_fd(),
        }
    }
}

/// Serves `metrics` on `listener` until the runtime stops. Must run inside
/// a tokio runtime. An accept error is logged and retried; one connection's
/// error never stops the server.
///
/// # Errors
/// Registering the listener with the runtime.
pub async fn serve(listener: MetricsListener, metrics: Arc<Metrics>) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    match listener {
        MetricsListener::Tcp(l) => {
            let l = tokio::net::TcpListener::from_std(l)?;
            loop {
                match l.accept().await {
                    Ok((s, _)) => spawn_connection(s, &metrics, &slots).await,
                    Err(e) => accept_failed(&e).await,
                }
            }
        }
        MetricsListener::Unix(l) => {
            let l = tokio::net::UnixListener::from_std(l)?;
            loop {
                match l.accept().await {
                    Ok((s, _)) => spawn_connection(s, &metrics, &slots).await,
                    Err(e) => accept_failed(&e).await,
                }
            }
        }
    }
}

async fn accept_failed(e: &std::io::Error) {
    tracing::warn!(error = %e, "metrics: accept failed");
    // Out of descriptors, most likely: let some close.
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// Serves one connection in its own task once a slot is free.
async fn spawn_connection<S>(stream: S, metrics: &Arc<Metrics>, slots: &Arc<Semaphore>)
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let Ok(slot) = Arc::clone(slots).acquire_owned().await else {
        return;
    };
    let metrics = Arc::clone(metrics);
    tokio::spawn(async move {
        let service = hyper::service::service_fn(move |req| {
            let metrics = Arc::clone(&metrics);
            async move { Ok::<_, Infallible>(respond(&req, &metrics)) }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_TIMEOUT)
            .keep_alive(false)
            .serve_connection(TokioIo::new(stream), service);
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "metrics: connection failed");
        }
        drop(slot);
    });
}

/// `GET /metrics`: the exposition; anything else: 404 or 405.
fn respond(req: &Request<Incoming>, metrics: &Metrics) -> Response<Full<Bytes>> {
    let (status, content_type, body) = if req.uri().path() != "/metrics" {
        (
            StatusCode::NOT_FOUND,
            "text/plain",
            Bytes::from_static(b"not found\n"),
        )
    } else if req.method() != Method::GET && req.method() != Method::HEAD {
        (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            Bytes::from_static(b"method not allowed\n"),
        )
    } else {
        (
            StatusCode::OK,
            prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            Bytes::from(metrics.encode()),
        )
    };
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ports_addresses_and_unix_paths() {
        let tcp = |s: &str| MetricsAddr::Tcp(s.parse().expect("addr"));
        assert_eq!(
            "9100".parse::<MetricsAddr>().expect("port"),
            tcp("127.0.0.1:9100")
        );
        assert_eq!(
            "0.0.0.0:9100".parse::<MetricsAddr>().expect("addr"),
            tcp("0.0.0.0:9100")
        );
        assert_eq!(
            "[::1]:0".parse::<MetricsAddr>().expect("v6"),
            tcp("[::1]:0")
        );
        assert_eq!(
            "unix:/run/m.sock".parse::<MetricsAddr>().expect("unix"),
            MetricsAddr::Unix("/run/m.sock".into())
        );
        assert_eq!(
            "fd:5".parse::<MetricsAddr>().expect("fd"),
            MetricsAddr::Fd(5)
        );
        for bad in [
            "",
            "unix:",
            "localhost:9100",
            "99999",
            "host",
            "fd:",
            "fd:1",
            "fd:x",
        ] {
            assert!(bad.parse::<MetricsAddr>().is_err(), "{bad}");
        }
        for s in ["127.0.0.1:9100", "[::1]:9100", "unix:/run/m.sock", "fd:5"] {
            assert_eq!(s.parse::<MetricsAddr>().expect("parses").to_string(), s);
        }
    }
}

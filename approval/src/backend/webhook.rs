//! The webhook backend: POST the question as JSON to a URL; a 200 response
//! whose body is an answer decides. Anything else (another status, a body
//! over [`MAX_MESSAGE_BYTES`], a body that is not an answer, a TLS or
//! connection failure) is an error, hence a deny.
//!
//! Authentication, either or both: a bearer token read from a file at each
//! question (so it can be rotated without a restart, and never sits in the
//! policy), and a client certificate for mutual TLS. With `https`, the
//! server is verified against the `ca` file if given, else the public web
//! roots compiled in (no system store is read).
//!
//! Pinning: a backend given addresses ([`WebhookBackend::with_addresses`])
//! connects only there and never resolves the URL's host; the host still
//! names the server in the TLS handshake (SNI, certificate check) and in
//! `Host`. `sluice run` resolves the host once, opens exactly those
//! addresses in the gateway's egress floor and pins the gateway to them
//! ([`WebhookPin`]), so the launcher and the jailed gateway cannot reach
//! different servers.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Uri, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::{AnswerFuture, Backend, BackendError};
use crate::wire::{Answer, MAX_MESSAGE_BYTES, Question};

/// Where and how to post questions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookConfig {
    /// `http://` or `https://` URL.
    pub url: String,
    /// A file holding the bearer token (surrounding whitespace trimmed).
    pub bearer_token_file: Option<PathBuf>,
    /// PEM certificate chain for mutual TLS (with `client_key`).
    pub client_cert: Option<PathBuf>,
    /// PEM private key for mutual TLS (with `client_cert`).
    pub client_key: Option<PathBuf>,
    /// PEM CA certificates that verify the server, instead of the web roots.
    pub ca: Option<PathBuf>,
}

/// The host and port of a webhook URL (`http` or `https`; the port
/// defaults to 80 or 443), IPv6 brackets removed: what the backend connects
/// to and names in TLS and `Host`, and what `sluice run` resolves and pins.
///
/// # Errors
/// A URL that is not `http` or `https`, or has no host.
pub fn url_host_port(url: &str) -> Result<(String, u16), BackendError> {
    let (_, _, host, port) = parse_url(url)?;
    Ok((host, port))
}

/// The URL, whether it is `https`, its host (brackets removed) and port.
fn parse_url(url: &str) -> Result<(Uri, bool, String, u16), BackendError> {
    let uri: Uri = url
        .parse()
        .map_err(|e| config_err(format!("webhook url {url:?}: {e}")))?;
    let https = match uri.scheme_str() {
        Some(s) if s.eq_ignore_ascii_case("https") => true,
        Some(s) if s.eq_ignore_ascii_case("http") => false,
        _ => {
            return Err(config_err(format!(
                "webhook url {url:?}: not http or https"
            )));
        }
    };
    let authority = uri
        .authority()
        .ok_or_else(|| config_err(format!("webhook url {url:?}: no host")))?;
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    if host.is_empty() {
        return Err(config_err(format!("webhook url {url:?}: no host")));
    }
    // `port_u16` is `None` both without a port and with one that is not a
    // number: the latter must not become the default port.
    let port = match authority.port_u16() {
        Some(p) => p,
        None if authority.as_str().ends_with(authority.host()) => {
            if https {
                443
            } else {
                80
            }
        }
        None => return Err(config_err(format!("webhook url {url:?}: bad port"))),
    };
    Ok((uri, https, host, port))
}

/// The addresses a launcher resolved a webhook's host to, for the gateway
/// to connect to instead of resolving it again (`--approval-webhook-name`,
/// `--approval-webhook-addr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookPin {
    /// The URL host the addresses were resolved for.
    pub host: String,
    /// The addresses with the URL's port; empty when none could be opened
    /// (every question is then denied).
    pub addrs: Vec<SocketAddr>,
}

impl WebhookPin {
    /// The pinned addresses for a webhook at `url`, or why there are none:
    /// a URL whose host or port is not the pin's (a reload changed it; the
    /// pin, like the egress floor's opening, holds until the run restarts),
    /// or an empty pin.
    ///
    /// # Errors
    /// [`BackendError::Config`] saying which.
    pub fn addresses_for(&self, url: &str) -> Result<Vec<SocketAddr>, BackendError> {
        let (host, port) = url_host_port(url)?;
        if !host.eq_ignore_ascii_case(&self.host) || self.addrs.iter().any(|a| a.port() != port) {
            return Err(config_err(format!(
                "webhook host {host}:{port} is not the one resolved when the run started ({}); \
                 a changed webhook host needs a restart",
                self.host
            )));
        }
        if self.addrs.is_empty() {
            return Err(config_err(format!(
                "webhook host {host}: no address was opened for it when the run started"
            )));
        }
        Ok(self.addrs.clone())
    }
}

/// Posts questions to a URL.
pub struct WebhookBackend {
    uri: Uri,
    authority: String,
    host: String,
    port: u16,
    /// Where to connect instead of resolving `host` (empty: resolve).
    pinned: Vec<SocketAddr>,
    tls: Option<(TlsConnector, ServerName<'static>)>,
    bearer_token_file: Option<PathBuf>,
}

impl std::fmt::Debug for WebhookBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookBackend")
            .field("uri", &self.uri)
            .field("pinned", &self.pinned)
            .field("tls", &self.tls.is_some())
            .field("bearer_token_file", &self.bearer_token_file)
            .finish_non_exhaustive()
    }
}

fn config_err(what: impl std::fmt::Display) -> BackendError {
    BackendError::Config(what.to_string())
}

impl WebhookBackend {
    /// Checks the URL and loads the TLS material (once: a bad file is a
    /// start-up error, not a deny at the first question).
    ///
    /// # Errors
    /// An unusable URL or a certificate, key or CA file that cannot be read.
    pub fn new(cfg: &WebhookConfig) -> Result<Self, BackendError> {
        let (uri, https, host, port) = parse_url(&cfg.url)?;
        let authority = uri
            .authority()
            .map(ToString::to_string)
            .ok_or_else(|| config_err(format!("webhook url {:?}: no host", cfg.url)))?;
        let tls = if https {
            let server = ServerName::try_from(host.clone())
                .map_err(|e| config_err(format!("webhook host {host:?}: {e}")))?;
            Some((TlsConnector::from(Arc::new(client_config(cfg)?)), server))
        } else {
            if cfg.client_cert.is_some() || cfg.ca.is_some() {
                return Err(config_err("webhook client_cert and ca need an https url"));
            }
            None
        };
        Ok(Self {
            authority,
            uri,
            host,
            port,
            pinned: Vec::new(),
            tls,
            bearer_token_file: cfg.bearer_token_file.clone(),
        })
    }

    /// Connects only to `addrs` (tried in order), never resolving the URL's
    /// host, which still names the server in TLS and `Host`. Empty: resolve
    /// the host at each question.
    #[must_use]
    pub fn with_addresses(mut self, addrs: Vec<SocketAddr>) -> Self {
        self.pinned = addrs;
        self
    }

    async fn post(&self, body: Vec<u8>) -> Result<Answer, BackendError> {
        let token = match &self.bearer_token_file {
            Some(path) => Some(read_token(path)?),
            None => None,
        };
        let tcp = if self.pinned.is_empty() {
            TcpStream::connect((self.host.as_str(), self.port)).await
        } else {
            TcpStream::connect(&self.pinned[..]).await
        }
        .map_err(BackendError::Connect)?;
        let _ = tcp.set_nodelay(true);
        match &self.tls {
            Some((connector, name)) => {
                let tls = connector
                    .connect(name.clone(), tcp)
                    .await
                    .map_err(|e| BackendError::Tls(e.to_string()))?;
                self.exchange(tls, body, token).await
            }
            None => self.exchange(tcp, body, token).await,
        }
    }

    async fn exchange<S>(
        &self,
        io: S,
        body: Vec<u8>,
        token: Option<String>,
    ) -> Result<Answer, BackendError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (mut sender, conn) = http1::handshake(TokioIo::new(io))
            .await
            .map_err(|e| BackendError::Http(e.to_string()))?;
        let conn = tokio::spawn(conn);
        let path = self.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut req = Request::builder()
            .method(Method::POST)
            .uri(path)
            .header(header::HOST, &self.authority)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json")
            .header(header::CONTENT_LENGTH, body.len());
        if let Some(token) = token {
            req = req.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let req = req
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| BackendError::Http(e.to_string()))?;
        let res = sender
            .send_request(req)
            .await
            .map_err(|e| BackendError::Http(e.to_string()))?;
        let status = res.status();
        if status != http::StatusCode::OK {
            conn.abort();
            return Err(BackendError::Status(status.as_u16()));
        }
        let bytes = Limited::new(res.into_body(), MAX_MESSAGE_BYTES)
            .collect()
            .await
            .map_err(|e| BackendError::Http(e.to_string()))?
            .to_bytes();
        conn.abort();
        Ok(Answer::parse(&bytes)?)
    }
}

impl Backend for WebhookBackend {
    fn kind(&self) -> &'static str {
        "webhook"
    }

    fn ask<'a>(&'a self, question: &'a Question) -> AnswerFuture<'a> {
        Box::pin(async move {
            let body = serde_json::to_vec(question).map_err(|e| BackendError::Wire(e.into()))?;
            self.post(body).await
        })
    }
}

/// The token in `path`, whitespace trimmed; an empty file is an error.
fn read_token(path: &Path) -> Result<String, BackendError> {
    let raw = std::fs::read_to_string(path)
        .map_err(|e| config_err(format!("bearer_token_file {}: {e}", path.display())))?;
    let token = raw.trim();
    if token.is_empty() || token.bytes().any(|b| b.is_ascii_control()) {
        return Err(config_err(format!(
            "bearer_token_file {}: empty or not one line",
            path.display()
        )));
    }
    Ok(token.to_owned())
}

fn client_config(cfg: &WebhookConfig) -> Result<rustls::ClientConfig, BackendError> {
    let mut roots = rustls::RootCertStore::empty();
    match &cfg.ca {
        Some(ca) => {
            for cert in CertificateDer::pem_file_iter(ca)
                .map_err(|e| config_err(format!("ca {}: {e}", ca.display())))?
            {
                let cert = cert.map_err(|e| config_err(format!("ca {}: {e}", ca.display())))?;
                roots
                    .add(cert)
                    .map_err(|e| config_err(format!("ca {}: {e}", ca.display())))?;
            }
            if roots.is_empty() {
                return Err(config_err(format!("ca {}: no certificate", ca.display())));
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| BackendError::Tls(e.to_string()))?
        .with_root_certificates(roots);
    match (&cfg.client_cert, &cfg.client_key) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .map_err(|e| config_err(format!("client_cert {}: {e}", cert.display())))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| config_err(format!("client_cert {}: {e}", cert.display())))?;
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| config_err(format!("client_key {}: {e}", key.display())))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| BackendError::Tls(e.to_string()))
        }
        (None, None) => Ok(builder.with_no_client_auth()),
        _ => Err(config_err("webhook client_cert and client_key go together")),
    }
}

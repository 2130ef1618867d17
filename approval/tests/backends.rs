//! The backends against real servers on loopback: a unix socket the test
//! listens on, an HTTP webhook and an HTTPS webhook that demands a client
//! certificate. Every failure a backend can meet is a deny (an error here),
//! never an answer.

#![allow(clippy::unwrap_used, reason = "test helpers: a panic is a failed test")]

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use sluice_approval::backend::unix::{UnixBackend, serve_one};
use sluice_approval::backend::webhook::{WebhookBackend, WebhookConfig, WebhookPin};
use sluice_approval::wire::WIRE_VERSION;
use sluice_approval::{Answer, Backend, BackendError, Choice, Question};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::mpsc;

fn question() -> Question {
    Question {
        version: WIRE_VERSION,
        sandbox: "sb-7".into(),
        policy: "agents".into(),
        name: "new.example.org".into(),
        qtype: "A".into(),
        tcp_ports: vec![443],
        udp_ports: vec![],
        always_allowed: true,
        refused_since: 0,
        timeout_ms: 0,
    }
}

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sluice-approval-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[tokio::test]
async fn unix_backend_asks_one_line_and_reads_one_back() {
    let dir = tempdir("unix");
    let path = dir.join("ask.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let server = tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        let mut seen = None;
        serve_one(s, |q| {
            seen = Some(q);
            async {
                Answer {
                    decision: Choice::AllowSandbox,
                    by: Some("ui".into()),
                }
            }
        })
        .await
        .unwrap();
        seen.unwrap()
    });
    let a = UnixBackend::new(&path).ask(&question()).await.unwrap();
    assert_eq!(a.decision, Choice::AllowSandbox);
    assert_eq!(a.by.as_deref(), Some("ui"));
    assert_eq!(server.await.unwrap(), question());
}

#[tokio::test]
async fn unix_backend_failures_are_errors() {
    let dir = tempdir("unix-fail");
    // Nobody listening.
    let err = UnixBackend::new(dir.join("none.sock"))
        .ask(&question())
        .await;
    assert!(matches!(err, Err(BackendError::Connect(_))), "{err:?}");
    // A listener that answers garbage, then one that closes, then one that floods.
    for (i, reply) in [&b"yes\n"[..], b"", &[b'x'; 10_000][..]]
        .into_iter()
        .enumerate()
    {
        let path = dir.join(format!("bad{i}.sock"));
        let listener = UnixListener::bind(&path).unwrap();
        let reply = reply.to_vec();
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let (mut s, _) = listener.accept().await.unwrap();
            let _ = s.write_all(&reply).await;
        });
        let err = UnixBackend::new(&path).ask(&question()).await;
        assert!(err.is_err(), "reply {i} was taken as {err:?}");
    }
}

/// What the test webhook saw.
#[derive(Debug)]
struct Seen {
    host: Option<String>,
    authorization: Option<String>,
    content_type: Option<String>,
    body: Vec<u8>,
}

/// Serves one HTTP/1.1 connection at a time on `listener` (TLS when
/// `tls`), answering `status` and `body`, and reports each request.
fn webhook(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    status: StatusCode,
    body: &'static [u8],
) -> mpsc::UnboundedReceiver<Seen> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let tx = tx.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let tx = tx.clone();
                    async move {
                        let h = |n| {
                            req.headers()
                                .get(n)
                                .and_then(|v| v.to_str().ok())
                                .map(str::to_owned)
                        };
                        let host = h("host");
                        let authorization = h("authorization");
                        let content_type = h("content-type");
                        let body_in = req
                            .into_body()
                            .collect()
                            .await
                            .map(|b| b.to_bytes().to_vec())
                            .unwrap_or_default();
                        let _ = tx.send(Seen {
                            host,
                            authorization,
                            content_type,
                            body: body_in,
                        });
                        Ok::<_, Infallible>(
                            Response::builder()
                                .status(status)
                                .body(Full::new(Bytes::from_static(body)))
                                .unwrap(),
                        )
                    }
                });
                let builder = hyper::server::conn::http1::Builder::new();
                match tls {
                    Some(acc) => {
                        if let Ok(s) = acc.accept(tcp).await {
                            let _ = builder.serve_connection(TokioIo::new(s), svc).await;
                        }
                    }
                    None => {
                        let _ = builder.serve_connection(TokioIo::new(tcp), svc).await;
                    }
                }
            });
        }
    });
    rx
}

async fn listen() -> (TcpListener, u16) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    (l, port)
}

fn http_config(port: u16) -> WebhookConfig {
    WebhookConfig {
        url: format!("http://127.0.0.1:{port}/approve?x=1"),
        bearer_token_file: None,
        client_cert: None,
        client_key: None,
        ca: None,
    }
}

#[tokio::test]
async fn webhook_posts_the_question_with_the_token_from_its_file() {
    let dir = tempdir("hook");
    let token = dir.join("token");
    std::fs::write(&token, "s3cret-token\n").unwrap();
    let (l, port) = listen().await;
    let mut seen = webhook(
        l,
        None,
        StatusCode::OK,
        br#"{"decision":"allow_once","by":"bot"}"#,
    );
    let cfg = WebhookConfig {
        bearer_token_file: Some(token.clone()),
        ..http_config(port)
    };
    let backend = WebhookBackend::new(&cfg).unwrap();
    let a = backend.ask(&question()).await.unwrap();
    assert_eq!(
        a,
        Answer {
            decision: Choice::AllowOnce,
            by: Some("bot".into())
        }
    );
    let s = seen.recv().await.unwrap();
    assert_eq!(s.authorization.as_deref(), Some("Bearer s3cret-token"));
    assert_eq!(s.content_type.as_deref(), Some("application/json"));
    assert_eq!(Question::parse(&s.body).unwrap(), question());
    // The token is read at each question: a rotated file is used next time.
    std::fs::write(&token, "rotated").unwrap();
    backend.ask(&question()).await.unwrap();
    assert_eq!(
        seen.recv().await.unwrap().authorization.as_deref(),
        Some("Bearer rotated")
    );
}

#[tokio::test]
async fn webhook_failures_are_errors() {
    for (status, body) in [
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            &br#"{"decision":"allow_once"}"#[..],
        ),
        (StatusCode::NO_CONTENT, b""),
        (StatusCode::OK, b"allow"),
        (StatusCode::OK, br#"{"decision":"allow_once","extra":true}"#),
        (StatusCode::OK, &[b' '; 5000][..]),
    ] {
        let (l, port) = listen().await;
        let _seen = webhook(l, None, status, body);
        let err = WebhookBackend::new(&http_config(port))
            .unwrap()
            .ask(&question())
            .await;
        assert!(
            err.is_err(),
            "{status} {:?} was taken as {err:?}",
            String::from_utf8_lossy(body)
        );
    }
    // Nothing listening.
    let (l, port) = listen().await;
    drop(l);
    let err = WebhookBackend::new(&http_config(port))
        .unwrap()
        .ask(&question())
        .await;
    assert!(matches!(err, Err(BackendError::Connect(_))), "{err:?}");
    // A token file that is missing is an error at the question, not an anonymous post.
    let (l, port) = listen().await;
    let mut seen = webhook(l, None, StatusCode::OK, br#"{"decision":"allow_once"}"#);
    let cfg = WebhookConfig {
        bearer_token_file: Some("/nonexistent/token".into()),
        ..http_config(port)
    };
    let err = WebhookBackend::new(&cfg).unwrap().ask(&question()).await;
    assert!(matches!(err, Err(BackendError::Config(_))), "{err:?}");
    assert!(seen.try_recv().is_err(), "posted without its token");
}

#[test]
fn webhook_configuration_is_checked_up_front() {
    for url in ["ftp://x/", "not a url", "/relative"] {
        let cfg = WebhookConfig {
            url: url.into(),
            ..http_config(1)
        };
        assert!(WebhookBackend::new(&cfg).is_err(), "{url}");
    }
    let cfg = WebhookConfig {
        client_cert: Some("/x".into()),
        ..http_config(1)
    };
    assert!(
        WebhookBackend::new(&cfg).is_err(),
        "client cert over plain http"
    );
}

struct Pki {
    dir: PathBuf,
    ca: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

impl Pki {
    fn new(tag: &str) -> Self {
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(rcgen::DnType::CommonName, format!("{tag} CA"));
        p.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let ca =
            rcgen::CertifiedIssuer::self_signed(p, rcgen::KeyPair::generate().unwrap()).unwrap();
        let dir = tempdir(tag);
        std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
        Self { dir, ca }
    }

    /// A leaf for `name`, written as `{file}.pem` and `{file}.key`.
    fn leaf(
        &self,
        name: &str,
        file: &str,
    ) -> (
        rustls::pki_types::CertificateDer<'static>,
        rustls::pki_types::PrivateKeyDer<'static>,
    ) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_owned()])
            .unwrap()
            .signed_by(&key, &self.ca)
            .unwrap();
        std::fs::write(self.dir.join(format!("{file}.pem")), cert.pem()).unwrap();
        std::fs::write(self.dir.join(format!("{file}.key")), key.serialize_pem()).unwrap();
        (
            cert.der().clone(),
            rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
        )
    }
}

#[tokio::test]
async fn webhook_over_mutual_tls() {
    let server_pki = Pki::new("server");
    let client_pki = Pki::new("client");
    let (cert, key) = server_pki.leaf("localhost", "server");
    client_pki.leaf("sluice-gateway", "client");
    let (wrong_cert, _) = server_pki.leaf("sluice-gateway", "wrong-client");
    let _ = wrong_cert;

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(client_pki.ca.der().clone()).unwrap();
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .unwrap();
    let server_cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(vec![cert], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_cfg));
    let (l, port) = listen().await;
    let mut seen = webhook(
        l,
        Some(acceptor),
        StatusCode::OK,
        br#"{"decision":"deny_sandbox"}"#,
    );

    let url = format!("https://localhost:{port}/ask");
    let good = WebhookConfig {
        url: url.clone(),
        bearer_token_file: None,
        client_cert: Some(client_pki.dir.join("client.pem")),
        client_key: Some(client_pki.dir.join("client.key")),
        ca: Some(server_pki.dir.join("ca.pem")),
    };
    let a = WebhookBackend::new(&good)
        .unwrap()
        .ask(&question())
        .await
        .unwrap();
    assert_eq!(a.decision, Choice::DenySandbox);
    assert!(seen.recv().await.is_some());

    // A client certificate from a CA the server does not trust is refused.
    let wrong = WebhookConfig {
        client_cert: Some(server_pki.dir.join("wrong-client.pem")),
        client_key: Some(server_pki.dir.join("wrong-client.key")),
        ..good.clone()
    };
    assert!(
        WebhookBackend::new(&wrong)
            .unwrap()
            .ask(&question())
            .await
            .is_err()
    );
    // No client certificate at all is refused.
    let none = WebhookConfig {
        client_cert: None,
        client_key: None,
        ..good.clone()
    };
    assert!(
        WebhookBackend::new(&none)
            .unwrap()
            .ask(&question())
            .await
            .is_err()
    );
    // A server the configured CA did not sign is refused (the web roots are not consulted).
    let other_ca = WebhookConfig {
        ca: Some(client_pki.dir.join("ca.pem")),
        ..good
    };
    let err = WebhookBackend::new(&other_ca)
        .unwrap()
        .ask(&question())
        .await;
    assert!(matches!(err, Err(BackendError::Tls(_))), "{err:?}");
    assert!(
        seen.try_recv().is_err(),
        "a refused client reached the handler"
    );
}

/// A pinned webhook connects to its pinned address only, never resolving
/// the URL's host (`hook.invalid` resolves nowhere: RFC 6761), and still
/// names that host in `Host`, in SNI and in the certificate check.
#[tokio::test]
async fn a_pinned_webhook_connects_to_its_address_and_keeps_the_urls_name() {
    let pki = Pki::new("pinned");
    let (cert, key) = pki.leaf("hook.invalid", "server");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server_cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_cfg));
    let (l, port) = listen().await;
    let mut seen = webhook(
        l,
        Some(acceptor),
        StatusCode::OK,
        br#"{"decision":"allow_once","by":"pinned"}"#,
    );
    let at: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let cfg = WebhookConfig {
        url: format!("https://hook.invalid:{port}/ask"),
        bearer_token_file: None,
        client_cert: None,
        client_key: None,
        ca: Some(pki.dir.join("ca.pem")),
    };
    // Unpinned: the name resolves nowhere, so nothing is asked.
    let err = WebhookBackend::new(&cfg).unwrap().ask(&question()).await;
    assert!(matches!(err, Err(BackendError::Connect(_))), "{err:?}");
    // Pinned: the question reaches the address, verified as hook.invalid.
    let a = WebhookBackend::new(&cfg)
        .unwrap()
        .with_addresses(vec![at])
        .ask(&question())
        .await
        .unwrap();
    assert_eq!(a.decision, Choice::AllowOnce);
    let got = seen.recv().await.unwrap();
    assert_eq!(
        got.host.as_deref(),
        Some(format!("hook.invalid:{port}").as_str())
    );
    // Pinned elsewhere (nobody listens there): a connect error, though the
    // server above still listens.
    let (gone, gone_port) = listen().await;
    drop(gone);
    let err = WebhookBackend::new(&cfg)
        .unwrap()
        .with_addresses(vec![format!("127.0.0.1:{gone_port}").parse().unwrap()])
        .ask(&question())
        .await;
    assert!(matches!(err, Err(BackendError::Connect(_))), "{err:?}");
    // The address pinned, the name another: the certificate check fails.
    let other = WebhookConfig {
        url: format!("https://other.invalid:{port}/ask"),
        ..cfg.clone()
    };
    let err = WebhookBackend::new(&other)
        .unwrap()
        .with_addresses(vec![at])
        .ask(&question())
        .await;
    assert!(matches!(err, Err(BackendError::Tls(_))), "{err:?}");
    assert!(
        seen.try_recv().is_err(),
        "a refused question reached the handler"
    );
}

/// A pin applies to the host and port it was resolved for only: a URL a
/// reload changed gets no address (a deny), and an empty pin none either.
#[test]
fn a_pin_applies_to_its_own_host_and_port_only() {
    let pin = WebhookPin {
        host: "Hook.Example".into(),
        addrs: vec!["192.0.2.8:8443".parse().unwrap()],
    };
    assert_eq!(
        pin.addresses_for("https://hook.example:8443/ask").unwrap(),
        pin.addrs
    );
    for url in [
        "https://other.example:8443/ask",
        "https://hook.example/ask",
        "http://hook.example:8080/ask",
    ] {
        let err = pin.addresses_for(url).unwrap_err();
        assert!(err.to_string().contains("restart"), "{url}: {err}");
    }
    let empty = WebhookPin {
        host: "hook.example".into(),
        addrs: Vec::new(),
    };
    assert!(empty.addresses_for("https://hook.example/ask").is_err());
}

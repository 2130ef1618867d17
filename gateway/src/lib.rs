//! sluice-gateway: the per-VM network sidecar.
//!
//! One process serves one guest: it speaks Ethernet with the guest over
//! QEMU's stream socket ([`frames`]), a unix datagram socket or a packet
//! socket on an interface ([`link`]), runs a userspace TCP/IP stack (smoltcp)
//! in one session task ([`session`]), serves DHCP ([`dhcp`]) and DNS
//! ([`dns`]) itself, decides every new flow ([`decide`]) and re-originates
//! allowed flows from ordinary host sockets, writing an audit trail
//! ([`audit`]). See `docs/gateway.md`.
//!
//! # Public API
//!
//! Public is only what the binary (`main.rs`), the launcher (`sluice run`
//! builds the gateway's argv from [`args::GatewayArgs`] and
//! [`config::PublishSpec`]; its tests render records with [`audit::ocsf`])
//! and the end-to-end tests (the audit rate limits) use: [`serve`], [`serve_with_reload`], their argument
//! types, and the modules [`args`], [`audit`], [`config`], [`decide`]
//! (with [`decide::platform`] and [`decide::policy`]; [`decide::Approvals`]
//! is the DNS server's runtime approvals, lent to the decider), [`flow`],
//! [`link`], [`metrics`] and [`reload`]. Every other module is private.
//!
//! The `test-util` feature (nothing that ships enables it) also makes
//! `dhcp`, `dns` (`approval`, `server`, `table`, `upstream`), `frames`, `packet`,
//! `session` and its alias `datapath` public, for the in-process drivers:
//! the fuzz targets (`fuzz/`) and `tests/src/bin/sluice-dns-bench.rs`. In
//! those modules an item a driver uses is `pub` with
//! `#[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]`, so
//! that without the feature the compiler still checks it is reachable from
//! nowhere else; every other item there is `pub(crate)`.
#![forbid(unsafe_code)]

// The public API (see the crate doc).
pub mod args;
pub mod audit;
pub mod config;
pub mod decide;
pub mod flow;
pub mod link;
pub mod metrics;
pub mod reload;

/// Declares modules that are public with the `test-util` feature, for the
/// in-process drivers, and have the given visibility otherwise (see the
/// crate doc).
macro_rules! public_for_drivers {
    ($vis:vis mod $($name:ident),+ $(,)?) => {
        $(
            #[cfg(feature = "test-util")]
            pub mod $name;
            #[cfg(not(feature = "test-util"))]
            $vis mod $name;
        )+
    };
}

public_for_drivers!(mod dhcp, dns, frames, packet, session);
mod writable;
/// The session under its earlier name, for in-process drivers
/// (`tests/src/bin/sluice-dns-bench.rs`) written against that path.
#[cfg(feature = "test-util")]
pub mod datapath {
    pub use crate::session::Datapath;
}

mod publish;
mod revoke;
mod stack;
mod tcp;
mod udp;
mod verdict;

#[cfg(test)]
mod name_corpus_tests;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use thiserror::Error;
use tokio::net::{TcpListener, UnixDatagram, UnixListener};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use crate::audit::{AuditEvent, AuditSink};
use crate::config::Config;
use crate::decide::Decider;
use crate::flow::Transport;
use crate::link::GuestLink;
use crate::session::{Datapath, Event, SessionEnd};

/// A failure that stops the gateway.
#[derive(Debug, Error)]
pub enum GatewayError {
    /// The guest socket path could not be bound.
    #[error("binding guest socket {path}: {source}")]
    BindGuest {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A published port could not be bound.
    #[error("binding published port {addr}: {source}")]
    BindPublish {
        /// The host address.
        addr: std::net::SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// Signal handlers could not be installed.
    #[error("installing signal handlers: {0}")]
    Signals(std::io::Error),
    /// Accepting a guest connection failed.
    #[error("accepting guest connection: {0}")]
    Accept(std::io::Error),
}

/// Where the guest's frames come from.
#[derive(Debug)]
pub enum GuestSource {
    /// Listen on this unix stream socket path, one guest at a time;
    /// re-accept after a disconnect.
    Socket(PathBuf),
    /// Bind a unix datagram socket at `path` (`--dgram PATH`): the peer is
    /// whoever of `peer_uids` sends the first datagram from a bound path
    /// (QEMU `-netdev dgram`'s `remote=`, vfkit); served until shutdown.
    Dgram {
        /// Where to bind.
        path: PathBuf,
        /// The uids whose datagrams may be the guest's.
        peer_uids: Vec<u32>,
    },
    /// An already-open link (`--fd`, `--fd --dgram`, `--attach`); the
    /// gateway exits when the guest closes it or it fails.
    Connected(GuestLink),
}

/// The write end of a launcher's readiness pipe (`--ready-fd`).
///
/// [`ReadySignal::send`] writes `ready` and a newline, then closes it. If it
/// is dropped unsent (the gateway stopped before serving), the pipe closes
/// with nothing written, which the reader sees as "stopped before ready".
#[derive(Debug, Default)]
pub struct ReadySignal(Option<std::fs::File>);

impl ReadySignal {
    /// Signals readiness on `pipe` (none: [`ReadySignal::default`]).
    pub fn new(pipe: std::fs::File) -> Self {
        Self(Some(pipe))
    }

    /// Writes the ready line once and closes the pipe; later calls do nothing.
    fn send(&mut self) {
        use std::io::Write as _;
        if let Some(mut pipe) = self.0.take()
            && let Err(e) = pipe.write_all(b"ready\n")
        {
            // The reader is gone: nobody waits for this gateway to be ready.
            tracing::warn!(error = %e, "writing the ready line to --ready-fd failed");
        }
    }
}

/// Serves guests until SIGTERM/SIGINT (returns `Ok`) or, for a connected
/// stream, until the guest disconnects. Must run inside a tokio runtime.
/// No policy reload: see [`serve_with_reload`].
pub async fn serve(
    cfg: Config,
    decider: Arc<dyn Decider>,
    audit: AuditSink,
    source: GuestSource,
) -> Result<(), GatewayError> {
    serve_with_reload(cfg, decider, audit, source, None, ReadySignal::default()).await
}

/// [`serve`], plus policy reload on SIGHUP and on changes of the policy file
/// when `reload` is given (see [`reload`]). Writes `gateway` audit records
/// when it starts and stops and when a guest session ends. `ready` is
/// signalled once the published ports and the guest socket are bound (for a
/// connected stream: once published ports are bound).
pub async fn serve_with_reload(
    cfg: Config,
    decider: Arc<dyn Decider>,
    mut audit: AuditSink,
    source: GuestSource,
    reload: Option<reload::ReloadSource>,
    mut ready: ReadySignal,
) -> Result<(), GatewayError> {
    let cfg = Arc::new(cfg);
    let (events_tx, mut events) = mpsc::unbounded_channel();
    spawn_signals(events_tx.clone())?;
    if let Some(mut source) = reload {
        // Secret values are read with the policy only where a proxy uses them.
        source.load_secrets = cfg.intercept.is_some();
        let events = events_tx.clone();
        reload::spawn(source, move |r| {
            events.send(Event::Reload(Box::new(r))).is_ok()
        })
        .map_err(GatewayError::Signals)?;
    }
    audit.record(&AuditEvent::Gateway {
        reason: sluice_policy::Reason::Started,
        detail: concat!("sluice-gateway ", env!("CARGO_PKG_VERSION")),
    });
    for spec in &cfg.publish {
        match spec.proto {
            Transport::Tcp => {
                let listener = TcpListener::bind(spec.host).await.map_err(|source| {
                    GatewayError::BindPublish {
                        addr: spec.host,
                        source,
                    }
                })?;
                let tx = events_tx.clone();
                let guest_port = spec.guest_port;
                tracing::info!(host = %spec.host, guest_port, "publishing TCP port");
                tokio::spawn(async move {
                    loop {
                        match listener.accept().await {
                            Ok((stream, peer)) => {
                                tracing::debug!(%peer, guest_port, "published connection");
                                if tx.send(Event::PublishTcp { stream, guest_port }).is_err() {
                                    break;
                                }
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "publish accept failed");
                                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                            }
                        }
                    }
                });
            }
            Transport::Udp => {
                let socket = tokio::net::UdpSocket::bind(spec.host)
                    .await
                    .map_err(|source| GatewayError::BindPublish {
                        addr: spec.host,
                        source,
                    })?;
                let socket = Arc::new(socket);
                let tx = events_tx.clone();
                let guest_port = spec.guest_port;
                tracing::info!(host = %spec.host, guest_port, "publishing UDP port");
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 65535];
                    loop {
                        match socket.recv_from(&mut buf).await {
                            Ok((n, peer)) => {
                                let data = buf[..n].to_vec();
                                let ev = Event::PublishUdp {
                                    socket: socket.clone(),
                                    peer,
                                    guest_port,
                                    data,
                                };
                                if tx.send(ev).is_err() {
                                    break;
                                }
                            }
                            Err(e) => {
                                tracing::debug!(error = %e, "publish UDP receive failed");
                                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                            }
                        }
                    }
                });
            }
        }
    }

    match source {
        GuestSource::Connected(link) => {
            tracing::info!(transport = link.kind(), "ready: serving the guest");
            ready.send();
            let mut dp = Datapath::new(cfg.clone(), decider.clone(), audit, events_tx.clone());
            let end = dp.run(&link, &mut events).await;
            log_end(&end);
            let mut audit = dp.into_audit();
            audit_end(&mut audit, &end);
            audit_stop(&mut audit);
            Ok(())
        }
        GuestSource::Dgram { path, peer_uids } => {
            remove_stale_socket(&path).map_err(|source| GatewayError::BindGuest {
                path: path.clone(),
                source,
            })?;
            let sock = UnixDatagram::bind(&path).map_err(|source| GatewayError::BindGuest {
                path: path.clone(),
                source,
            })?;
            let link = GuestLink::dgram_bound(sock, peer_uids).map_err(|source| {
                GatewayError::BindGuest {
                    path: path.clone(),
                    source,
                }
            })?;
            tracing::info!(socket = %path.display(), transport = link.kind(), "ready: serving the guest");
            ready.send();
            let mut dp = Datapath::new(cfg.clone(), decider.clone(), audit, events_tx.clone());
            let end = dp.run(&link, &mut events).await;
            log_end(&end);
            let mut audit = dp.into_audit();
            audit_end(&mut audit, &end);
            let _ = std::fs::remove_file(&path);
            audit_stop(&mut audit);
            Ok(())
        }
        GuestSource::Socket(path) => {
            remove_stale_socket(&path).map_err(|source| GatewayError::BindGuest {
                path: path.clone(),
                source,
            })?;
            let listener = UnixListener::bind(&path).map_err(|source| GatewayError::BindGuest {
                path: path.clone(),
                source,
            })?;
            tracing::info!(socket = %path.display(), "ready: waiting for the guest");
            ready.send();
            let result = loop {
                let stream = tokio::select! {
                    r = listener.accept() => match r {
                        Ok((s, _)) => s,
                        Err(e) => break Err(GatewayError::Accept(e)),
                    },
                    ev = events.recv() => match ev {
                        Some(Event::Shutdown) | None => break Ok(()),
                        Some(Event::Reload(r)) => {
                            reload::apply_idle(*r, cfg.intercept.as_deref(), &mut audit);
                            continue;
                        }
                        // Nothing to deliver to without a guest: drop (closes published connections).
                        Some(_) => continue,
                    },
                };
                let link = match GuestLink::stream(stream) {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::warn!(error = %e, "guest connection not registered: closed");
                        continue;
                    }
                };
                tracing::info!("guest connected");
                let mut dp = Datapath::new(cfg.clone(), decider.clone(), audit, events_tx.clone());
                let end = dp.run(&link, &mut events).await;
                log_end(&end);
                audit = dp.into_audit();
                audit_end(&mut audit, &end);
                audit.flush();
                if matches!(end, SessionEnd::Shutdown) {
                    break Ok(());
                }
            };
            let _ = std::fs::remove_file(&path);
            audit_stop(&mut audit);
            result
        }
    }
}

/// The `gateway` audit record for the end of a guest session.
fn audit_end(audit: &mut AuditSink, end: &SessionEnd) {
    let (reason, detail) = match end {
        SessionEnd::GuestClosed => (sluice_policy::Reason::Closed, "guest disconnected".into()),
        SessionEnd::ProtocolError(e) => (
            sluice_policy::Reason::FrameError,
            format!("guest stream protocol error: {e}"),
        ),
        SessionEnd::GuestIo(e) => (
            sluice_policy::Reason::Closed,
            format!("guest stream error: {e}"),
        ),
        // The stop record follows.
        SessionEnd::Shutdown => return,
    };
    audit.record(&AuditEvent::Gateway {
        reason,
        detail: &detail,
    });
}

/// The last audit record; flushes.
fn audit_stop(audit: &mut AuditSink) {
    audit.record(&AuditEvent::Gateway {
        reason: sluice_policy::Reason::Shutdown,
        detail: "sluice-gateway stopping",
    });
    audit.flush();
}

fn log_end(end: &SessionEnd) {
    match end {
        SessionEnd::GuestClosed => tracing::info!("guest disconnected"),
        SessionEnd::ProtocolError(e) => {
            tracing::warn!(error = %e, "guest stream protocol error; connection dropped")
        }
        SessionEnd::GuestIo(e) => {
            tracing::warn!(error = %e, "guest stream error; connection dropped")
        }
        SessionEnd::Shutdown => tracing::info!("shutting down"),
    }
}

fn spawn_signals(tx: mpsc::UnboundedSender<Event>) -> Result<(), GatewayError> {
    let mut term = signal(SignalKind::terminate()).map_err(GatewayError::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(GatewayError::Signals)?;
    let mut usr1 = signal(SignalKind::user_defined1()).map_err(GatewayError::Signals)?;
    tokio::spawn(async move {
        loop {
            let ev = tokio::select! {
                _ = term.recv() => Event::Shutdown,
                _ = int.recv() => Event::Shutdown,
                _ = usr1.recv() => Event::DumpCounters,
            };
            if tx.send(ev).is_err() {
                break;
            }
        }
    });
    Ok(())
}

/// Removes a socket left at `path` by an earlier run, so it can be bound
/// again; anything else there (a file, a directory, a link) is an error,
/// never deleted.
fn remove_stale_socket(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::FileTypeExt as _;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path),
        Ok(_) => Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            "exists and is not a socket",
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod stale_socket_tests {
    use super::remove_stale_socket;

    #[test]
    fn only_a_socket_is_removed_before_binding() {
        let dir = std::env::temp_dir().join(format!("sluice-stale-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let sock = dir.join("old.sock");
        drop(std::os::unix::net::UnixDatagram::bind(&sock).expect("bind"));
        remove_stale_socket(&sock).expect("a stale socket is removed");
        assert!(!sock.exists());
        remove_stale_socket(&sock).expect("nothing there is fine");
        let file = dir.join("precious");
        std::fs::write(&file, b"keep").expect("file");
        let e = remove_stale_socket(&file).expect_err("a file is not a socket");
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(&file).expect("still there"), b"keep");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

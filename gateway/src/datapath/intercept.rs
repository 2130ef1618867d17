//! The interception hook: a TLS flow whose ClientHello passed every
//! enforcement check, and whose SNI the policy inspects (a secret is bound to
//! it, or an `inspect:` pattern matches it), is handed to the TLS-terminating
//! proxy ([`sluice_intercept::Interceptor`]) instead of being spliced to a
//! host socket.
//!
//! The flow's host side becomes one end of a `UnixStream` pair
//! ([`HostStream::Local`]); the proxy task gets the other end. The datapath
//! pumps bytes exactly as for a spliced flow, so the ClientHello it only
//! peeked is replayed into the pair and the proxy's rustls reads it first.
//! The proxy connects upstream itself, to the validated destination only.
//! Every other flow keeps [`HostStream::Tcp`].

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::task::{Context, Poll};

use sluice_intercept::{AuditOut, FlowInfo, HttpEvent};
use smoltcp::iface::SocketHandle;
use smoltcp::socket::tcp;
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::mpsc;

use super::{Datapath, Event, Flow};
use crate::decide::FlowKey;
use crate::enforce::WireName;

/// The host side of an open flow.
#[derive(Debug)]
pub(super) enum HostStream {
    /// A host TCP connection to the destination (spliced).
    Tcp(TcpStream),
    /// One end of a pair whose other end the interception proxy holds.
    Local(UnixStream),
}

impl From<TcpStream> for HostStream {
    fn from(s: TcpStream) -> Self {
        Self::Tcp(s)
    }
}

impl HostStream {
    pub(super) fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Self::Tcp(s) => s.try_read(buf),
            Self::Local(s) => s.try_read(buf),
        }
    }

    pub(super) fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Self::Tcp(s) => s.try_write(buf),
            Self::Local(s) => s.try_write(buf),
        }
    }

    pub(super) fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            Self::Tcp(s) => s.poll_read_ready(cx),
            Self::Local(s) => s.poll_read_ready(cx),
        }
    }

    pub(super) fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            Self::Tcp(s) => s.poll_write_ready(cx),
            Self::Local(s) => s.poll_write_ready(cx),
        }
    }
}

impl AsFd for HostStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Self::Tcp(s) => s.as_fd(),
            Self::Local(s) => s.as_fd(),
        }
    }
}

/// Delivers the proxy's events to the datapath, which writes them through
/// its audit sink.
struct EventAudit(mpsc::UnboundedSender<Event>);

impl AuditOut for EventAudit {
    fn record(&self, event: HttpEvent) {
        let _ = self.0.send(Event::Intercept(Box::new(event)));
    }
}

impl Datapath {
    /// Called when inspection allowed flow `id`: hands it to the proxy when
    /// its SNI is inspected. True when the flow was taken (opened towards
    /// the proxy, or reset because the hand-over failed); false when it is
    /// to be spliced as usual.
    pub(super) fn try_intercept(&mut self, id: u64, handle: SocketHandle, key: &FlowKey) -> bool {
        let Some(interceptor) = self.cfg.intercept.clone() else {
            return false;
        };
        let sni = match self.flows.get(&id) {
            Some(Flow {
                wire: Some(WireName::Sni(sni)),
                ..
            }) => sni.clone(),
            Some(Flow {
                wire: Some(WireName::Host(host)),
                ..
            }) => {
                let host = host.clone();
                self.note_plain_http_placeholders(id, handle, key, &host, &interceptor);
                return false;
            }
            _ => return false,
        };
        if !self.decider.intercepts(key, &sni) {
            return false;
        }
        let (ours, theirs) = match UnixStream::pair() {
            Ok(p) => p,
            Err(e) => {
                // Fail closed: a flow that must be inspected is never spliced.
                tracing::warn!(error = %e, "interception: no socket pair; flow reset");
                self.sockets.get_mut::<tcp::Socket<'_>>(handle).abort();
                self.finish_flow(id, "inspect_failed");
                return true;
            }
        };
        let flow = FlowInfo {
            id,
            src: key.src,
            dst: key.dst,
            sni,
        };
        let audit: Arc<dyn AuditOut> = Arc::new(EventAudit(self.events.clone()));
        tokio::spawn(interceptor.serve(theirs, flow, audit));
        self.open_flow(id, handle, HostStream::Local(ours));
        true
    }

    /// Plain HTTP is never intercepted nor substituted: placeholders in the
    /// first request head (the bytes inspection read) pass unchanged and are
    /// logged `secret_host_mismatch`. Later requests on a kept-alive
    /// connection are not seen.
    fn note_plain_http_placeholders(
        &mut self,
        id: u64,
        handle: SocketHandle,
        key: &FlowKey,
        host: &str,
        interceptor: &sluice_intercept::Interceptor,
    ) {
        let store = interceptor.secrets();
        let sock = self.sockets.get_mut::<tcp::Socket<'_>>(handle);
        let names: Vec<String> = match sock.peek(crate::enforce::INSPECT_MAX_BYTES) {
            Ok(bytes) => store
                .placeholders_in(bytes)
                .into_iter()
                .map(str::to_owned)
                .collect(),
            Err(_) => return,
        };
        if names.is_empty() {
            return;
        }
        let mut event = HttpEvent::new(
            sluice_policy::audit::Kind::Http,
            sluice_policy::Reason::SecretHostMismatch,
            id,
            key.src,
            key.dst,
            "",
        );
        event.sni.clear();
        event.host = Some(host.to_owned());
        event.detail = Some(format!(
            "placeholder of secret(s) {} sent over plain HTTP (never substituted); passed through unchanged",
            names.join(", ")
        ));
        self.on_intercept_event(&event);
    }

    /// Writes one proxy event as an audit record.
    pub(super) fn on_intercept_event(&mut self, event: &HttpEvent) {
        let sandbox = self.audit.sandbox().to_owned();
        let policy = self.audit.policy().cloned();
        let policy_ref = match policy.as_deref() {
            Some(p) => sluice_policy::audit::PolicyRef::of(p),
            None => sluice_policy::audit::PolicyRef {
                id: crate::audit::NO_POLICY_ID.into(),
                version: crate::audit::NO_POLICY_ID.into(),
                label: None,
            },
        };
        let skeleton = sluice_policy::audit::AuditRecord::new(
            event.ts,
            &sandbox,
            event.kind,
            event.reason,
            policy_ref,
        );
        self.audit.write_record(&event.fill(skeleton));
    }

    /// After a reload: the proxy picks up the new policy's secret values
    /// (rotation). A store that cannot be loaded keeps the old values.
    pub(super) fn reload_intercept(&mut self, policy: &sluice_policy::CompiledPolicy) {
        let Some(interceptor) = &self.cfg.intercept else {
            return;
        };
        match sluice_secrets::SecretStore::load(policy) {
            Ok(store) => interceptor.set_secrets(Arc::new(store)),
            Err(e) => {
                tracing::warn!(error = %e, "reload: secrets not reloaded; the previous values stay")
            }
        }
    }
}

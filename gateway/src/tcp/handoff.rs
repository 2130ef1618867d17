//! The proxy hand-over. A flow that passed every enforcement check is
//! handed to a proxy instead of being spliced to a host socket when:
//! - it is TLS and its SNI is inspected by the policy (a secret is bound to
//!   it, or an `inspect:` pattern matches it): the TLS-terminating proxy
//!   ([`sluice_intercept::Interceptor`]);
//! - it is plain HTTP and a policy is enforced
//!   ([`crate::decide::Decider::proxies_plain_http`]): the plain-HTTP proxy
//!   ([`sluice_intercept::PlainProxy`]), which checks every request's Host
//!   against the one the first request was admitted with and reports
//!   placeholders (never substituted).
//!
//! The flow's host side becomes one end of an in-process pipe
//! ([`HostStream::Local`], [`super::pipe`]); the proxy task gets the other
//! end. The datapath pumps bytes exactly as for a spliced flow, so the first
//! bytes it only peeked (ClientHello, first request head) are replayed into
//! the pipe and the proxy reads them first. The proxy connects upstream itself, to the
//! validated destination only. Every other flow keeps [`HostStream::Tcp`].

use std::io;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use sluice_intercept::{AuditOut, FlowInfo, HttpEvent, PlainFlow, PlainProxy};
use smoltcp::iface::SocketHandle;
use smoltcp::socket::tcp;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::pipe::{self, DatapathEnd, ProxyEnd};
use crate::decide::{DenyReason, FlowKey};
use crate::flow::{Admission, WireName};
use crate::metrics::Proxy;
use crate::session::{Datapath, Event};

/// The host side of an open flow.
#[derive(Debug)]
pub(crate) enum HostStream {
    /// A host TCP connection to the destination (spliced).
    Tcp(TcpStream),
    /// The datapath's end of a pipe whose other end a proxy task holds.
    Local(DatapathEnd),
}

impl From<TcpStream> for HostStream {
    fn from(s: TcpStream) -> Self {
        Self::Tcp(s)
    }
}

impl HostStream {
    pub(crate) fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Self::Tcp(s) => s.try_read(buf),
            Self::Local(s) => s.try_read(buf),
        }
    }

    pub(crate) fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Self::Tcp(s) => s.try_write(buf),
            Self::Local(s) => s.try_write(buf),
        }
    }

    pub(crate) fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            Self::Tcp(s) => s.poll_read_ready(cx),
            Self::Local(s) => s.poll_read_ready(cx),
        }
    }

    pub(crate) fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            Self::Tcp(s) => s.poll_write_ready(cx),
            Self::Local(s) => s.poll_write_ready(cx),
        }
    }

    /// The guest finished sending: passes the half-close on.
    pub(crate) fn shutdown_write(&self) {
        match self {
            Self::Tcp(s) => {
                let _ = socket2::SockRef::from(s).shutdown(std::net::Shutdown::Write);
            }
            Self::Local(s) => s.shutdown_write(),
        }
    }

    /// The flow ended by a reset (the guest's, or an abort of ours): the
    /// host side is reset too when it is dropped, not closed cleanly.
    pub(crate) fn reset_on_close(&self) {
        match self {
            Self::Tcp(s) => {
                let _ = socket2::SockRef::from(s).set_linger(Some(Duration::ZERO));
            }
            Self::Local(s) => s.reset(),
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
    /// Called when inspection allowed flow `id`: hands it to a proxy when
    /// the decider says so (a TLS flow whose SNI is inspected: the
    /// interception proxy; a plain-HTTP flow of an enforcing gateway: the
    /// plain-HTTP proxy). True when the flow was taken (opened towards the
    /// proxy, or reset because the hand-over failed); false when it is to be
    /// spliced as usual.
    pub(crate) fn try_intercept(&mut self, id: u64, handle: SocketHandle, key: &FlowKey) -> bool {
        let wire = match self.flows.get(&id).and_then(|f| f.admission.as_ref()) {
            Some(Admission { wire: Some(w), .. }) => w.clone(),
            _ => return false,
        };
        match wire {
            WireName::Sni(sni) => self.try_intercept_tls(id, handle, key, sni),
            WireName::Host(host) => self.try_proxy_plain(id, handle, key, host),
        }
    }

    /// Fail closed: a TLS flow the policy inspects is never spliced. When
    /// the running sandbox CA cannot sign for its SNI (a reload added the
    /// host outside the CA's name constraints, or there is no CA because the
    /// policy at start inspected nothing) it is reset at once and audited
    /// `inspect_failed` with the cause (a restart makes a CA that covers it).
    fn try_intercept_tls(
        &mut self,
        id: u64,
        handle: SocketHandle,
        key: &FlowKey,
        sni: String,
    ) -> bool {
        if !self.decider.intercepts(key, &sni) {
            return false;
        }
        let interceptor = match self.cfg.intercept.clone() {
            Some(i) if i.ca().permits(&sni) => i,
            other => {
                let code = if other.is_some() {
                    DenyReason::OutsideSandboxCa
                } else {
                    DenyReason::NoSandboxCa
                };
                self.refuse_uninterceptable(id, handle, key, code);
                return true;
            }
        };
        let theirs = self.hand_over(id, handle);
        let flow = FlowInfo {
            id,
            src: key.src,
            dst: key.dst,
            sni,
        };
        if let Some(m) = self.audit.metrics() {
            m.intercepted(Proxy::Tls);
        }
        let audit: Arc<dyn AuditOut> = Arc::new(EventAudit(self.events.clone()));
        tokio::spawn(interceptor.serve(theirs, flow, audit));
        true
    }

    /// Resets flow `id`, whose SNI the policy inspects but the running CA
    /// cannot sign for, and audits it (`why`: [`DenyReason::OutsideSandboxCa`]
    /// or [`DenyReason::NoSandboxCa`], both `inspect_failed`).
    fn refuse_uninterceptable(
        &mut self,
        id: u64,
        handle: SocketHandle,
        key: &FlowKey,
        why: DenyReason,
    ) {
        self.sockets.get_mut::<tcp::Socket<'_>>(handle).abort();
        // Send the RST now, before the socket is removed with the flow.
        self.egress();
        self.counters.flows_denied += 1;
        let wire = self
            .flows
            .get(&id)
            .and_then(|f| f.admission.as_ref()?.wire.clone());
        self.audit.record(&crate::audit::AuditEvent::InspectedDeny {
            flow: id,
            src: key.src,
            dst: key.dst,
            verdict: &why.verdict(),
            wire: wire.as_ref(),
        });
        self.remove_flow(id);
    }

    /// Plain HTTP under a policy: every request's Host is checked by
    /// [`PlainProxy`] against `host`, the one the first request was admitted
    /// with. Never substituted: placeholders of the sandbox's secrets (when
    /// the interception proxy holds any) are reported, passed unchanged.
    fn try_proxy_plain(
        &mut self,
        id: u64,
        handle: SocketHandle,
        key: &FlowKey,
        host: String,
    ) -> bool {
        if !self.decider.proxies_plain_http(key) {
            return false;
        }
        let theirs = self.hand_over(id, handle);
        let flow = PlainFlow {
            id,
            src: key.src,
            dst: key.dst,
            host,
        };
        if let Some(m) = self.audit.metrics() {
            m.intercepted(Proxy::PlainHttp);
        }
        let secrets = self.cfg.intercept.as_ref().map(|i| i.secrets());
        let audit: Arc<dyn AuditOut> = Arc::new(EventAudit(self.events.clone()));
        let proxy = PlainProxy::new(self.cfg.connect_timeout);
        tokio::spawn(proxy.serve(theirs, flow, secrets, audit));
        true
    }

    /// Opens flow `id` towards a proxy: the datapath's end of a new pipe
    /// becomes its host side, the proxy's end is returned.
    fn hand_over(&mut self, id: u64, handle: SocketHandle) -> ProxyEnd {
        let (ours, theirs) = pipe::pair();
        self.open_flow(id, handle, HostStream::Local(ours));
        theirs
    }

    /// Writes one proxy event as an audit record.
    pub(crate) fn on_intercept_event(&mut self, event: &HttpEvent) {
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
    /// (rotation) and the inspected patterns outside the running CA are
    /// found; the lines for the reload record (`crate::reload`).
    pub(crate) fn reload_intercept(&mut self, loaded: &crate::reload::Loaded) -> String {
        crate::reload::reload_interception(loaded, self.cfg.intercept.as_deref())
    }
}

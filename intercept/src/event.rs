//! What the proxy reports: one [`HttpEvent`] per request on an intercepted
//! connection (kind `http`), and one per connection-level failure (kind
//! `connection`: upstream certificate refused, handshake with the guest
//! failed). The gateway turns each into a schema-1 audit line with
//! [`HttpEvent::fill`], starting from a record that carries its sandbox id
//! and policy reference.
//!
//! Secret values never reach an event: only secret names and locations.

use std::borrow::Cow;
use std::net::SocketAddr;

use sluice_policy::Reason;
use sluice_policy::Transport;
use sluice_policy::audit::{AuditRecord, Kind, SecretLocation, SecretUse, Timestamp};

/// One audit-worthy event of the proxy (owned, sent across tasks).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HttpEvent {
    /// `http` for a request, `connection` for a connection-level failure.
    pub kind: Kind,
    /// Why (allowlisted for a request served, or the failure reason).
    pub reason: Reason,
    /// When it happened.
    pub ts: Timestamp,
    /// The gateway's flow id.
    pub flow: u64,
    /// Guest endpoint.
    pub src: SocketAddr,
    /// Upstream destination.
    pub dst: SocketAddr,
    /// The SNI the guest sent (verified by enforcement); empty for plain
    /// HTTP (then omitted from the record).
    pub sni: String,
    /// The request's Host / `:authority` as sent (absent on connection events).
    pub host: Option<String>,
    /// Request method.
    pub method: Option<String>,
    /// Request path without the query.
    pub path: Option<String>,
    /// Status returned to the guest.
    pub status: Option<u16>,
    /// Secrets substituted: (name, location). Never values.
    pub secrets: Vec<(String, SecretLocation)>,
    /// Request body bytes sent upstream.
    pub bytes_up: Option<u64>,
    /// Response body bytes sent to the guest.
    pub bytes_down: Option<u64>,
    /// From the request head to the end of the response body, ms.
    pub duration_ms: Option<u64>,
    /// Free text (error text, secret names on a mismatch). Never values.
    pub detail: Option<String>,
}

impl HttpEvent {
    /// An event about flow `flow` with nothing but the connection filled in.
    pub fn new(
        kind: Kind,
        reason: Reason,
        flow: u64,
        src: SocketAddr,
        dst: SocketAddr,
        sni: &str,
    ) -> Self {
        Self {
            kind,
            reason,
            ts: Timestamp::now(),
            flow,
            src,
            dst,
            sni: sni.to_owned(),
            host: None,
            method: None,
            path: None,
            status: None,
            secrets: Vec::new(),
            bytes_up: None,
            bytes_down: None,
            duration_ms: None,
            detail: None,
        }
    }

    /// The schema-1 audit record for this event: `skeleton` supplies the
    /// sandbox id and policy reference; everything else comes from the event.
    pub fn fill<'a>(&'a self, skeleton: AuditRecord<'a>) -> AuditRecord<'a> {
        let mut r = skeleton
            .flow(self.flow)
            .endpoints(Transport::Tcp, self.src, self.dst);
        if !self.sni.is_empty() {
            r = r.sni(&self.sni);
        }
        r.ts = self.ts;
        r.kind = self.kind;
        r.reason = self.reason;
        r.decision = self.reason.decision();
        r.host = self.host.as_deref().map(Cow::Borrowed);
        r.method = self.method.as_deref().map(Cow::Borrowed);
        r.path = self.path.as_deref().map(Cow::Borrowed);
        r.status = self.status;
        r.secrets = self
            .secrets
            .iter()
            .map(|(name, location)| SecretUse {
                name: Cow::Borrowed(name),
                location: *location,
            })
            .collect();
        r.bytes_up = self.bytes_up;
        r.bytes_down = self.bytes_down;
        r.duration_ms = self.duration_ms;
        r.detail = self.detail.as_deref().map(Cow::Borrowed);
        r
    }
}

/// Where the proxy sends its events (the gateway forwards them to its audit
/// sink). Must not block.
pub trait AuditOut: Send + Sync + 'static {
    /// Records one event.
    fn record(&self, event: HttpEvent);
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_policy::audit::PolicyRef;

    #[test]
    fn record_round_trips_and_names_secrets_only() {
        let mut e = HttpEvent::new(
            Kind::Http,
            Reason::Allowlisted,
            7,
            "10.0.2.15:40000".parse().unwrap(),
            "198.51.100.10:443".parse().unwrap(),
            "api.example.com",
        );
        e.method = Some("GET".into());
        e.path = Some("/v1".into());
        e.status = Some(200);
        e.secrets = vec![("openai".into(), SecretLocation::Header)];
        let policy =
            sluice_policy::from_domains(&["api.example.com"], &Default::default()).unwrap();
        let skeleton = AuditRecord::new(
            Timestamp::now(),
            "vm",
            Kind::Gateway,
            Reason::Closed,
            PolicyRef::of(&policy),
        );
        let line = e.fill(skeleton).to_json();
        let back = AuditRecord::from_json(&line).unwrap();
        assert_eq!(back.kind, Kind::Http);
        assert_eq!(back.reason, Reason::Allowlisted);
        assert_eq!(back.sandbox, "vm");
        assert_eq!(back.status, Some(200));
        assert_eq!(back.secrets[0].name, "openai");
        assert_eq!(back.sni.as_deref(), Some("api.example.com"));
    }
}

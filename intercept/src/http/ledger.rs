//! The HTTP exchange ledger: one [`Exchange`] per request/response pair
//! accumulates what the request's `http` audit record needs (method, Host,
//! path, status, secrets, byte counts, detail) and writes it exactly once,
//! in [`Exchange::finish`], with the exchange's [`Outcome`].
//!
//! Who finishes: the proxy's request handler for an exchange it answers
//! itself (refused, upstream failed); the response body layer when the
//! response body ends or breaks; the splice task when an upgraded stream
//! ends. One fallback only: an `Exchange` dropped unfinished (the guest went
//! away and hyper dropped the response body or the handler's future)
//! finishes itself in `Drop` with [`Outcome::ClientGone`]. So every exchange
//! writes one `http` record, whatever path it takes.
//!
//! Placeholders the request passed through unchanged are written by the same
//! finish, just before the `http` record, as a separate `secret_host_mismatch`
//! record (docs/audit.md): from the head (known when the request was
//! substituted) and from the body and trailers, which the request body layer
//! reports into the exchange's [`RequestTally`] as it streams.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use http::StatusCode;
use sluice_policy::Reason;
use sluice_policy::audit::{Kind, SecretLocation};
use sluice_secrets::{PlaceholderScanner, Substitutions};

use super::upgrade::Spliced;
use crate::event::{AuditOut, HttpEvent};

/// Which proxy the exchange is on: decides the wording of its
/// `secret_host_mismatch` record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Channel {
    /// An intercepted TLS connection (secrets are substituted there).
    Tls,
    /// A plain-HTTP connection (nothing is ever substituted).
    Plain,
}

/// How an exchange ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// The response body ended (the status was set with
    /// [`Exchange::respond`]).
    Completed,
    /// Answered by the proxy itself, with `status`: refused (Host, CONNECT,
    /// upgrade, substitution) or an upstream that failed before a response.
    Refused {
        reason: Reason,
        status: StatusCode,
        detail: Option<String>,
    },
    /// The upstream's response body broke after its head was relayed.
    UpstreamBroke(String),
    /// The guest went away before the response ended (the fallback of an
    /// exchange dropped unfinished).
    ClientGone,
    /// An upgraded (spliced) stream ended.
    Spliced(Spliced),
}

/// What the request body reports to its exchange while it streams (it lives
/// in the upstream client's hands, apart from the response): bytes sent
/// upstream, secrets substituted in the body and trailers, and placeholders
/// passed through. Data only: records are written by [`Exchange::finish`].
#[derive(Debug, Default)]
pub(crate) struct RequestTally {
    bytes: AtomicU64,
    state: Mutex<TallyState>,
}

#[derive(Debug, Default)]
struct TallyState {
    /// Secrets the body replacer substituted (known when the body ended).
    body_used: Vec<String>,
    /// What request trailers substituted and saw.
    trailers: Substitutions,
    /// Scans the body as the guest sent it for passed-through placeholders.
    scanner: Option<PlaceholderScanner>,
}

impl RequestTally {
    /// A tally whose body is scanned by `scanner` (if any).
    pub(crate) fn new(scanner: Option<PlaceholderScanner>) -> Arc<Self> {
        Arc::new(Self {
            bytes: AtomicU64::new(0),
            state: Mutex::new(TallyState {
                scanner,
                ..TallyState::default()
            }),
        })
    }

    /// `n` body bytes went upstream.
    pub(crate) fn sent(&self, n: usize) {
        self.bytes.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// A body chunk as the guest sent it (before substitution).
    pub(crate) fn scan(&self, chunk: &[u8]) {
        if let Ok(mut s) = self.state.lock()
            && let Some(scan) = s.scanner.as_mut()
        {
            scan.feed(chunk);
        }
    }

    /// The body replacer substituted these secrets.
    pub(crate) fn body_substituted<'a>(&self, names: impl IntoIterator<Item = &'a str>) {
        if let Ok(mut s) = self.state.lock() {
            for n in names {
                if !s.body_used.iter().any(|u| u == n) {
                    s.body_used.push(n.to_owned());
                }
            }
        }
    }

    /// The request trailers' substitution.
    pub(crate) fn trailers_substituted(&self, from: Substitutions) {
        if let Ok(mut s) = self.state.lock() {
            let into = &mut s.trailers;
            for u in from.used {
                if !into.used.contains(&u) {
                    into.used.push(u);
                }
            }
            for (list, names) in [
                (&mut into.mismatched, from.mismatched),
                (&mut into.not_allowed, from.not_allowed),
            ] {
                for n in names {
                    if !list.contains(&n) {
                        list.push(n);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
impl RequestTally {
    /// Whether the body is scanned at all.
    pub(crate) fn scanning(&self) -> bool {
        self.state.lock().is_ok_and(|s| s.scanner.is_some())
    }

    /// What request trailers substituted and saw so far.
    pub(crate) fn trailers(&self) -> Substitutions {
        self.state
            .lock()
            .map(|s| s.trailers.clone())
            .unwrap_or_default()
    }
}

/// One request/response exchange's audit ledger (module docs).
pub(crate) struct Exchange {
    audit: Arc<dyn AuditOut>,
    /// The `http` record in the making (reason `allowlisted` until an
    /// outcome says otherwise).
    event: HttpEvent,
    channel: Channel,
    started: Instant,
    /// Placeholders passed through in the head: secrets not bound to the
    /// host, and bound ones where their locations forbid.
    head_mismatched: Vec<String>,
    head_not_allowed: Vec<String>,
    /// The request body's tally, once the request is forwarded.
    request: Option<Arc<RequestTally>>,
    /// Response body bytes sent to the guest.
    down: u64,
    finished: bool,
}

impl std::fmt::Debug for Exchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exchange")
            .field("event", &self.event)
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

impl Exchange {
    /// Opens the ledger of a request `event` (method, path and flow filled
    /// in) started at `started`.
    pub(crate) fn open(
        audit: Arc<dyn AuditOut>,
        event: HttpEvent,
        channel: Channel,
        started: Instant,
    ) -> Self {
        Self {
            audit,
            event,
            channel,
            started,
            head_mismatched: Vec::new(),
            head_not_allowed: Vec::new(),
            request: None,
            down: 0,
            finished: false,
        }
    }

    /// The request's Host / `:authority` as sent.
    pub(crate) fn host(&mut self, host: Option<String>) {
        self.event.host = host;
    }

    /// Adds to the record's `detail` (`; `-separated).
    pub(crate) fn note(&mut self, detail: String) {
        self.event.detail = Some(match self.event.detail.take() {
            Some(d) => format!("{d}; {detail}"),
            None => detail,
        });
    }

    /// The request head's substitution: secrets used, placeholders passed.
    pub(crate) fn head_substituted(&mut self, subs: &Substitutions) {
        self.event.secrets.clone_from(&subs.used);
        self.head_mismatched.clone_from(&subs.mismatched);
        self.head_not_allowed.clone_from(&subs.not_allowed);
    }

    /// Placeholders passed through in the head (plain HTTP: every secret's).
    pub(crate) fn head_placeholders(&mut self, names: Vec<String>) {
        self.head_mismatched = names;
    }

    /// The request is forwarded with a body reporting to `tally`.
    pub(crate) fn forwarded(&mut self, tally: Arc<RequestTally>) {
        self.request = Some(tally);
    }

    /// The status relayed to the guest.
    pub(crate) fn respond(&mut self, status: StatusCode) {
        self.event.status = Some(status.as_u16());
    }

    /// `n` response body bytes went to the guest.
    pub(crate) fn delivered(&mut self, n: usize) {
        self.down += n as u64;
    }

    /// Writes the exchange's records: the `secret_host_mismatch` one(s) if
    /// placeholders passed through, then the `http` record with `outcome`.
    pub(crate) fn finish(mut self, outcome: Outcome) {
        self.write(outcome);
    }

    fn write(&mut self, outcome: Outcome) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        let duration = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let up = self
            .request
            .as_ref()
            .map_or(0, |t| t.bytes.load(Ordering::Relaxed));
        let mut e = self.event.clone();
        match outcome {
            Outcome::Completed => {
                e.bytes_up = Some(up);
                e.bytes_down = Some(self.down);
            }
            Outcome::Refused {
                reason,
                status,
                detail,
            } => {
                e.reason = reason;
                e.status = Some(status.as_u16());
                if detail.is_some() {
                    e.detail = detail;
                }
            }
            Outcome::UpstreamBroke(why) => {
                e.reason = Reason::UpstreamError;
                e.bytes_up = Some(up);
                e.bytes_down = Some(self.down);
                e.detail = Some(format!("upstream response body: {why}"));
            }
            Outcome::ClientGone => {
                e.bytes_up = Some(up);
                e.bytes_down = Some(self.down);
                let gone = "the guest went away before the response ended".to_owned();
                e.detail = Some(match e.detail.take() {
                    Some(d) => format!("{d}; {gone}"),
                    None => gone,
                });
            }
            Outcome::Spliced(s) => {
                e.bytes_up = Some(s.up);
                e.bytes_down = Some(s.down);
                if let Some(err) = s.error {
                    e.detail = Some(err);
                }
            }
        }
        e.duration_ms = Some(duration);
        let (body_used, trailers, body_mismatched, body_not_allowed) = match &self.request {
            Some(t) => match t.state.lock() {
                Ok(s) => (
                    s.body_used.clone(),
                    s.trailers.clone(),
                    s.scanner
                        .as_ref()
                        .map(|s| {
                            s.mismatched()
                                .into_iter()
                                .map(str::to_owned)
                                .collect::<Vec<String>>()
                        })
                        .unwrap_or_default(),
                    s.scanner
                        .as_ref()
                        .map(|s| {
                            s.not_allowed()
                                .into_iter()
                                .map(str::to_owned)
                                .collect::<Vec<String>>()
                        })
                        .unwrap_or_default(),
                ),
                Err(_) => Default::default(),
            },
            None => Default::default(),
        };
        for n in body_used {
            let used = (n, SecretLocation::Body);
            if !e.secrets.contains(&used) {
                e.secrets.push(used);
            }
        }
        for u in &trailers.used {
            if !e.secrets.contains(u) {
                e.secrets.push(u.clone());
            }
        }
        if let Some(m) = self.passed_through(&body_mismatched, &body_not_allowed) {
            self.audit.record(m);
        }
        if self.channel == Channel::Tls && !trailers.mismatched.is_empty() {
            let mut m = self.mismatch_event();
            m.detail = Some(format!(
                "placeholder of secret(s) {} in request trailers to {}, which they are not bound to; passed through unchanged",
                trailers.mismatched.join(", "),
                self.event.sni
            ));
            self.audit.record(m);
        }
        self.audit.record(e);
    }

    /// A `secret_host_mismatch` record about this request (no status, no
    /// counts, no secrets used).
    fn mismatch_event(&self) -> HttpEvent {
        let mut m = self.event.clone();
        m.kind = Kind::Http;
        m.reason = Reason::SecretHostMismatch;
        m.secrets.clear();
        m.status = None;
        m.detail = None;
        m
    }

    /// The `secret_host_mismatch` record for placeholders passed through in
    /// the head and the body, if any (only once the request was forwarded:
    /// a request refused before is not reported).
    fn passed_through(
        &self,
        body_mismatched: &[String],
        body_not_allowed: &[String],
    ) -> Option<HttpEvent> {
        self.request.as_ref()?;
        let detail = match self.channel {
            Channel::Tls => passed_through_detail(
                &self.event.sni,
                [(&self.head_mismatched, "head"), (body_mismatched, "body")],
                [(&self.head_not_allowed, "head"), (body_not_allowed, "body")],
            )?,
            Channel::Plain => {
                if self.head_mismatched.is_empty() && body_mismatched.is_empty() {
                    return None;
                }
                let mut found: Vec<String> = self
                    .head_mismatched
                    .iter()
                    .map(|n| format!("{n} (head)"))
                    .collect();
                found.extend(body_mismatched.iter().map(|n| format!("{n} (body)")));
                format!(
                    "placeholder of secret(s) {} sent over plain HTTP (never substituted); passed through unchanged",
                    found.join(", ")
                )
            }
        };
        let mut m = self.mismatch_event();
        m.detail = Some(detail);
        Some(m)
    }
}

impl Drop for Exchange {
    /// The one fallback: an exchange nobody finished (its response body or
    /// its handler was dropped when the guest went away).
    fn drop(&mut self) {
        self.write(Outcome::ClientGone);
    }
}

/// The `detail` of a TLS `secret_host_mismatch` record: each secret once,
/// with where its placeholder was seen (`head`, `body`); `None` when there is
/// nothing to report. `mismatched`: secrets not bound to `sni`;
/// `not_allowed`: bound secrets seen where their `locations` forbid.
pub(crate) fn passed_through_detail(
    sni: &str,
    mismatched: [(&[String], &str); 2],
    not_allowed: [(&[String], &str); 2],
) -> Option<String> {
    fn list(groups: [(&[String], &str); 2]) -> String {
        let mut names: Vec<(&str, Vec<&str>)> = Vec::new();
        for (group, place) in groups {
            for name in group {
                let name = name.as_str();
                match names.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, places)) => places.push(place),
                    None => names.push((name, vec![place])),
                }
            }
        }
        names
            .iter()
            .map(|(n, places)| format!("{n} ({})", places.join(", ")))
            .collect::<Vec<_>>()
            .join(", ")
    }
    let mut parts = Vec::new();
    let mismatched_list = list(mismatched);
    if !mismatched_list.is_empty() {
        parts.push(format!(
            "placeholder of secret(s) {mismatched_list} sent to {sni}, which they are not bound to"
        ));
    }
    let not_allowed_list = list(not_allowed);
    if !not_allowed_list.is_empty() {
        parts.push(format!(
            "placeholder of secret(s) {not_allowed_list} sent to {sni} where their locations do not allow substitution"
        ));
    }
    if parts.is_empty() {
        return None;
    }
    parts.push("passed through unchanged".to_owned());
    Some(parts.join("; "))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Records every event (tests of this crate).
    #[derive(Default)]
    pub(crate) struct Recorded(pub(crate) Mutex<Vec<HttpEvent>>);

    impl AuditOut for Recorded {
        fn record(&self, event: HttpEvent) {
            if let Ok(mut v) = self.0.lock() {
                v.push(event);
            }
        }
    }

    impl Recorded {
        pub(crate) fn take(&self) -> Vec<HttpEvent> {
            std::mem::take(&mut *self.0.lock().unwrap())
        }
    }

    fn exchange(audit: &Arc<Recorded>, channel: Channel) -> Exchange {
        let mut e = HttpEvent::new(
            Kind::Http,
            Reason::Allowlisted,
            3,
            "10.0.2.15:40000".parse().unwrap(),
            "198.51.100.10:443".parse().unwrap(),
            "a.example.com",
        );
        e.method = Some("GET".into());
        e.path = Some("/p".into());
        let out: Arc<dyn AuditOut> = audit.clone();
        Exchange::open(out, e, channel, Instant::now())
    }

    /// Every way an exchange ends writes exactly one `http` record with
    /// its outcome, and nothing more when nothing passed through.
    #[test]
    fn each_outcome_writes_one_record() {
        let audit = Arc::new(Recorded::default());
        let outcomes: Vec<(Option<Outcome>, Reason, Option<u16>)> = vec![
            (Some(Outcome::Completed), Reason::Allowlisted, Some(200)),
            (
                Some(Outcome::Refused {
                    reason: Reason::HostSniMismatch,
                    status: StatusCode::MISDIRECTED_REQUEST,
                    detail: None,
                }),
                Reason::HostSniMismatch,
                Some(421),
            ),
            (
                Some(Outcome::UpstreamBroke("reset".into())),
                Reason::UpstreamError,
                Some(200),
            ),
            (
                Some(Outcome::Spliced(Spliced {
                    up: 5,
                    down: 7,
                    error: None,
                })),
                Reason::Allowlisted,
                Some(200),
            ),
            // Dropped unfinished: the fallback.
            (None, Reason::Allowlisted, Some(200)),
        ];
        for (outcome, reason, status) in outcomes {
            let mut x = exchange(&audit, Channel::Tls);
            x.respond(StatusCode::OK);
            x.delivered(11);
            let gone = outcome.is_none();
            match outcome {
                Some(o) => x.finish(o),
                None => drop(x),
            }
            let got = audit.take();
            assert_eq!(got.len(), 1, "{got:?}");
            assert_eq!(
                (got[0].kind, got[0].reason, got[0].status),
                (Kind::Http, reason, status)
            );
            assert!(got[0].duration_ms.is_some());
            if gone {
                assert_eq!(got[0].bytes_down, Some(11));
                assert!(got[0].detail.as_deref().unwrap().contains("went away"));
            }
        }
    }

    #[test]
    fn passed_through_placeholders_precede_the_http_record() {
        let store = crate::trailers::test_store();
        let sub = store.for_host("api.example.com");
        let audit = Arc::new(Recorded::default());
        let mut x = exchange(&audit, Channel::Tls);
        let mut subs = Substitutions::default();
        subs.mismatched = vec!["far".into()];
        x.head_substituted(&subs);
        let tally = RequestTally::new(sub.request_body_scanner());
        x.forwarded(tally.clone());
        assert!(tally.scanning());
        tally.scan(b"PH-far-sec");
        tally.scan(b"ret and PH-bdy-secret");
        tally.sent(31);
        tally.body_substituted(["bdy"]);
        x.respond(StatusCode::OK);
        x.finish(Outcome::Completed);
        let got = audit.take();
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0].reason, Reason::SecretHostMismatch);
        assert_eq!(
            got[0].detail.as_deref(),
            Some(
                "placeholder of secret(s) far (head, body) sent to a.example.com, which they \
                 are not bound to; passed through unchanged"
            )
        );
        assert_eq!(got[1].reason, Reason::Allowlisted);
        assert_eq!(got[1].bytes_up, Some(31));
        assert_eq!(
            got[1].secrets,
            vec![("bdy".to_owned(), SecretLocation::Body)]
        );

        // Refused before forwarding: the head's placeholders are not
        // reported (nothing went anywhere), one record.
        let mut x = exchange(&audit, Channel::Plain);
        x.head_placeholders(vec!["tok".into()]);
        x.finish(Outcome::Refused {
            reason: Reason::HostMismatch,
            status: StatusCode::MISDIRECTED_REQUEST,
            detail: None,
        });
        assert_eq!(audit.take().len(), 1);
    }

    #[test]
    fn passed_through_detail_names_each_secret_once_with_its_places() {
        let v = |s: &[&str]| s.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let d = passed_through_detail(
            "x.test",
            [(&v(&["a", "b"]), "head"), (&v(&["b", "c"]), "body")],
            [(&[], "head"), (&v(&["d"]), "body")],
        )
        .unwrap();
        assert_eq!(
            d,
            "placeholder of secret(s) a (head), b (head, body), c (body) sent to x.test, which they \
             are not bound to; placeholder of secret(s) d (body) sent to x.test where their \
             locations do not allow substitution; passed through unchanged"
        );
        assert_eq!(
            passed_through_detail(
                "x.test",
                [(&[], "head"), (&[], "body")],
                [(&[], "head"), (&[], "body")]
            ),
            None
        );
    }
}

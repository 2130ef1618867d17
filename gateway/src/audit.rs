//! The audit sink: one schema-1 [`AuditRecord`] JSON line per decision (DNS
//! query, connection, flow close, policy reload, gateway lifecycle), written
//! to a file or stdout. The schema is `docs/audit.md`.
//!
//! The datapath describes what happened with an [`AuditEvent`], carrying
//! the [`Verdict`] its decision made (a typed [`Reason`], the rule that
//! decided, the gateway's explanation) or how a flow ended ([`FlowEnd`]);
//! this module only serialises it, adding the `policy` reference (id,
//! version hash, label) of the policy in force ([`AuditSink::set_policy`]
//! is called on every applied reload). Nothing is decided here.
//!
//! # Flood bounding
//! Every record (allow or deny, of every kind) passes the window limiter
//! of module [`limit`]: per one-second window, the first line of each
//! (kind, reason) is always written, then up to [`LINES_PER_REASON`] lines
//! of each (kind, reason) and up to [`FIRST_SEEN_PER_WINDOW`] first
//! occurrences of a (kind, reason, name), under a ceiling of
//! [`LINES_PER_WINDOW`]. What is suppressed is counted per (kind, reason)
//! and written as one `summary` record (`reason: rate_limit_summary`,
//! `suppressed: [{kind, reason, count}]`) when the window ends: on the next
//! record or [`AuditSink::tick`] after it (the datapath ticks on every loop
//! turn, and its loop wakes at least once a second), and on
//! [`AuditSink::flush`]. Every line but a summary is at most
//! [`MAX_LINE_BYTES`] long (longer ones are written with their
//! guest-controlled fields cut, see [`clamp`]); a summary at most
//! [`MAX_SUMMARY_BYTES`]. So a window writes at most
//! [`MAX_LINES_PER_WINDOW`] lines, and every suppressed record is still
//! counted.
//!
//! With [`AuditSink::set_format`] `Ocsf` the same records are written as
//! OCSF events (module [`ocsf`]); limits and clamping are unchanged.
//!
//! Write errors are logged once and counted, never fatal.

use std::borrow::Cow;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hickory_proto::op::ResponseCode;
use sluice_approval::Choice;
use sluice_policy::audit::{ApprovalInfo, AuditRecord, Kind, PolicyRef, Timestamp};
use sluice_policy::{CompiledPolicy, Reason};

use crate::flow::{FlowEnd, Transport, WireName};
use crate::metrics::Metrics;
use crate::verdict::{Rule, Verdict};

mod limit;
pub mod ocsf;

pub use crate::args::AuditFormat;

use limit::Limiter;
pub use limit::{
    FIRST_SEEN_PER_WINDOW, LIMITED_KINDS, LINES_PER_REASON, LINES_PER_WINDOW, MAX_LINES_PER_WINDOW,
    WINDOW,
};

/// The longest line written but a summary, in bytes with its newline,
/// provided the operator's own strings (sandbox id, policy id and label)
/// total under 1 KiB. A longer record is written with its guest-controlled
/// strings cut ([`clamp`]).
pub const MAX_LINE_BYTES: usize = 8 * 1024;

/// The longest summary line in bytes (same proviso as [`MAX_LINE_BYTES`]):
/// one entry of at most [`SUMMARY_ENTRY_BYTES`] per (kind, reason) pair
/// plus the record's own fields.
pub const MAX_SUMMARY_BYTES: usize =
    1024 + 1024 + LIMITED_KINDS * Reason::ALL.len() * SUMMARY_ENTRY_BYTES;

/// The longest `suppressed` entry: `{"kind":"policy_reload","reason":R,"count":u64::MAX},`
/// with the longest reason spelling.
pub const SUMMARY_ENTRY_BYTES: usize = 100;

/// Strings a guest controls are cut to this many characters in a record
/// that would be longer than [`MAX_LINE_BYTES`].
const CLAMP_CHARS: usize = 128;

/// Lists (answers, secrets) are cut to this many entries in such a record.
const CLAMP_ENTRIES: usize = 16;

/// The policy reference written when the gateway runs without a policy
/// (platform deny set only).
pub const NO_POLICY_ID: &str = "none";

/// How long a runtime approval decision lasts (its `approval` record's
/// `lasts`; docs/approval.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalLasts {
    /// Allow once: until the TTL of the DNS answer handed out ends.
    DnsTtl,
    /// Deny once (or a failure): repeats within a few seconds are refused
    /// without asking again.
    RetryWindow,
    /// Until the sandbox ends.
    Sandbox,
    /// For this sandbox, and written to the policy's overlay file for the
    /// next ones.
    Always,
}

impl ApprovalLasts {
    /// The record's spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::DnsTtl => "dns_ttl",
            Self::RetryWindow => "retry_window",
            Self::Sandbox => "sandbox",
            Self::Always => "always",
        }
    }
}

/// What happened, in the datapath's terms, with the [`Verdict`] the
/// decision made; [`AuditSink::record`] serialises it as a schema-1
/// [`AuditRecord`].
#[derive(Debug)]
pub enum AuditEvent<'a> {
    /// A flow was allowed and connected (kind `connection`, decision allow).
    FlowOpen {
        /// Flow id (unique within the process).
        flow: u64,
        /// TCP or UDP.
        transport: Transport,
        /// Guest endpoint.
        src: SocketAddr,
        /// Destination.
        dst: SocketAddr,
        /// The decider's verdict: reason and the rule that allowed it.
        verdict: &'a Verdict,
    },
    /// An inspected flow was allowed on the name it presented (kind
    /// `connection`, decision allow, `sni` or `host` set).
    InspectedOpen {
        /// Flow id.
        flow: u64,
        /// Guest endpoint.
        src: SocketAddr,
        /// Destination.
        dst: SocketAddr,
        /// The SNI or Host that admitted the flow.
        wire: &'a WireName,
        /// The decider's verdict on its first bytes.
        verdict: &'a Verdict,
    },
    /// A host connection through a `--publish` mapping (kind `connection`,
    /// reason `published`).
    PublishedOpen {
        /// Flow id.
        flow: u64,
        /// TCP or UDP.
        transport: Transport,
        /// The gateway-side endpoint the guest sees.
        src: SocketAddr,
        /// The guest endpoint.
        dst: SocketAddr,
    },
    /// A flow was denied (kind `connection`, decision deny).
    FlowDeny {
        /// TCP or UDP.
        transport: Transport,
        /// Guest endpoint.
        src: SocketAddr,
        /// Destination.
        dst: SocketAddr,
        /// Why.
        verdict: &'a Verdict,
    },
    /// An inspected flow was denied on its first bytes (kind `connection`,
    /// decision deny, with the flow id and the name seen, if any).
    InspectedDeny {
        /// Flow id.
        flow: u64,
        /// Guest endpoint.
        src: SocketAddr,
        /// Destination.
        dst: SocketAddr,
        /// Why.
        verdict: &'a Verdict,
        /// The SNI or Host, when the first bytes named one.
        wire: Option<&'a WireName>,
    },
    /// A flow ended (kind `flow_close`).
    FlowClose {
        /// The flow and its totals.
        totals: FlowTotals,
        /// How it ended.
        end: FlowEnd,
    },
    /// An open flow was reset because a reloaded policy denies it (kind
    /// `flow_close`, reason `reload_revoked`, the new verdict's reason in
    /// `detail`).
    Revoked {
        /// The flow and its totals.
        totals: FlowTotals,
        /// Why the new policy denies it.
        why: Reason,
        /// The SNI or Host that had admitted it, if inspected.
        wire: Option<&'a WireName>,
    },
    /// A DNS query from the guest (kind `dns`).
    Dns {
        /// Query name (empty when the query could not be read).
        qname: &'a str,
        /// Query type.
        qtype: &'a str,
        /// Response code returned.
        rcode: ResponseCode,
        /// Addresses returned (and recorded).
        answers: &'a [IpAddr],
        /// Why: `dns_answered` with the rule that allowed the name, or
        /// the denial (`not_allowlisted`, `denylisted`, `private_answer`,
        /// ...), or `upstream_error`.
        verdict: &'a Verdict,
    },
    /// A policy reload (kind `policy_reload`): applied (the sink's policy
    /// is already the new one) or rejected (the old one stays).
    Reload {
        /// Whether the new policy was swapped in.
        applied: bool,
        /// What triggered it (`sighup`, `file_changed`).
        trigger: &'a str,
        /// Applied: a summary (previous version, flows revoked); rejected:
        /// the errors, one `file:line:col: message` per line.
        detail: &'a str,
    },
    /// A guest frame dropped before any flow exists (kind `connection`,
    /// decision deny, no endpoints): spoofed source, IPv6, ICMP not for the
    /// gateway. Rate-limited per reason like every connection deny.
    FrameDrop {
        /// `spoofed_source`, `ipv6_blocked` or `icmp_blocked`.
        reason: Reason,
        /// The drop counter's name.
        detail: &'a str,
    },
    /// A runtime approval decision (kind `approval`; docs/approval.md):
    /// `approval_allowed` or `approval_denied`.
    Approval {
        /// The exact name asked about.
        name: &'a str,
        /// The decision as it stands (an `allow_always` the overlay could
        /// not take is `allow_sandbox`); its reason is `approval_allowed`
        /// when it opens the name, `approval_denied` otherwise.
        choice: Choice,
        /// Who decided (`unix: alice`, `timeout`, `webhook: backend_error`).
        by: &'a str,
        /// How long it lasts.
        lasts: ApprovalLasts,
        /// TCP ports an allow opens.
        tcp_ports: &'a [u16],
        /// UDP ports an allow opens.
        udp_ports: &'a [u16],
        /// Why a backend gave no answer, or why the overlay was not written.
        detail: Option<&'a str>,
    },
    /// A gateway lifecycle event or guest-side protocol error (kind
    /// `gateway`).
    Gateway {
        /// `started`, `shutdown`, `closed` (guest disconnected),
        /// `frame_error` (guest broke the stream protocol).
        reason: Reason,
        /// Free text.
        detail: &'a str,
    },
}

/// A flow that ended, as its `flow_close` line reports it (the part
/// [`AuditEvent::FlowClose`] and [`AuditEvent::Revoked`] share).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowTotals {
    /// Flow id.
    pub flow: u64,
    /// TCP or UDP.
    pub transport: Transport,
    /// Guest endpoint.
    pub src: SocketAddr,
    /// Destination.
    pub dst: SocketAddr,
    /// Bytes from the guest to the destination.
    pub bytes_up: u64,
    /// Bytes from the destination to the guest.
    pub bytes_down: u64,
    /// Flow lifetime in milliseconds.
    pub duration_ms: u64,
}

impl FlowTotals {
    /// A lifetime in whole milliseconds, saturating.
    pub fn millis(lifetime: Duration) -> u64 {
        u64::try_from(lifetime.as_millis()).unwrap_or(u64::MAX)
    }
}

/// Writes schema-1 audit lines (see the module docs).
pub struct AuditSink {
    writer: LineWriter,
    limiter: Limiter,
    sandbox: String,
    policy: Option<Arc<CompiledPolicy>>,
    /// Counts every record and line (`--metrics`).
    metrics: Option<Arc<Metrics>>,
}

/// The output and its counters.
struct LineWriter {
    out: Box<dyn Write + Send>,
    /// The line being written: serialised here first, then handed to `out`
    /// in one `write_all` (see [`LineWriter::write`]).
    line: Vec<u8>,
    write_errors: u64,
    lines: u64,
    format: AuditFormat,
}

/// A line buffer that grew past this (a huge `detail`) is shrunk back after
/// its line, so one large record does not pin memory.
const LINE_BUFFER_KEEP: usize = 64 * 1024;

impl std::fmt::Debug for AuditSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditSink")
            .field("sandbox", &self.sandbox)
            .field("lines", &self.writer.lines)
            .finish_non_exhaustive()
    }
}

/// The audit spelling of a DNS response code (`NOERROR`, `NXDOMAIN`, ...).
pub fn rcode_mnemonic(rcode: ResponseCode) -> &'static str {
    match u16::from(rcode) {
        0 => "NOERROR",
        1 => "FORMERR",
        2 => "SERVFAIL",
        3 => "NXDOMAIN",
        4 => "NOTIMP",
        5 => "REFUSED",
        _ => "OTHER",
    }
}

fn set_wire<'a>(rec: &mut AuditRecord<'a>, wire: Option<&'a WireName>) {
    match wire {
        Some(WireName::Sni(n)) => rec.sni = Some(Cow::Borrowed(n)),
        Some(WireName::Host(n)) => rec.host = Some(Cow::Borrowed(n)),
        None => {}
    }
}

/// The reference to `policy`, or to [`NO_POLICY_ID`].
fn policy_ref(policy: Option<&CompiledPolicy>) -> PolicyRef<'_> {
    match policy {
        Some(p) => PolicyRef::of(p),
        None => PolicyRef {
            id: Cow::Borrowed(NO_POLICY_ID),
            version: Cow::Borrowed(NO_POLICY_ID),
            label: None,
        },
    }
}

impl AuditSink {
    /// A sink writing to `out` for sandbox `sandbox`, with no policy
    /// (`policy.id` is [`NO_POLICY_ID`] until [`AuditSink::set_policy`]).
    pub fn new(out: Box<dyn Write + Send>, sandbox: &str) -> Self {
        Self {
            writer: LineWriter {
                out,
                line: Vec::with_capacity(1024),
                write_errors: 0,
                lines: 0,
                format: AuditFormat::Schema1,
            },
            limiter: Limiter::new(Instant::now()),
            sandbox: sandbox.to_owned(),
            policy: None,
            metrics: None,
        }
    }

    /// Counts every record (written or suppressed) and line in `metrics`
    /// from now on, and names the policy in force there.
    pub fn set_metrics(&mut self, metrics: Arc<Metrics>) {
        metrics.set_policy(&policy_ref(self.policy.as_deref()));
        self.metrics = Some(metrics);
    }

    /// The metrics the sink counts into, for the datapath's own counts.
    pub(crate) fn metrics(&self) -> Option<&Metrics> {
        self.metrics.as_deref()
    }

    /// Writes every record in `format` from now on (default schema 1); the
    /// records, limits and clamping are the same in both formats.
    pub fn set_format(&mut self, format: AuditFormat) {
        self.writer.format = format;
    }

    /// The policy in force from now on: its reference goes into every line
    /// and its rules are named on decisions.
    pub fn set_policy(&mut self, policy: Option<Arc<CompiledPolicy>>) {
        self.policy = policy;
        if let Some(m) = &self.metrics {
            m.set_policy(&policy_ref(self.policy.as_deref()));
        }
    }

    /// The policy the sink names in its lines.
    pub fn policy(&self) -> Option<&Arc<CompiledPolicy>> {
        self.policy.as_ref()
    }

    /// Lines written so far (including summaries).
    pub fn lines_written(&self) -> u64 {
        self.writer.lines
    }

    /// The sandbox id.
    pub fn sandbox(&self) -> &str {
        &self.sandbox
    }

    /// Writes `event` as one record, unless the window's limits suppress
    /// it (module docs, "Flood bounding"); then it is counted.
    pub fn record(&mut self, event: &AuditEvent<'_>) {
        self.tick();
        let rec = build(&self.sandbox, self.policy.as_deref(), event);
        let admitted = self.limiter.admit(&rec);
        self.writer
            .write_counted(&rec, admitted, self.metrics.as_deref());
    }

    /// Writes a record built elsewhere (e.g. `http` records of an
    /// intercepting or plain-HTTP proxy; start from [`AuditSink::skeleton`]),
    /// unchanged but for [`clamp`], under the same limits as
    /// [`AuditSink::record`]'s, so a guest repeating a request on a
    /// kept-alive connection cannot flood the log.
    pub fn write_record(&mut self, rec: &AuditRecord<'_>) {
        self.tick();
        let admitted = self.limiter.admit(rec);
        self.writer
            .write_counted(rec, admitted, self.metrics.as_deref());
    }

    /// A record skeleton with this sink's sandbox and policy reference.
    pub fn skeleton(&self, kind: Kind, reason: Reason) -> AuditRecord<'_> {
        let pref = policy_ref(self.policy.as_deref());
        AuditRecord::new(Timestamp::now(), &self.sandbox, kind, reason, pref)
    }

    /// Ends the rate-limit window when a second has passed, writing the
    /// summary of what it suppressed. Cheap; call it often.
    pub fn tick(&mut self) {
        let now = Instant::now();
        if self.limiter.window_ended(now) {
            self.limiter.next_window(now);
            self.write_summary();
        }
    }

    fn write_summary(&mut self) {
        let suppressed = self.limiter.take_suppressed();
        if suppressed.is_empty() {
            return;
        }
        let pref = policy_ref(self.policy.as_deref());
        let mut rec = AuditRecord::new(
            Timestamp::now(),
            &self.sandbox,
            Kind::Summary,
            Reason::RateLimitSummary,
            pref,
        );
        rec.suppressed = suppressed;
        let written = self.writer.write(&rec);
        if let Some(m) = &self.metrics {
            m.audit_line_written(written);
        }
    }

    /// Writes any pending suppression summary and flushes.
    pub fn flush(&mut self) {
        self.write_summary();
        let _ = self.writer.out.flush();
    }
}

impl LineWriter {
    /// Counts `rec` in `metrics`, then writes it when the limiter
    /// `admitted` it (counted as written or suppressed).
    fn write_counted(&mut self, rec: &AuditRecord<'_>, admitted: bool, metrics: Option<&Metrics>) {
        if let Some(m) = metrics {
            m.observe(rec);
        }
        if admitted {
            let written = self.write(rec);
            if let Some(m) = metrics {
                m.audit_line_written(written);
            }
        } else if let Some(m) = metrics {
            m.audit_suppressed(rec);
        }
    }

    /// Serialises `rec` into the line buffer, then writes the whole line
    /// with one `write_all` and flushes. serde_json writes a record token by
    /// token; straight into an unbuffered file that was one `write(2)` per
    /// token, about a hundred system calls per line (docs/benchmarks.md,
    /// "Enforcement cost"). Now a line is one system call, and a line is
    /// never interleaved with another writer's at the token level.
    ///
    /// A record whose line would be longer than [`MAX_LINE_BYTES`] (a
    /// summary: [`MAX_SUMMARY_BYTES`]) is written [`clamp`]ed instead.
    /// True when the line was written.
    fn write(&mut self, rec: &AuditRecord<'_>) -> bool {
        let res = self.serialise(rec).and_then(|()| {
            if self.line.len() > MAX_LINE_BYTES && rec.kind != Kind::Summary {
                let cut = clamp(rec);
                self.serialise(&cut)?;
                if self.line.len() > MAX_LINE_BYTES {
                    self.serialise(&bare(rec))?;
                }
            }
            self.out.write_all(&self.line)?;
            self.out.flush()
        });
        if self.line.capacity() > LINE_BUFFER_KEEP {
            self.line = Vec::with_capacity(1024);
        }
        match res {
            Ok(()) => {
                self.lines += 1;
                true
            }
            Err(e) => {
                if self.write_errors == 0 {
                    tracing::error!(error = %e, "audit write failed");
                }
                self.write_errors += 1;
                false
            }
        }
    }
}

impl LineWriter {
    fn serialise(&mut self, rec: &AuditRecord<'_>) -> std::io::Result<()> {
        self.line.clear();
        match self.format {
            AuditFormat::Schema1 => rec.write_line(&mut self.line),
            AuditFormat::Ocsf => ocsf::write_line(rec, &mut self.line),
        }
    }
}

/// `s` cut to [`CLAMP_CHARS`] characters (escaped by JSON, each is at most
/// 6 bytes), marked with a trailing `...` when cut.
fn cut<'a>(s: &Cow<'a, str>) -> Cow<'a, str> {
    match s.char_indices().nth(CLAMP_CHARS) {
        Some((at, _)) => Cow::Owned(format!("{}...", &s[..at])),
        None => s.clone(),
    }
}

/// `rec` with every guest-controlled string (`qname`, `qtype`, `rcode`,
/// `sni`, `host`, `method`, `path`, the rule's matched `name`, `detail`)
/// cut to [`CLAMP_CHARS`] characters and its lists (`answers`, `secrets`)
/// to [`CLAMP_ENTRIES`] entries: with the other fields' fixed sizes, under
/// [`MAX_LINE_BYTES`]. Only records that would be longer are clamped (an
/// HTTP path of kilobytes, a reload's every error: the whole text is in
/// the gateway's log).
pub fn clamp<'a>(rec: &AuditRecord<'a>) -> AuditRecord<'a> {
    let mut r = rec.clone();
    for f in [
        &mut r.qname,
        &mut r.qtype,
        &mut r.rcode,
        &mut r.sni,
        &mut r.host,
        &mut r.method,
        &mut r.path,
        &mut r.detail,
    ] {
        if let Some(s) = f.as_ref() {
            *f = Some(cut(s));
        }
    }
    if let Some(rule) = r.rule.as_mut() {
        rule.id = cut(&rule.id);
        rule.pattern = cut(&rule.pattern);
        rule.name = rule.name.as_ref().map(cut);
    }
    r.answers.truncate(CLAMP_ENTRIES);
    r.secrets.truncate(CLAMP_ENTRIES);
    for s in &mut r.secrets {
        s.name = cut(&s.name);
    }
    r
}

/// `rec` with only its mandatory fields, flow and endpoints, and a
/// `detail` saying the rest was dropped: the last resort when even the
/// clamped record is too long (operator strings over the proviso of
/// [`MAX_LINE_BYTES`]).
fn bare<'a>(rec: &AuditRecord<'a>) -> AuditRecord<'a> {
    let mut r = AuditRecord::new(rec.ts, "", rec.kind, rec.reason, rec.policy.clone());
    r.sandbox = rec.sandbox.clone();
    r.flow = rec.flow;
    r.transport = rec.transport;
    r.src = rec.src;
    r.dst = rec.dst;
    r.detail = Some(Cow::Borrowed(
        "record over the line size bound; fields dropped",
    ));
    r
}

/// `rec` with a closed flow's id, endpoints and totals.
fn closed<'a>(rec: AuditRecord<'a>, t: &FlowTotals) -> AuditRecord<'a> {
    rec.flow(t.flow)
        .endpoints(t.transport, t.src, t.dst)
        .totals(t.bytes_up, t.bytes_down, t.duration_ms)
}

/// `rec` with `verdict`'s rule and explanation.
fn with_verdict<'a>(mut rec: AuditRecord<'a>, verdict: &'a Verdict) -> AuditRecord<'a> {
    rec.rule = verdict.rule.as_ref().map(Rule::to_audit);
    rec.detail = verdict.detail.map(Cow::Borrowed);
    rec
}

/// Serialises one event as its record under `policy` (see the module docs).
fn build<'a>(
    sandbox: &'a str,
    policy: Option<&'a CompiledPolicy>,
    event: &'a AuditEvent<'a>,
) -> AuditRecord<'a> {
    let pref = policy_ref(policy);
    let new =
        |kind, reason| AuditRecord::new(Timestamp::now(), sandbox, kind, reason, pref.clone());
    match *event {
        AuditEvent::FlowOpen {
            flow,
            transport,
            src,
            dst,
            verdict,
        } => with_verdict(
            new(Kind::Connection, verdict.reason)
                .flow(flow)
                .endpoints(transport, src, dst),
            verdict,
        ),
        AuditEvent::InspectedOpen {
            flow,
            src,
            dst,
            wire,
            verdict,
        } => {
            let mut r = with_verdict(
                new(Kind::Connection, verdict.reason).flow(flow).endpoints(
                    Transport::Tcp,
                    src,
                    dst,
                ),
                verdict,
            );
            set_wire(&mut r, Some(wire));
            r
        }
        AuditEvent::PublishedOpen {
            flow,
            transport,
            src,
            dst,
        } => new(Kind::Connection, Reason::Published)
            .flow(flow)
            .endpoints(transport, src, dst),
        AuditEvent::FlowDeny {
            transport,
            src,
            dst,
            verdict,
        } => with_verdict(
            new(Kind::Connection, verdict.reason).endpoints(transport, src, dst),
            verdict,
        ),
        AuditEvent::InspectedDeny {
            flow,
            src,
            dst,
            verdict,
            wire,
        } => {
            let mut r = with_verdict(
                new(Kind::Connection, verdict.reason).flow(flow).endpoints(
                    Transport::Tcp,
                    src,
                    dst,
                ),
                verdict,
            );
            set_wire(&mut r, wire);
            r
        }
        AuditEvent::FlowClose { ref totals, end } => {
            let mut r = closed(new(Kind::FlowClose, end.reason()), totals);
            r.detail = end.detail().map(Cow::Borrowed);
            r
        }
        AuditEvent::Revoked {
            ref totals,
            why,
            wire,
        } => {
            let mut r =
                closed(new(Kind::FlowClose, Reason::ReloadRevoked), totals).detail(why.as_str());
            set_wire(&mut r, wire);
            r
        }
        AuditEvent::Dns {
            qname,
            qtype,
            rcode,
            answers,
            verdict,
        } => {
            let mut r = new(Kind::Dns, verdict.reason);
            // A query that could not be read has no name or type.
            if !qname.is_empty() {
                r = r.query(qname, qtype);
            }
            r.rcode = Some(Cow::Borrowed(rcode_mnemonic(rcode)));
            r.answers = answers.to_vec();
            with_verdict(r, verdict)
        }
        AuditEvent::Reload {
            applied,
            trigger,
            detail,
        } => {
            let reason = if applied {
                Reason::ReloadApplied
            } else {
                Reason::ReloadRejected
            };
            let text = if detail.is_empty() {
                Cow::Owned(format!("trigger: {trigger}"))
            } else {
                Cow::Owned(format!("trigger: {trigger}\n{detail}"))
            };
            new(Kind::PolicyReload, reason).detail(text)
        }
        AuditEvent::FrameDrop { reason, detail } => new(Kind::Connection, reason).detail(detail),
        AuditEvent::Approval {
            name,
            choice,
            by,
            lasts,
            tcp_ports,
            udp_ports,
            detail,
        } => {
            let allowed = choice.allows();
            let reason = if allowed {
                Reason::ApprovalAllowed
            } else {
                Reason::ApprovalDenied
            };
            let mut r = new(Kind::Approval, reason);
            r.approval = Some(ApprovalInfo {
                name: Cow::Borrowed(name),
                decision: Cow::Borrowed(choice.as_str()),
                by: Cow::Borrowed(by),
                lasts: Cow::Borrowed(lasts.as_str()),
                tcp_ports: if allowed {
                    tcp_ports.to_vec()
                } else {
                    Vec::new()
                },
                udp_ports: if allowed {
                    udp_ports.to_vec()
                } else {
                    Vec::new()
                },
            });
            r.detail = detail.map(Cow::Borrowed);
            r
        }
        AuditEvent::Gateway { reason, detail } => {
            let r = new(Kind::Gateway, reason);
            if detail.is_empty() {
                r
            } else {
                r.detail(detail)
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;

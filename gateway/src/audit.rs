//! The audit sink: one JSON line per flow open, deny and close and per DNS
//! query, written to a file or stdout.
//!
//! This is a narrow module on purpose: when the policy crate's audit record
//! types land, only [`AuditEvent`]'s serialisation changes. Denied-flow lines
//! are rate-limited ([`DENY_LINES_PER_SEC`] per second); the suppressed count is
//! written as a `deny_suppressed` summary line when the next second starts.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;

/// Deny lines written per second before suppression starts.
pub const DENY_LINES_PER_SEC: u32 = 50;

/// One audit record.
#[derive(Debug, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum AuditEvent<'a> {
    /// A flow was allowed and connected.
    FlowOpen {
        /// Flow id (unique within the process).
        flow: u64,
        /// `tcp` or `udp`.
        proto: &'static str,
        /// Guest endpoint.
        src: SocketAddr,
        /// Destination.
        dst: SocketAddr,
        /// Names the destination was resolved for (from the DNS table).
        names: &'a [&'a str],
    },
    /// A flow was denied.
    FlowDeny {
        /// `tcp` or `udp`.
        proto: &'static str,
        /// Guest endpoint.
        src: SocketAddr,
        /// Destination.
        dst: SocketAddr,
        /// Reason code.
        reason: &'static str,
    },
    /// A flow ended.
    FlowClose {
        /// Flow id.
        flow: u64,
        /// `tcp` or `udp`.
        proto: &'static str,
        /// Guest endpoint.
        src: SocketAddr,
        /// Destination.
        dst: SocketAddr,
        /// Bytes from the guest to the destination.
        bytes_up: u64,
        /// Bytes from the destination to the guest.
        bytes_down: u64,
        /// Flow lifetime in milliseconds.
        duration_ms: u64,
        /// How it ended (`closed`, `reset`, `shutdown`, ...).
        end: &'static str,
    },
    /// A DNS query from the guest.
    Dns {
        /// Query name.
        qname: &'a str,
        /// Query type.
        qtype: &'a str,
        /// Response code returned.
        rcode: &'a str,
        /// Addresses returned (and recorded).
        answers: &'a [IpAddr],
        /// `forwarded`, `local`, `denied` (a policy refused the name or
        /// every answer address) or `failed`.
        outcome: &'static str,
        /// Why the query was denied (`not_allowlisted`, `denylisted`,
        /// `private_answer`); absent otherwise.
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<&'static str>,
    },
    /// Deny lines suppressed by the rate limit in the previous window.
    DenySuppressed {
        /// How many.
        count: u64,
    },
}

#[derive(Serialize)]
struct Line<'a> {
    ts: String,
    sandbox: &'a str,
    #[serde(flatten)]
    event: &'a AuditEvent<'a>,
}

/// Writes audit lines; write errors are logged once and counted, never fatal.
pub struct AuditSink {
    out: Box<dyn Write + Send>,
    sandbox: String,
    window_start: Instant,
    denies_in_window: u32,
    suppressed: u64,
    write_errors: u64,
}

impl std::fmt::Debug for AuditSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditSink")
            .field("sandbox", &self.sandbox)
            .finish_non_exhaustive()
    }
}

impl AuditSink {
    /// A sink writing to `out` for sandbox `sandbox`.
    pub fn new(out: Box<dyn Write + Send>, sandbox: &str) -> Self {
        Self {
            out,
            sandbox: sandbox.to_owned(),
            window_start: Instant::now(),
            denies_in_window: 0,
            suppressed: 0,
            write_errors: 0,
        }
    }

    /// Writes `event` (rate-limited when it is a deny).
    pub fn record(&mut self, event: &AuditEvent<'_>) {
        let now = Instant::now();
        if now.duration_since(self.window_start) >= Duration::from_secs(1) {
            self.window_start = now;
            self.denies_in_window = 0;
            if self.suppressed > 0 {
                let count = self.suppressed;
                self.suppressed = 0;
                self.write(&AuditEvent::DenySuppressed { count });
            }
        }
        if matches!(event, AuditEvent::FlowDeny { .. }) {
            if self.denies_in_window >= DENY_LINES_PER_SEC {
                self.suppressed += 1;
                return;
            }
            self.denies_in_window += 1;
        }
        self.write(event);
    }

    fn write(&mut self, event: &AuditEvent<'_>) {
        let line = Line {
            ts: rfc3339_now(),
            sandbox: &self.sandbox,
            event,
        };
        let res = serde_json::to_writer(&mut self.out, &line)
            .map_err(std::io::Error::other)
            .and_then(|()| self.out.write_all(b"\n"))
            .and_then(|()| self.out.flush());
        if let Err(e) = res {
            if self.write_errors == 0 {
                tracing::error!(error = %e, "audit write failed");
            }
            self.write_errors += 1;
        }
    }

    /// Writes any pending suppression summary and flushes.
    pub fn flush(&mut self) {
        if self.suppressed > 0 {
            let count = self.suppressed;
            self.suppressed = 0;
            self.write(&AuditEvent::DenySuppressed { count });
        }
        let _ = self.out.flush();
    }
}

/// UTC timestamp with millisecond precision, e.g. `2026-11-21T19:30:00.123Z`.
fn rfc3339_now() -> String {
    let d = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86400, secs % 86400);
    let (y, m, dd) = civil_from_days(i64::try_from(days).unwrap_or(0));
    format!(
        "{y:04}-{m:02}-{dd:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60,
        d.subsec_millis()
    )
}

/// Days since 1970-01-01 to (year, month, day) (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (
        if m <= 2 { y + 1 } else { y },
        u32::try_from(m).unwrap_or(1),
        u32::try_from(d).unwrap_or(1),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);
    impl Write for Shared {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_are_json_and_denies_are_rate_limited() {
        let buf = Shared::default();
        let mut sink = AuditSink::new(Box::new(buf.clone()), "sb1");
        let src: SocketAddr = "10.0.2.15:1000".parse().unwrap();
        let dst: SocketAddr = "127.0.0.1:22".parse().unwrap();
        for _ in 0..(DENY_LINES_PER_SEC + 25) {
            sink.record(&AuditEvent::FlowDeny {
                proto: "tcp",
                src,
                dst,
                reason: "platform_denied",
            });
        }
        sink.flush();
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), DENY_LINES_PER_SEC as usize + 1);
        assert_eq!(lines[0]["event"], "flow_deny");
        assert_eq!(lines[0]["reason"], "platform_denied");
        assert_eq!(lines[0]["sandbox"], "sb1");
        assert_eq!(lines[0]["dst"], "127.0.0.1:22");
        let last = lines.last().unwrap();
        assert_eq!(last["event"], "deny_suppressed");
        assert_eq!(last["count"], 25);
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_413), (2025, 11, 21));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }
}

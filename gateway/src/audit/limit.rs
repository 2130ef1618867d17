//! The audit flood bound: which records of a window are written, and the
//! counts of the others for the window's summary (docs/audit.md, "Flood
//! bounding").
//!
//! Every record but a summary goes through [`Limiter::admit`]. Within one
//! [`WINDOW`] a record is written when:
//! 1. it is the first of its (kind, reason) in the window (always), or
//! 2. the window has written fewer than [`LINES_PER_WINDOW`] lines and
//!    either its (kind, reason) has written fewer than [`LINES_PER_REASON`]
//!    lines, or its (kind, reason, name) has not been written yet in the
//!    window and fewer than [`FIRST_SEEN_PER_WINDOW`] such first
//!    occurrences were written beyond the per-reason budgets.
//!
//! Anything else is counted per (kind, reason) and reported in the summary
//! written when the window ends. A record's *name* is what it is about: its
//! DNS question name, SNI, Host and destination address (those it carries).
//!
//! So one window writes at most [`MAX_LINES_PER_WINDOW`] lines: the
//! ceiling, one first line per (kind, reason) pair, and one summary.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};
use std::time::{Duration, Instant};

use sluice_policy::Reason;
use sluice_policy::audit::{AuditRecord, Kind, Suppressed};

/// The rate-limit window. A window ends on the first record or tick after
/// it has lasted this long, so windows are never shorter.
pub const WINDOW: Duration = Duration::from_secs(1);

/// Lines of one (kind, reason) written per window whatever their names.
pub const LINES_PER_REASON: u32 = 20;

/// First occurrences of a (kind, reason, name) written per window beyond
/// the per-reason budgets (shared by all kinds).
pub const FIRST_SEEN_PER_WINDOW: u32 = 100;

/// Lines per window after which only the first line of a (kind, reason)
/// not yet seen in the window is written.
pub const LINES_PER_WINDOW: u32 = 500;

/// The record kinds the limiter governs: all but `summary` (`dns`,
/// `connection`, `http`, `flow_close`, `policy_reload`, `gateway`).
pub const LIMITED_KINDS: usize = 6;

/// The most lines one window can write: [`LINES_PER_WINDOW`], the first
/// line of every (kind, reason) pair, and one summary.
pub const MAX_LINES_PER_WINDOW: usize =
    LINES_PER_WINDOW as usize + LIMITED_KINDS * Reason::ALL.len() + 1;

/// What the limiter knows of the current window.
pub(crate) struct Limiter {
    window_start: Instant,
    /// Lines written in this window per (kind, reason).
    per_reason: HashMap<(Kind, Reason), u32>,
    /// Hashes of the (kind, reason, name) keys written in this window (at
    /// most [`MAX_LINES_PER_WINDOW`]). Keyed with a per-process random
    /// hasher, so a guest cannot aim for a collision.
    seen: HashSet<u64>,
    hasher: RandomState,
    /// Lines written in this window.
    lines: u32,
    /// First occurrences written beyond the per-reason budgets.
    first_seen: u32,
    /// Records suppressed since the last summary, per (kind, reason), in
    /// order of first suppression.
    suppressed: Vec<Suppressed>,
}

impl Limiter {
    /// A limiter whose first window starts at `now`.
    pub(crate) fn new(now: Instant) -> Self {
        Self {
            window_start: now,
            per_reason: HashMap::new(),
            seen: HashSet::new(),
            hasher: RandomState::new(),
            lines: 0,
            first_seen: 0,
            suppressed: Vec::new(),
        }
    }

    /// Whether the current window has lasted [`WINDOW`] at `now`.
    pub(crate) fn window_ended(&self, now: Instant) -> bool {
        now.duration_since(self.window_start) >= WINDOW
    }

    /// Starts a new window at `now`. The counts of the one that ended stay
    /// pending until [`Limiter::take_suppressed`].
    pub(crate) fn next_window(&mut self, now: Instant) {
        self.window_start = now;
        self.per_reason.clear();
        self.seen.clear();
        self.lines = 0;
        self.first_seen = 0;
    }

    /// The suppressed counts since the last call (empty when none).
    pub(crate) fn take_suppressed(&mut self) -> Vec<Suppressed> {
        std::mem::take(&mut self.suppressed)
    }

    /// Whether `rec` is written (see the module docs); if not, it is
    /// counted for the summary. Summaries are always written.
    pub(crate) fn admit(&mut self, rec: &AuditRecord<'_>) -> bool {
        if rec.kind == Kind::Summary {
            return true;
        }
        let key = self.hasher.hash_one((
            rec.kind,
            rec.reason,
            rec.qname.as_deref(),
            rec.sni.as_deref(),
            rec.host.as_deref(),
            rec.dst.as_ref().map(|d| d.ip),
        ));
        let written = self.per_reason.entry((rec.kind, rec.reason)).or_insert(0);
        let admit = if *written == 0 {
            true
        } else if self.lines >= LINES_PER_WINDOW {
            false
        } else if *written < LINES_PER_REASON {
            true
        } else if self.first_seen < FIRST_SEEN_PER_WINDOW && !self.seen.contains(&key) {
            self.first_seen += 1;
            true
        } else {
            false
        };
        if admit {
            *written += 1;
            self.lines += 1;
            self.seen.insert(key);
            return true;
        }
        let kind = Some(rec.kind);
        match self
            .suppressed
            .iter_mut()
            .find(|s| s.kind == kind && s.reason == rec.reason)
        {
            Some(s) => s.count = s.count.saturating_add(1),
            None => self.suppressed.push(Suppressed {
                kind,
                reason: rec.reason,
                count: 1,
            }),
        }
        false
    }

    /// Moves the window's start (tests: one window however slowly a loaded
    /// machine runs the loop).
    #[cfg(test)]
    pub(crate) fn hold_window(&mut self, until: Instant) {
        self.window_start = until;
    }
}

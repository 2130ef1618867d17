//! Where one `sluice run`'s time goes: named marks on the launcher's clock,
//! from its start to the command's exit, for `--json` (`phases_ms`) and for
//! the table `SLUICE_BOOT_TIMES=1` prints on stderr.
//!
//! The launcher marks its own steps (image cache check, gateway and QEMU
//! started, the gateway's ready line, the agent's hello, the command's
//! first output). The guest's steps are marked when their console line
//! reaches the launcher ([`Phases::console_line`]): the agent prints one
//! short line at each step (`sluice-agent: start`, `... modules loaded`,
//! `... network up`). Every mark is a host `Instant`: the guest's own clock
//! runs slow under TCG while the kernel calibrates, so its timestamp is
//! shown only as the kernel's view (`guest uptime` on the agent's first
//! line), never mixed into the table.

use std::io::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The environment variable that asks for the phase table on stderr.
pub(crate) const BOOT_TIMES_ENV: &str = "SLUICE_BOOT_TIMES";

/// The guest console lines that mark a phase, with the phase's name. A
/// line marks its phase the first time it arrives.
const GUEST_MARKS: [(&str, &str); 3] = [
    ("sluice-agent: start", "agent_start"),
    ("sluice-agent: modules loaded", "agent_modules"),
    ("sluice-agent: network up", "guest_network"),
];

/// One run's marks, shared with the threads that see the guest and the
/// gateway (cheap to clone).
#[derive(Clone)]
pub(crate) struct Phases {
    start: Instant,
    marks: Arc<Mutex<Vec<(&'static str, Instant)>>>,
    /// What the guest said about its own clock, for the table.
    guest_uptime: Arc<Mutex<Option<String>>>,
}

impl Phases {
    /// Starts the clock at `start` (the launcher's start).
    pub(crate) fn new(start: Instant) -> Self {
        Self {
            start,
            marks: Arc::new(Mutex::new(Vec::new())),
            guest_uptime: Arc::new(Mutex::new(None)),
        }
    }

    /// Marks `name` now, unless it was marked before (the first time counts).
    pub(crate) fn mark(&self, name: &'static str) {
        self.mark_at(name, Instant::now());
    }

    /// Marks `name` at `at`, unless it was marked before.
    pub(crate) fn mark_at(&self, name: &'static str, at: Instant) {
        if let Ok(mut m) = self.marks.lock()
            && !m.iter().any(|(n, _)| *n == name)
        {
            m.push((name, at));
        }
    }

    /// Looks at one console line as it arrives and marks the guest phase it
    /// announces, if any.
    pub(crate) fn console_line(&self, line: &str, at: Instant) {
        let line = line.trim_end();
        for (prefix, name) in GUEST_MARKS {
            if let Some(rest) = line.strip_prefix(prefix) {
                self.mark_at(name, at);
                if name == "agent_start"
                    && let Ok(mut u) = self.guest_uptime.lock()
                {
                    *u = Some(rest.trim().trim_matches(['(', ')']).to_owned());
                }
            }
        }
    }

    /// The marks in time order, each as milliseconds since the start.
    fn sorted(&self) -> Vec<(&'static str, u128)> {
        let mut marks = self.marks.lock().map(|m| m.clone()).unwrap_or_default();
        marks.sort_by_key(|(_, at)| *at);
        marks
            .into_iter()
            .map(|(n, at)| (n, at.saturating_duration_since(self.start).as_millis()))
            .collect()
    }

    /// `{"image_ready": 12, ...}`: every mark in milliseconds since the
    /// launcher's start (time order is the order of the values).
    pub(crate) fn to_json(&self) -> serde_json::Value {
        self.sorted()
            .into_iter()
            .map(|(n, ms)| {
                let ms = u64::try_from(ms).unwrap_or(u64::MAX);
                (n.to_owned(), serde_json::Value::from(ms))
            })
            .collect::<serde_json::Map<_, _>>()
            .into()
    }

    /// The table for `SLUICE_BOOT_TIMES=1`: each mark, its time since the
    /// start and since the mark before.
    pub(crate) fn table(&self) -> String {
        let mut out = String::from("sluice: phase                  at ms   +ms\n");
        let mut prev = 0;
        for (name, ms) in self.sorted() {
            out.push_str(&format!(
                "sluice: {name:<22} {ms:>6} {:>5}\n",
                ms.saturating_sub(prev)
            ));
            prev = ms;
        }
        if let Ok(Some(u)) = self.guest_uptime.lock().as_deref() {
            out.push_str(&format!(
                "sluice: (the guest kernel's own clock at agent_start: {u})\n"
            ));
        }
        out
    }

    /// Prints [`Self::table`] on stderr when [`BOOT_TIMES_ENV`] is set.
    pub(crate) fn print_if_asked(&self) {
        if std::env::var_os(BOOT_TIMES_ENV).is_some_and(|v| !v.is_empty() && v != "0") {
            let _ = std::io::stderr().write_all(self.table().as_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn marks_keep_the_first_time_and_sort_by_time() {
        let t0 = Instant::now();
        let p = Phases::new(t0);
        p.mark_at("b", t0 + Duration::from_millis(20));
        p.mark_at("a", t0 + Duration::from_millis(10));
        p.mark_at("a", t0 + Duration::from_millis(30));
        assert_eq!(p.sorted(), vec![("a", 10), ("b", 20)]);
        let json = p.to_json();
        assert_eq!(json["a"], 10);
        assert_eq!(json["b"], 20);
    }

    #[test]
    fn console_lines_mark_guest_phases_and_keep_the_guest_clock() {
        let t0 = Instant::now();
        let p = Phases::new(t0);
        p.console_line("some kernel line\n", t0 + Duration::from_millis(5));
        p.console_line(
            "sluice-agent: start (guest uptime 1.93 s)\r\n",
            t0 + Duration::from_millis(900),
        );
        p.console_line(
            "sluice-agent: modules loaded\n",
            t0 + Duration::from_millis(1000),
        );
        assert_eq!(
            p.sorted(),
            vec![("agent_start", 900), ("agent_modules", 1000)]
        );
        let table = p.table();
        assert!(table.contains("agent_start"), "{table}");
        assert!(table.contains("guest uptime 1.93 s"), "{table}");
    }
}

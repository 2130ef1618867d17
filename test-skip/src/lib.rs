//! One rule for tests whose subject is missing on this host (no QEMU, no
//! `/dev/kvm`, no Landlock, no route, ...): the test FAILS with the reason,
//! unless the environment variable [`ENV`] names what may be skipped.
//!
//! ```no_run
//! if !std::path::Path::new("/dev/kvm").exists()
//!     && sluice_test_skip::may_skip("kvm", "/dev/kvm is missing")
//! {
//!     return;
//! }
//! ```
//!
//! An allowed skip writes one line to the process's real standard error
//! (not through the test harness's output capture, so it is seen for
//! passing tests too):
//!
//! ```text
//! SLUICE-SKIP kvm: <test name>: <reason>
//! ```
//!
//! `scripts/test` counts these lines ([`LINE_PREFIX`]) and prints the total
//! and the reasons at the end of a run.

#![allow(clippy::panic)] // Failing the calling test is this crate's job.

use std::io::Write;

/// The environment variable holding the comma-separated short names of
/// what may be skipped (`SLUICE_TEST_MAY_SKIP=kvm,landlock`).
pub const ENV: &str = "SLUICE_TEST_MAY_SKIP";

/// Every skip line starts with this (then `<what>: <test>: <reason>`).
pub const LINE_PREFIX: &str = "SLUICE-SKIP ";

/// Whether `list` (the value of [`ENV`]) names `what`: comma-separated,
/// surrounding spaces ignored, exact and case-sensitive match.
pub fn list_allows(list: &str, what: &str) -> bool {
    list.split(',').any(|w| w.trim() == what)
}

/// The skip line for `what` in test `test` (no trailing newline). Newlines
/// in the reason are replaced by spaces so that one skip is one line.
pub fn skip_line(what: &str, test: &str, reason: &str) -> String {
    let reason = reason.replace(['\n', '\r'], " ");
    format!("{LINE_PREFIX}{what}: {test}: {reason}")
}

/// Called by a test that cannot run its subject: `what` is the short name of
/// the missing thing (`kvm`, `qemu`, `landlock`, ...), `reason` says what is
/// missing. When [`ENV`] names `what`, writes the skip line and returns true
/// (the test then returns early). Otherwise panics with the reason, failing
/// the test. Never returns false.
pub fn may_skip(what: &str, reason: &str) -> bool {
    let allowed = std::env::var(ENV).unwrap_or_default();
    let current = std::thread::current();
    let test = current.name().unwrap_or("<unnamed>");
    if list_allows(&allowed, what) {
        let line = skip_line(what, test, reason);
        // Straight to fd 2: the test harness captures `eprintln!`.
        let _ = writeln!(std::io::stderr().lock(), "{line}");
        return true;
    }
    panic!("{test}: cannot run: {reason} (set {ENV}={what} to allow skipping this)");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_names_exact_short_names() {
        assert!(list_allows("kvm", "kvm"));
        assert!(list_allows("qemu, kvm ,landlock", "kvm"));
        assert!(!list_allows("", "kvm"));
        assert!(!list_allows("kvm2,xkvm", "kvm"));
        assert!(!list_allows("KVM", "kvm"));
    }

    #[test]
    fn a_skip_is_one_line_with_the_prefix() {
        let l = skip_line("kvm", "t::x", "no\n/dev/kvm");
        assert_eq!(l, "SLUICE-SKIP kvm: t::x: no /dev/kvm");
    }

    #[test]
    #[should_panic(expected = "cannot run: nothing here")]
    fn not_allowed_fails_the_test() {
        // A name no environment allows.
        may_skip("sluice-test-skip-never-allowed", "nothing here");
    }
}

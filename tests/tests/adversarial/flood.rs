//! Audit flooding (docs/threat-model.md): a flood of allowed DNS queries
//! and plain-HTTP requests is bounded in the audit, and what matters is
//! still recorded.

use super::*;

const FLOOD: &str = include_str!("flood.py");

/// Milliseconds since the epoch of an audit `ts` (`2026-11-21T19:20:30.123Z`).
fn ts_millis(ts: &str) -> Option<i64> {
    let num = |r: std::ops::Range<usize>| ts.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hh, mm, ss, ms) = (num(11..13)?, num(14..16)?, num(17..19)?, num(20..23)?);
    // Days from the civil date (proleptic Gregorian), Howard Hinnant's way.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((((days * 24 + hh) * 60 + mm) * 60 + ss) * 1000 + ms)
}

/// Lines written plus the summaries' suppressed counts for (`kind`, `reason`).
fn made(lines: &[Value], kind: &str, reason: &str) -> u64 {
    lines
        .iter()
        .map(|l| {
            if l["kind"] == "summary" {
                l["suppressed"].as_array().map_or(0, |s| {
                    s.iter()
                        .filter(|c| c["kind"] == kind && c["reason"] == reason)
                        .filter_map(|c| c["count"].as_u64())
                        .sum()
                })
            } else {
                u64::from(l["kind"] == kind && l["reason"] == reason)
            }
        })
        .sum()
}

/// A guest looping allowed DNS queries and plain-HTTP requests (one
/// kept-alive connection) for a few seconds cannot grow the audit log past
/// its documented bound, and nothing goes uncounted: for DNS answers, HTTP
/// requests, connections and closes, the lines written plus the summaries'
/// counts equal what the guest made (and, for requests, what the origin
/// logged). The bound is checked on the record timestamps, so a loaded
/// machine cannot make it pass or fail: windows (delimited by the summary
/// each flooded window ends with) last at least a second and write at most
/// `MAX_LINES_PER_WINDOW` lines, at most `LINES_PER_REASON +
/// FIRST_SEEN_PER_WINDOW` of one (kind, reason).
#[test]
#[ignore = "needs root: run via scripts/test"]
fn a_flood_of_allowed_dns_and_http_is_bounded_in_the_audit() -> Result<()> {
    use sluice_gateway::audit::{FIRST_SEEN_PER_WINDOW, LINES_PER_REASON, MAX_LINES_PER_WINDOW};
    let w = world()?;
    let script = w.dir().join("flood.py");
    std::fs::write(&script, FLOOD)?;
    let out = w.guest_ok(
        &format!("python3 {} {ORIGIN_NAME} {ORIGIN_ADDR} 4", script.display()),
        240,
    )?;
    let nums: Vec<u64> = out
        .split_whitespace()
        .filter_map(|t| t.parse().ok())
        .collect();
    let [queries, requests, connections] = nums[..] else {
        bail!("flood output: {out}");
    };
    ensure!(queries > 100 && requests > 100, "not a flood: {out}");
    let origin = w
        .origin_requests()
        .iter()
        .filter(|r| r["path"].as_str().is_some_and(|p| p.starts_with("/flood/")))
        .count();
    ensure!(
        u64::try_from(origin)? == requests,
        "origin logged {origin} of {requests} requests"
    );

    // Every record is in once its flow closed and the last window's
    // summary is written (a second after that window began).
    let want = [
        ("dns", "dns_answered", queries),
        ("http", "allowlisted", requests),
        ("connection", "allowlisted", connections),
        ("flow_close", "closed", connections),
    ];
    let covered = |lines: &[Value]| {
        want.iter()
            .all(|(kind, reason, n)| made(lines, kind, reason) >= *n)
    };
    let _ = wait_until("the audit to count the whole flood", WAIT, || {
        covered(&audit(&w))
    });
    let lines = audit(&w);
    for (kind, reason, n) in want {
        ensure!(
            made(&lines, kind, reason) == n,
            "{kind}/{reason}: {} lines + suppressed, the guest made {n}",
            made(&lines, kind, reason)
        );
    }

    // The bound, window by window.
    let summaries: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i]["kind"] == "summary")
        .collect();
    ensure!(
        summaries.len() >= 2,
        "{} summaries: the flood was not rate-limited",
        summaries.len()
    );
    for pair in summaries.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        let t = |i: usize| ts_millis(lines[i]["ts"].as_str().unwrap_or_default());
        let (Some(ta), Some(tb)) = (t(a), t(b)) else {
            bail!("unreadable ts: {} / {}", lines[a], lines[b]);
        };
        // A window lasts at least a second (ms rounding of the stamps aside).
        ensure!(tb - ta >= 990, "summaries {} ms apart", tb - ta);
        // Windows without suppression write no summary: between two
        // summaries lie at most as many windows as whole seconds.
        let windows = usize::try_from((tb - ta) / 1000)?.max(1);
        let seg = &lines[a + 1..b];
        ensure!(
            seg.len() < MAX_LINES_PER_WINDOW * windows,
            "{} lines in {windows} window(s)",
            seg.len()
        );
        for (kind, reason, _) in want {
            let n = seg
                .iter()
                .filter(|l| l["kind"] == kind && l["reason"] == reason)
                .count();
            let bound = usize::try_from(LINES_PER_REASON + FIRST_SEEN_PER_WINDOW)? * windows;
            ensure!(
                n <= bound,
                "{n} {kind}/{reason} lines in {windows} window(s)"
            );
        }
    }
    Ok(())
}

//! The gateway's memory under many flows, end to end (issue 16): the guest
//! namespace holds 10,000 established echo flows through the real gateway
//! to the origin in the fake internet; the gateway's resident memory
//! (`VmRSS`) stays within 64 MB, a new connection still echoes, and with
//! `--max-flows` reached the next connection is refused (RST, so the
//! guest's connect fails with "refused", not a timeout) with exactly one
//! `flow_limit` audit line. Needs root: run via `scripts/test` (or
//! `cargo test --release -p sluice-e2e --test memory -- --include-ignored`).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use sluice_e2e::hold::{FlowHolder, HARNESS_NOFILE, raise_nofile};
use sluice_e2e::{ECHO_PORT, ORIGIN_ADDR, World, wait_until};

/// The flows the guest holds.
const FLOWS: u32 = 10_000;
/// The bound on the gateway's resident memory while it holds them (issue 16).
const RSS_BOUND_KB: u64 = 64 * 1024;
/// Bound on the wait for idle flows' send rings to be given back (the
/// gateway sweeps every second); only stops a failing test.
const SETTLE_WAIT: Duration = Duration::from_secs(60);

#[test]
#[ignore = "needs root: run via scripts/test"]
fn ten_thousand_flows_fit_in_64_mb_and_the_flow_past_max_flows_is_refused() -> Result<()> {
    // Every process of the world (origin, gateway, guest holder) inherits
    // room for the flows.
    let nofile = raise_nofile(HARNESS_NOFILE)?;
    ensure!(
        nofile >= u64::from(FLOWS) + 1024,
        "open-file limit {nofile}: {FLOWS} flows need more"
    );
    // One slot beyond the held flows: the probe connection takes it, the
    // connection after it is over the limit.
    let mut w = World::builder()
        .sidecar_arg(&format!("--max-flows={}", FLOWS + 1))
        .start()?;
    let echo = SocketAddr::from((ORIGIN_ADDR, ECHO_PORT));

    let held = FlowHolder::start(&w, echo, FLOWS).with_context(|| w.sidecar_log())?;
    let mut rss_kb = u64::MAX;
    let settled = wait_until("the gateway's RSS within the bound", SETTLE_WAIT, || {
        rss_kb = w.sidecar().and_then(|p| p.rss_kb()).unwrap_or(u64::MAX);
        rss_kb <= RSS_BOUND_KB
    });
    eprintln!("gateway RSS with {FLOWS} idle echo flows: {rss_kb} kB");
    ensure!(
        settled.is_ok() && rss_kb <= RSS_BOUND_KB,
        "gateway RSS {rss_kb} kB with {FLOWS} flows, bound {RSS_BOUND_KB} kB"
    );
    w.check_alive()?;

    // The sidecar still answers: one more flow echoes (it takes the last slot).
    let probe = FlowHolder::start(&w, echo, 1).context("a new connection with the flows held")?;

    // The flow past --max-flows: refused at once by a RST.
    let refused = FlowHolder::start(&w, echo, 1);
    let err = match refused {
        Ok(_) => anyhow::bail!("flow {} accepted with --max-flows {}", FLOWS + 2, FLOWS + 1),
        Err(e) => format!("{e:#}"),
    };
    ensure!(
        err.contains("refused"),
        "the flow past the limit was not refused: {err}"
    );
    w.wait_audit("the flow_limit line", SETTLE_WAIT, |r| {
        r["reason"] == "flow_limit"
    })?;
    let limit_lines = w
        .audit()?
        .into_iter()
        .filter(|r| r["reason"] == "flow_limit")
        .collect::<Vec<_>>();
    ensure!(limit_lines.len() == 1, "flow_limit lines: {limit_lines:#?}");
    let line = &limit_lines[0];
    ensure!(
        line["kind"] == "connection" && line["decision"] == "deny",
        "{line:#}"
    );
    ensure!(line["dst"]["port"] == ECHO_PORT, "{line:#}");
    w.check_alive()?;
    drop(probe);
    drop(held);
    Ok(())
}

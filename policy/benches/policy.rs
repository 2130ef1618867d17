//! Policy benchmark (not a timed test): compile time, snapshot heap size and
//! check throughput for a 100,000-rule allowlist mixing exact names,
//! `*.` and `**.` wildcards, plus deny rules and CIDRs.
//!
//! Run: `cargo bench -p sluice-policy --bench policy` (optionally
//! `-- RULES LOOKUPS`). Prints one line per figure; docs/benchmarks.md
//! ("policy") records a run.
//!
//! Heap is measured with a counting global allocator; the same counter
//! proves the checks allocate nothing.

// The counting allocator needs `unsafe impl GlobalAlloc`; it only forwards to
// the system allocator. Bench-only: the library itself forbids unsafe.
#![allow(unsafe_code)]
#![allow(
    clippy::unwrap_used,
    clippy::cast_possible_truncation,
    reason = "bench harness"
)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Instant;

use sluice_policy::{CompileOptions, Transport, from_yaml_str};

struct Counting;

static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);
static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees carry over; the counters are atomics
// and never touch the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        LIVE_BYTES.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: `ptr` was allocated by `System` with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        LIVE_BYTES.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// xorshift64*: deterministic, dependency-free.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// CPU seconds (user + system) this process has used, from
/// `/proc/self/stat` (10 ms resolution; assumes CLK_TCK = 100). On a shared,
/// oversubscribed machine wall time mostly measures the neighbours; CPU time
/// measures this process.
fn cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or_default();
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    ticks as f64 / 100.0
}

const TLDS: [&str; 6] = ["com", "net", "org", "io", "dev", "co.uk"];

fn exact_name(i: u64) -> String {
    format!("api{i}.svc{}.{}", i % 977, TLDS[(i % 6) as usize])
}
fn sub_base(i: u64) -> String {
    format!("cdn{i}.{}", TLDS[(i % 6) as usize])
}
fn apex_base(i: u64) -> String {
    format!("corp{i}.{}", TLDS[(i % 6) as usize])
}

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| !a.starts_with('-'));
    let rules: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let lookups: u64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(5_000_000);
    let n_exact = rules * 6 / 10;
    let n_sub = rules * 25 / 100;
    let n_apex = rules * 14 / 100;
    let n_deny = rules - n_exact - n_sub - n_apex;

    let mut yaml = String::with_capacity(rules as usize * 48);
    yaml.push_str("version: 1\nid: bench\nallow:\n");
    for i in 0..n_exact {
        yaml.push_str(&format!("  - domain: {}\n", exact_name(i)));
    }
    for i in 0..n_sub {
        yaml.push_str(&format!("  - domain: \"*.{}\"\n", sub_base(i)));
    }
    for i in 0..n_apex {
        yaml.push_str(&format!(
            "  - domain: \"**.{}\"\n    ports: [443, 8443]\n",
            apex_base(i)
        ));
    }
    yaml.push_str("  - cidrs: [203.0.113.0/24, 198.51.100.0/24]\n    ports: [5432]\n");
    yaml.push_str("deny:\n");
    for i in 0..n_deny {
        yaml.push_str(&format!("  - bad{i}.{}\n", sub_base(i)));
    }

    let c0 = cpu_secs();
    let t0 = Instant::now();
    let mut opts = serde_saphyr::Options::default();
    let mut budget = serde_saphyr::Budget::default();
    budget.max_nodes = 1 << 24;
    budget.max_events = 1 << 25;
    opts.budget = Some(budget);
    let _: serde::de::IgnoredAny = serde_saphyr::from_str_with_options(&yaml, opts).unwrap();
    println!(
        "yaml parse alone (serde-saphyr into IgnoredAny): {:.3} s wall, {:.2} s CPU",
        t0.elapsed().as_secs_f64(),
        cpu_secs() - c0
    );

    let before = LIVE_BYTES.load(Ordering::Relaxed);
    let c0 = cpu_secs();
    let t0 = Instant::now();
    let policy = from_yaml_str(&yaml, "bench.yaml", &CompileOptions::default()).unwrap();
    let compile = t0.elapsed();
    let compile_cpu = cpu_secs() - c0;
    let heap = LIVE_BYTES.load(Ordering::Relaxed) - before;
    println!(
        "rules: {rules} ({n_exact} exact, {n_sub} `*.`, {n_apex} `**.`, {n_deny} deny, 2 cidr); yaml {} KiB",
        yaml.len() / 1024
    );
    println!(
        "compile (parse + validate + build): {:.3} s wall, {compile_cpu:.2} s CPU",
        compile.as_secs_f64()
    );
    println!(
        "snapshot heap: {:.1} MiB ({} bytes/rule)",
        heap as f64 / 1048576.0,
        heap / rules as i64
    );

    // Query mix: 40% exact hits, 20% `*.` hits (2-3 labels deep), 10% `**.`
    // apex hits, 10% deny hits, 20% misses; names in mixed case with a
    // trailing dot on some, like names off the wire.
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let queries: Vec<String> = (0..4096)
        .map(|_| {
            let k = rng.below(100);
            let name = match k {
                0..40 => exact_name(rng.below(n_exact)),
                40..60 => format!("a{}.b.{}", rng.below(1000), sub_base(rng.below(n_sub))),
                60..70 => apex_base(rng.below(n_apex)),
                70..80 => format!("bad{0}.{1}", rng.below(n_deny.max(1)), sub_base(0)),
                _ => format!("miss{}.svc{}.com", rng.below(1_000_000), rng.below(977)),
            };
            if k.is_multiple_of(3) {
                format!("{}.", name.to_uppercase())
            } else {
                name
            }
        })
        .collect();

    let name_mix = |i: u64| queries[(i & 4095) as usize].as_str();
    measure("check_name", lookups, |i| {
        black_box(policy.check_name(black_box(name_mix(i)))).is_allowed()
    });
    measure("check_name_port (tcp 443)", lookups, |i| {
        black_box(policy.check_name_port(black_box(name_mix(i)), Transport::Tcp, 443)).is_allowed()
    });
    let ip = IpAddr::V4(Ipv4Addr::new(93, 184, 215, 14));
    measure("check_destination (ip, 443, [name])", lookups, |i| {
        let names = [name_mix(i)];
        black_box(policy.check_destination(black_box(ip), 443, &names)).is_allowed()
    });
}

/// Run `check(i)` for `i` in `0..lookups` in ten rounds and print: the
/// whole run's wall and CPU rates, the best round's rate per CPU-second (on
/// a shared machine the best round is the one least disturbed by
/// neighbours; each round is long enough for the 10 ms CPU clock), and the
/// allocations counted during the checks.
fn measure(what: &str, lookups: u64, mut check: impl FnMut(u64) -> bool) {
    const ROUNDS: u64 = 10;
    let per_round = (lookups / ROUNDS).max(1);
    let mut allowed = 0u64;
    let mut allocs = 0u64;
    let mut best = 0f64;
    let c_all = cpu_secs();
    let t_all = Instant::now();
    for round in 0..ROUNDS {
        let c0 = cpu_secs();
        let allocs_before = ALLOCS.load(Ordering::Relaxed);
        for i in round * per_round..(round + 1) * per_round {
            if check(i) {
                allowed += 1;
            }
        }
        // Count before reading /proc (which allocates).
        allocs += ALLOCS.load(Ordering::Relaxed) - allocs_before;
        let cpu = cpu_secs() - c0;
        if cpu > 0.0 {
            best = best.max(per_round as f64 / cpu / 1e6);
        }
    }
    let wall = t_all.elapsed().as_secs_f64();
    let cpu = cpu_secs() - c_all;
    let total = per_round * ROUNDS;
    println!(
        "{what}: {total} checks in {wall:.3} s wall = {:.2} M/s; {cpu:.2} s CPU = {:.2} M per CPU-second; best round {best:.2} M per CPU-second; {:.0}% allowed; allocations during checks: {allocs}",
        total as f64 / wall / 1e6,
        total as f64 / cpu.max(0.01) / 1e6,
        allowed as f64 * 100.0 / total as f64
    );
}

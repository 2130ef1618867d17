//! Fuzz the name-to-address table (`sluice_gateway::dns::DnsTable`) against
//! a naive model: a flat list of (address, name, expiry, seq, pins) with
//! the documented rules (TTL clamp, the later expiry kept, a full table
//! purges the expired then evicts the unpinned pair expiring soonest, a
//! full address evicts its own soonest unpinned name or refuses the new
//! one, pins per flow).
//!
//! Input: two configuration bytes (capacity, names per address, TTL
//! bounds), then operations of three bytes each: insert, advance the clock,
//! pin, unpin, purge, retain. After every operation every lookup
//! (`resolved_for`, `remaining`, `names_for`, `len`) agrees with the model,
//! no address holds more names than its bound, and an insert never takes a
//! pinned, unexpired pair.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use sluice_gateway::dns::DnsTable;

const IPS: [IpAddr; 3] = [
    IpAddr::V4(Ipv4Addr::new(198, 51, 100, 1)),
    IpAddr::V4(Ipv4Addr::new(198, 51, 100, 2)),
    IpAddr::V4(Ipv4Addr::new(203, 0, 113, 3)),
];

/// Six valid names (already normal) and one the normaliser refuses.
const NAMES: [&str; 7] = [
    "a.example",
    "b.example",
    "c.example",
    "www.d.example",
    "e-1.example",
    "f.example.net",
    "bad name",
];
const VALID: usize = 6;

/// A spelling of name `n` the table must treat as the name itself: upper
/// case and/or a trailing dot, as `form` says.
fn spelling(n: usize, form: u8) -> String {
    let mut s = NAMES[n].to_owned();
    if form & 1 == 1 {
        s = s.to_ascii_uppercase();
    }
    if form & 2 == 2 {
        s.push('.');
    }
    s
}

#[derive(Debug, Clone)]
struct Pair {
    ip: usize,
    name: usize,
    /// Offset of the expiry from the run's base instant.
    expires: Duration,
    seq: u64,
    pins: u32,
}

#[derive(Debug, Default)]
struct Model {
    pairs: Vec<Pair>,
    flows: HashMap<u64, (usize, Vec<(usize, u64)>)>,
    next_seq: u64,
    capacity: usize,
    per_address: usize,
    min_ttl: Duration,
    max_ttl: Duration,
}

impl Model {
    fn find(&self, ip: usize, name: usize) -> Option<usize> {
        self.pairs.iter().position(|p| p.ip == ip && p.name == name)
    }

    /// The unpinned pair with the least (expiry, seq) among `candidates`.
    fn soonest_unpinned(&self, candidates: impl Fn(&Pair) -> bool) -> Option<usize> {
        self.pairs
            .iter()
            .enumerate()
            .filter(|(_, p)| p.pins == 0 && candidates(p))
            .min_by_key(|(_, p)| (p.expires, p.seq))
            .map(|(i, _)| i)
    }

    fn insert(&mut self, ip: usize, name: usize, ttl: Duration, now: Duration) {
        if name >= VALID {
            return;
        }
        let expires = now + ttl.clamp(self.min_ttl, self.max_ttl);
        if let Some(i) = self.find(ip, name) {
            if expires > self.pairs[i].expires {
                self.pairs[i].expires = expires;
            }
            return;
        }
        if self.pairs.len() >= self.capacity {
            self.purge(now);
        }
        if self.pairs.len() >= self.capacity
            && let Some(i) = self.soonest_unpinned(|_| true)
        {
            self.pairs.remove(i);
        }
        if self.pairs.iter().filter(|p| p.ip == ip).count() >= self.per_address {
            match self.soonest_unpinned(|p| p.ip == ip) {
                Some(i) => {
                    self.pairs.remove(i);
                }
                None => return,
            }
        }
        self.pairs.push(Pair {
            ip,
            name,
            expires,
            seq: self.next_seq,
            pins: 0,
        });
        self.next_seq += 1;
    }

    fn purge(&mut self, now: Duration) {
        self.pairs.retain(|p| p.expires > now);
    }

    fn pin(&mut self, flow: u64, ip: usize, names: &[usize]) {
        self.unpin(flow);
        let mut pinned = Vec::new();
        for &n in names {
            if let Some(i) = self.find(ip, n) {
                self.pairs[i].pins += 1;
                pinned.push((n, self.pairs[i].seq));
            }
        }
        if !pinned.is_empty() {
            self.flows.insert(flow, (ip, pinned));
        }
    }

    fn unpin(&mut self, flow: u64) {
        let Some((ip, names)) = self.flows.remove(&flow) else {
            return;
        };
        for (n, seq) in names {
            if let Some(i) = self.find(ip, n)
                && self.pairs[i].seq == seq
            {
                self.pairs[i].pins = self.pairs[i].pins.saturating_sub(1);
            }
        }
    }
}

/// One fuzz input (the libFuzzer target and the corpus replay call this).
pub fn run(data: &[u8]) {
    let Some((config, ops)) = data.split_first_chunk::<2>() else {
        return;
    };
    let capacity = 1 + usize::from(config[0] % 12);
    let per_address = 1 + usize::from(config[1] % 5);
    let min_ttl = Duration::from_secs(u64::from(config[1] >> 4) % 3);
    let max_ttl = min_ttl + Duration::from_secs(1 + u64::from(config[0] >> 4) % 8);

    let mut table = DnsTable::new(capacity);
    table.set_max_names_per_address(per_address);
    table.set_ttl_bounds(min_ttl, max_ttl);
    assert_eq!(table.ttl_bounds(), (min_ttl, max_ttl));
    let mut model = Model {
        capacity,
        per_address,
        min_ttl,
        max_ttl,
        ..Model::default()
    };
    // `before` reads every pair held, expired or not.
    let before = Instant::now();
    let base = before + Duration::from_secs(1);
    let mut now = Duration::ZERO;

    for op in ops.chunks_exact(3) {
        let (a, b) = (op[1], op[2]);
        match op[0] % 8 {
            0..=2 => {
                let (ip, name) = (
                    usize::from(a) % IPS.len(),
                    usize::from(a >> 2) % NAMES.len(),
                );
                let ttl = Duration::from_secs(u64::from(b % 12));
                let pinned_live: Vec<(usize, usize)> = model
                    .pairs
                    .iter()
                    .filter(|p| p.pins > 0 && p.expires > now)
                    .map(|p| (p.ip, p.name))
                    .collect();
                table.insert(IPS[ip], &spelling(name, a >> 5), ttl, base + now);
                model.insert(ip, name, ttl, now);
                for (ip, n) in pinned_live {
                    assert!(
                        table.resolved_for(IPS[ip], NAMES[n], base + now),
                        "an insert took the pinned pair ({}, {})",
                        IPS[ip],
                        NAMES[n]
                    );
                }
            }
            3 => now += Duration::from_secs(u64::from(a % 5)),
            4 => {
                let (flow, ip) = (u64::from(a % 4), usize::from(b) % IPS.len());
                let names: Vec<usize> = (0..NAMES.len())
                    .filter(|n| (b >> 1) & (1 << n) != 0)
                    .collect();
                let spelled: Vec<String> = names.iter().map(|&n| spelling(n, a >> 4)).collect();
                table.pin(flow, IPS[ip], spelled.iter().map(String::as_str));
                model.pin(flow, ip, &names);
            }
            5 => {
                table.unpin(u64::from(a % 4));
                model.unpin(u64::from(a % 4));
            }
            6 => {
                table.purge_expired(base + now);
                model.purge(now);
            }
            _ => {
                let keep = |name: &str| {
                    NAMES
                        .iter()
                        .position(|n| *n == name)
                        .is_some_and(|i| a & (1 << i) != 0)
                };
                let removed = table.retain_names(keep);
                let held = model.pairs.len();
                model.pairs.retain(|p| a & (1 << p.name) != 0);
                assert_eq!(removed, held - model.pairs.len(), "retain_names count");
            }
        }
        check(&table, &model, base, before, now);
    }
}

/// Every lookup of the table agrees with the model at `now`.
fn check(table: &DnsTable, model: &Model, base: Instant, before: Instant, now: Duration) {
    assert_eq!(table.len(), model.pairs.len(), "len: {model:?}");
    assert_eq!(table.is_empty(), model.pairs.is_empty());
    let at = base + now;
    for (i, &ip) in IPS.iter().enumerate() {
        let mut live: Vec<&Pair> = model
            .pairs
            .iter()
            .filter(|p| p.ip == i && p.expires > now)
            .collect();
        live.sort_by_key(|p| std::cmp::Reverse((p.expires, p.seq)));
        let want: Vec<&str> = live.iter().map(|p| NAMES[p.name]).collect();
        let got: Vec<&str> = table.names_for(ip, at).collect();
        assert_eq!(got, want, "names_for({ip}): {model:?}");
        let held = model.pairs.iter().filter(|p| p.ip == i).count();
        assert!(held <= model.per_address, "model over its bound");
        assert_eq!(
            table.names_for(ip, before).count(),
            held,
            "pairs held for {ip}"
        );
        for (n, name) in NAMES.iter().enumerate() {
            let pair = model
                .pairs
                .iter()
                .find(|p| p.ip == i && p.name == n && p.expires > now);
            for form in 0..4 {
                let spelled = spelling(n, form);
                assert_eq!(
                    table.resolved_for(ip, &spelled, at),
                    pair.is_some(),
                    "resolved_for({ip}, {spelled}): {model:?}"
                );
                assert_eq!(
                    table.remaining(ip, &spelled, at),
                    pair.map(|p| p.expires - now),
                    "remaining({ip}, {name})"
                );
            }
        }
    }
}

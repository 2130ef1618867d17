#!/usr/bin/env bash
# DNS queries/s through the gateway and through passt, in ONE run, through
# the same harness (issue 12 points 4 and 5): the fake internet's dnsmasq
# answers every *.bench.test name with one address; per sidecar, after the
# guest has resolved 10 and then 100,000 distinct names to that address,
# sequential queries for names already answered (cached) and for names
# never asked (uncached); then the same after 10 names in a second world
# whose resolver is a relay to dnsmasq holding each query DELAY_MS (a slow
# upstream). docs/benchmarks.md "DNS: many names on one address".
#
#   benches/dns-names.sh [SECS_PER_CELL]      # default 3
#   NAMES=10,1000 DELAY_MS=50 benches/dns-names.sh 2
#
# Needs root. One JSON line per cell in ${OUT:-/tmp/slh-dns-names.jsonl};
# a markdown table on stdout, the load average before and after on stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-3}"
names="${NAMES:-10,100000}"
delay="${DELAY_MS:-20}"
out="${OUT:-/tmp/slh-dns-names.jsonl}"
: "${CARGO_TARGET_DIR:=target}"
export CARGO_TARGET_DIR
cargo build --release --locked -p sluice-gateway -p sluice-e2e --bins >&2
bin="$CARGO_TARGET_DIR/release"
: > "$out"
echo "dns-names: load before: $(uptime)" >&2
for sidecar in gateway passt; do
  echo "dns-names: $sidecar ..." >&2
  "$bin/sluice-bench" dns --sidecar "$sidecar" --names "$names" --secs "$secs" \
    --delay-ms "$delay" | tee -a "$out" >&2
done
echo "dns-names: load after: $(uptime)" >&2
python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
cells = {}
for r in rows:
    cells[(r["names"], r["upstream"], r["mode"], r["sidecar"])] = r
keys = sorted({(r["names"], r["upstream"], r["mode"]) for r in rows},
              key=lambda k: (k[1] != "as is", k[0], k[2]))
print("| names on the address | upstream | query | sluice q/s | passt q/s | sluice / passt | failed (sluice, passt) |")
print("|---:|---|---|---:|---:|---:|---|")
for k in keys:
    g, p = cells.get(k + ("sluice-gateway",)), cells.get(k + ("passt",))
    gq = g["qps"] if g else None
    pq = p["qps"] if p else None
    ratio = f"{gq / pq:.2f}" if gq and pq else "n/a"
    f = lambda x: f"{x:.0f}" if x is not None else "n/a"
    print(f"| {k[0]:,} | {k[1]} | {k[2]} | {f(gq)} | {f(pq)} | {ratio} | "
          f"{g['failed'] if g else 'n/a'}, {p['failed'] if p else 'n/a'} |")
PY

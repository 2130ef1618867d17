#!/usr/bin/env bash
# Enforcement cost: the same sluice-gateway through the same harness, once
# allowing everything (no --policy) and once with a realistic 1,000-rule
# policy under which the benchmark's traffic is allowed, one run each, side by
# side. Prints the JSON of both runs and a markdown table (ratio, added
# latency) with the load average before and after.
#
#   benches/enforce.sh [SECS]     # SECS per iperf3 run (default 10)
#   RULES=10000 benches/enforce.sh
#
# Needs root (network namespaces). Does not touch benches/datapath.sh's
# output; the raw output is also kept in ${OUT:-/tmp/slh-enforce-bench.txt}.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-10}"
out="${OUT:-/tmp/slh-enforce-bench.txt}"
: "${CARGO_TARGET_DIR:=target}"
export CARGO_TARGET_DIR

cargo build --release --locked -p sluice-gateway -p sluice-e2e --bins >&2
bin="$CARGO_TARGET_DIR/release"
"$bin/sluice-enforce-bench" --secs "$secs" --rules "${RULES:-1000}" | tee "$out"

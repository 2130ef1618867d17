#!/usr/bin/env bash
# Datapath benchmark: sluice-gateway vs passt, side by side in ONE run, through
# the same harness (namespace guest + sluice-tap-bridge + fake internet), at
# MTU 1500 and 65520. Prints a markdown table with ratios to passt.
#
#   benches/datapath.sh [SECS]        # SECS per iperf3 run (default 10)
#   SIDECARS="passt" benches/datapath.sh   # one sidecar only
#
# Needs root (network namespaces). Output: the table on stdout, the raw JSON
# lines in ${OUT:-/tmp/slh-bench.jsonl}.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-10}"
out="${OUT:-/tmp/slh-bench.jsonl}"
: "${CARGO_TARGET_DIR:=target}"
export CARGO_TARGET_DIR

cargo build --release --locked -p sluice-gateway -p sluice-e2e --bins >&2
bin="$CARGO_TARGET_DIR/release"
: > "$out"
for mtu in 1500 65520; do
  for sc in ${SIDECARS:-passt gateway}; do
    echo "datapath: $sc at MTU $mtu ..." >&2
    if ! "$bin/sluice-bench" run --sidecar "$sc" --mtu "$mtu" --secs "$secs" >> "$out"; then
      echo "{\"sidecar\":\"$([ "$sc" = gateway ] && echo sluice-gateway || echo passt)\",\"mtu\":$mtu,\"error\":true}" >> "$out"
      echo "datapath: $sc at MTU $mtu FAILED" >&2
    fi
  done
done
"$bin/sluice-bench" table "$out"

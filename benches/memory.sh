#!/usr/bin/env bash
# Memory benchmark: the sidecar's RSS idle and while the guest holds 1,000,
# 10,000 and 50,000 established, idle echo flows (each proven by one echo
# round trip), gateway and passt in ONE run through the same harness; after
# each step one more connection must still echo.
#
#   benches/memory.sh [COUNTS]        # default 1000,10000,50000
#   SIDECARS="gateway" benches/memory.sh   # one sidecar only
#
# Needs root (network namespaces; raises its open-file limit to 131072 and
# widens the guest namespace's ephemeral port range). Output: JSON lines on
# stdout and in ${OUT:-/tmp/slh-memory.jsonl}; `uptime` before and after.
set -euo pipefail
cd "$(dirname "$0")/.."
counts="${1:-1000,10000,50000}"
out="${OUT:-/tmp/slh-memory.jsonl}"
: "${CARGO_TARGET_DIR:=target}"
export CARGO_TARGET_DIR

cargo build --release --locked -p sluice-gateway -p sluice-e2e --bins >&2
bin="$CARGO_TARGET_DIR/release"
: > "$out"
echo "memory: start $(date -u +%FT%TZ) $(uptime)" >&2
for sc in ${SIDECARS:-gateway passt}; do
  echo "memory: $sc ..." >&2
  if ! "$bin/sluice-bench" rss --sidecar "$sc" --flows "$counts" | tee -a "$out"; then
    echo "{\"sidecar\":\"$sc\",\"error\":true}" | tee -a "$out"
  fi
done
echo "memory: end $(date -u +%FT%TZ) $(uptime)" >&2

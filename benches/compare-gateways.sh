#!/usr/bin/env bash
# Two sluice-gateway binaries side by side with passt, in ONE run, through the
# same harness as benches/datapath.sh: for a change to the gateway, "old" is a
# gateway binary built from the base commit, "new" this tree's.
#
#   OLD_GATEWAY=/path/to/old/sluice-gateway benches/compare-gateways.sh [SECS]
#
# Needs root. One JSON line per run (with "variant": passt|new|old) in
# ${OUT:-/tmp/slh-compare.jsonl}; docs/benchmarks.md "Session 5" shows a table.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-10}"
out="${OUT:-/tmp/slh-compare.jsonl}"
: "${OLD_GATEWAY:?set OLD_GATEWAY to the old sluice-gateway binary}"
: "${CARGO_TARGET_DIR:=target}"
export CARGO_TARGET_DIR
cargo build --release --locked -p sluice-gateway -p sluice-e2e --bins >&2
bin="$CARGO_TARGET_DIR/release"
: > "$out"
for mtu in 65520 1500; do
  for variant in passt new old; do
    echo "compare: $variant at MTU $mtu ..." >&2
    sidecar=gateway
    env=()
    case "$variant" in
      passt) sidecar=passt ;;
      old) env=(SLUICE_BIN_SLUICE_GATEWAY="$OLD_GATEWAY") ;;
    esac
    if line=$(env "${env[@]}" "$bin/sluice-bench" run --sidecar "$sidecar" --mtu "$mtu" --secs "$secs"); then
      echo "{\"variant\":\"$variant\",${line#\{}" >> "$out"
    else
      echo "{\"variant\":\"$variant\",\"mtu\":$mtu,\"error\":true}" >> "$out"
    fi
  done
done
echo "compare: results in $out" >&2

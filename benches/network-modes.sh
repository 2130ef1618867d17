#!/usr/bin/env bash
# QEMU-level throughput of `sluice run --network stream|dgram|tap`: a real
# guest downloads and uploads BYTES (default 200 MB) over plain HTTP from
# the harness's fake-internet origin (in a namespace of its own on this
# machine), ROUNDS rounds (default 3), the modes alternating (the order
# rotates each round). Run by hand, as root, not in CI:
#
#   benches/network-modes.sh [BYTES] [ROUNDS]
#
# One JSON line per run (with the 1-minute load average read before it)
# and a markdown table on stdout; docs/benchmarks.md "Network modes, under
# QEMU" records one. The machine may be shared: read the load column.
set -euo pipefail
cd "$(dirname "$0")/.."
bytes="${1:-200000000}"
rounds="${2:-3}"
: "${CARGO_TARGET_DIR:=target}"
export CARGO_TARGET_DIR
cargo build --release --locked -p sluice-gateway -p sluice-launcher -p sluice-e2e --bins >&2
RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --locked \
  -p sluice-guest-agent --target x86_64-unknown-linux-gnu >&2
agent="$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release/sluice-agent"
echo "network-modes: load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
"$CARGO_TARGET_DIR/release/sluice-modes-bench" --agent "$agent" \
  --bytes "$bytes" --rounds "$rounds"
echo "network-modes: load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

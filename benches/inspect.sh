#!/usr/bin/env bash
# Inspection benchmark: the cost of TLS interception (secret injection)
# against splicing the SAME host, in ONE run, through the namespace harness
# (guest namespace + sluice-tap-bridge + fake internet origin):
# TLS handshake latency, a large download, and requests/s on one kept-alive
# HTTP/2 connection. Prints a markdown table (docs/benchmarks.md).
#
#   benches/inspect.sh [--handshakes N] [--mib M] [--requests R]
#
# Needs root (network namespaces).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${CARGO_TARGET_DIR:=target}"
export CARGO_TARGET_DIR

cargo build --release --locked -p sluice-gateway -p sluice-e2e --bins >&2
exec "$CARGO_TARGET_DIR/release/sluice-inspect-bench" "$@"

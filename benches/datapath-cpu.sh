#!/usr/bin/env bash
# Datapath cost, load-insensitive: gateway CPU seconds per GB transferred and
# CPU microseconds per connection / DNS query, two gateway binaries
# alternating in the same minutes (sluice-bench xfer; docs/benchmarks.md,
# "Session 3 profile").
#
#   benches/datapath-cpu.sh OLD_GATEWAY NEW_GATEWAY [ROUNDS]
#
# Needs root and the release sluice-bench (cargo build --release -p
# sluice-e2e --bins). Prints one line per phase and binary.
set -euo pipefail
cd "$(dirname "$0")/.."
old="${1:?old sluice-gateway binary}"
new="${2:?new sluice-gateway binary}"
rounds="${3:-2}"
bench="${CARGO_TARGET_DIR:-target}/release/sluice-bench"

summary() {
  python3 -c '
import json, sys
tag = sys.argv[1]
for line in sys.stdin:
    d = json.loads(line)
    p = d["phase"]
    if p == "xfer":
        print(tag, "mtu", d["mtu"], "down" if d["reverse"] else "up", d["streams"], "streams:",
              "%.2f Gbit/s" % d["gbps"], "%.3f CPU s/GB" % d["sidecar_cpu_s_per_gb"],
              "bridge %.3f" % d["bridge_cpu_s_per_gb"], "%.2f switches/MB" % d["sidecar_switches_per_mb"])
    elif p == "connrate":
        print(tag, "mtu", d["mtu"], "connect: %.0f/s p50 %.0f us" % (d["rate"], d["p50_us"]),
              "%.0f CPU us/conn" % d["sidecar_cpu_us_per_conn"])
    else:
        print(tag, "mtu", d["mtu"], "dns: %.0f q/s" % d["qps"], "%.0f CPU us/query" % d["sidecar_cpu_us_per_query"])
' "$1"
}

for _ in $(seq "$rounds"); do
  for tag in old new; do
    bin="$old"; [ "$tag" = new ] && bin="$new"
    SLUICE_BIN_SLUICE_GATEWAY="$bin" "$bench" xfer --mtu 65520 --bytes 2G --streams 1,4 \
      --reverse --conns 500 --queries 1000 | summary "$tag"
    SLUICE_BIN_SLUICE_GATEWAY="$bin" "$bench" xfer --mtu 1500 --bytes 1G --streams 1,4 \
      --reverse | summary "$tag"
  done
done
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"

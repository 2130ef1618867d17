#!/usr/bin/env bash
# The gateway's work per forwarded DNS query, allow-all vs a generated policy,
# counted in instructions (valgrind's callgrind): load-insensitive, unlike
# the wall-clock figures of benches/enforce.sh. Runs `sluice-dns-bench`
# (tests/src/bin/sluice-dns-bench.rs: the real datapath in one process, the
# guest and the upstream resolver played in the same thread) with LO and HI
# queries in each mode; per query = (Ir(HI) - Ir(LO)) / (HI - LO), so start-up
# and policy compilation cancel out. Prints one line per mode, then the
# functions whose per-query cost differs most between the modes (inclusive).
#
#   benches/dns-cost.sh            # 1,000 rules, 200 and 600 queries
#   RULES=10000 LO=100 HI=300 benches/dns-cost.sh
#
# Needs valgrind (scripts/install-deps installs it) and python3; no root, no network.
# Output files stay in ${OUT:-/tmp/td-dns-cost}.
set -euo pipefail
cd "$(dirname "$0")/.."
rules="${RULES:-1000}"
lo="${LO:-200}"
hi="${HI:-600}"
out="${OUT:-/tmp/td-dns-cost}"
: "${CARGO_TARGET_DIR:=target}"
export CARGO_TARGET_DIR
mkdir -p "$out"

cargo build --release --locked -p sluice-e2e --bin sluice-dns-bench >&2
bin="$CARGO_TARGET_DIR/release/sluice-dns-bench"

ir() { # MODE_RULES QUERIES -> total instructions
  local f="$out/r$1-q$2.out"
  valgrind --tool=callgrind --callgrind-out-file="$f" "$bin" --rules "$1" --queries "$2" \
    >"$out/r$1-q$2.log" 2>&1
  callgrind_annotate "$f" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }'
}

for mode in 0 "$rules"; do
  a=$(ir "$mode" "$lo")
  b=$(ir "$mode" "$hi")
  echo "rules=$mode instructions/query=$(( (b - a) / (hi - lo) ))"
done

# Per-function inclusive cost per query in each mode, and the difference.
python3 - "$out" "$rules" "$lo" "$hi" <<'EOF'
import re, subprocess, sys
out, rules, lo, hi = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def load(path):
    text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", path],
                          capture_output=True, text=True, check=True).stdout
    costs = {}
    for line in text.splitlines():
        m = re.match(r"\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(?!=>)(.*)", line)
        if m:
            name = re.sub(r"\s*\[[^\]]*\]\s*$", "", m.group(2).strip())
            name = re.sub(r"\s*\([\d,]+x\)\s*$", "", re.sub(r"^.*\.rs:", "", name))
            costs[name] = costs.get(name, 0) + int(m.group(1).replace(",", ""))
    return costs
def per_query(r):
    a, b = load(f"{out}/r{r}-q{lo}.out"), load(f"{out}/r{r}-q{hi}.out")
    return {k: (b.get(k, 0) - a.get(k, 0)) / (hi - lo) for k in set(a) | set(b)}
base, pol = per_query(0), per_query(rules)
rows = sorted(((pol.get(k, 0) - base.get(k, 0), k) for k in set(base) | set(pol)
               if "sluice" in k), reverse=True)
print(f"\n{'policy-allow':>12} {'allow-all':>10} {'policy':>10}  function (inclusive, per query)")
for d, k in rows[:25]:
    print(f"{d:12.0f} {base.get(k, 0):10.0f} {pol.get(k, 0):10.0f}  {k[:120]}")
EOF

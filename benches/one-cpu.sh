#!/usr/bin/env bash
# Runs COMMAND with one CPU to itself: for the command's duration every
# other task on the machine is confined to the remaining CPUs (a cgroup v1
# cpuset), and COMMAND and everything it starts (sidecar, bridge, guest
# namespace clients, origin servers) run on that one CPU alone. Afterwards
# every task is moved back.
#
# Why (docs/benchmarks.md, "Session 10"): on the 2-core hosts these figures
# come from, a wake-up across CPUs is expensive and its cost varies run to
# run, so unpinned round-trip figures are bimodal (the same build gives a
# connect p50 of 75 us or 199 us), and other jobs on the machine, even
# under `nice -n 19`, move every figure. With the whole pipeline on one
# dedicated CPU, repeated runs agree within a few percent and the figures
# compare what each sidecar costs per byte, connection and query.
#
#   benches/one-cpu.sh [--cpu N] -- COMMAND...
#
# Needs root and a cgroup v1 cpuset hierarchy at /sys/fs/cgroup/cpuset
# (on cgroup v2, use `isolcpus=` or `systemctl set-property` instead).
set -euo pipefail
C=/sys/fs/cgroup/cpuset
cpu=""
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) cpu="$2"; shift 2 ;;
    --) shift; break ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "usage: benches/one-cpu.sh [--cpu N] -- COMMAND..." >&2; exit 2; }
[ -f "$C/cpuset.cpus" ] || { echo "one-cpu.sh: no cgroup v1 cpuset at $C" >&2; exit 1; }
n=$(nproc --all)
[ "$n" -ge 2 ] || { echo "one-cpu.sh: needs at least 2 CPUs, have $n" >&2; exit 1; }
cpu="${cpu:-$((n - 1))}"
rest=$(seq 0 $((n - 1)) | grep -vx "$cpu" | paste -sd, -)
mems=$(cat "$C/cpuset.mems")
bench="$C/sluice-bench-$$"
others="$C/sluice-rest-$$"

move_all() { # FROM TO
  local p
  for p in $(cat "$1/tasks"); do echo "$p" >"$2/tasks" 2>/dev/null || true; done
}
restore() {
  for g in "$bench" "$others"; do
    [ -d "$g" ] || continue
    move_all "$g" "$C"
    rmdir "$g" 2>/dev/null || true
  done
}
trap restore EXIT
mkdir "$bench" "$others"
echo "$cpu" >"$bench/cpuset.cpus"
echo "$mems" >"$bench/cpuset.mems"
echo "$rest" >"$others/cpuset.cpus"
echo "$mems" >"$others/cpuset.mems"
# Twice: a task forked while the first pass ran is caught by the second.
# Kernel threads bound to a CPU refuse the move and stay.
move_all "$C" "$others"
move_all "$C" "$others"
echo "one-cpu.sh: CPU $cpu for: $*; everything else on CPU(s) $rest" >&2
status=0
sh -c 'echo $$ >"$1/tasks" && shift && exec "$@"' sh "$bench" "$@" || status=$?
exit "$status"

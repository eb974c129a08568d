#!/usr/bin/env bash
# What confining a step to its cgroup adds to launching 8 ranks, side by side in one run:
#
#   gangrun run --nproc-per-node 8 --cgroup off      -- /bin/true
#   gangrun run --nproc-per-node 8 --cgroup required --mem 1G -- /bin/true
#
# Each is run RUNS times (default 21), alternating, after one warm-up run of each; the
# median and min/max wall times are printed. Needs root and writable cgroup v1
# hierarchies (docs/run.md, "The step's cgroup").
#
# Usage: benchmarks/cgroup_launch.sh [RUNS]      (after `make build`)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
runs=${1:-21}
gangrun="$root/bin/gangrun"
[ -x "$gangrun" ] || { echo "build gangrun first: make build" >&2; exit 2; }

time_ms() {
  local t0 t1
  t0=$(date +%s%N)
  "$@" >/dev/null 2>&1
  t1=$(date +%s%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f\n", (b-a)/1e6}'
}
stats() { sort -n | awk '{v[NR]=$1} END{m=(NR%2)?v[(NR+1)/2]:(v[NR/2]+v[NR/2+1])/2; printf "median %8.1f ms   min %8.1f   max %8.1f   (n=%d)\n", m, v[1], v[NR], NR}'; }
median() { sort -n | awk '{v[NR]=$1} END{print (NR%2)?v[(NR+1)/2]:(v[NR/2]+v[NR/2+1])/2}'; }

off=(--nproc-per-node 8 --cgroup off -- /bin/true)
on=(--nproc-per-node 8 --cgroup required --mem 1G -- /bin/true)
"$gangrun" run "${on[@]}" >/dev/null 2>&1 || { echo "gangrun run --cgroup required fails here: $("$gangrun" run "${on[@]}" 2>&1 | tail -1)" >&2; exit 1; }
time_ms "$gangrun" run "${off[@]}" >/dev/null
a=(); b=()
for _ in $(seq "$runs"); do
  a+=("$(time_ms "$gangrun" run "${off[@]}")")
  b+=("$(time_ms "$gangrun" run "${on[@]}")")
done
echo "machine: $(nproc) cores, $(uname -sr), load $(cut -d' ' -f1-3 /proc/loadavg)"
printf 'gangrun run --cgroup off:              '; printf '%s\n' "${a[@]}" | stats
printf 'gangrun run --cgroup required --mem 1G: '; printf '%s\n' "${b[@]}" | stats
am=$(printf '%s\n' "${a[@]}" | median); bm=$(printf '%s\n' "${b[@]}" | median)
awk -v a="$am" -v b="$bm" 'BEGIN{printf "added (median on - median off): %.1f ms\n", b-a}'

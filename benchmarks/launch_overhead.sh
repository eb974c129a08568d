#!/usr/bin/env bash
# Launch overhead: gangrun against torchrun, side by side in one run.
#
#   gangrun run --nproc-per-node 8 -- /bin/true
#   torchrun --standalone --monitor_interval 0.1 --no_python --nproc_per_node 8 /bin/true
#
# (0.1 s is torch 2.x's default monitor interval.) Each is run RUNS times (default 7),
# alternating, after one warm-up run of each; the median and min/max wall times are
# printed. torchrun is Debian's torch 1.13 started through cmd/gangrun/testdata/bin/
# torchrun, the shim that works around its Python 3.11 start-up crash; the shim only
# patches one function before calling torch.distributed.run.main.
#
# Usage: benchmarks/launch_overhead.sh [RUNS]      (after `make build`)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
runs=${1:-7}
gangrun="$root/bin/gangrun"
torchrun="$root/cmd/gangrun/testdata/bin/torchrun"
[ -x "$gangrun" ] || { echo "build gangrun first: make build" >&2; exit 2; }

time_ms() {
  local t0 t1
  t0=$(date +%s%N)
  "$@" >/dev/null 2>&1
  t1=$(date +%s%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f\n", (b-a)/1e6}'
}
stats() { sort -n | awk '{v[NR]=$1} END{m=(NR%2)?v[(NR+1)/2]:(v[NR/2]+v[NR/2+1])/2; printf "median %8.1f ms   min %8.1f   max %8.1f   (n=%d)\n", m, v[1], v[NR], NR}'; }

g=(); t=()
time_ms "$gangrun" run --nproc-per-node 8 -- /bin/true >/dev/null
time_ms "$torchrun" --standalone --monitor_interval 0.1 --no_python --nproc_per_node 8 /bin/true >/dev/null
for _ in $(seq "$runs"); do
  g+=("$(time_ms "$gangrun" run --nproc-per-node 8 -- /bin/true)")
  t+=("$(time_ms "$torchrun" --standalone --monitor_interval 0.1 --no_python --nproc_per_node 8 /bin/true)")
done
gm=$(printf '%s\n' "${g[@]}" | sort -n | awk '{v[NR]=$1} END{print (NR%2)?v[(NR+1)/2]:(v[NR/2]+v[NR/2+1])/2}')
tm=$(printf '%s\n' "${t[@]}" | sort -n | awk '{v[NR]=$1} END{print (NR%2)?v[(NR+1)/2]:(v[NR/2]+v[NR/2+1])/2}')
echo "machine: $(nproc) cores, $(uname -sr)"
printf 'gangrun  run --nproc-per-node 8 -- /bin/true:  '; printf '%s\n' "${g[@]}" | stats
printf 'torchrun --nproc_per_node 8 /bin/true:       '; printf '%s\n' "${t[@]}" | stats
awk -v a="$tm" -v b="$gm" 'BEGIN{printf "speed-up (median torchrun / median gangrun): %.0fx\n", a/b}'

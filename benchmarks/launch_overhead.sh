#!/usr/bin/env bash
# Launch overhead: gangrun against torchrun 2.x and torch 1.13's, side by side in one run.
#
#   gangrun run --nproc-per-node 8 -- /bin/true
#   gangrun run --standalone --monitor-interval 0.1 --no-python --nproc-per-node 8 /bin/true
#                                              (torchrun's own line, alias torchrun='gangrun run')
#   torchrun --standalone --monitor-interval 0.1 --no-python --nproc-per-node 8 /bin/true
#                                              (torch 2.x from PyPI: scripts/install-torch2.sh)
#   torchrun --standalone --monitor_interval 0.1 --no_python --nproc_per_node 8 /bin/true
#                                              (Debian's torch 1.13)
#
# (0.1 s is torch 2.x's default monitor interval.) Each is run RUNS times (default 7),
# in turn, after one warm-up run of each; the median and min/max wall times are printed.
# torch 1.13's torchrun is started through cmd/gangrun/testdata/bin/torchrun, the shim
# that works around its Python 3.11 start-up crash (it only patches one function before
# calling torch.distributed.run.main); torch 2.x's is its own console script.
#
# Usage: benchmarks/launch_overhead.sh [RUNS]      (after `make build`; installs torch 2.x
#        into its cache the first time, scripts/install-torch2.sh)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
runs=${1:-7}
gangrun="$root/bin/gangrun"
torchrun1="$root/cmd/gangrun/testdata/bin/torchrun"
[ -x "$gangrun" ] || { echo "build gangrun first: make build" >&2; exit 2; }
torchrun2="$(dirname "$("$root/scripts/install-torch2.sh")")/torchrun"
torch2=$("$(dirname "$torchrun2")/python" -c 'import torch; print(torch.__version__)' 2>/dev/null)

time_ms() {
  local t0 t1
  t0=$(date +%s%N)
  "$@" >/dev/null 2>&1
  t1=$(date +%s%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f\n", (b-a)/1e6}'
}
stats() { sort -n | awk '{v[NR]=$1} END{m=(NR%2)?v[(NR+1)/2]:(v[NR/2]+v[NR/2+1])/2; printf "median %8.1f ms   min %8.1f   max %8.1f   (n=%d)\n", m, v[1], v[NR], NR}'; }
median() { sort -n | awk '{v[NR]=$1} END{print (NR%2)?v[(NR+1)/2]:(v[NR/2]+v[NR/2+1])/2}'; }

cmds=(
  "$gangrun run --nproc-per-node 8 -- /bin/true"
  "$gangrun run --standalone --monitor-interval 0.1 --no-python --nproc-per-node 8 /bin/true"
  "$torchrun2 --standalone --monitor-interval 0.1 --no-python --nproc-per-node 8 /bin/true"
  "$torchrun1 --standalone --monitor_interval 0.1 --no_python --nproc_per_node 8 /bin/true"
)
names=(
  "gangrun run --nproc-per-node 8 -- /bin/true"
  "gangrun run (torchrun's line)"
  "torchrun $torch2"
  "torchrun 1.13 (Debian)"
)
declare -a results
for c in "${cmds[@]}"; do time_ms $c >/dev/null; done # warm-up
for _ in $(seq "$runs"); do
  for i in "${!cmds[@]}"; do
    results[$i]+="$(time_ms ${cmds[$i]}) "
  done
done
echo "machine: $(nproc) cores, $(uname -sr), load average $(cut -d' ' -f1-3 /proc/loadavg)"
for i in "${!cmds[@]}"; do
  printf '%-46s ' "${names[$i]}:"; printf '%s\n' ${results[$i]} | stats
done
g=$(printf '%s\n' ${results[0]} | median)
for i in 2 3; do
  t=$(printf '%s\n' ${results[$i]} | median)
  awk -v a="$t" -v b="$g" -v n="${names[$i]}" 'BEGIN{printf "speed-up against %s (median / gangrun'"'"'s median): %.0fx\n", n, a/b}'
done

#!/usr/bin/env bash
# The agent's CPU with Prometheus scraping it every 15 s: one `gangrun agent
# --metrics-addr` (the recorded DGX H100 inventory: 8 GPUs, no NVML here, so the scrape
# reads the inventory and Consul, not the driver; BenchmarkScrape8GPUNode measures a
# scrape with go-nvml's mock) on a Consul dev agent started here, elected scheduler
# (so its scrapes also read the queue), with a 4-GPU job of `sleep` running on it. After
# a 20 s warm-up, the agent's user+system CPU time (/proc/PID/stat) is read, /metrics is
# scraped every INTERVAL seconds for DURATION seconds, and the CPU time read again; the
# figure is that CPU time over DURATION, in % of one core: the agent's whole cost
# (session renewals, watches, the scheduler's and the controller's loops), scrapes
# included. The same is measured without scrapes for comparison.
#
# Usage: make build && benchmarks/metrics_cpu.sh [DURATION] [INTERVAL]   (defaults 120 15)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
duration=${1:-120}
interval=${2:-15}
gangrun=${GANGRUN_BIN:-$root/bin/gangrun}
consul=${GANGRUN_CONSUL:-$root/.tools/bin/consul}
inv="$root/topology/testdata/inventories/dgx-h100.json"
[ -x "$gangrun" ] || { echo "build gangrun first: make build" >&2; exit 2; }
[ -x "$consul" ] || { echo "no consul: scripts/install-consul.sh" >&2; exit 2; }
. "$root/benchmarks/lib.sh"
work=$(mktemp -d)
pids=()
cleanup() {
  [ -n "${job:-}" ] && "$gangrun" cancel --consul "127.0.0.1:$http" "$job" >/dev/null 2>&1 || true
  sleep 1
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  stop_munged
  rm -rf "$work"
}
trap cleanup EXIT
mport=$(port)
start_consul "$work/consul.log"
pids+=("$consul_pid")
start_munged # the agent checks MUNGE credentials, as on a default cluster
"$gangrun" agent --consul "127.0.0.1:$http" --node-name gpu-m --advertise-addr 127.0.0.1 --topology-file "$inv" \
  --metrics-addr "127.0.0.1:$mport" >"$work/agent.log" 2>&1 &
agent=$!
pids+=($agent)
until curl -fs "http://127.0.0.1:$mport/metrics" | grep -q 'gangrun_scheduler_leader 1'; do sleep 0.2; done
cd "$work"
job=$("$gangrun" submit --consul "127.0.0.1:$http" --nodes 1 --gpus-per-node 4 --name bench -- sleep 3600)
sleep 20
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
measure() { # $1: scrape or idle
  local t0 c0 c1 t1 n=0
  t0=$(date +%s.%N); c0=$(ticks "$agent")
  local end=$(( $(date +%s) + duration ))
  while [ "$(date +%s)" -lt "$end" ]; do
    if [ "$1" = scrape ]; then curl -fs -o /dev/null "http://127.0.0.1:$mport/metrics"; n=$((n+1)); fi
    sleep "$interval"
  done
  c1=$(ticks "$agent"); t1=$(date +%s.%N)
  python3 -c "c=($c1-$c0)/$hz; w=$t1-$t0; print(f'$1: $n scrapes in {w:.0f} s, agent CPU {c:.3f} s = {100*c/w:.3f} % of a core')" 2>/dev/null || \
    echo "$1: cpu ticks $((c1-c0)) over $duration s"
}
series=$(curl -fs "http://127.0.0.1:$mport/metrics" | grep -vc '^#')
bytes=$(curl -fs "http://127.0.0.1:$mport/metrics" | wc -c)
echo "exposition: $series series, $bytes bytes"
measure scrape
measure idle

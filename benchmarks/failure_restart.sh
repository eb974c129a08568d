#!/usr/bin/env bash
# Failure-to-restart time across two nodes: from a worker's SIGKILL on node B to every
# worker of the next attempt running, on both nodes, excluding the trainer's own
# start-up (the workers are a shell that records when it starts).
#
# Two `gangrun run` processes (node-a, node-b) on this machine meet through a Consul dev
# agent (.tools/bin/consul, started here on free ports), 2 workers each, world size 4,
# --restart-backoff 0s. The time spans: node B's supervisor seeing the death, reporting
# the failure, node A hearing of it through a blocking query, both stopping their
# workers, a new rendezvous round, and the new workers starting.
#
# Usage: make build && benchmarks/failure_restart.sh [RUNS]     (default 5)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
runs=${1:-5}
gangrun="$root/bin/gangrun"
consul="$root/.tools/bin/consul"
[ -x "$gangrun" ] || { echo "build gangrun first: make build" >&2; exit 2; }
[ -x "$consul" ] || { echo "no consul: scripts/install-consul.sh" >&2; exit 2; }

. "$root/benchmarks/lib.sh"
work=$(mktemp -d)
consul_pid=
trap 'kill $consul_pid 2>/dev/null; rm -rf "$work"' EXIT
start_consul "$work/consul.log"
sleep 1

now() { date +%s.%N; }
results=()
for r in $(seq "$runs"); do
  d="$work/run$r"; mkdir -p "$d"
  worker='echo "$GANGRUN_ATTEMPT $(date +%s.%N)" >> '"$d"'/start-$RANK
if [ "$GANGRUN_ATTEMPT" = 0 ]; then echo $$ > '"$d"'/pid-$RANK; exec sleep 300; fi'
  pids=()
  for n in a b; do
    "$gangrun" run --coordinator "consul://127.0.0.1:$http" --job-id "restart-$r" --nnodes 2 \
      --node-name "node-$n" --advertise-addr 127.0.0.1 --nproc-per-node 2 --restart-backoff 0s \
      --max-restarts 1 --term-timeout 5s -- /bin/sh -c "$worker" >"$d/$n.out" 2>"$d/$n.err" &
    pids+=($!)
  done
  until [ -f "$d/pid-0" ] && [ -f "$d/pid-1" ] && [ -f "$d/pid-2" ] && [ -f "$d/pid-3" ]; do sleep 0.05; done
  sleep 0.5
  victim=$(cat "$d/pid-3")     # rank 3: a worker of the node holding node rank 1
  t0=$(now)
  kill -9 "$victim"
  wait "${pids[@]}"
  t1=$(cat "$d"/start-* | awk '$1 == 1 {print $2}' | sort -n | tail -1)
  n1=$(cat "$d"/start-* | awk '$1 == 1' | wc -l)
  [ "$n1" = 4 ] || { echo "run $r: $n1 workers restarted, want 4" >&2; cat "$d"/*.err >&2; exit 1; }
  ms=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", (b-a)*1000}')
  results+=("$ms")
  echo "run $r: $ms ms"
done
printf '%s\n' "${results[@]}" | sort -n | awk '{v[NR]=$1} END{m=(NR%2)?v[(NR+1)/2]:(v[NR/2]+v[NR/2+1])/2; printf "failure-to-restart, 2 nodes × 2 workers: median %.1f ms (min %.1f, max %.1f, n=%d)\n", m, v[1], v[NR], NR}'

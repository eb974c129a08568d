#!/usr/bin/env bash
# What proving who submits costs (docs/acl.md#identity-munge): JOBS one-GPU jobs of
# `/bin/true` submitted from the command line (`gangrun submit`, SHELLS shells at once)
# to one `gangrun agent` with the recorded DGX H100 inventory (8 GPUs), once with the
# agent checking MUNGE credentials (the default: a munged started here, every submit
# sealing its job, the elected agent accepting each, every step checking its
# attestation) and once with `--auth none` (nothing made or checked), ROUNDS times,
# alternating, each run on a fresh Consul dev agent and a fresh agent. Two figures per
# run: the submits (first `gangrun submit` started → last one exited) and the whole
# (first submit started → every job COMPLETED, polled every 0.2 s).
#
# Usage: make build && benchmarks/submit_auth.sh [JOBS] [SHELLS] [ROUNDS]   (defaults 200 4 3)
# WAIT_S bounds the wait for every job to complete (default 300 s); the jobs left are counted.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=${1:-200}
shells=${2:-4}
rounds=${3:-3}
gangrun=${GANGRUN_BIN:-$root/bin/gangrun}
consul=${GANGRUN_CONSUL:-$root/.tools/bin/consul}
inv="$root/topology/testdata/inventories/dgx-h100.json"
[ -x "$gangrun" ] || { echo "build gangrun first: make build" >&2; exit 2; }
[ -x "$consul" ] || { echo "no consul: scripts/install-consul.sh" >&2; exit 2; }
. "$root/benchmarks/lib.sh"
work=$(mktemp -d)
mark="GANGRUN_BENCH_SUBMIT_AUTH=$work"
consul_pid= agent=
stop_run() {
  if [ -n "$agent" ]; then kill -TERM "$agent" 2>/dev/null || true; wait "$agent" 2>/dev/null || true; agent=; fi
  if [ -n "$consul_pid" ]; then kill "$consul_pid" 2>/dev/null || true; wait "$consul_pid" 2>/dev/null || true; consul_pid=; fi
}
cleanup() {
  stop_run
  stop_munged
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
start_munged
mkdir -p "$work/tmp" && chmod 0755 "$work"

run() { # MODE (munge|none)
  local mode=$1 addr t0 t1 t2 flags=()
  [ "$mode" = none ] && flags=(--auth none)
  start_consul "$work/consul.log"
  addr="127.0.0.1:$http"
  env "$mark" TMPDIR="$work/tmp" "$gangrun" agent --consul "$addr" --node-name n1 --advertise-addr 127.0.0.1 \
    --topology-file "$inv" "${flags[@]}" >"$work/agent-$mode.log" 2>&1 &
  agent=$!
  until "$gangrun" nodes --consul "$addr" --json 2>/dev/null | grep -q '"state": "up"'; do sleep 0.1; done
  sleep 1
  mkdir -p "$work/out-$mode" && cd "$work/out-$mode"
  local pids=()
  t0=$EPOCHREALTIME
  for s in $(seq "$shells"); do
    ( for i in $(seq $((jobs / shells))); do "$gangrun" submit --consul "$addr" --output /dev/null -- /bin/true >/dev/null; done ) &
    pids+=($!)
  done
  wait "${pids[@]}"
  t1=$EPOCHREALTIME
  local deadline=$((SECONDS + ${WAIT_S:-300}))
  until [ "$("$gangrun" queue --consul "$addr" --all --json | python3 -c '
import json, sys
q = json.load(sys.stdin)
print(sum(1 for j in q if j.get("kind", "job") == "job" and j["state"] == "COMPLETED"))')" -ge "$((jobs / shells * shells))" ]; do
    [ $SECONDS -ge $deadline ] && { echo "$mode: not every job COMPLETED within ${WAIT_S:-300} s:" >&2; "$gangrun" queue --consul "$addr" >&2; break; }
    sleep 0.2
  done
  t2=$EPOCHREALTIME
  bad=$("$gangrun" queue --consul "$addr" --all --json | python3 -c '
import json, sys
print(sum(1 for j in json.load(sys.stdin) if j["state"] != "COMPLETED"))')
  cd "$root"
  stop_run
  awk -v m="$mode" -v n="$((jobs / shells * shells))" -v a="$t0" -v b="$t1" -v c="$t2" -v bad="$bad" 'BEGIN{
    printf "%-6s %d jobs: submits %6.2f s (%5.1f/s)   all COMPLETED %6.2f s (%5.1f jobs/s)   not completed %d\n", m, n, b-a, n/(b-a), c-a, n/(c-a), bad}'
}

echo "machine: $(nproc) cores, $(uname -sr), load $(cut -d' ' -f1-3 /proc/loadavg), $("$consul" version | head -1) dev agent"
for r in $(seq "$rounds"); do
  if [ $((r % 2)) = 1 ]; then run munge; run none; else run none; run munge; fi
done

#!/usr/bin/env bash
# Cluster jobs (`gangrun submit`) on one machine: `gangrun agent` processes with the
# recorded DGX H100 inventory (topology/testdata/inventories/dgx-h100.json, replayed
# --health-events, no GPU needed) meet through a Consul dev agent (.tools/bin/consul,
# started here on free ports). Two figures:
#
#  1. submit → every worker running: 4 agents, `gangrun submit --nodes 4
#     --gpus-per-node 2 -- /bin/sh -c 'date +%s.%N >> FILE; sleep 2'`, RUNS times (default
#     10), one after the other (each waits for COMPLETED). The time runs from just before
#     `gangrun submit` is started to the last of the 8 workers' timestamps. It spans the
#     submit (its CLI process, the feasibility read, the transaction), the scheduler's
#     grant, the controller's move to RUNNING, each agent's launcher starting the step
#     process (`gangrun __step`), the step's session, GPU hand-over and rendezvous, and
#     the workers' start. A breakdown per run comes from the agents' logs (scheduler
#     "granted", controller "job running", launcher "starting the job's step", ms
#     resolution) and `gangrun show --json` (spec.submitted, attempts[0].started).
#
#  2. node death → the job running again on the spare: FAILOVERS times (default 3), 3
#     fresh agents (a partition of their own), `--nodes 2 --spare-nodes 1
#     --gpus-per-node 2`, workers that append "NODE ATTEMPT RANK TIME" to a shared file
#     every 0.1 s. Once attempt 0 runs on both nodes, the second node's agent AND its step
#     process (`gangrun __step … JOB NODE`) are SIGKILLed. Split into (a) kill → the
#     controller records the node lost (show --json lost_nodes[].at; the agent's session,
#     TTL 20 s, must expire first: Consul takes between TTL and 2×TTL) and (b) lost → the
#     first line of the new attempt on the spare (and → every worker of it running).
#
# Usage: make build && benchmarks/jobs.sh [RUNS] [FAILOVERS]      (defaults 10 and 3)
# GANGRUN_BIN overrides the binary (default bin/gangrun); KEEP_WORK=1 keeps the work
# directory (agents' logs, the jobs' output with the steps' own log lines).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
runs=${1:-10}
failovers=${2:-3}
gangrun=${GANGRUN_BIN:-$root/bin/gangrun}
consul=${GANGRUN_CONSUL:-$root/.tools/bin/consul}
inv="$root/topology/testdata/inventories/dgx-h100.json"
[ -x "$gangrun" ] || { echo "build gangrun first: make build" >&2; exit 2; }
[ -x "$consul" ] || { echo "no consul: scripts/install-consul.sh" >&2; exit 2; }

. "$root/benchmarks/lib.sh"
work=$(mktemp -d)
# Every agent, step and worker carries this in its environment: the cleanup finds them
# by it (the steps run in sessions of their own and outlive their agents).
mark="GANGRUN_BENCH_JOBS=$work"
mkdir -p "$work/tmp" # the agents' and steps' TMPDIR (the steps' own logs), removed with $work
consul_pid=
declare -A agent_pid=()

marked_pids() {
  local p
  for p in /proc/[0-9]*; do
    tr '\0' '\n' 2>/dev/null <"$p/environ" | grep -qxF "$mark" && echo "${p#/proc/}"
  done
  return 0
}
cleanup() {
  local pids
  for p in "${agent_pid[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  pids=$(marked_pids)
  if [ -n "$pids" ]; then kill -TERM $pids 2>/dev/null || true; sleep 1; fi
  pids=$(marked_pids)
  if [ -n "$pids" ]; then kill -KILL $pids 2>/dev/null || true; fi
  if [ -n "$consul_pid" ]; then kill "$consul_pid" 2>/dev/null || true; fi
  stop_munged
  wait 2>/dev/null || true
  if [ -n "${KEEP_WORK:-}" ]; then echo "kept $work (agents' logs, jobs' output)" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start_consul "$work/consul.log"
start_munged # the agents check MUNGE credentials, as on a default cluster
addr="127.0.0.1:$http"
sleep 1

g() { "$gangrun" "$1" --consul "$addr" "${@:2}"; }
start_agent() { # NAME [LABELS]
  local n=$1
  : >"$work/$n.health"
  env "$mark" TMPDIR="$work/tmp" "$gangrun" agent --consul "$addr" --node-name "$n" --advertise-addr 127.0.0.1 \
    --topology-file "$inv" --health-events "$work/$n.health" --log-format json ${2:+--labels "$2"} \
    >"$work/agent-$n.log" 2>&1 &
  agent_pid[$n]=$!
}
wait_up() { # NODE...
  local want="$*"
  until g nodes --json | python3 -c '
import json, sys
up = {n["name"] for n in json.load(sys.stdin) if n["state"] == "up"}
sys.exit(0 if set(sys.argv[1:]) <= up else 1)' $want; do sleep 0.2; done
}
show_field() { # ID PYTHON-EXPR-ON-m
  g show --json "$1" | python3 -c 'import json, sys; m = json.load(sys.stdin); print('"$2"')'
}
wait_state() { # ID STATE TIMEOUT_S
  local deadline=$((SECONDS + $3)) s
  while :; do
    s=$(show_field "$1" 'm["state"]')
    [ "$s" = "$2" ] && return 0
    case $s in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL)
      echo "job $1 ended $s, want $2" >&2; g show "$1" >&2; return 1;; esac
    [ $SECONDS -ge $deadline ] && { echo "job $1 not $2 within $3 s (is $s)" >&2; g show "$1" >&2; return 1; }
    sleep 0.1
  done
}
stats() { sort -n | awk '{v[NR]=$1} END{m=(NR%2)?v[(NR+1)/2]:(v[NR/2]+v[NR/2+1])/2; printf "median %8.1f ms   min %8.1f   max %8.1f   (n=%d)\n", m, v[1], v[NR], NR}'; }

echo "machine: $(nproc) cores, $(uname -sr), $("$consul" version | head -1) dev agent"

# ---- 1. submit → every worker running, 4 nodes × 2 workers -----------------------------
nodes4=(node-1 node-2 node-3 node-4)
for n in "${nodes4[@]}"; do start_agent "$n"; sleep 0.3; done # node-1 is elected first
wait_up "${nodes4[@]}"
sleep 1
mkdir -p "$work/submit"
cd "$work/submit"
# One warm-up job, not counted (the scheduler caches the inventories it places on).
id=$(g submit --nodes 4 --gpus-per-node 2 -- /bin/true)
wait_state "$id" COMPLETED 60
total=() ; : >"$work/breakdown.tsv"
for r in $(seq "$runs"); do
  f="$work/submit/start-$r"
  t0=$EPOCHREALTIME
  id=$(g submit --nodes 4 --gpus-per-node 2 -- /bin/sh -c "date +%s.%N >> $f; sleep 2")
  t1=$EPOCHREALTIME
  sleep 2.5 # the job takes 2 s at least: no polling (CPU) while it starts
  wait_state "$id" COMPLETED 60
  n=$(wc -l <"$f")
  [ "$n" = 8 ] || { echo "run $r: $n workers started, want 8" >&2; cat "$work/submit/gangrun-$id.out" >&2; exit 1; }
  last=$(sort -n "$f" | tail -1)
  ms=$(awk -v a="$t0" -v b="$last" 'BEGIN{printf "%.1f", (b-a)*1000}')
  total+=("$ms")
  # The breakdown: every point in ms after t0.
  g show --json "$id" >"$work/show-$id.json"
  python3 - "$id" "$t0" "$t1" "$f" "$work/show-$id.json" "$work"/agent-node-*.log >>"$work/breakdown.tsv" <<'EOF'
import json, sys, datetime
job, t0, t1, wfile, showf, logs = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6:]
def ts(s): return datetime.datetime.strptime(s, "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()
def rfc(s):  # RFC 3339 with up to 9 fraction digits
    s = s.replace("Z", "+00:00")
    if "." in s:
        head, rest = s.split(".", 1)
        i = next((k for k, c in enumerate(rest) if c in "+-"), len(rest))
        s = head + "." + rest[:i][:6].ljust(6, "0") + rest[i:]
    return datetime.datetime.fromisoformat(s).timestamp()
m = json.load(open(showf))
granted = running = None; spawns = []
for p in logs:
    for line in open(p):
        try: e = json.loads(line)
        except ValueError: continue
        if e.get("msg") == "granted" and e.get("id") == job: granted = ts(e["ts"])
        if e.get("msg") == "job running" and e.get("job") == job: running = ts(e["ts"])
        if e.get("msg") == "starting the job's step" and e.get("job") == job: spawns.append(ts(e["ts"]))
w = sorted(float(x) for x in open(wfile))
ms = lambda t: "%.1f" % ((t - t0) * 1000) if t else "-"
print("\t".join([job, ms(rfc(m["spec"]["submitted"])), ms(t1), ms(granted), ms(running),
                 ms(min(spawns)) if spawns else "-", ms(max(spawns)) if spawns else "-",
                 ms(rfc(m["attempts"][0]["started"])) if m["attempts"] else "-", ms(w[0]), ms(w[-1])]))
EOF
  echo "run $r: job $id, $ms ms"
done
echo
echo "breakdown, ms after t0 (just before gangrun submit started):"
{
  echo -e "job\tsubmitted\tsubmit-exit\tgranted\trunning\tstep1-spawn\tstep4-spawn\tround-closed\tworker-first\tworker-last"
  cat "$work/breakdown.tsv"
  python3 -c '
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
med = lambda c: "%.1f" % statistics.median(float(r[c]) for r in rows if r[c] != "-") if any(r[c] != "-" for r in rows) else "-"
print("\t".join(["median"] + [med(c) for c in range(1, len(rows[0]))]))' "$work/breakdown.tsv"
} | column -t -s $'\t'
printf 'submit → last of 8 workers running (4 nodes × 2): '; printf '%s\n' "${total[@]}" | stats

# ---- 2. node death → the job running again on the spare ---------------------------------
cd "$work"
la=(); lb=(); lall=()
for r in $(seq "$failovers"); do
  d="$work/failover$r"; mkdir -p "$d"; cd "$d"
  part="fo$r"; fo=("$part-a" "$part-b" "$part-c")
  for n in "${fo[@]}"; do start_agent "$n" "partition=$part"; done
  wait_up "${fo[@]}"
  sleep 1
  lines="$d/lines"
  worker='while :; do echo "$GANGRUN_NODE_NAME $GANGRUN_ATTEMPT $RANK $EPOCHREALTIME" >> '"$lines"'; sleep 0.1; done'
  id=$(g submit --partition "$part" --nodes 2 --spare-nodes 1 --gpus-per-node 2 --term-timeout 2s -- /bin/bash -c "$worker")
  wait_state "$id" RUNNING 60
  until [ -f "$lines" ] && [ "$(awk '$2 == 0 {print $1, $3}' "$lines" | sort -u | wc -l)" -ge 4 ]; do sleep 0.1; done
  sleep 1
  read -r victim spare <<<"$(show_field "$id" 'm["nodes"][1]["name"], m["spares"][0]')"
  leader=$(curl -sf "$addr/v1/kv/gangrun/scheduler/leader?raw" || true)
  step=
  for p in $(marked_pids); do
    mapfile -d '' -t args <"/proc/$p/cmdline" 2>/dev/null || continue
    n=${#args[@]}
    if [ "$n" -ge 3 ] && [ "${args[1]}" = __step ] && [ "${args[n-2]}" = "$id" ] && [ "${args[n-1]}" = "$victim" ]; then step=$p; fi
  done
  [ -n "$step" ] || { echo "failover $r: no step of job $id on $victim" >&2; exit 1; }
  tk=$EPOCHREALTIME
  kill -KILL "${agent_pid[$victim]}" "$step"
  { wait "${agent_pid[$victim]}"; } 2>/dev/null || true
  unset "agent_pid[$victim]"
  # Wait for the new attempt's 4 workers (2 on the spare).
  until [ "$(awk -v s="$spare" '$2 > 0 {print $1, $3}' "$lines" | sort -u | wc -l)" -ge 4 ] && \
        awk -v s="$spare" '$1 == s && $2 > 0 {f=1} END{exit !f}' "$lines"; do sleep 0.2; done
  g show --json "$id" >"$d/show.json"
  read -r lost first all <<<"$(python3 - "$d/show.json" "$lines" "$spare" <<'EOF'
import json, sys, datetime
m = json.load(open(sys.argv[1])); spare = sys.argv[3]
s = m["lost_nodes"][0]["at"].replace("Z", "+00:00")
if "." in s:
    head, rest = s.split(".", 1); i = next((k for k, c in enumerate(rest) if c in "+-"), len(rest))
    s = head + "." + rest[:i][:6].ljust(6, "0") + rest[i:]
lost = datetime.datetime.fromisoformat(s).timestamp()
first = {}
for line in open(sys.argv[2]):
    f = line.split()
    if len(f) == 4 and int(f[1]) > 0:
        k = (f[0], f[2]); first[k] = min(first.get(k, 1e20), float(f[3]))
print(lost, min(v for (n, _), v in first.items() if n == spare), max(first.values()))
EOF
)"
  a=$(awk -v a="$tk" -v b="$lost" 'BEGIN{printf "%.1f", (b-a)*1000}')
  b=$(awk -v a="$lost" -v b="$first" 'BEGIN{printf "%.1f", (b-a)*1000}')
  c=$(awk -v a="$lost" -v b="$all" 'BEGIN{printf "%.1f", (b-a)*1000}')
  la+=("$a"); lb+=("$b"); lall+=("$c")
  echo "failover $r: job $id, killed $victim (leader $leader), spare $spare: (a) kill → lost $a ms, (b) lost → first worker on the spare $b ms, → all 4 workers $c ms"
  g cancel "$id" >/dev/null
  wait_state "$id" CANCELLED 60 || true
  for n in "${fo[@]}"; do
    if [ -n "${agent_pid[$n]:-}" ]; then
      kill -TERM "${agent_pid[$n]}"; wait "${agent_pid[$n]}" 2>/dev/null || true; unset "agent_pid[$n]"
    fi
  done
done
echo
printf '(a) kill → node seen lost (session expiry, TTL 20 s):      '; printf '%s\n' "${la[@]}" | stats
printf '(b) lost → first worker of the new attempt on the spare:   '; printf '%s\n' "${lb[@]}" | stats
printf '    lost → all 4 workers of the new attempt running:       '; printf '%s\n' "${lall[@]}" | stats

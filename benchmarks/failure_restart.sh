#!/usr/bin/env bash
# Failure-to-restart time across two nodes: from a worker's SIGKILL to every worker of
# the next attempt running, on both nodes, excluding the trainer's own start-up (the
# workers are a shell script that records when it starts), for gangrun and its peers,
# interleaved in one run.
#
# Each mode starts two launchers on this machine as two nodes, 2 workers each (world
# size 4). Once the four workers run, rank 3's is SIGKILLed; the figure runs until all
# four workers of the next attempt have started. The modes:
#
#   gangrun-consul   gangrun run --coordinator consul://... --nnodes 2 --nproc-per-node 2
#                      --restart-backoff 0s --max-restarts 1 -- worker.sh DIR
#                    (through a Consul dev agent started here)
#   gangrun-c10d     gangrun run LINE      (torchrun's own line, no Consul: the first
#                    gangrun serves the c10d endpoint; the torchrun form's defaults)
#   torchrun2        torchrun LINE         (torch 2.x from PyPI, scripts/install-torch2.sh;
#                    its default --monitor-interval, 0.1 s)
#   torchrun1        torchrun LINE         (Debian's torch 1.13 through the test shim
#                    cmd/gangrun/testdata/bin/torchrun, underscore spellings; its default
#                    --monitor_interval, 5 s)
#   torchrun1-0.1    the same with --monitor_interval 0.1 (tuned: torch 2.x's default)
#
#   LINE = --nnodes 2 --nproc-per-node 2 --max-restarts 1 --rdzv-backend c10d
#          --rdzv-endpoint 127.0.0.1:PORT --rdzv-id restart-N --no-python worker.sh DIR
#
# PORT is a fresh port below the kernel's ephemeral range for each run (as
# benchmarks/goodput.py picks them). worker.sh records "RANK TIME" when started after
# the kill (then exits 0, so the launchers finish) and otherwise sleeps; an attempt is
# told by that, not by TORCHELASTIC_RESTART_COUNT, which torchrun does not raise on the
# node that restarts only because the other one rejoined.
#
# Usage: make build && benchmarks/failure_restart.sh [RUNS]     (default 5)
#        FAILURE_MODES=gangrun-consul,torchrun2 ... chooses the modes (default all five);
#        GANGRUN_BIN the gangrun binary (default bin/gangrun), GANGRUN_CONSUL the consul
#        binary (default .tools/bin/consul); KEEP_WORK=1 keeps the work directory (each
#        run's launcher logs and worker start times). Installs torch 2.x into its cache
#        the first time (scripts/install-torch2.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
runs=${1:-5}
gangrun=${GANGRUN_BIN:-$root/bin/gangrun}
consul=${GANGRUN_CONSUL:-$root/.tools/bin/consul}
modes=${FAILURE_MODES:-gangrun-consul,gangrun-c10d,torchrun2,torchrun1,torchrun1-0.1}
IFS=, read -r -a modes <<<"$modes"
[ -x "$gangrun" ] || { echo "build gangrun first: make build" >&2; exit 2; }
case ",${modes[*]}," in *gangrun-consul*) [ -x "$consul" ] || { echo "no consul: scripts/install-consul.sh" >&2; exit 2; } ;; esac
torchrun1="$root/cmd/gangrun/testdata/bin/torchrun"
case " ${modes[*]} " in *torchrun2*)
  torchrun2="$(dirname "$("$root/scripts/install-torch2.sh")")/torchrun"     # installs it the first time
  torch2=$("$(dirname "$torchrun2")/python" -c 'import torch; print(torch.__version__)') ;;
esac

. "$root/benchmarks/lib.sh"
work=$(mktemp -d)
consul_pid=
launchers=()
cleanup() {
  for p in "${launchers[@]}"; do kill -KILL -- "-$p" 2>/dev/null || true; done
  [ -z "$consul_pid" ] || kill "$consul_pid" 2>/dev/null || true
  if [ -n "${KEEP_WORK:-}" ]; then echo "kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
case " ${modes[*]} " in *gangrun-consul*) start_consul "$work/consul.log"; sleep 1 ;; esac

cat >"$work/worker.sh" <<'EOF'
#!/bin/sh
# $1: the run's directory. Started after the kill: record the start and exit; before it: sleep.
if [ -e "$1/killed" ]; then echo "$RANK $(date +%s.%N)" >>"$1/restarted"; exit 0; fi
echo $$ >"$1/pid-$RANK.tmp" && mv "$1/pid-$RANK.tmp" "$1/pid-$RANK"
exec sleep 300
EOF
chmod +x "$work/worker.sh"

now() { date +%s.%N; }

# one MODE RUN: a single measure; sets ms (milliseconds).
one() {
  local mode=$1 r=$2 d="$work/$1-$2" p t0 t1 n deadline
  mkdir -p "$d"
  p=$(low_port)
  local line=(--nnodes 2 --nproc-per-node 2 --max-restarts 1 --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$p"
    --rdzv-id "restart-$r" --no-python "$work/worker.sh" "$d")
  local line1=(--nnodes 2 --nproc_per_node 2 --max_restarts 1 --rdzv_backend c10d --rdzv_endpoint "127.0.0.1:$p"
    --rdzv_id "restart-$r")
  local cmd=()
  launchers=()
  for n in a b; do
    case $mode in
      gangrun-consul) cmd=("$gangrun" run --coordinator "consul://127.0.0.1:$http" --job-id "restart-$r-$$" --nnodes 2
        --node-name "node-$n" --advertise-addr 127.0.0.1 --nproc-per-node 2 --restart-backoff 0s
        --max-restarts 1 -- "$work/worker.sh" "$d") ;;
      gangrun-c10d) cmd=("$gangrun" run "${line[@]}") ;;
      torchrun2) cmd=("$torchrun2" "${line[@]}") ;;
      torchrun1) cmd=("$torchrun1" "${line1[@]}" --no_python "$work/worker.sh" "$d") ;;
      torchrun1-0.1) cmd=("$torchrun1" "${line1[@]}" --monitor_interval 0.1 --no_python "$work/worker.sh" "$d") ;;
      *) echo "unknown mode $mode" >&2; exit 2 ;;
    esac
    setsid "${cmd[@]}" >"$d/$n.out" 2>"$d/$n.err" &
    launchers+=($!)
  done
  deadline=$(( $(date +%s) + 120 ))
  until [ -f "$d/pid-0" ] && [ -f "$d/pid-1" ] && [ -f "$d/pid-2" ] && [ -f "$d/pid-3" ]; do
    [ "$(date +%s)" -lt "$deadline" ] || { echo "$mode run $r: the workers did not start" >&2; tail -n 20 "$d"/*.err >&2; exit 1; }
    sleep 0.05
  done
  sleep 0.5
  : >"$d/killed"
  t0=$(now)
  kill -9 "$(cat "$d/pid-3")"
  deadline=$(( $(date +%s) + 120 ))
  until [ "$(cat "$d/restarted" 2>/dev/null | wc -l)" -ge 4 ]; do
    [ "$(date +%s)" -lt "$deadline" ] || { echo "$mode run $r: the next attempt did not start" >&2; tail -n 20 "$d"/*.err >&2; exit 1; }
    sleep 0.05
  done
  n=$(awk '{print $1}' "$d/restarted" | sort -u | wc -l)
  [ "$n" = 4 ] || { echo "$mode run $r: ranks restarted: $(awk '{print $1}' "$d/restarted" | tr '\n' ' '), want 0-3 once" >&2; exit 1; }
  t1=$(awk '{print $2}' "$d/restarted" | sort -n | tail -1)
  # The launchers end once their new workers exit 0 (torchrun's exit barrier, gangrun's
  # endpoint close_timeout may keep them a while): give them 60 s, then stop them.
  for p in "${launchers[@]}"; do
    for _ in $(seq 600); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  launchers=()
  ms=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", (b-a)*1000}')
}

stats() { sort -n | awk '{v[NR]=$1} END{m=(NR%2)?v[(NR+1)/2]:(v[NR/2]+v[NR/2+1])/2; printf "median %8.1f ms   min %8.1f   max %8.1f   (n=%d)\n", m, v[1], v[NR], NR}'; }

echo "machine: $(nproc) cores, $(uname -sr), load average before $(cut -d' ' -f1-3 /proc/loadavg); gangrun $(git -C "$root" rev-parse --short HEAD)${torch2:+, torch $torch2}"
declare -A results
for r in $(seq "$runs"); do
  for m in "${modes[@]}"; do
    one "$m" "$r"
    results[$m]+="$ms "
    echo "run $r $m: $ms ms"
  done
done
echo "load average after $(cut -d' ' -f1-3 /proc/loadavg)"
for m in "${modes[@]}"; do
  printf '%-16s ' "$m:"; printf '%s\n' ${results[$m]} | stats
done

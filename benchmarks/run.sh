#!/usr/bin/env bash
# Runs every benchmark behind the figures in benchmarks/README.md, one after the other
# (they share two cores: never run them side by side). Takes about 35 minutes
# (failure_restart.sh's torchrun modes about 4 of them).
#
# Usage: make bench      (builds gangrun and installs what is missing first)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export CGO_CFLAGS=-Wno-deprecated-declarations
echo "== launch overhead";        benchmarks/launch_overhead.sh 7
echo "== failure to restart";     benchmarks/failure_restart.sh 7
echo "== warm restarts";          /usr/bin/python3 benchmarks/warm_restart.py bin/gangrun /usr/bin/python3 5
echo "== gang grants";            go test ./allocator -run '^$' -bench BenchmarkGrant -benchtime 10x
echo "== placement";              go test ./allocator -run '^$' -bench 'ChooseDevices|ChooseNodes' -benchmem
echo "== rendezvous";             go test ./rendezvous -run '^$' -bench BenchmarkRendezvous -benchtime 3x
echo "== torch c10d rendezvous";  /usr/bin/python3 benchmarks/rdzv_c10d.py 8 5; /usr/bin/python3 benchmarks/rdzv_c10d.py 16 3
echo "== checkpoints";            go test ./checkpoint -run '^$' -bench . -benchtime 3s
if command -v hyperfine >/dev/null; then benchmarks/ckpt_latest.sh; else echo "(hyperfine not installed: skipping the binary's ckpt latest timing)"; fi
if [ "$(id -u)" = 0 ]; then
  echo "== step cgroup";          go test ./internal/cgroup -run '^$' -bench 'BenchmarkStepOps|BenchmarkLaunch8' -benchtime 200x -count 5
  benchmarks/cgroup_launch.sh 21
else echo "(not root: skipping the step cgroup's benchmarks)"; fi
echo "== topology probe";         go test ./topology -run '^$' -bench BenchmarkProbe -benchtime 100x -count 3
echo "== parsers";                go test ./hostlist ./bench -run '^$' -bench .
echo "== cluster jobs";          benchmarks/jobs.sh 10 3
echo "== job throughput";        GANGRUN_BENCH_JOBS=100 go test ./job -run '^$' -bench JobThroughput -benchtime 1x -timeout 20m
echo "== goodput";              /usr/bin/python3 benchmarks/goodput.py 120 20 1

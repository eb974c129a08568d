#!/usr/bin/env bash
# Measures `gangrun ckpt latest` on a directory of 10,000 checkpoint directories (issue:
# under 200 ms). Builds gangrun, writes step-10 .. step-100000 (each with a model file and
# the generic layout's .complete marker; the newest left unfinished, as a crash mid-save
# leaves it), then times the command with hyperfine (warm page cache) and checks its
# answer.
#
# Usage: benchmarks/ckpt_latest.sh [N]     (N checkpoints, default 10000)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
n=${1:-10000}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

(cd "$root" && CGO_CFLAGS=-Wno-deprecated-declarations go build -o "$work/gangrun" ./cmd/gangrun)
dir="$work/ckpt"
mkdir -p "$dir"
for i in $(seq 1 "$n"); do
  d="$dir/step-$((i * 10))"
  mkdir "$d"
  : > "$d/model.pt"
  [ "$i" -lt "$n" ] && : > "$d/.complete"
done

want="$dir/step-$(((n - 1) * 10))"
got=$("$work/gangrun" ckpt latest "$dir")
[ "$got" = "$want" ] || { echo "ckpt latest printed $got, want $want" >&2; exit 1; }

hyperfine --warmup 3 --min-runs 20 -N "$work/gangrun ckpt latest $dir"

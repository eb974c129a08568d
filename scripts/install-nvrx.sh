#!/usr/bin/env bash
# Installs NVIDIA's ft_launcher (requirements/nvrx.txt: nvidia-resiliency-ext and its
# dependencies other than torch, every package pinned, --no-deps) for the goodput
# benchmark, into a directory of packages outside the clone that runs on the torch 2.x
# environment's python (scripts/install-torch2.sh): cached per machine under
# ${XDG_CACHE_HOME:-~/.cache}/gangrun/nvrx-<first 12 hex digits of both files' sha256>.
# Prints a command line that runs ft_launcher: "env PYTHONPATH=DIR PYTHON -m ...".
# About 10 MB; a few seconds once torch 2.x is there.
#
# Usage: scripts/install-nvrx.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
[ $# -eq 0 ] || { echo "install-nvrx.sh: unknown argument $1 (want none)" >&2; exit 2; }
py=$("$root/scripts/install-torch2.sh")
req="$root/requirements/nvrx.txt"
key=$(cat "$req" "$root/requirements/torch2.txt" | sha256sum | cut -c1-12)
dir="${XDG_CACHE_HOME:-$HOME/.cache}/gangrun/nvrx-$key"
marker="$dir/.installed"
run="env PYTHONPATH=$dir $py -m nvidia_resiliency_ext.fault_tolerance.launcher"
if [ -f "$marker" ]; then echo "$run"; exit 0; fi
mkdir -p "$(dirname "$dir")"
exec 9>"$dir.lock"
flock 9
if [ -f "$marker" ]; then echo "$run"; exit 0; fi
rm -rf "$dir"
"$py" -m pip install -q --disable-pip-version-check --no-input --no-deps --target "$dir" -r "$req" >&2
PYTHONPATH=$dir "$py" -c 'import nvidia_resiliency_ext.fault_tolerance.launcher' >/dev/null
date -u +%FT%TZ >"$marker"
echo "$run"

#!/usr/bin/env bash
# Installs the trainers the checkpoint tests save with (requirements/trainers.txt:
# transformers, accelerate, DeepSpeed, Lightning and their dependencies other than torch,
# every package pinned, --no-deps) into a directory of packages outside the clone that
# runs on the torch 2.x environment's python (scripts/install-torch2.sh) through
# PYTHONPATH: cached per machine under
# ${XDG_CACHE_HOME:-~/.cache}/gangrun/trainers-<first 12 hex digits of both files' sha256>.
# Prints that directory; `make test` exports it as GANGRUN_TRAINERS.
#
# About 60 MB to download and 280 MB installed, once torch 2.x is there: 37 s on the
# 2-core development VM (2026-12-04). DeepSpeed comes as a source distribution, built
# here without build isolation (its setup.py imports torch) and without compiling its
# ops; on CPU it JIT-builds its shm_comm op into ~/.cache/torch_extensions at first use
# (about 55 s once; g++ and python3-dev, which scripts/install-deps.sh trainers installs).
# Concurrent runs wait for each other (flock); an install cut short is redone, never
# used: the directory counts as installed only once its marker is written.
#
# Usage: scripts/install-trainers.sh        install (or reuse) and print the directory
#        scripts/install-trainers.sh --path print the directory it installs to, install nothing
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
req="$root/requirements/trainers.txt"
key=$(cat "$req" "$root/requirements/torch2.txt" | sha256sum | cut -c1-12)
dir="${XDG_CACHE_HOME:-$HOME/.cache}/gangrun/trainers-$key"
marker="$dir/.installed"

if [ "${1:-}" = "--path" ]; then echo "$dir"; exit 0; fi
[ $# -eq 0 ] || { echo "install-trainers.sh: unknown argument $1 (want none or --path)" >&2; exit 2; }
if [ -f "$marker" ]; then echo "$dir"; exit 0; fi

py=$("$root/scripts/install-torch2.sh")
mkdir -p "$(dirname "$dir")"
exec 9>"$dir.lock"
flock 9
# Another run may have finished it while this one waited for the lock.
if [ -f "$marker" ]; then echo "$dir"; exit 0; fi

echo "installing transformers, accelerate, DeepSpeed and Lightning into $dir ..." >&2
start=$(date +%s)
rm -rf "$dir"
"$py" -m pip install -q --disable-pip-version-check --no-input --no-deps --no-build-isolation --use-pep517 \
  --target "$dir" -r "$req" >&2
PYTHONPATH=$dir "$py" -c 'import transformers, accelerate, deepspeed, lightning, safetensors' >/dev/null
echo "$(date -u +%FT%TZ) installed from $req in $(( $(date +%s) - start )) s" >"$marker"
echo "trainers installed in $(( $(date +%s) - start )) s" >&2
echo "$dir"

#!/usr/bin/env bash
# Installs the Slurm clients the client tests run (requirements/clients.txt: submitit,
# dask-jobqueue and their dependencies other than torch, every package pinned,
# --no-deps) into a directory of packages outside the clone that runs on the torch 2.x
# environment's python (scripts/install-torch2.sh) through PYTHONPATH: cached per
# machine under
# ${XDG_CACHE_HOME:-~/.cache}/gangrun/clients-<first 12 hex digits of both files' sha256>.
# Prints that directory; `make test` exports it as GANGRUN_CLIENTS.
#
# About 6 MB to download, wheels only. Concurrent runs wait for each other (flock); an
# install cut short is redone, never used: the directory counts as installed only once
# its marker is written.
#
# Usage: scripts/install-clients.sh        install (or reuse) and print the directory
#        scripts/install-clients.sh --path print the directory it installs to, install nothing
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
req="$root/requirements/clients.txt"
key=$(cat "$req" "$root/requirements/torch2.txt" | sha256sum | cut -c1-12)
dir="${XDG_CACHE_HOME:-$HOME/.cache}/gangrun/clients-$key"
marker="$dir/.installed"

if [ "${1:-}" = "--path" ]; then echo "$dir"; exit 0; fi
[ $# -eq 0 ] || { echo "install-clients.sh: unknown argument $1 (want none or --path)" >&2; exit 2; }
if [ -f "$marker" ]; then echo "$dir"; exit 0; fi

py=$("$root/scripts/install-torch2.sh")
mkdir -p "$(dirname "$dir")"
exec 9>"$dir.lock"
flock 9
# Another run may have finished it while this one waited for the lock.
if [ -f "$marker" ]; then echo "$dir"; exit 0; fi

echo "installing submitit and dask-jobqueue into $dir ..." >&2
start=$(date +%s)
rm -rf "$dir"
"$py" -m pip install -q --disable-pip-version-check --no-input --no-deps --only-binary=:all: \
  --target "$dir" -r "$req" >&2
PYTHONPATH=$dir "$py" -c 'import submitit, dask_jobqueue, distributed' >/dev/null
echo "$(date -u +%FT%TZ) installed from $req in $(( $(date +%s) - start )) s" >"$marker"
echo "clients installed in $(( $(date +%s) - start )) s" >&2
echo "$dir"

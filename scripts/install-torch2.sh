#!/usr/bin/env bash
# Installs torch 2.x from PyPI (requirements/torch2.txt, every package pinned) into a
# virtual environment of Debian's python3 outside the clone, cached per machine under
# ${XDG_CACHE_HOME:-~/.cache}/gangrun/torch2-<first 12 hex digits of the file's sha256>,
# so every clone on the machine shares it and a machine that installed it once never
# downloads again; a changed requirements file gets a new directory beside the old one.
# Links it as .tools/torch2 in the clone (git-ignored) and prints its python's path.
#
# The first install downloads about 4 GB (PyPI's Linux torch wheel brings NVIDIA's CUDA
# libraries; they load and run on CPU without a GPU) and takes 5.4 GB: 111 s on the
# 2-core development VM (2026-12-04; 235 s while other jobs loaded it). Concurrent runs
# wait for each other (flock); an install cut short is redone, never used: the
# environment counts as installed only once its marker is written.
#
# Usage: scripts/install-torch2.sh        install (or reuse) and print the interpreter's path
#        scripts/install-torch2.sh --path print the path it installs to, install nothing
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
req="$root/requirements/torch2.txt"
base=/usr/bin/python3
key=$(sha256sum "$req" | cut -c1-12)
venv="${XDG_CACHE_HOME:-$HOME/.cache}/gangrun/torch2-$key"
py="$venv/bin/python"
marker="$venv/.installed"

if [ "${1:-}" = "--path" ]; then echo "$py"; exit 0; fi
[ $# -eq 0 ] || { echo "install-torch2.sh: unknown argument $1 (want none or --path)" >&2; exit 2; }

link() {
  mkdir -p "$root/.tools"
  ln -sfn "$venv" "$root/.tools/torch2"
  echo "$py"
}

if [ -f "$marker" ] && [ -x "$py" ]; then link; exit 0; fi

mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
# Another run may have finished it while this one waited for the lock.
if [ -f "$marker" ] && [ -x "$py" ]; then link; exit 0; fi

if ! "$base" -c 'import venv, ensurepip' >/dev/null 2>&1; then
  echo "installing Debian's python3-venv ..." >&2
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3-venv
fi

echo "installing torch 2.x from PyPI into $venv (about 4 GB, 2 minutes the first time) ..." >&2
start=$(date +%s)
rm -rf "$venv"
"$base" -m venv "$venv"
"$py" -m pip install -q --disable-pip-version-check --no-input -r "$req" >&2
"$py" -c 'import torch, torch.distributed.run, numpy' >/dev/null
echo "$(date -u +%FT%TZ) installed from $req in $(( $(date +%s) - start )) s" >"$marker"
echo "torch 2.x installed in $(( $(date +%s) - start )) s" >&2
link

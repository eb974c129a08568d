#!/usr/bin/env bash
# Sourced by scripts/install-trainers.sh and scripts/install-clients.sh: the install,
# shared by both, of pinned requirements into a directory of packages outside the clone
# that runs on the torch 2.x environment's python (scripts/install-torch2.sh) through
# PYTHONPATH, cached per machine under
# ${XDG_CACHE_HOME:-~/.cache}/gangrun/NAME-<first 12 hex digits of the requirements' and
# requirements/torch2.txt's sha256>. Concurrent runs wait for each other (flock); an
# install cut short is redone, never used: the directory counts as installed only once
# its marker is written.
#
# install_target NAME WHAT IMPORTS [PIPOPTS...] -- [ARGS...] installs
# requirements/NAME.txt with pip's extra options PIPOPTS (WHAT names the packages in the
# progress line; `import IMPORTS` checks them), ARGS being the calling script's own:
# none installs (or reuses) and prints the directory, --path prints it and installs
# nothing, anything else is refused (exit 2).
install_target() {
  local name=$1 what=$2 imports=$3
  shift 3
  local pipopts=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do pipopts+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  local root req key dir marker py start
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  req="$root/requirements/$name.txt"
  key=$(cat "$req" "$root/requirements/torch2.txt" | sha256sum | cut -c1-12)
  dir="${XDG_CACHE_HOME:-$HOME/.cache}/gangrun/$name-$key"
  marker="$dir/.installed"

  if [ "${1:-}" = "--path" ]; then echo "$dir"; exit 0; fi
  [ $# -eq 0 ] || { echo "install-$name.sh: unknown argument $1 (want none or --path)" >&2; exit 2; }
  if [ -f "$marker" ]; then echo "$dir"; exit 0; fi

  py=$("$root/scripts/install-torch2.sh")
  mkdir -p "$(dirname "$dir")"
  exec 9>"$dir.lock"
  flock 9
  # Another run may have finished it while this one waited for the lock.
  if [ -f "$marker" ]; then echo "$dir"; exit 0; fi

  echo "installing $what into $dir ..." >&2
  start=$(date +%s)
  rm -rf "$dir"
  "$py" -m pip install -q --disable-pip-version-check --no-input --no-deps "${pipopts[@]}" \
    --target "$dir" -r "$req" >&2
  PYTHONPATH=$dir "$py" -c "import $imports" >/dev/null
  echo "$(date -u +%FT%TZ) installed from $req in $(( $(date +%s) - start )) s" >"$marker"
  echo "$name installed in $(( $(date +%s) - start )) s" >&2
  echo "$dir"
}

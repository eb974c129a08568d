#!/usr/bin/env bash
# Installs what gangrun's demo and tests need on a fresh Debian machine, skipping what is
# already there: Debian's python3-torch (torch 1.13, CPU, gloo; used through
# /usr/bin/python3), iproute2, and a Consul v1.14.11 dev server (scripts/install-consul.sh).
#
# Usage: scripts/install-deps.sh [torch] [consul]    (no arguments: both)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
want=("$@"); [ ${#want[@]} -eq 0 ] && want=(torch consul)

apt_install() {
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  if [ -z "${GANGRUN_APT_UPDATED:-}" ]; then
    $sudo apt-get update -qq
    export GANGRUN_APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@"
}

for w in "${want[@]}"; do
  case "$w" in
    torch)
      if ! /usr/bin/python3 -c 'import torch, numpy' >/dev/null 2>&1; then
        echo "installing Debian's python3-torch (CPU) ..." >&2
        apt_install python3-torch python3-numpy
      fi
      ;;
    consul)
      "$root/scripts/install-consul.sh" >/dev/null
      ;;
    *) echo "install-deps.sh: unknown component $w (want torch or consul)" >&2; exit 2 ;;
  esac
done

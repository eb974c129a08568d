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
# its marker is written (install-target.sh, shared with install-trainers.sh).
#
# Usage: scripts/install-clients.sh        install (or reuse) and print the directory
#        scripts/install-clients.sh --path print the directory it installs to, install nothing
set -euo pipefail
# shellcheck source=install-target.sh
. "$(dirname "$0")/install-target.sh"
install_target clients "submitit and dask-jobqueue" "submitit, dask_jobqueue, distributed" --only-binary=:all: -- "$@"

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
# used: the directory counts as installed only once its marker is written
# (install-target.sh, shared with install-clients.sh).
#
# Usage: scripts/install-trainers.sh        install (or reuse) and print the directory
#        scripts/install-trainers.sh --path print the directory it installs to, install nothing
set -euo pipefail
# shellcheck source=install-target.sh
. "$(dirname "$0")/install-target.sh"
install_target trainers "transformers, accelerate, DeepSpeed and Lightning" "transformers, accelerate, deepspeed, lightning, safetensors" --no-build-isolation --use-pep517 -- "$@"

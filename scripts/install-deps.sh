#!/usr/bin/env bash
# Installs what gangrun's demo, tests and benchmarks need on a fresh Debian machine,
# skipping what is already there. Components:
#   torch     Debian's python3-torch and python3-numpy (torch 1.13, CPU, gloo; used through
#             /usr/bin/python3): the demo, the end-to-end tests, the benchmarks
#   torch2    torch 2.x from PyPI (requirements/torch2.txt, every package pinned) in a
#             virtual environment of Debian's python3 cached outside the clone under
#             ~/.cache/gangrun (scripts/install-torch2.sh; about 4 GB and 2 minutes once):
#             the tests run their PyTorch end-to-end tests on it too, and compare gangrun
#             with the real torchrun 2.x
#   trainers  transformers, accelerate, DeepSpeed and Lightning from PyPI
#             (requirements/trainers.txt, every package pinned) in a directory cached under
#             ~/.cache/gangrun that runs on torch2's python (scripts/install-trainers.sh;
#             about 280 MB and 40 s once), with g++ and python3-dev for the op DeepSpeed
#             compiles on CPU: the checkpoint tests cut these trainers' own saves short
#             and check `gangrun ckpt latest` against their loaders
#   clients   submitit and dask-jobqueue from PyPI (requirements/clients.txt, every
#             package pinned) in a directory cached under ~/.cache/gangrun that runs on
#             torch2's python (scripts/install-clients.sh; about 6 MB and 10 s once): the
#             Slurm front end's client tests run them against gangrun's Slurm commands
#   consul    a Consul v1.14.11 server built from the Go module proxy into .tools/bin
#             (scripts/install-consul.sh; about 4 minutes once, then cached): the tests
#             and benchmarks start Consul dev agents; the demo does not need it
#   iproute2  the `ip` tool: tests that give nodes their own network namespaces
#   prometheus  Debian's prometheus package (the server and promtool): the metrics tests
#             start a real Prometheus that scrapes test agents, and check the exposition
#             with `promtool check metrics`
#   chromium  Debian's chromium: the status page's test loads it in headless Chromium
#   passwd    useradd and userdel (Debian's passwd): tests make the Unix users that jobs
#             run as, and remove them
#   munge     Debian's munge (munged, munge, mungekey and libmunge.so.2): the tests run
#             their own munged daemons, as every node of a cluster runs one; the
#             package's own service is left stopped if nothing had started it
#   slurm     Debian's Slurm 22.05 (slurmctld, slurmd, slurm-client): the Slurm front end's
#             tests start a real Slurm of their own (internal/slurmtest) and compare;
#             the packages' own services are left stopped
#   modules   Debian's environment-modules (the `module` command a job script's
#             `module load` runs, on the nodes as under Slurm)
#
# Usage: scripts/install-deps.sh [torch] [torch2] [trainers] [clients] [consul] [iproute2] [prometheus] [chromium] [passwd] [munge] [slurm] [modules]
# (no arguments: all of them). The Makefile asks for what each target needs: `make demo`
# torch only, `make test` all of them, `make bench` torch and consul.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
want=("$@"); [ ${#want[@]} -eq 0 ] && want=(torch torch2 trainers clients consul iproute2 prometheus chromium passwd munge slurm modules)

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
    torch2)
      "$root/scripts/install-torch2.sh" >/dev/null
      ;;
    trainers)
      # DeepSpeed on CPU compiles its shm_comm op at first use (torch's cpp_extension):
      # it needs g++ and Python's headers.
      if ! command -v g++ >/dev/null 2>&1 || ! [ -f "$(/usr/bin/python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" ]; then
        echo "installing g++ and python3-dev (DeepSpeed's CPU op build) ..." >&2
        apt_install g++ python3-dev
      fi
      "$root/scripts/install-trainers.sh" >/dev/null
      ;;
    clients)
      "$root/scripts/install-clients.sh" >/dev/null
      ;;
    consul)
      "$root/scripts/install-consul.sh" >/dev/null
      ;;
    iproute2)
      if ! command -v ip >/dev/null 2>&1; then
        echo "installing iproute2 (ip) ..." >&2
        apt_install iproute2
      fi
      ;;
    prometheus)
      if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
        echo "installing Debian's prometheus (server and promtool) ..." >&2
        apt_install prometheus
      fi
      ;;
    chromium)
      if ! command -v chromium >/dev/null 2>&1; then
        echo "installing Debian's chromium (headless) ..." >&2
        apt_install chromium
      fi
      ;;
    passwd)
      if ! command -v useradd >/dev/null 2>&1 || ! command -v userdel >/dev/null 2>&1; then
        echo "installing Debian's passwd (useradd, userdel) ..." >&2
        apt_install passwd
      fi
      ;;
    munge)
      if ! command -v munge >/dev/null 2>&1 || ! [ -x /usr/sbin/munged ] || ! [ -x /usr/sbin/mungekey ] ||
         ! /sbin/ldconfig -p 2>/dev/null | grep 'libmunge\.so\.2' >/dev/null; then
        echo "installing Debian's munge (munged, munge, libmunge) ..." >&2
        apt_install munge
      fi
      ;;
    slurm)
      if ! command -v slurmctld >/dev/null 2>&1 || ! command -v slurmd >/dev/null 2>&1 || ! command -v sbatch >/dev/null 2>&1; then
        echo "installing Debian's Slurm (slurmctld, slurmd, slurm-client) ..." >&2
        apt_install slurmctld slurmd slurm-client
        # Debian starts the packaged daemons where it may; the tests run their own.
        if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
          sudo_=""; [ "$(id -u)" -ne 0 ] && sudo_="sudo"
          $sudo_ systemctl disable --now slurmctld slurmd >/dev/null 2>&1 || true
        fi
      fi
      ;;
    modules)
      if [ ! -e /etc/profile.d/modules.sh ]; then
        echo "installing Debian's environment-modules ..." >&2
        apt_install environment-modules
      fi
      ;;
    *) echo "install-deps.sh: unknown component $w (want torch, torch2, trainers, clients, consul, iproute2, prometheus, chromium, passwd, munge, slurm or modules)" >&2; exit 2 ;;
  esac
done

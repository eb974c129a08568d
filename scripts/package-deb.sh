#!/usr/bin/env bash
# Builds gangrun's Debian package with dpkg-deb: the files `make install` puts on a
# node (PREFIX=/usr, SYSCONFDIR=/etc), staged with DESTDIR, plus the control file,
# conffiles, md5sums and the maintainer scripts of packaging/debian/. dpkg-deb rather
# than nfpm: it is on every Debian machine already, and the package is one staged tree.
#
# Usage: scripts/package-deb.sh [OUTDIR]     (default dist/; `make deb` runs it)
# Environment:
#   DEB_VERSION     the package version (make deb passes its DEB_VERSION); default the
#                   release version (the VERSION file) on the commit tagged vVERSION with
#                   a clean tree, else VERSION+git.COMMIT (COMMIT: 12 hex digits, .dirty
#                   for a tree with changes), which sorts after that release
#   BIN             a gangrun binary to package instead of building bin/gangrun
#   DEB_MAINTAINER  the Maintainer field
#   DEB_COMPRESS    dpkg-deb's compressor: xz (the default), gzip (faster: the tests), none
# Prints the path of the package it wrote.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-dist}
mkdir -p "$out"
out=$(cd "$out" && pwd)

version=${DEB_VERSION:-}
if [ -z "$version" ]; then
  version=$(tr -d '[:space:]' <"$root/VERSION")
  c=$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || true)
  if [ -n "$c" ]; then
    dirty=$(git -C "$root" diff --quiet HEAD -- 2>/dev/null || echo .dirty)
    tagged=$(git -C "$root" tag --points-at HEAD --list "v$version" 2>/dev/null || true)
    if [ -z "$tagged" ] || [ -n "$dirty" ]; then
      version="$version+git.$c$dirty"
    fi
  fi
fi
# Debian policy 5.6.12: an upstream version starts with a digit and holds only
# alphanumerics and . + ~ (and - only with a Debian revision, which this has none of).
if ! [[ $version =~ ^[0-9][A-Za-z0-9.+~]*$ ]]; then
  echo "package-deb.sh: DEB_VERSION $version: want a Debian version: a digit first, then letters, digits, . + ~" >&2
  exit 2
fi

# The package's architecture is the binary's: Go's GOARCH named as Debian names it.
goarch=$(cd "$root" && go env GOARCH)
case $goarch in
  amd64 | arm64 | riscv64 | s390x) arch=$goarch ;;
  386) arch=i386 ;;
  arm) arch=armhf ;;
  ppc64le) arch=ppc64el ;;
  loong64) arch=loong64 ;;
  *) echo "package-deb.sh: GOARCH $goarch: no Debian architecture known for it" >&2; exit 2 ;;
esac

stage=$(mktemp -d "${TMPDIR:-/tmp}/gangrun-deb.XXXXXX")
trap 'rm -rf "$stage"' EXIT
chmod 0755 "$stage" # mktemp made it 0700: the package's / must not be
# No Slurm command links in the package: /usr/bin/sbatch and the rest are Debian's
# slurm-client's files; `gangrun slurm-links DIR` makes them where wanted (docs/slurm.md).
make -s -C "$root" install DESTDIR="$stage" PREFIX=/usr SYSCONFDIR=/etc SLURM_LINKS= ${BIN:+BIN="$BIN"} >/dev/null
bin="$stage/usr/bin/gangrun"

# libc's version from the binary's symbol versions (cgo links libc alone: libmunge and
# NVML are opened with dlopen, so a node without them still runs gangrun).
depends=libc6
if command -v objdump >/dev/null; then
  glibc=$(objdump -T "$bin" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)
  [ -n "$glibc" ] && depends="libc6 (>= $glibc)"
fi

mkdir -p "$stage/DEBIAN"
installed_kb=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
cat >"$stage/DEBIAN/control" <<EOF
Package: gangrun
Version: $version
Architecture: $arch
Maintainer: ${DEB_MAINTAINER:-gangrun maintainers <gangrun@invalid>}
Installed-Size: $installed_kb
Depends: $depends
Recommends: munge
Suggests: consul
Section: admin
Priority: optional
Description: distributed-training launcher and GPU cluster scheduler
 gangrun starts every worker of a PyTorch DDP, FSDP or DeepSpeed job with the
 environment torchrun gives, restarts the gang from its newest complete
 checkpoint when one fails, and on a cluster of gangrun agents (over Consul)
 places jobs on GPUs as gangs, the way Slurm's sbatch and slurmd do.
 .
 This package installs the gangrun binary and the gangrun-agent systemd unit
 with its settings in /etc/gangrun; the unit is neither enabled nor started.
EOF
# The settings an operator edits: dpkg keeps their changes across upgrades.
(cd "$stage" && find etc -type f | sort | sed 's|^|/|') >"$stage/DEBIAN/conffiles"
(cd "$stage" && find . -path ./DEBIAN -prune -o -type f -print | sed 's|^\./||' | sort | xargs md5sum) >"$stage/DEBIAN/md5sums"
install -m 0755 "$root"/packaging/debian/postinst "$root"/packaging/debian/prerm "$root"/packaging/debian/postrm "$stage/DEBIAN/"
chmod 0644 "$stage/DEBIAN/control" "$stage/DEBIAN/conffiles" "$stage/DEBIAN/md5sums"

deb="$out/gangrun_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Z"${DEB_COMPRESS:-xz}" --build "$stage" "$deb" >/dev/null
echo "$deb"

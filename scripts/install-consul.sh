#!/usr/bin/env bash
# Builds the Consul server gangrun's tests and demos run against, v1.14.11: the last
# MPL-2.0 release the Go module proxy serves (newer Consul modules are under the BSL or
# refused). Installs it as .tools/bin/consul in the repository and caches it under
# ${XDG_CACHE_HOME:-~/.cache}/gangrun so a fresh clone on the same machine reuses it.
#
# Usage: scripts/install-consul.sh            build (or reuse) and print the binary's path
#        CONSUL_VERSION is fixed on purpose; do not bump it past v1.14.x (licence).
set -euo pipefail

version=v1.14.11
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/.tools/bin/consul"
cache_dir="${XDG_CACHE_HOME:-$HOME/.cache}/gangrun/consul-$version"
cached="$cache_dir/consul"

# The version check reads the whole output: `| grep -q` under pipefail fails at random
# when grep exits first and consul dies of SIGPIPE.
have() {
  local out
  [ -x "$1" ] && out=$("$1" version 2>/dev/null) && [[ $out == *"Consul ${version}"* ]]
}

# install copies $1 to $2 through a temporary file and a rename: copying over a consul
# that a test is running fails with "Text file busy".
install_to() {
  mkdir -p "$(dirname "$2")"
  cp "$1" "$2.tmp.$$" && mv -f "$2.tmp.$$" "$2"
}

if have "$dest"; then echo "$dest"; exit 0; fi
mkdir -p "$(dirname "$dest")"
if have "$cached"; then
  install_to "$cached" "$dest"
  echo "$dest"
  exit 0
fi

echo "building Consul $version from the Go module proxy (about 4 minutes the first time)..." >&2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
cat > go.mod <<MOD
module gangrun.local/consulbuild

go 1.26

require (
	github.com/hashicorp/consul $version
	github.com/hashicorp/consul/api v1.18.1
	github.com/hashicorp/consul/proto-public v0.2.1
	github.com/hashicorp/consul/sdk v0.13.0
)

// From Consul's own go.mod at $version.
replace launchpad.net/gocheck => github.com/go-check/check v0.0.0-20140225173054-eb6ee6f84d0a
MOD
cat > tools.go <<'GO'
//go:build tools

package consulbuild

import _ "github.com/hashicorp/consul"
GO
GOFLAGS=-mod=mod go mod tidy >&2 2>/dev/null || GOFLAGS=-mod=mod go get github.com/hashicorp/consul@$version >&2
GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath \
  -ldflags "-X github.com/hashicorp/consul/version.GitCommit=gangrun-build -X github.com/hashicorp/consul/version.Version=${version#v} -X github.com/hashicorp/consul/version.VersionPrerelease=" \
  -o consul github.com/hashicorp/consul
mkdir -p "$cache_dir"
install_to consul "$cached"
install_to consul "$dest"
echo "$dest"

// Package gangrun holds the release version of gangrun (cmd/gangrun is the program; the
// packages beside this file are its parts).
//
// A release is the VERSION file's version on the commit tagged vVERSION ("v0.1.0"):
// `make tag` makes the tag, after checking that the tree is clean and the tag new.
// Between releases VERSION holds the last release's version, and `gangrun version` also
// prints the commit the binary was built from. The records gangrun keeps in Consul have
// schema versions of their own (internal/schema), which `gangrun version` lists: two
// releases may share a cluster as docs/operations.md ("Upgrades") says.
package gangrun

import (
	_ "embed"
	"runtime/debug"
	"strings"
)

//go:embed VERSION
var versionFile string

// commit is set at build time where Go does not record the commit itself (GOFLAGS
// -buildvcs=false): -ldflags "-X github.com/gangrun/gangrun.commit=HASH", as `make
// build` does.
var commit string

// Version returns the release version, as the VERSION file holds it ("0.1.0").
func Version() string { return strings.TrimSpace(versionFile) }

// Commit returns the commit the running binary was built from: the one `make build`
// gave it, else the one Go recorded (runtime/debug.ReadBuildInfo's vcs.revision,
// shortened to 12 hex digits), with "-dirty" when the tree had uncommitted changes;
// "unknown" for a binary built outside a git checkout, or with -buildvcs=false by
// plain go build.
func Commit() string {
	if commit != "" {
		return commit
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	rev, dirty := "", false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "unknown"
	}
	rev = rev[:min(len(rev), 12)]
	if dirty {
		rev += "-dirty"
	}
	return rev
}

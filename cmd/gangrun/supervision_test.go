package main

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// TestSupervisionFlagsSameOnRunAndSubmit: every supervision flag is on `run` and on
// `submit` with the same type, default and help, and reads the same in both --help
// texts.
func TestSupervisionFlagsSameOnRunAndSubmit(t *testing.T) {
	var sf supervisionFlags
	shared := pflag.NewFlagSet("supervision", pflag.ContinueOnError)
	sf.register(shared)
	_, runHelp, _ := inProcess("run", "--help")
	_, submitHelp, _ := inProcess("submit", "--help")
	n := 0
	shared.VisitAll(func(f *pflag.Flag) {
		n++
		runLine, submitLine := helpLine(runHelp, f.Name), helpLine(submitHelp, f.Name)
		if runLine == "" || runLine != submitLine {
			t.Errorf("--%s:\nrun --help:    %q\nsubmit --help: %q", f.Name, runLine, submitLine)
		}
	})
	for _, name := range []string{"max-restarts", "restart-backoff", "no-restart-exit-code", "hang-timeout", "warm-restarts", "warm-imports", "warm-delay"} {
		if shared.Lookup(name) == nil {
			t.Errorf("--%s is not a supervision flag", name)
		}
	}
	if n == 0 {
		t.Fatal("no supervision flags")
	}
}

// helpLine is flag name's line in a --help text ("" when it has none).
func helpLine(help, name string) string {
	for _, l := range strings.Split(help, "\n") {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		flag, _, _ := strings.Cut(f[0], "[") // --warm-restarts[=true|false]
		if flag == "--"+name {
			return strings.Join(f, " ") // pflag pads the columns to each command's longest flag
		}
	}
	return ""
}

package main

import (
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/gangrun/gangrun/launcher"
)

// supervisionFlags are the flags of a gang's supervision (launcher.Supervision):
// restarts, their backoff, the hang timeout, warm standbys. `gangrun run` and `gangrun
// submit` (and its #GANGRUN lines) register them with this one register, so both take
// the same names, defaults and help, and a cluster job is supervised as `run` is. A new
// supervision setting is a field of launcher.Supervision and a flag here.
type supervisionFlags struct {
	sup launcher.Supervision
	// warm is --warm-restarts (Supervision keeps its opposite, zero by default);
	// exitCode is --no-restart-exit-code as given (its 0 is Supervision's NoExitCode).
	warm     bool
	exitCode int
	// warmDelay is --warm-delay as given: 0 is "at once", which Supervision writes as a
	// negative delay (its 0 is the default).
	warmDelay time.Duration
}

func (f *supervisionFlags) register(fs *pflag.FlagSet) {
	d := launcher.DefaultSupervision()
	f.sup = d
	fs.IntVar(&f.sup.MaxRestarts, "max-restarts", d.MaxRestarts, "restarts of the gang after failures (a cluster job's lost nodes do not count)")
	fs.StringVar(&f.sup.Backoff, "restart-backoff", "exp", "wait before each restart without progress: exp (1s doubling to 30s) or a duration (0s: none)")
	fs.IntVar(&f.exitCode, "no-restart-exit-code", launcher.DefaultNoRestartExitCode, "a worker exiting with this code ends the run at once, no restart (0: none)")
	durationVar(fs, &f.sup.HangTimeout, "hang-timeout", d.HangTimeout, durationFlag{min: minHangTimeout, max: maxWait, zeroOK: true,
		minWhy: "it is checked every 100ms to 5s, so a shorter one cannot be honoured"},
		"no output from any rank for this long is a failure; 0 is off (else 1s to 10000h)")
	fs.BoolVar(&f.warm, "warm-restarts", true, "restart Python workers from standby interpreters that imported --warm-imports already (false: always a fresh interpreter)")
	fs.StringSliceVar(&f.sup.WarmImports, "warm-imports", d.WarmImports, "modules a standby imports before it waits, MOD[,MOD...] (default "+strings.Join(launcher.DefaultWarmImports, ",")+", each import's error ignored)")
	durationVar(fs, &f.warmDelay, "warm-delay", launcher.DefaultWarmDelay, durationFlag{max: maxGrace, zeroOK: true},
		"start the next attempt's standbys this long after cold workers start, so their imports do not slow the workers' start-up (0s: at once; warm workers fork theirs at once)")
}

// supervision is the launcher.Supervision the flags give, each default as its zero
// value (so that a job submitted with the defaults is an older release's record).
// Errors: a --no-restart-exit-code outside 0..255, which the encoding would hide.
func (f *supervisionFlags) supervision() (launcher.Supervision, error) {
	if err := launcher.CheckNoRestartExitCode(f.exitCode); err != nil {
		return launcher.Supervision{}, err
	}
	s := f.sup
	if s.Backoff == "exp" {
		s.Backoff = ""
	}
	switch f.exitCode {
	case launcher.DefaultNoRestartExitCode:
		s.NoRestartExitCode = 0
	case 0:
		s.NoRestartExitCode = launcher.NoExitCode
	default:
		s.NoRestartExitCode = f.exitCode
	}
	s.ColdRestarts = !f.warm
	switch f.warmDelay {
	case launcher.DefaultWarmDelay:
		s.WarmDelay = 0
	case 0:
		s.WarmDelay = -1 // at once (Supervision's 0 is the default)
	default:
		s.WarmDelay = f.warmDelay
	}
	return s, nil
}

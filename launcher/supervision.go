package launcher

import (
	"fmt"
	"time"
)

// Supervision is how a gang's failures are handled: how often and how soon it is
// restarted, what counts as hung, and whether restarts start from warm standby
// interpreters. `gangrun run` and a cluster job's step take the same one: the CLI
// registers one set of flags for it on both `run` and `submit` (cmd/gangrun's
// supervisionFlags), job.Spec keeps it in the job's record, and Spec hands it to the
// supervisor's Config — so a supervision setting added here (a field, its flag, its
// check in Check and its place in Config) reaches both.
//
// The JSON names are the job record's (job.Spec embeds a Supervision), and every
// field's zero value is its default: a job submitted with the defaults is the record
// an older release writes (max_restarts alone), which that release's agents accept
// during a rolling upgrade (they check the record's MUNGE credential over the fields
// they know: TestRollingUpgrade). A field added later must keep that rule.
type Supervision struct {
	// MaxRestarts is --max-restarts, 0..MaxRestartsLimit: failed attempts retried. (A
	// cluster job's lost nodes do not count against it: the step is given what is left.)
	MaxRestarts int `json:"max_restarts"`
	// Backoff is --restart-backoff, as ParseBackoff takes it ("" is "exp").
	Backoff string `json:"restart_backoff,omitempty"`
	// NoRestartExitCode is --no-restart-exit-code: 1..255 that code, 0 the default
	// (DefaultNoRestartExitCode), NoExitCode for none (the flag's 0); see Config.
	NoRestartExitCode int `json:"no_restart_exit_code,omitempty"`
	// HangTimeout is --hang-timeout: no output from any rank for this long is a
	// failure; 0 is off.
	HangTimeout time.Duration `json:"hang_timeout,omitempty"`
	// ColdRestarts is --warm-restarts=false; WarmImports is --warm-imports (nil:
	// DefaultWarmImports); see Config's WarmRestarts and WarmImports.
	ColdRestarts bool     `json:"cold_restarts,omitempty"`
	WarmImports  []string `json:"warm_imports,omitempty"`
	// WarmDelay is --warm-delay (Config.WarmDelay): 0 is DefaultWarmDelay, a negative
	// one none (the standbys start with the workers; the flag's 0s).
	WarmDelay time.Duration `json:"warm_delay,omitempty"`
}

// NoExitCode is Supervision.NoRestartExitCode's "no such code" (--no-restart-exit-code 0).
const NoExitCode = -1

// DefaultSupervision is the supervision of `gangrun run` and `gangrun submit` when no
// flag says otherwise (docs/run.md, "Flags"): every field zero but MaxRestarts.
func DefaultSupervision() Supervision {
	return Supervision{MaxRestarts: DefaultMaxRestarts}
}

// exitCode is the code that ends the run without a restart, 0 for none.
func (s Supervision) exitCode() int {
	switch s.NoRestartExitCode {
	case 0:
		return DefaultNoRestartExitCode
	case NoExitCode:
		return 0
	}
	return s.NoRestartExitCode
}

// CheckNoRestartExitCode refuses code, --no-restart-exit-code as given (0 for none),
// outside 0..255. (The flag's -1 would otherwise read as NoExitCode.)
func CheckNoRestartExitCode(code int) error {
	if code < 0 || code > 255 {
		return fmt.Errorf("--no-restart-exit-code %d: want 1..255, or 0 for none", code)
	}
	return nil
}

// Check refuses a value the supervisor cannot honour, naming the flag and the value:
// Prepare checks it before anything starts, and a job's spec before it is queued.
func (s Supervision) Check() error {
	if err := checkMaxRestarts(s.MaxRestarts); err != nil {
		return err
	}
	if _, err := ParseBackoff(s.Backoff); err != nil {
		return err
	}
	if err := CheckNoRestartExitCode(s.exitCode()); err != nil {
		return err
	}
	if s.HangTimeout < 0 {
		return fmt.Errorf("--hang-timeout %s: must not be negative", s.HangTimeout)
	}
	return checkWarmImports(s.WarmImports)
}

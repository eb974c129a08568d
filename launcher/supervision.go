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
// The JSON names are the job record's (job.Spec embeds a Supervision): a field added
// later must be omitempty with a zero value meaning what a job without it did before,
// so that records written before it read the same (internal/schema's rule).
type Supervision struct {
	// MaxRestarts is --max-restarts, 0..MaxRestartsLimit: failed attempts retried. (A
	// cluster job's lost nodes do not count against it: the step is given what is left.)
	MaxRestarts int `json:"max_restarts"`
	// Backoff is --restart-backoff, as ParseBackoff takes it ("" is "exp").
	Backoff string `json:"restart_backoff,omitempty"`
	// NoRestartExitCode is --no-restart-exit-code, 0..255 (0: none); see Config. (A job
	// record without Backoff was written before supervision was kept: its step runs
	// with DefaultSupervision's backoff and code, as such jobs did.)
	NoRestartExitCode int `json:"no_restart_exit_code,omitempty"`
	// HangTimeout is --hang-timeout: no output from any rank for this long is a
	// failure; 0 is off.
	HangTimeout time.Duration `json:"hang_timeout,omitempty"`
	// WarmRestarts and WarmImports are --warm-restarts and --warm-imports; see Config.
	// A job record without them restarts cold, as jobs did before they were kept.
	WarmRestarts bool     `json:"warm_restarts,omitempty"`
	WarmImports  []string `json:"warm_imports,omitempty"`
	// WarmDelay is --warm-delay (Config.WarmDelay): 0 is DefaultWarmDelay, a negative
	// one none (the standbys start with the workers; the flag's 0s).
	WarmDelay time.Duration `json:"warm_delay,omitempty"`
}

// DefaultSupervision is the supervision of `gangrun run` and `gangrun submit` when no
// flag says otherwise (docs/run.md, "Flags").
func DefaultSupervision() Supervision {
	return Supervision{MaxRestarts: DefaultMaxRestarts, Backoff: "exp", NoRestartExitCode: DefaultNoRestartExitCode,
		WarmRestarts: true, WarmDelay: DefaultWarmDelay}
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
	if s.NoRestartExitCode < 0 || s.NoRestartExitCode > 255 {
		return fmt.Errorf("--no-restart-exit-code %d: want 1..255, or 0 for none", s.NoRestartExitCode)
	}
	if s.HangTimeout < 0 {
		return fmt.Errorf("--hang-timeout %s: must not be negative", s.HangTimeout)
	}
	return checkWarmImports(s.WarmImports)
}

package policy

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Pre-emption types (slurm.conf's PreemptType) and partition modes (PreemptMode).
const (
	// PreemptOff: no job pre-empts another (the default, as Slurm's preempt/none).
	PreemptOff = "off"
	// PreemptPartitionPrio: a pending job may pre-empt running jobs of partitions whose
	// tier is lower than its own partition's (Slurm's preempt/partition_prio, which
	// compares the partitions' PriorityTier).
	PreemptPartitionPrio = "partition_prio"
	// ModeRequeue: a pre-empted job is stopped and requeued (Slurm's PreemptMode=REQUEUE):
	// the only mode, and the default, of a partition whose jobs may be pre-empted.
	ModeRequeue = "requeue"
	// ModeOff: the partition's jobs are never pre-empted (PreemptMode=OFF).
	ModeOff = "off"
)

// Pre-emption defaults.
const (
	// DefaultPreemptSignal is the signal a victim's workers get first: SIGTERM, as
	// Slurm sends on pre-emption.
	DefaultPreemptSignal = syscall.SIGTERM
	// DefaultGraceTime is the time between that signal and the victim's stop. Slurm's
	// GraceTime defaults to 0 (SIGKILL at once); gangrun gives a trainer the time to
	// write a checkpoint, as long as its own --term-timeout default (30 s).
	DefaultGraceTime = 30 * time.Second
	// MaxGraceTime bounds grace_time, as gangrun bounds every grace (--term-timeout):
	// a longer one is a typo.
	MaxGraceTime = 24 * time.Hour
)

// preemptSignals are the signals a policy may name: the two a trainer handles to
// checkpoint (gangrun's example trainer checkpoints and goes on at SIGUSR1, checkpoints
// and exits at SIGTERM), SIGUSR2 and SIGINT.
var preemptSignals = map[string]syscall.Signal{"SIGTERM": syscall.SIGTERM, "SIGUSR1": syscall.SIGUSR1,
	"SIGUSR2": syscall.SIGUSR2, "SIGINT": syscall.SIGINT}

// Preemption is the operator's pre-emption policy (slurm.conf's PreemptType,
// PreemptExemptTime, and the partitions' GraceTime, one for all here). The zero value
// pre-empts nothing.
type Preemption struct {
	// Type is PreemptOff ("" too) or PreemptPartitionPrio.
	Type string `json:"type,omitempty"`
	// ExemptTime is how long a job runs (since its latest start) before it may be
	// pre-empted (PreemptExemptTime). 0: at once.
	ExemptTime Duration `json:"exempt_time,omitempty"`
	// Signal is what the victim's workers get first: "SIGTERM" (default), "SIGUSR1",
	// "SIGUSR2" or "SIGINT" (with or without "SIG"). A terminating one (SIGTERM, SIGINT)
	// stops the workers, SIGKILL after GraceTime; SIGUSR1/SIGUSR2 are only delivered,
	// and the workers are killed once GraceTime has passed, unless they ended meanwhile:
	// GraceTime is a hard limit either way, as Slurm's is.
	Signal string `json:"signal,omitempty"`
	// GraceTime is the time between Signal and the stop (default DefaultGraceTime).
	GraceTime Duration `json:"grace_time,omitempty"`
}

// validate checks the pre-emption policy against the partitions; errors name the field.
func (p *Policy) validatePreemption() error {
	pr := p.Preemption
	switch pr.Type {
	case "", PreemptOff, PreemptPartitionPrio:
	default:
		return fmt.Errorf("preemption.type %q: want %q or %q", pr.Type, PreemptOff, PreemptPartitionPrio)
	}
	if pr.ExemptTime < 0 {
		return fmt.Errorf("preemption.exempt_time %s: must not be negative", time.Duration(pr.ExemptTime))
	}
	if pr.GraceTime < 0 || time.Duration(pr.GraceTime) > MaxGraceTime {
		return fmt.Errorf("preemption.grace_time %s: want 0 to %s", time.Duration(pr.GraceTime), MaxGraceTime)
	}
	if pr.Signal != "" {
		if _, ok := preemptSignals[signalKey(pr.Signal)]; !ok {
			return fmt.Errorf("preemption.signal %q: want SIGTERM, SIGUSR1, SIGUSR2 or SIGINT", pr.Signal)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(p.Partitions)) {
		switch m := p.Partitions[name].PreemptMode; m {
		case "", ModeRequeue, ModeOff:
		default:
			return fmt.Errorf("partitions.%s.preempt_mode %q: want %q or %q", name, m, ModeRequeue, ModeOff)
		}
	}
	return nil
}

func signalKey(s string) string {
	s = strings.ToUpper(s)
	if !strings.HasPrefix(s, "SIG") {
		s = "SIG" + s
	}
	return s
}

// PreemptionOn reports whether the policy lets any job pre-empt another.
func (p *Policy) PreemptionOn() bool { return p != nil && p.Preemption.Type == PreemptPartitionPrio }

// Tier returns partition name's tier (0 for a partition the policy does not name).
func (p *Policy) Tier(name string) int { return p.Partitions[name].Tier }

// MayPreempt reports whether a pending job of partition preemptor may pre-empt a
// running job of partition victim: pre-emption is on, the victim's partition's tier is
// lower than the preemptor's, and its preempt_mode is not off.
func (p *Policy) MayPreempt(preemptor, victim string) bool {
	return p.PreemptionOn() && p.Tier(victim) < p.Tier(preemptor) && p.Partitions[victim].PreemptMode != ModeOff
}

// PreemptSignal returns the signal a victim's workers get first.
func (p *Policy) PreemptSignal() syscall.Signal {
	if s, ok := preemptSignals[signalKey(p.Preemption.Signal)]; ok && p.Preemption.Signal != "" {
		return s
	}
	return DefaultPreemptSignal
}

// GraceTime returns the time between the signal and a victim's stop.
func (p *Policy) GraceTime() time.Duration {
	if p.Preemption.GraceTime == 0 {
		return DefaultGraceTime
	}
	return time.Duration(p.Preemption.GraceTime)
}

// ExemptTime returns how long a job runs before it may be pre-empted.
func (p *Policy) ExemptTime() time.Duration { return time.Duration(p.Preemption.ExemptTime) }

// Candidate is a running job that may be pre-empted, as SelectVictims weighs it.
type Candidate struct {
	ID string
	// Tier is its partition's tier; Priority its --priority; Started its latest start.
	Tier     int
	Priority int
	Started  time.Time
}

// exactSearchMax bounds the candidates SelectVictims searches exhaustively for the
// fewest victims (sets of up to exactSetMax): C(12,3) = 220 placements at most.
const (
	exactSearchMax = 12
	exactSetMax    = 3
)

// SelectVictims chooses which of cands to pre-empt so that a pending job fits: fits
// reports whether it would, were the jobs given released. It returns nil when no set
// does (not even all of cands: nothing is pre-empted in vain), else the victims in
// preference order.
//
// The preference, as Slurm's: the lowest tier first, then the lowest --priority, then
// the youngest (the least work lost), then the id. Among up to exactSearchMax
// candidates the smallest set that fits (of up to exactSetMax jobs) is found exactly,
// the most preferred among sets of that size; otherwise, or when none that small fits,
// victims are taken in preference order until the job fits, and then any whose release
// is not needed (the job fits without it) is spared, the latest taken first.
func SelectVictims(cands []Candidate, fits func(ids []string) bool) []string {
	c := slices.Clone(cands)
	slices.SortStableFunc(c, func(a, b Candidate) int {
		switch {
		case a.Tier != b.Tier:
			return a.Tier - b.Tier
		case a.Priority != b.Priority:
			return a.Priority - b.Priority
		case !a.Started.Equal(b.Started):
			return b.Started.Compare(a.Started)
		}
		return strings.Compare(a.ID, b.ID)
	})
	ids := make([]string, len(c))
	for i := range c {
		ids[i] = c[i].ID
	}
	if len(ids) == 0 || !fits(ids) {
		return nil
	}
	if len(ids) <= exactSearchMax {
		for k := 1; k <= min(exactSetMax, len(ids)); k++ {
			if set := firstFitting(ids, k, fits); set != nil {
				return set
			}
		}
	}
	var chosen []string
	for _, id := range ids {
		chosen = append(chosen, id)
		if fits(chosen) {
			break
		}
	}
	for i := len(chosen) - 1; i >= 0 && len(chosen) > 1; i-- {
		without := slices.Delete(slices.Clone(chosen), i, i+1)
		if fits(without) {
			chosen = without
		}
	}
	return chosen
}

// firstFitting returns the first k-subset of ids, in lexicographic order of positions
// (so the most preferred first), that fits; nil when none does.
func firstFitting(ids []string, k int, fits func([]string) bool) []string {
	idx := make([]int, k)
	for i := range idx {
		idx[i] = i
	}
	for {
		set := make([]string, k)
		for i, j := range idx {
			set[i] = ids[j]
		}
		if fits(set) {
			return set
		}
		i := k - 1
		for i >= 0 && idx[i] == len(ids)-k+i {
			i--
		}
		if i < 0 {
			return nil
		}
		idx[i]++
		for j := i + 1; j < k; j++ {
			idx[j] = idx[j-1] + 1
		}
	}
}

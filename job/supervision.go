package job

import (
	"context"
	"path/filepath"
	"slices"
	"time"

	"github.com/gangrun/gangrun/failure"
	"github.com/gangrun/gangrun/internal/store"
)

// The causes a job's restarts are counted by (State.RestartsByCause, the metric
// gangrun_job_restarts_total): a small fixed set, each the class of the failure that
// ended the attempt before a restart. CauseOf says which failure.Kind counts under
// which.
const (
	// CauseWorkerExit: a worker exited with a non-zero code (failure.Exit).
	CauseWorkerExit = "worker_exit"
	// CauseSignal: a worker was killed by a signal (failure.Signal).
	CauseSignal = "signal"
	// CauseHang: the supervisor's hang detection stopped the gang (failure.Hang:
	// --hang-timeout, no output, no heartbeat; failure.Watchdog: torch's watchdog timer
	// expired).
	CauseHang = "hang"
	// CauseNodeLost: a node of the attempt was lost (down, cut off, its step gone,
	// drained by an operator) between the attempt's start and the next one's
	// (failure.NodeLost).
	CauseNodeLost = "node_lost"
	// CauseGPUHealth: a node of the attempt was drained because one of its GPUs failed
	// (failure.GPUHealth: the agent's health watch, an Xid, ECC, NVML's verdict).
	CauseGPUHealth = "gpu_health"
	// CausePreempted: a job of a higher tier pre-empted it (preempt.go,
	// failure.Preempted); like a lost node's, such a restart does not use up
	// --max-restarts.
	CausePreempted = "preempted"
	// CauseOther: anything else that restarted the gang (failure.StartError: a worker
	// that could not start; no kind: a membership change without a lost node).
	CauseOther = "other"
)

// RestartCauses returns the causes, in the order metrics and show list them.
func RestartCauses() []string {
	return []string{CauseWorkerExit, CauseSignal, CauseHang, CauseNodeLost, CauseGPUHealth, CausePreempted, CauseOther}
}

// CauseOf returns the restart cause (one of RestartCauses) a failure of kind k counts
// under; CauseOther for a start error and for no kind. A new failure.Kind gets its case
// here (TestCauseOfEveryKind checks that none is forgotten).
func CauseOf(k failure.Kind) string {
	switch k {
	case failure.Exit:
		return CauseWorkerExit
	case failure.Signal:
		return CauseSignal
	case failure.Hang, failure.Watchdog:
		return CauseHang
	case failure.NodeLost:
		return CauseNodeLost
	case failure.GPUHealth:
		return CauseGPUHealth
	case failure.Preempted:
		return CausePreempted
	}
	return CauseOther
}

// classify returns the cause class of attempt a, which ended and was followed by next:
// a node lost meanwhile first (its peers' failures follow from it), then the kind of
// the failure that ended it.
func classify(a, next Attempt, lost []LostNode) string {
	for _, l := range lost {
		if l.At.Before(a.Started) || l.At.After(next.Started) {
			continue
		}
		return CauseOf(l.kind())
	}
	return CauseOf(a.kind())
}

// countRestarts counts, once each, the attempts that ended and were followed by another
// (a restart): Attempt.RestartCause names the class, State.RestartsByCause adds it up
// (it outlives the attempts the state drops, maxAttemptsKept). It reports whether it
// counted any.
func (s *State) countRestarts() bool {
	changed := false
	for i := 0; i+1 < len(s.Attempts); i++ {
		a := &s.Attempts[i]
		if a.Ended.IsZero() || a.RestartCause != "" {
			continue
		}
		a.RestartCause = classify(*a, s.Attempts[i+1], s.LostNodes)
		if a.kind() == failure.Preempted || slices.ContainsFunc(s.Preemptions, func(p Preemption) bool {
			return !p.At.Before(a.Started) && !p.At.After(s.Attempts[i+1].Started)
		}) {
			a.RestartCause = CausePreempted
		}
		if s.RestartsByCause == nil {
			s.RestartsByCause = map[string]int{}
		}
		s.RestartsByCause[a.RestartCause]++
		changed = true
	}
	return changed
}

// Recovery returns how long the job's last restart took, from the failure (the end of
// the attempt that failed) to the next attempt's workers started (the first node's:
// gangrun does not see the trainer's first step); false when there was none yet.
func (s *State) Recovery() (time.Duration, bool) {
	for i := len(s.Attempts) - 1; i > 0; i-- {
		prev, a := s.Attempts[i-1], s.Attempts[i]
		if prev.RestartCause == "" || prev.Ended.IsZero() || a.WorkersStarted.IsZero() {
			continue
		}
		return max(a.WorkersStarted.Sub(prev.Ended), 0), true
	}
	return 0, false
}

// ETTR returns the job's effective training time ratio at now: productive time over
// wall time since it first started (to its end once it ended), as
// benchmarks/goodput.py defines it, from what gangrun knows:
//
//   - an attempt that succeeded, or the one running, was productive from its workers'
//     start to its end (now);
//   - an attempt that failed was productive from its workers' start to the newest
//     checkpoint completed before it failed — the one the next attempt resumed from,
//     when that checkpoint is newer than the attempt's start; work after it is lost;
//   - everything else (pending after a requeue, rendezvous, backoff, start-up before
//     the workers ran) is not.
//
// The start-up inside the workers (imports, loading the checkpoint) counts as
// productive: gangrun does not see the trainer's steps. ok is false when it cannot be
// computed honestly: the job has not started, or an attempt failed while gangrun knew
// of no checkpoint directory (the trainer may resume on its own; gangrun cannot tell).
func (s *State) ETTR(checkpointDir string, now time.Time) (float64, bool) {
	if s.Started.IsZero() {
		return 0, false
	}
	end := now
	if !s.Ended.IsZero() {
		end = s.Ended
	}
	wall := end.Sub(s.Started)
	if wall <= 0 {
		return 0, false
	}
	var productive time.Duration
	for i, a := range s.Attempts {
		if a.WorkersStarted.IsZero() {
			continue
		}
		switch {
		case a.Ended.IsZero() && i == len(s.Attempts)-1:
			productive += max(end.Sub(a.WorkersStarted), 0)
		case a.RestartCause == "" && i == len(s.Attempts)-1:
			// The last attempt ended, and nothing restarted it: its work stands (a
			// success), or the job ended with it (the work up to its end is what the job
			// has, as goodput.py counts the newest step reached).
			productive += max(a.Ended.Sub(a.WorkersStarted), 0)
		case a.RestartCause != "":
			if checkpointDir == "" {
				return 0, false
			}
			next := s.Attempts[i+1]
			if ck := next.ResumeFromTime; !ck.IsZero() && ck.After(a.WorkersStarted) {
				if ck.After(a.Ended) {
					ck = a.Ended
				}
				productive += ck.Sub(a.WorkersStarted)
			}
		}
	}
	return min(productive.Seconds()/wall.Seconds(), 1), true
}

// CheckpointPath returns the job's checkpoint directory as its steps use it (relative to
// its work directory), "" when it has none.
func (s Spec) CheckpointPath() string {
	if s.CheckpointDir == "" || filepath.IsAbs(s.CheckpointDir) {
		return s.CheckpointDir
	}
	return filepath.Join(s.WorkDir, s.CheckpointDir)
}

// RankZeroNode returns the node that runs node rank 0 of the job's current attempt (the
// first of its nodes in node-rank order), or the first of the job's nodes before its
// attempt's round closed; "" when the job runs nowhere. That node's agent exports the
// job's supervision metrics.
func (s *State) RankZeroNode() string {
	if s.Status != Running && s.Status != Completing {
		return ""
	}
	if n := len(s.Attempts); n > 0 && s.Attempts[n-1].Ended.IsZero() && len(s.Attempts[n-1].Nodes) > 0 {
		return s.Attempts[n-1].Nodes[0]
	}
	if len(s.Nodes) > 0 {
		return s.Nodes[0]
	}
	return ""
}

// CheckpointSeen is a job's newest complete checkpoint as an agent saw it.
type CheckpointSeen struct {
	// Path is the checkpoint; Time its modification time (when it was completed).
	Path string    `json:"path"`
	Time time.Time `json:"time"`
	// Seen is when the agent found it.
	Seen time.Time `json:"seen"`
}

// NoteCheckpoint records c as job id's newest complete checkpoint (State.Checkpoint),
// unless the state has it, or a newer one, already.
func NoteCheckpoint(ctx context.Context, s store.Store, id string, c CheckpointSeen) error {
	if err := checkID(id); err != nil {
		return err
	}
	_, _, err := update(ctx, s, id, func(j *Job) bool {
		if old := j.State.Checkpoint; old != nil && (old.Path == c.Path || old.Time.After(c.Time)) {
			return false
		}
		j.State.Checkpoint = &c
		return true
	})
	return err
}

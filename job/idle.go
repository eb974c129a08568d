package job

import (
	"context"
	"strings"
	"time"

	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
)

// IdleMark is a node's note that a running job's GPUs there have stayed under the
// utilisation threshold for the set time (agent --waste-threshold, --waste-after): GPUs
// granted and wasted. The node's agent writes it at gangrun/batch/jobs/<id>/idle/<node>,
// held by its session (it goes when the agent does), and removes it once the GPUs work
// again or the job leaves the node.
type IdleMark struct {
	Node string `json:"node"`
	// GPUs are the job's GPUs on the node (NVML indexes), all under Threshold.
	GPUs []int `json:"gpus"`
	// Since is when they last went under it; MaxUtil is the highest utilisation (in %)
	// of any of them at the last look.
	Since     time.Time `json:"since"`
	MaxUtil   float64   `json:"max_util_percent"`
	Threshold float64   `json:"threshold_percent"`
}

func idlePrefix(id string) string    { return jobsPrefix + id + "/idle/" }
func idleKey(id, node string) string { return idlePrefix(id) + node }
func isIdleKey(id, key string) bool  { return strings.HasPrefix(key, idlePrefix(id)) }

// MarkIdle writes node's idle mark m for job id, held by session (the node agent's).
func MarkIdle(ctx context.Context, s store.Store, session, id string, m IdleMark) error {
	if err := checkID(id); err != nil {
		return err
	}
	b, err := schema.Marshal(schema.IdleMark, m)
	if err != nil {
		return err
	}
	_, err = s.Txn(ctx, []store.Op{{Verb: store.Lock, Key: idleKey(id, m.Node), Value: b, Session: session}})
	return err
}

// ClearIdle removes node's idle mark for job id (none: nothing to do).
func ClearIdle(ctx context.Context, s store.Store, id, node string) error {
	if err := checkID(id); err != nil {
		return err
	}
	_, err := s.Txn(ctx, []store.Op{{Verb: store.Delete, Key: idleKey(id, node)}})
	return err
}

// IdleGPUs counts the GPUs of j's idle marks, and returns the earliest mark's Since
// (zero when none). Marks count only while the job runs.
func (j *Job) IdleGPUs() (int, time.Time) {
	if j.State.Status != Running {
		return 0, time.Time{}
	}
	n, since := 0, time.Time{}
	for _, m := range j.Idle {
		n += len(m.GPUs)
		if since.IsZero() || m.Since.Before(since) {
			since = m.Since
		}
	}
	return n, since
}

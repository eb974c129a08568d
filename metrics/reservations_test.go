package metrics

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/internal/store"
)

// TestReservationsFromTheSchedulersStatus: on the elected agent, gangrun_reservations
// counts the requests the scheduler keeps nodes for (its published status) and
// gangrun_reserved_nodes the distinct nodes kept; an agent that is not elected
// exports neither.
func TestReservationsFromTheSchedulersStatus(t *testing.T) {
	s := store.NewMemory()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, _ := json.Marshal(allocator.SchedulerStatus{Pending: map[string]string{"r1": "Resources", "r2": "Resources"},
		Reserved: map[string][]string{"r1": {"a", "b"}, "r2": {"b", "c"}}, Leader: "a", Updated: time.Now()})
	if _, err := s.Txn(ctx, []store.Op{{Verb: store.Set, Key: "gangrun/scheduler/status", Value: st}}); err != nil {
		t.Fatal(err)
	}
	c := NewSchedulerCollector(s, NewView(s, time.Millisecond))
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	gauge := func() map[string]float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, mf := range mfs {
			if n := mf.GetName(); n == "gangrun_reservations" || n == "gangrun_reserved_nodes" {
				out[n] = mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		return out
	}
	if got := gauge(); len(got) != 0 {
		t.Errorf("not elected: %v, want no reservation series", got)
	}
	go func() { _ = c.Lead(ctx, s, "") }()
	deadline := time.Now().Add(5 * time.Second)
	for !c.leader.Load() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got := gauge(); got["gangrun_reservations"] != 2 || got["gangrun_reserved_nodes"] != 3 {
		t.Errorf("elected: %v, want 2 reservations over 3 nodes", got)
	}
}

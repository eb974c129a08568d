package job

import (
	"context"
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/store"
)

// TestGPUSeconds: the charge is the sum over attempts of the attempt's nodes ×
// --gpus-per-node × its running time, checked against hand-computed numbers.
func TestGPUSeconds(t *testing.T) {
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	for _, tc := range []struct {
		name string
		gpus int
		st   State
		want float64
	}{
		{"never ran", 8, State{Status: Cancelled, Ended: at(5)}, 0},
		{"one attempt: 2 nodes × 4 GPUs × 10 min", 4,
			State{Ended: at(10), Attempts: []Attempt{{Nodes: []string{"a", "b"}, Started: at(0), Ended: at(10)}}}, 2 * 4 * 600},
		{"a restart on other nodes: 8 GPUs × 10 min + 8 GPUs × 30 min; the 2 min between is not charged", 4,
			State{Ended: at(42), Attempts: []Attempt{
				{Nodes: []string{"a", "b"}, Started: at(0), Ended: at(10)},
				{Nodes: []string{"a", "c"}, Started: at(12), Ended: at(42)}}}, 4800 + 14400},
		{"shrunk to one node: 1 node × 2 GPUs × 90 s", 2,
			State{Ended: at(3), Attempts: []Attempt{{Nodes: []string{"a"}, Started: at(0), Ended: t0.Add(90 * time.Second)}}}, 180},
		{"an attempt still open counts to the job's end", 1,
			State{Ended: at(20), Attempts: []Attempt{{Nodes: []string{"a", "b", "c"}, Started: at(5)}}}, 3 * 1 * 900},
		{"an attempt whose nodes were never known is not charged", 8,
			State{Ended: at(20), Attempts: []Attempt{{Started: at(0), Ended: at(20)}}}, 0},
	} {
		if got := GPUSeconds(Spec{GPUsPerNode: tc.gpus}, tc.st); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: %v GPU-seconds, want %v", tc.name, got, tc.want)
		}
	}
}

// putJob writes job j's spec and state as Submit and the controller would.
func putJob(t *testing.T, s store.Store, j Job) {
	t.Helper()
	sp, _ := json.Marshal(j.Spec)
	st, _ := json.Marshal(j.State)
	if _, err := s.Txn(context.Background(), []store.Op{{Verb: store.Set, Key: specKey(j.Spec.ID), Value: sp}, {Verb: store.Set, Key: stateKey(j.Spec.ID), Value: st}}); err != nil {
		t.Fatal(err)
	}
}

// TestRecordWrittenWithTheFinalState: the change that makes a job final writes its
// record in the same transaction, once (a second change of the ended job writes none);
// a pending job's cancel writes it too.
func TestRecordWrittenWithTheFinalState(t *testing.T) {
	ctx := context.Background()
	s := store.NewMemory()
	t0 := time.Now().UTC().Truncate(time.Second)
	spec := Spec{ID: "7", Name: "train", User: "ann", Account: "vision", Partition: "big", GPUsPerNode: 4, Submitted: t0.Add(-time.Hour), CheckpointDir: "/ckpt"}
	putJob(t, s, Job{Spec: spec, State: State{Status: Completing, End: Failed, ExitCode: 3, Nodes: []string{"a", "b"}, Started: t0.Add(-50 * time.Minute),
		RestartsByCause: map[string]int{CauseWorkerExit: 1}, Restarts: 1,
		Attempts: []Attempt{
			{Number: 0, Nodes: []string{"a", "b"}, Started: t0.Add(-50 * time.Minute), Ended: t0.Add(-30 * time.Minute), RestartCause: CauseWorkerExit, WorkersStarted: t0.Add(-50 * time.Minute)},
			{Number: 1, Nodes: []string{"a", "b"}, Started: t0.Add(-30 * time.Minute), Ended: t0.Add(-10 * time.Minute), WorkersStarted: t0.Add(-30 * time.Minute),
				ResumeFromTime: t0.Add(-40 * time.Minute)}}}})
	end := func(j *Job) bool {
		if j.State.Status != Completing {
			return false
		}
		j.State.Status, j.State.Ended = j.State.End, t0
		return true
	}
	if _, changed, err := update(ctx, s, "7", end); err != nil || !changed {
		t.Fatalf("end the job: %v %v", changed, err)
	}
	if _, _, err := update(ctx, s, "7", func(j *Job) bool { j.State.Reason = "later note"; return true }); err != nil {
		t.Fatal(err)
	}
	rs, err := Records(ctx, s, t0.Add(-24*time.Hour), t0.Add(time.Second), Filter{})
	if err != nil || len(rs) != 1 {
		t.Fatalf("records %v %v, want one", rs, err)
	}
	r := rs[0]
	// 2 nodes × 4 GPUs × (20 + 20 min) = 19200 GPU-seconds; productive: 10 min of the
	// first attempt (to the checkpoint at −40 min) + 20 min of the second, over 50 min.
	if r.State != Failed || r.ExitCode != 3 || r.User != "ann" || r.Account != "vision" || r.Partition != "big" || r.Name != "train" ||
		r.NumNodes != 2 || r.GPUs != 8 || r.GPUSeconds != 19200 || r.Elapsed != 3000 || r.Restarts != 1 || r.RestartsByCause[CauseWorkerExit] != 1 ||
		r.ETTR == nil || math.Abs(*r.ETTR-0.6) > 1e-9 || !r.Ended.Equal(t0) || !r.Submitted.Equal(spec.Submitted) {
		b, _ := json.Marshal(r)
		t.Errorf("record %s", b)
	}

	pending := Spec{ID: "8", User: "bob", GPUsPerNode: 1, Submitted: t0}
	putJob(t, s, Job{Spec: pending, State: State{Status: Pending, Reason: "Priority"}})
	if ok, err := Cancel(ctx, s, "8"); err != nil || !ok {
		t.Fatalf("cancel: %v %v", ok, err)
	}
	rs, err = Records(ctx, s, t0.Add(-24*time.Hour), time.Now().Add(time.Minute), Filter{User: "bob"})
	if err != nil || len(rs) != 1 || rs[0].State != Cancelled || rs[0].Account != "bob" || rs[0].GPUSeconds != 0 || !rs[0].Started.IsZero() {
		t.Errorf("the pending job's cancel: records %+v %v, want one CANCELLED, account bob, nothing charged", rs, err)
	}
}

// TestFoldKeepsTheUsage: records past the retention go into their day's rollup and
// are deleted; the report sums the same GPU-hours and jobs before and after; folding
// again counts nothing twice; rollups past RollupRetention are dropped.
func TestFoldKeepsTheUsage(t *testing.T) {
	ctx := context.Background()
	s := store.NewMemory()
	now := time.Date(2025, 6, 30, 12, 0, 0, 0, time.UTC)
	day := func(d int, h int) time.Time { return time.Date(2025, 5, d, h, 0, 0, 0, time.UTC) }
	for _, r := range []Record{
		{ID: "1", User: "ann", Account: "vision", State: Completed, Ended: day(1, 10), GPUSeconds: 3600},           // 1 GPU-hour
		{ID: "2", User: "ann", Account: "vision", State: Failed, Ended: day(1, 23), GPUSeconds: 7200},              // 2
		{ID: "3", User: "bob", Account: "vision", State: Completed, Ended: day(2, 1), GPUSeconds: 1800},            // 0.5
		{ID: "4", User: "bob", Account: "nlp", State: Cancelled, Ended: day(2, 5), GPUSeconds: 0},                  // 0
		{ID: "5", User: "cat", Account: "nlp", State: Timeout, Ended: now.Add(-24 * time.Hour), GPUSeconds: 36000}, // 10, kept
	} {
		if err := WriteRecord(ctx, s, r); err != nil {
			t.Fatal(err)
		}
	}
	// A rollup older than RollupRetention, to be dropped.
	old := Rollup{Day: "2024-01-01"}
	old.Add(Record{User: "ann", Account: "vision", GPUSeconds: 100})
	b, _ := json.Marshal(old)
	if _, err := s.Txn(ctx, []store.Op{{Verb: store.Set, Key: acctDailyKey(old.Day), Value: b}}); err != nil {
		t.Fatal(err)
	}
	since := day(1, 0)
	want := map[string]Usage{ // account/user → jobs, GPU-seconds
		"vision/ann": {Jobs: 2, GPUSeconds: 10800}, "vision/bob": {Jobs: 1, GPUSeconds: 1800},
		"nlp/bob": {Jobs: 1}, "nlp/cat": {Jobs: 1, GPUSeconds: 36000},
		"vision": {Jobs: 3, GPUSeconds: 12600}, "nlp": {Jobs: 2, GPUSeconds: 36000},
	}
	check := func(when string) {
		t.Helper()
		rep, err := Report(ctx, s, since, now)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]Usage{}
		for _, a := range rep {
			got[a.Account] = Usage{Jobs: a.Jobs, GPUSeconds: a.GPUSeconds}
			for _, u := range a.Users {
				got[a.Account+"/"+u.User] = Usage{Jobs: u.Jobs, GPUSeconds: u.GPUSeconds}
			}
		}
		if len(got) != len(want) {
			t.Errorf("%s: report %v, want %v", when, got, want)
		}
		for k, w := range want {
			if g := got[k]; g.Jobs != w.Jobs || g.GPUSeconds != w.GPUSeconds {
				t.Errorf("%s: %s used %+v, want %+v", when, k, g, w)
			}
		}
	}
	check("before the fold")
	cutoff := now.Add(-DefaultAcctRetention) // 2025-05-31 12:00
	n, err := Fold(ctx, s, nil, cutoff, now)
	if err != nil || n != 4 {
		t.Fatalf("fold: %d records, %v; want 4", n, err)
	}
	check("after the fold")
	if n, err := Fold(ctx, s, nil, cutoff, now); err != nil || n != 0 {
		t.Errorf("fold again: %d records, %v; want none", n, err)
	}
	check("after folding again")
	rs, _ := Records(ctx, s, since, now, Filter{})
	if len(rs) != 1 || rs[0].ID != "5" {
		t.Errorf("records left %+v, want job 5 alone", rs)
	}
	ro, _ := Rollups(ctx, s, day(1, 0), day(2, 0))
	if len(ro) != 1 || ro[0].Day != "2025-05-01" || ro[0].Usage["vision"]["ann"].Jobs != 2 || ro[0].Usage["vision"]["ann"].GPUSeconds != 10800 ||
		ro[0].Usage["vision"]["ann"].States[Failed] != 1 {
		t.Errorf("rollup of 2025-05-01: %+v", ro)
	}
	if e, _ := s.Get(ctx, acctDailyKey(old.Day)); e != nil {
		t.Errorf("the rollup of %s outlived RollupRetention", old.Day)
	}
	// A report from the middle of a folded day counts the whole day (day granularity).
	rep, _ := Report(ctx, s, day(2, 3), now)
	total := 0.0
	for _, a := range rep {
		total += a.GPUSeconds
	}
	if total != 1800+36000 {
		t.Errorf("report since 2025-05-02 03:00: %v GPU-seconds, want the folded day 2 (1800) and job 5 (36000)", total)
	}
}

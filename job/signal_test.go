package job

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gangrun/gangrun/audit"
	"github.com/gangrun/gangrun/internal/store"
)

// TestSignalRequests: on the in-memory store with a real elected agent serving the
// boxes, alice's signal of her running job is written into its record (the signal,
// where it goes, who sent it) and leaves it RUNNING; bob's signal of it is refused
// naming alice and audited; a pending job is ErrPending, an ended one ErrFinished, no
// job ErrNotFound; an unknown signal name is scancel's error.
func TestSignalRequests(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := store.NewMemory()
	serveRequests(ctx, t, s)

	before := time.Now().Add(-time.Minute)
	putJob(t, s, Job{Spec: Spec{ID: "80", User: "alice", GPUsPerNode: 1}, State: State{Status: Running, Nodes: []string{"n1"}}})
	putJob(t, s, Job{Spec: Spec{ID: "81", User: "alice", GPUsPerNode: 1}, State: State{Status: Pending}})
	putJob(t, s, Job{Spec: Spec{ID: "82", User: "alice", GPUsPerNode: 1}, State: State{Status: Completed}})
	alice, bob := Asker{User: "alice", Wait: time.Minute}, Asker{User: "bob", Wait: time.Minute}
	if n, err := alice.Signal(ctx, s, "80", syscall.SIGUSR2, SignalSteps); n != 1 || err != nil {
		t.Errorf("alice signals her running job: %d, %v", n, err)
	}
	if n, err := alice.Signal(ctx, s, "80", syscall.SIGTERM, SignalBatch); n != 1 || err != nil {
		t.Errorf("alice signals her job's batch shell: %d, %v", n, err)
	}
	j, err := Read(ctx, s, "80")
	if err != nil {
		t.Fatal(err)
	}
	if j.State.Status != Running || len(j.State.Signals) != 2 {
		t.Fatalf("alice's job after her signals: %s, %+v; want RUNNING with 2 signals", j.State.Status, j.State.Signals)
	}
	if r := j.State.Signals[0]; r.Signal != int(syscall.SIGUSR2) || r.Target != SignalSteps || r.By != "alice" || r.At.Before(before) {
		t.Errorf("the first signal: %+v, want USR2 to steps by alice", r)
	}
	if r := j.State.Signals[1]; r.Signal != int(syscall.SIGTERM) || r.Target != SignalBatch {
		t.Errorf("the second signal: %+v, want TERM to batch", r)
	}
	if _, err := bob.Signal(ctx, s, "80", syscall.SIGUSR2, SignalSteps); !errors.Is(err, ErrNotYours) {
		t.Errorf("bob signals alice's job: %v, want ErrNotYours", err)
	}
	if _, err := alice.Signal(ctx, s, "81", syscall.SIGUSR2, SignalSteps); !errors.Is(err, ErrPending) {
		t.Errorf("a pending job's signal: %v, want ErrPending", err)
	}
	if _, err := alice.Signal(ctx, s, "82", syscall.SIGUSR2, SignalSteps); !errors.Is(err, ErrFinished) {
		t.Errorf("an ended job's signal: %v, want ErrFinished", err)
	}
	if _, err := alice.Signal(ctx, s, "404", syscall.SIGUSR2, SignalSteps); !errors.Is(err, ErrNotFound) {
		t.Errorf("no job's signal: %v, want ErrNotFound", err)
	}
	if j, _ := Read(ctx, s, "80"); len(j.State.Signals) != 2 {
		t.Errorf("alice's job after the refusals: %d signals, want 2", len(j.State.Signals))
	}
	entries, err := audit.List(ctx, s, before, "")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.User+" "+e.Action+" "+e.Target+" "+e.Detail)
	}
	want := "bob signal job 80 USR2 to steps: refused: the job is alice's (your token is bob's)"
	if strings.Join(got, "\n") != want {
		t.Errorf("audit:\n%s\nwant:\n%s", strings.Join(got, "\n"), want)
	}
	for v, want := range map[string]string{"USR2": "", "sigusr1": "", "SIGTERM": "", "10": "", "FOO": "Unknown job signal: FOO", "0": "Unknown job signal: 0"} {
		_, err := SignalNumber(v)
		if got := ""; err != nil {
			got = err.Error()
			if got != want {
				t.Errorf("SignalNumber(%q): %q, want %q", v, got, want)
			}
		} else if want != "" {
			t.Errorf("SignalNumber(%q): no error, want %q", v, want)
		}
	}
}

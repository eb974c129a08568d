package slurm

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/identity"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/job"
	"github.com/gangrun/gangrun/topology"
)

// fakeCluster is a Cluster over a memory store that records the jobs scancel cancels
// and signals.
type fakeCluster struct {
	s                   store.Store
	cancelled, signaled []string
}

type memStore struct{ store.Store }

func (memStore) Close() {}

func (c *fakeCluster) Open(context.Context) (Store, error) { return memStore{c.s}, nil }
func (c *fakeCluster) Munge(context.Context, Store) (*identity.Munge, error) {
	return nil, nil
}
func (c *fakeCluster) Submit(context.Context, Store, job.Spec, *job.Array) (string, []string, error) {
	panic("not used")
}
func (c *fakeCluster) Cancel(_ context.Context, _ Store, id string) (int, error) {
	c.cancelled = append(c.cancelled, id)
	return 1, nil
}
func (c *fakeCluster) Hold(context.Context, Store, string, job.HoldOp) (int, error) {
	panic("not used")
}
func (c *fakeCluster) Update(context.Context, Store, string, job.Update) (int, error) {
	panic("not used")
}
func (c *fakeCluster) Signal(_ context.Context, _ Store, id string, _ syscall.Signal, _ string) (int, error) {
	c.signaled = append(c.signaled, id)
	return 1, nil
}

// TestScancelFilters: -n selects the jobs of that name, among those named when ids are
// given too; --signal with a filter reaches running jobs alone (these are pending).
func TestScancelFilters(t *testing.T) {
	ctx := context.Background()
	s := store.NewMemory()
	inv, err := topology.LoadFile(filepath.Join("..", "topology", "testdata", "inventories", "dgx-h100.json"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(allocator.NodeRecord{Name: "n1", Addr: "127.0.0.1", GPUs: len(inv.GPUs),
		Devices: inv.Allocatable(), Registered: time.Now().UTC()})
	if _, err := s.Txn(ctx, []store.Op{{Verb: store.Set, Key: allocator.ClusterPrefix + "nodes/n1", Value: b}}); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, name := range []string{"a", "b", "a"} {
		id, err := job.Submit(ctx, s, job.Spec{User: "alice", Name: name, Command: []string{"true"}, WorkDir: "/tmp",
			MinNodes: 1, MaxNodes: 1, GPUsPerNode: 1, TimeLimit: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	run := func(args ...string) *fakeCluster {
		t.Helper()
		c := &fakeCluster{s: s}
		var out, errOut bytes.Buffer
		e := &Env{Stdout: &out, Stderr: &errOut, Getenv: func(string) string { return "" }, Cluster: c}
		if code := Scancel(ctx, e, args); code != 0 {
			t.Fatalf("scancel %q: exit %d %s", args, code, errOut.String())
		}
		return c
	}
	if c := run("-n", "a"); !slices.Equal(c.cancelled, []string{ids[0], ids[2]}) || c.signaled != nil {
		t.Errorf("scancel -n a: cancelled %q signalled %q, want %q", c.cancelled, c.signaled, []string{ids[0], ids[2]})
	}
	if c := run("--jobname=a", ids[1], ids[2]); !slices.Equal(c.cancelled, []string{ids[2]}) {
		t.Errorf("scancel --jobname=a %s %s: cancelled %q, want %q", ids[1], ids[2], c.cancelled, ids[2])
	}
	if c := run("-s", "USR1", "-n", "a"); c.signaled != nil || c.cancelled != nil {
		t.Errorf("scancel -s USR1 -n a of pending jobs: signalled %q cancelled %q, want none", c.signaled, c.cancelled)
	}
	if c := run("-s", "USR1", ids[0]); !slices.Equal(c.signaled, []string{ids[0]}) || c.cancelled != nil {
		t.Errorf("scancel -s USR1 %s: signalled %q cancelled %q", ids[0], c.signaled, c.cancelled)
	}
}

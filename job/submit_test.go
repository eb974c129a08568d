package job

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/internal/consultest"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/topology"
)

// registerNode writes node's record as its agent would (the recorded DGX H100's
// devices), with labels.
func registerNode(t *testing.T, s store.Store, node string, labels map[string]string) {
	t.Helper()
	inv, err := topology.LoadFile(filepath.Join("..", "topology", "testdata", "inventories", "dgx-h100.json"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(allocator.NodeRecord{Name: node, Addr: "127.0.0.1", Labels: labels, GPUs: len(inv.GPUs),
		Devices: inv.Allocatable(), Registered: time.Now().UTC()})
	if _, err := s.Txn(context.Background(), []store.Op{{Verb: store.Set, Key: allocator.ClusterPrefix + "nodes/" + node, Value: b}}); err != nil {
		t.Fatal(err)
	}
}

// TestConcurrentSubmitsTakeUniqueIDs: submitters in two processes (two store clients),
// several at once in each, get every id once, 1 to N with none skipped, and every job
// is queued whole under its id; a one-off submit through a third client between them
// takes the next id too.
func TestConcurrentSubmitsTakeUniqueIDs(t *testing.T) {
	agent := consultest.Start(t)
	clients := []*store.Consul{consultest.ConsulStore(t, agent), consultest.ConsulStore(t, agent)}
	registerNode(t, clients[0], "n1", nil)
	ctx := context.Background()
	const perClient, each = 4, 15
	var mu sync.Mutex
	names := map[string]string{} // id → the name submitted under it
	var wg sync.WaitGroup
	for c, s := range clients {
		for g := range perClient {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := range each {
					name := fmt.Sprintf("c%d-g%d-%d", c, g, k)
					id, err := Submit(ctx, s, Spec{Name: name, User: "u", MinNodes: 1, MaxNodes: 1, GPUsPerNode: 1,
						Command: []string{"true"}, WorkDir: t.TempDir()})
					if err != nil {
						t.Errorf("submit %s: %v", name, err)
						return
					}
					mu.Lock()
					if was, ok := names[id]; ok {
						t.Errorf("id %s given twice: to %s and to %s", id, was, name)
					}
					names[id] = name
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	const n = 2 * perClient * each
	if len(names) != n {
		t.Fatalf("%d ids for %d submits", len(names), n)
	}
	for i := 1; i <= n; i++ {
		id := strconv.Itoa(i)
		name, ok := names[id]
		if !ok {
			t.Errorf("id %s was skipped", id)
			continue
		}
		j, err := Read(ctx, clients[0], id)
		if err != nil || j.Spec.Name != name || j.Spec.ID != id || j.State.Status != Pending {
			t.Errorf("job %s (submitted as %s): %+v, %v", id, name, j, err)
		}
		if e, err := clients[1].Get(ctx, allocator.RequestKey(id)); err != nil || e == nil {
			t.Errorf("job %s has no request: %v", id, err)
		}
	}
	// A one-off submitter between the two clients' submits; then each client again:
	// each takes the next id, whatever the client last wrote.
	other := consultest.ConsulStore(t, agent)
	for i, s := range []store.Store{other, clients[0], clients[1], other} {
		id, err := Submit(ctx, s, Spec{Name: "after", User: "u", MinNodes: 1, MaxNodes: 1, GPUsPerNode: 1, Command: []string{"true"}, WorkDir: t.TempDir()})
		if want := strconv.Itoa(n + 1 + i); err != nil || id != want {
			t.Errorf("submit %d after the others: id %q, %v; want %s", i, id, err, want)
		}
	}
}

// TestSubmitRefusalNamesTheFlagsGiven: a job that, with its spares or its minimum
// nodes, needs more nodes than are registered is refused naming --nodes and
// --spare-nodes as given, not their sum.
func TestSubmitRefusalNamesTheFlagsGiven(t *testing.T) {
	s := store.NewMemory()
	registerNode(t, s, "a", nil)
	registerNode(t, s, "b", nil)
	for _, c := range []struct {
		min, max, spares int
		want             string
	}{
		{2, 2, 1, "--nodes 2 --spare-nodes 1: only 2 registered nodes could ever take 4 GPUs each with these constraints (the job and its spares need 3)"},
		{3, 4, 0, "--nodes 3:4: only 2 registered nodes could ever take 4 GPUs each with these constraints"},
		{1, 2, 2, "--nodes 1:2 --spare-nodes 2: only 2 registered nodes could ever take 4 GPUs each with these constraints (the job and its spares need 3)"},
	} {
		_, err := Submit(context.Background(), s, Spec{User: "u", MinNodes: c.min, MaxNodes: c.max, SpareNodes: c.spares, GPUsPerNode: 4,
			Command: []string{"true"}, WorkDir: t.TempDir()})
		if !errors.Is(err, ErrInvalid) || err.Error() != c.want {
			t.Errorf("--nodes %d:%d --spare-nodes %d: %v, want %q", c.min, c.max, c.spares, err, c.want)
		}
	}
}

// TestSubmitChecksTheNodesAsTheyAreNow: a client that keeps the node records between
// submits refuses and accepts as a fresh read would: a partition whose only node went
// is refused at once, a partition whose node just registered is accepted at once.
func TestSubmitChecksTheNodesAsTheyAreNow(t *testing.T) {
	agent := consultest.Start(t)
	s := consultest.ConsulStore(t, agent)
	ctx := context.Background()
	registerNode(t, s, "a1", map[string]string{allocator.LabelPartition: "a"})
	registerNode(t, s, "b1", map[string]string{allocator.LabelPartition: "b"})
	submit := func(partition string, gpus int) error {
		t.Helper()
		_, err := Submit(ctx, s, Spec{Name: partition, User: "u", Partition: partition, MinNodes: 1, MaxNodes: 1, GPUsPerNode: gpus,
			Command: []string{"true"}, WorkDir: t.TempDir()})
		return err
	}
	for _, p := range []string{"a", "b"} {
		if err := submit(p, 1); err != nil {
			t.Fatalf("--partition %s: %v", p, err)
		}
	}
	if err := submit("c", 1); !errors.Is(err, ErrInvalid) {
		t.Fatalf("--partition c before its node registered: %v, want refused", err)
	}
	// Node b1 leaves; c1 registers; a1 loses its GPUs but two (a record rewritten).
	if _, err := s.Txn(ctx, []store.Op{{Verb: store.Delete, Key: allocator.ClusterPrefix + "nodes/b1"}}); err != nil {
		t.Fatal(err)
	}
	registerNode(t, s, "c1", map[string]string{allocator.LabelPartition: "c"})
	if err := submit("c", 1); err != nil {
		t.Errorf("--partition c just after its node registered: %v", err)
	}
	if err := submit("b", 1); !errors.Is(err, ErrInvalid) {
		t.Errorf("--partition b after its only node left: %v, want refused", err)
	}
	rec, err := s.Get(ctx, allocator.ClusterPrefix+"nodes/a1")
	if err != nil || rec == nil {
		t.Fatal(rec, err)
	}
	var r allocator.NodeRecord
	if err := json.Unmarshal(rec.Value, &r); err != nil {
		t.Fatal(err)
	}
	r.Devices = r.Devices[:2]
	b, _ := json.Marshal(r)
	if _, err := s.Txn(ctx, []store.Op{{Verb: store.Set, Key: rec.Key, Value: b}}); err != nil {
		t.Fatal(err)
	}
	if err := submit("a", 4); !errors.Is(err, ErrInvalid) {
		t.Errorf("--gpus-per-node 4 after a's only node kept 2: %v, want refused", err)
	}
	if err := submit("a", 2); err != nil {
		t.Errorf("--gpus-per-node 2 on a: %v", err)
	}
	jobs, err := List(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, j := range jobs {
		got = append(got, j.Spec.Partition)
	}
	if want := []string{"a", "b", "c", "a"}; !slices.Equal(got, want) {
		t.Errorf("queued jobs' partitions %v, want %v", got, want)
	}
}

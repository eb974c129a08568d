package metrics

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/internal/consultest"
	"github.com/gangrun/gangrun/topology"
)

// mappingFiles returns dir's files by name and content, as dcgm-exporter reads them:
// not the writer's temporary files (a rename can take one away between the listing and
// the read, which made the test fail under load).
func mappingFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, de := range des {
		if strings.HasPrefix(de.Name(), ".") {
			continue // the writer's temporary file, which dcgm-exporter skips too
		}
		b, err := os.ReadFile(filepath.Join(dir, de.Name()))
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed between the listing and the read: a GPU given back
		}
		if err != nil {
			t.Fatal(err)
		}
		out[de.Name()] = string(b)
	}
	return out
}

// TestDCGMJobMappingFiles: on a real Consul, with a node agent in this process (a DGX
// H100's inventory), WriteJobMapping keeps dcgm-exporter's HPC job-mapping directory: a
// stale file of a free GPU left by an earlier agent goes at once (a file whose name is
// not a GPU index stays); each GPU two grants hold gets a file named by its index
// holding the grant's id; a grant given back removes its GPUs' files and leaves the
// other grant's.
func TestDCGMJobMappingFiles(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := consultest.ConsulStore(t, consultest.Start(t))
	m := newMockNode(t, dgxh100.New(), "gpu-m")
	a, err := allocator.NewAgent(s, allocator.AgentConfig{Node: "gpu-m", Addr: "127.0.0.1", Inventory: m.inv})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitFor(t, 20*time.Second, func() bool { return a.Session() != "" }, "the agent registered")

	dir := filepath.Join(t.TempDir(), "dcgm-job-map")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{"5": "stale\n", "README": "not a GPU\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	go func() {
		_ = WriteJobMapping(ctx, JobMappingConfig{Store: s, Node: "gpu-m", Dir: dir, Inventory: func() *topology.Inventory { return m.inv }})
	}()
	waitFor(t, 10*time.Second, func() bool { _, stale := mappingFiles(t, dir)["5"]; return !stale }, "the stale file of free GPU 5 removed")

	grant := func(gpus int) (*allocator.Ticket, allocator.Grant) {
		t.Helper()
		tk, err := allocator.Submit(ctx, s, allocator.Request{Nodes: 1, GPUsPerNode: gpus})
		if err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
		defer wcancel()
		g, err := tk.Wait(wctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		return tk, g
	}
	ta, ga := grant(2)
	tb, gb := grant(3)
	want := map[string]string{"README": "not a GPU\n"}
	for _, g := range []allocator.Grant{ga, gb} {
		for _, d := range g.Nodes[0].Devices {
			want[d] = g.ID + "\n" // whole GPUs: the device id is the GPU's index
		}
	}
	same := func(got, want map[string]string) bool {
		if len(got) != len(want) {
			return false
		}
		for k, v := range want {
			if got[k] != v {
				return false
			}
		}
		return true
	}
	var got map[string]string
	waitFor(t, 10*time.Second, func() bool { got = mappingFiles(t, dir); return same(got, want) }, "a file per held GPU with its grant's id")
	t.Logf("held: %v", got)

	if err := ta.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, d := range ga.Nodes[0].Devices {
		delete(want, d)
	}
	waitFor(t, 10*time.Second, func() bool { got = mappingFiles(t, dir); return same(got, want) }, "the released grant's files removed, the other's kept")
	if err := tb.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool { got = mappingFiles(t, dir); return same(got, map[string]string{"README": "not a GPU\n"}) }, "every GPU file removed")
}

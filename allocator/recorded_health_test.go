package allocator

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gangrun/gangrun/topology"
)

// TestRecordedHealthSkipsBadLines: a replayed health stream reports the changes of the
// node's GPUs and skips, naming them, lines that are not JSON, name a GPU the inventory
// lacks, or carry an unknown state.
func TestRecordedHealthSkipsBadLines(t *testing.T) {
	inv, err := topology.LoadFile(filepath.Join("..", "topology", "testdata", "inventories", "dgx-h100.json"))
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "health")
	lines := strings.Join([]string{
		`not json`,
		`{"Index": 99, "Xid": 79, "Health": {"state": "failed"}}`,
		`{"Index": 0, "Health": {"state": "bogus"}}`,
		`{"Index": 3, "Xid": 79, "Health": {"state": "failed", "reasons": ["Xid 79"]}}`,
	}, "\n") + "\n"
	if err := os.WriteFile(file, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var reported []topology.GPUHealthChange
	var bad []string
	src := RecordedHealth(file, func(line string, err error) {
		mu.Lock()
		bad = append(bad, line+": "+err.Error())
		mu.Unlock()
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = src(ctx, inv, func(ch topology.GPUHealthChange) {
		mu.Lock()
		reported = append(reported, ch)
		mu.Unlock()
	})
	mu.Lock()
	defer mu.Unlock()
	if len(reported) != 1 || reported[0].Index != 3 || reported[0].Health.State != topology.Failed {
		t.Errorf("reported %+v, want GPU 3 failed only", reported)
	}
	if len(bad) != 3 || !strings.Contains(bad[1], "GPU index 99") || !strings.Contains(bad[2], `"bogus"`) {
		t.Errorf("skipped lines %q, want the three bad ones named", bad)
	}
}

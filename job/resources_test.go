package job

import (
	"math"
	"strings"
	"testing"
)

// TestNodeCPUsAndMem: a job's CPUs and memory per node, by Slurm's rules: tasks on the
// node (the most any gets) × --cpus-per-task; --mem, or --mem-per-cpu × those CPUs,
// or --mem-per-gpu × the node's GPUs; gangrun's own job one CPU per GPU. A product
// past int64 saturates, and Validate refuses it.
func TestNodeCPUsAndMem(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name      string
		s         Spec
		cpus      int
		mem       int64
		refusedAs string
	}{
		{"own job", Spec{GPUsPerNode: 4, MinNodes: 1, Mem: 100 * mib}, 4, 100 * mib, ""},
		{"batch default", Spec{MinNodes: 1, Batch: &Batch{}}, 1, 0, ""},
		{"ntasks over nodes", Spec{MinNodes: 2, Batch: &Batch{NTasks: 5, CPUsPerTask: 3}}, 9, 0, ""},
		{"per node", Spec{MinNodes: 2, Batch: &Batch{NTasksPerNode: 4, CPUsPerTask: 2}, MemPerCPU: 10 * mib}, 8, 80 * mib, ""},
		{"per GPU", Spec{MinNodes: 1, GPUsPerNode: 3, Batch: &Batch{}, MemPerGPU: 1000 * mib}, 1, 3000 * mib, ""},
		{"too small", Spec{MinNodes: 1, Batch: &Batch{}, MemPerCPU: mib}, 1, mib, "want at least 16M"},
		{"overflow", Spec{MinNodes: 1, Batch: &Batch{NTasksPerNode: 1 << 24, CPUsPerTask: 1 << 24}, MemPerCPU: 1 << 50}, 1 << 48, math.MaxInt64, "want at most 1P"},
		{"two", Spec{MinNodes: 1, Batch: &Batch{}, Mem: 100 * mib, MemPerCPU: 100 * mib}, 1, 100 * mib, "mutually exclusive"},
	} {
		if got := tc.s.NodeCPUs(); got != tc.cpus {
			t.Errorf("%s: NodeCPUs %d, want %d", tc.name, got, tc.cpus)
		}
		if got := tc.s.NodeMem(); got != tc.mem {
			t.Errorf("%s: NodeMem %d, want %d", tc.name, got, tc.mem)
		}
		s := tc.s
		s.MaxNodes, s.Command, s.WorkDir = s.MinNodes, []string{"true"}, "/tmp"
		err := s.Validate()
		if tc.refusedAs == "" && err != nil && strings.Contains(err.Error(), "mem") {
			t.Errorf("%s: refused: %v", tc.name, err)
		}
		if tc.refusedAs != "" && (err == nil || !strings.Contains(err.Error(), tc.refusedAs)) {
			t.Errorf("%s: Validate %v, want it refused saying %q", tc.name, err, tc.refusedAs)
		}
	}
}

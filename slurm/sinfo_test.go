package slurm

import (
	"testing"

	"github.com/gangrun/gangrun/allocator"
)

// TestSinfoNodeCounts: %c and %m are the nodes' count where they agree, else the least
// and "+"; %e is the memory no job holds, "MIN-MAX" where the nodes differ, "N/A" for
// no node.
func TestSinfoNodeCounts(t *testing.T) {
	a := allocator.NodeStatus{Name: "a", CPUsTotal: 8, MemoryMiB: 4096, MemoryUsedMiB: 1024}
	b := allocator.NodeStatus{Name: "b", CPUsTotal: 16, MemoryMiB: 4096, MemoryUsedMiB: 5000}
	cpus := func(n allocator.NodeStatus) int64 { return int64(n.CPUsTotal) }
	mem := func(n allocator.NodeStatus) int64 { return n.MemoryMiB }
	for _, tc := range []struct{ got, want string }{
		{minPlus([]allocator.NodeStatus{a}, cpus), "8"},
		{minPlus([]allocator.NodeStatus{b, a}, cpus), "8+"},
		{minPlus([]allocator.NodeStatus{a, b}, mem), "4096"},
		{minPlus(nil, cpus), "0"},
		{freeMem([]allocator.NodeStatus{a}), "3072"},
		{freeMem([]allocator.NodeStatus{a, b}), "0-3072"}, // b's jobs hold more than it has
		{freeMem(nil), "N/A"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

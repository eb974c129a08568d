package slurm

import (
	"testing"

	"github.com/gangrun/gangrun/job"
)

// TestSlurmMem: memory as Slurm 22.05's squeue %m and scontrol show job's
// MinMemoryNode, MinMemoryCPU and TRES write it (read from a real Slurm: --mem=1500,
// 2048, 4G, 3000000K, --mem-per-cpu=1536, 1G, --mem=300G).
func TestSlurmMem(t *testing.T) {
	for mib, want := range map[int64]string{0: "0", 100: "100M", 1500: "1500M", 1536: "1.50G", 2048: "2G", 4096: "4G",
		2929: "2929M", 1024: "1G", 300 << 10: "300G", 3 << 20: "3T"} {
		if got := slurmMem(mib); got != want {
			t.Errorf("slurmMem(%d) = %q, want %q", mib, got, want)
		}
	}
	if got := minMemory(job.Spec{MemPerCPU: 1536 << 20}); got != "1.50G" {
		t.Errorf("--mem-per-cpu=1536: MIN_MEMORY %q, want 1.50G", got)
	}
	if got := minMemory(job.Spec{MemPerGPU: 100 << 20, GPUsPerNode: 2}); got != "0" {
		t.Errorf("--mem-per-gpu=100: MIN_MEMORY %q, want 0 (Slurm's MemPerTres)", got)
	}
}

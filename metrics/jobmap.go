package metrics

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/topology"
)

// JobMappingConfig configures WriteJobMapping.
type JobMappingConfig struct {
	Store store.Store
	// Node is this node's name.
	Node string
	// Dir is dcgm-exporter's HPC job-mapping directory (its --hpc-job-mapping-dir).
	Dir string
	// Inventory returns the node's inventory: which GPU each allocatable device is on.
	Inventory func() *topology.Inventory
	Log       *zap.Logger
}

// WriteJobMapping keeps, until ctx ends, dcgm-exporter's HPC job-mapping files in
// cfg.Dir for this node's GPUs: one file per GPU, named by its NVML index ("0", "1",
// ...), holding the id of the job (or `gangrun alloc` grant) holding it, one per line
// (several for a MIG GPU whose devices several jobs hold) — the format of
// dcgm-exporter's hpcMapper (internal/pkg/transformation/hpc.go), which labels the
// GPU's metrics hpc_job with each line. It follows the node's device keys with a
// blocking query: a file is written (to a temporary name, then renamed, so that
// dcgm-exporter never reads half of one) when its GPU's holders change, and removed
// when the GPU is freed. Files of GPUs not held are removed at the start too (an agent
// that stopped while a job ran); files whose names are not GPU indexes are left alone.
// The files stay when ctx ends: the jobs' steps outlive their agent.
func WriteJobMapping(ctx context.Context, cfg JobMappingConfig) error {
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return fmt.Errorf("dcgm job-mapping dir: %w", err)
	}
	w := store.NewWatcher(cfg.Store, allocator.NodeGPUsPrefix(cfg.Node))
	written := map[int]string{} // GPU → its file's content (absent: no file)
	first := true
	for {
		entries, err := w.Next(ctx)
		if err != nil {
			return nil
		}
		want := jobMapping(cfg.Inventory(), allocator.HeldDevices(entries))
		if first {
			if written, err = existingMapping(cfg.Dir); err != nil {
				log.Warn("dcgm job mapping: read the directory", zap.Error(err))
			}
			first = false
		}
		for _, gpu := range slices.Sorted(maps.Keys(want)) {
			if written[gpu] == want[gpu] {
				continue
			}
			if err := writeAtomic(cfg.Dir, gpu, want[gpu]); err != nil {
				log.Warn("dcgm job mapping: write", zap.Int("gpu", gpu), zap.Error(err))
				continue
			}
			written[gpu] = want[gpu]
		}
		for _, gpu := range slices.Sorted(maps.Keys(written)) {
			if _, held := want[gpu]; held {
				continue
			}
			if err := os.Remove(filepath.Join(cfg.Dir, strconv.Itoa(gpu))); err != nil && !errors.Is(err, fs.ErrNotExist) {
				log.Warn("dcgm job mapping: remove", zap.Int("gpu", gpu), zap.Error(err))
				continue
			}
			delete(written, gpu)
		}
	}
}

// jobMapping returns each held GPU's file content: the ids of the grants holding its
// devices, sorted, one per line.
func jobMapping(inv *topology.Inventory, held map[string]string) map[int]string {
	ids := map[int][]string{}
	for _, d := range inv.Allocatable() {
		if id, ok := held[d.ID]; ok && !slices.Contains(ids[d.GPU], id) {
			ids[d.GPU] = append(ids[d.GPU], id)
		}
	}
	out := map[int]string{}
	for gpu, list := range ids {
		slices.Sort(list)
		out[gpu] = strings.Join(list, "\n") + "\n"
	}
	return out
}

// existingMapping reads the mapping files already in dir (named by a GPU index).
func existingMapping(dir string) (map[int]string, error) {
	out := map[int]string{}
	des, err := os.ReadDir(dir)
	if err != nil {
		return out, err
	}
	for _, de := range des {
		gpu, err := strconv.Atoi(de.Name())
		if err != nil || gpu < 0 || !de.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, de.Name()))
		if err != nil {
			return out, err
		}
		out[gpu] = string(b)
	}
	return out, nil
}

// writeAtomic writes GPU gpu's file: a temporary file (a name dcgm-exporter skips: not
// a number), then a rename over the old one.
func writeAtomic(dir string, gpu int, content string) error {
	tmp := filepath.Join(dir, "."+strconv.Itoa(gpu)+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, strconv.Itoa(gpu))); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

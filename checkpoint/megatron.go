package checkpoint

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// Megatron-LM's per-rank directories inside iter_NNNNNNN (megatron/training/
// checkpointing.py, get_checkpoint_name): mp_rank_{tp:02d}, with pipeline parallelism
// mp_rank_{tp:02d}_{pp:03d}, with expert parallelism one more _{ep:03d}; each holds
// model_optim_rng.pt, and distrib_optim.pt with the distributed optimizer.
var megatronRankRe = regexp.MustCompile(`^mp_rank_([0-9]+)(?:_([0-9]+))?(?:_([0-9]+))?$`)

const (
	megatronModelFile = "model_optim_rng.pt"
	megatronOptimFile = "distrib_optim.pt"
)

// hasMegatronRanks reports whether a directory listing holds mp_rank_* directories.
func hasMegatronRanks(entries []fs.DirEntry) bool {
	for _, e := range entries {
		if megatronRankRe.MatchString(e.Name()) {
			return true
		}
	}
	return false
}

// checkMegatron applies Megatron-LM's rule to an iter_NNNNNNN (or release) directory:
// the torch_dist / torch_dcp / fsdp_dtensor formats are torch.distributed.checkpoint
// directories (complete with a non-empty `.metadata`); the legacy torch format is
// complete when checkMegatronEntries holds.
func checkMegatron(dir string) verdict {
	if _, err := os.Lstat(filepath.Join(dir, dcpMetadata)); !errors.Is(err, fs.ErrNotExist) {
		return checkDCP(dir, FormatMegatron)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return notDone(FormatMegatron, "%s", describeFSError(err))
	}
	if !hasMegatronRanks(entries) {
		return notDone(FormatMegatron, "no %s (torch_dist) and no mp_rank_*/%s (legacy torch format): the save did not finish", dcpMetadata, megatronModelFile)
	}
	return checkMegatronEntries(dir, entries)
}

// checkMegatronEntries is the legacy torch format's rule: every mp_rank_* directory
// holds a non-empty model_optim_rng.pt (and distrib_optim.pt, when present, is not
// empty), and the rank tuples form a full grid — every combination of the tensor,
// pipeline and expert ranks seen, from 0.
func checkMegatronEntries(dir string, entries []fs.DirEntry) verdict {
	seen := map[string]bool{}
	dims := -1
	maxes := []int{}
	for _, e := range entries {
		m := megatronRankRe.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		parts := []string{m[1]}
		for _, p := range m[2:] {
			if p != "" {
				parts = append(parts, p)
			}
		}
		if dims >= 0 && len(parts) != dims {
			return notDone(FormatMegatron, "rank directories mix naming schemes (%s)", e.Name())
		}
		if dims < 0 {
			dims = len(parts)
			maxes = make([]int, dims)
		}
		key := make([]string, dims)
		for i, p := range parts {
			n := atoiSmall(p)
			if n < 0 {
				return notDone(FormatMegatron, "rank directory %s: rank out of range", e.Name())
			}
			if n > maxes[i] {
				maxes[i] = n
			}
			key[i] = strconv.Itoa(n)
		}
		seen[strings.Join(key, "_")] = true
		rankDir := filepath.Join(dir, e.Name())
		fi, err := os.Stat(filepath.Join(rankDir, megatronModelFile))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return notDone(FormatMegatron, "%s/%s missing", e.Name(), megatronModelFile)
		case err != nil:
			return notDone(FormatMegatron, "%s/%s: %s", e.Name(), megatronModelFile, describeFSError(err))
		case !fi.Mode().IsRegular() || fi.Size() == 0:
			return notDone(FormatMegatron, "%s/%s is empty or not a regular file", e.Name(), megatronModelFile)
		}
		if fi, err := os.Stat(filepath.Join(rankDir, megatronOptimFile)); err == nil && fi.Size() == 0 {
			return notDone(FormatMegatron, "%s/%s is empty (0 bytes)", e.Name(), megatronOptimFile)
		}
	}
	total := 1
	for _, m := range maxes {
		total *= m + 1
		if total > 1<<20 {
			return notDone(FormatMegatron, "rank numbers out of range")
		}
	}
	if len(seen) != total {
		return notDone(FormatMegatron, "%d of %d rank directories present (ranks up to mp_rank_%s): some ranks did not save",
			len(seen), total, joinInts(maxes))
	}
	return done(FormatMegatron)
}

func joinInts(ns []int) string {
	parts := make([]string, len(ns))
	for i, n := range ns {
		parts[i] = strconv.Itoa(n)
	}
	return strings.Join(parts, "_")
}

package checkpoint

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	"github.com/gangrun/gangrun/internal/userfile"
)

// FormatTorchtitan is torchtitan's step-N directories (torchtitan/components/
// checkpointer/dcp.py): a torch.distributed.checkpoint directory, or, for the last
// save with --checkpoint.last_save_in_hf, a Hugging Face safetensors export.
const FormatTorchtitan Format = "torchtitan"

// hfIndex is the Hugging Face sharded-weights index (torch.distributed.checkpoint's
// _hf_utils._metadata_fn, transformers' SAFE_WEIGHTS_INDEX_NAME).
const hfIndex = "model.safetensors.index.json"

// maxHFIndexBytes bounds how much of the index is read, in bytes (64 MiB): it maps each
// tensor name to its file, a few MiB for the largest models.
const maxHFIndexBytes = 64 << 20

// torchtitanLayout is torchtitan's: CheckpointManager._find_load_step takes the highest
// step-N whose directory holds `.metadata` (a DCP checkpoint) or
// model.safetensors.index.json (an HF export: dcp_save with to_hf writes the shards,
// then consolidate_safetensors_files writes the index last). `.metadata` directories
// stay the dcp layout's under auto-detection; this layout judges the ones holding the
// index. It owns no name.
type torchtitanLayout struct{}

func (torchtitanLayout) info() layoutInfo {
	return layoutInfo{format: FormatTorchtitan, marker: hfIndex}
}

func (torchtitanLayout) candidate(_, name string, typ fs.FileMode) *candidate {
	return stepDirCandidate(name, typ, famStep)
}

func (torchtitanLayout) reserves(string) bool { return false }

// judge: _find_load_step's test — `.metadata` (the dcp rule) or the HF index
// (checkHFExport).
func (torchtitanLayout) judge(s *scan, c *candidate) verdict {
	dir := s.path(c)
	if _, err := os.Lstat(filepath.Join(dir, dcpMetadata)); err == nil {
		return checkDCP(dir, FormatTorchtitan)
	}
	if _, err := os.Lstat(filepath.Join(dir, hfIndex)); err == nil {
		return checkHFExport(dir, FormatTorchtitan)
	}
	if _, err := os.Stat(dir); err != nil {
		return notDone(FormatTorchtitan, "%s", describeFSError(err))
	}
	return notDone(FormatTorchtitan, "neither %s nor %s: torchtitan's _find_load_step skips it (the save did not finish)", dcpMetadata, hfIndex)
}

func (torchtitanLayout) claim(*scan, *candidate) nameClaim { return notMine }

func (torchtitanLayout) detect(_ *scan, _ *candidate, dir string, entries []fs.DirEntry) (verdict, bool) {
	if hasEntry(entries, hfIndex) {
		return checkHFExport(dir, FormatTorchtitan), true
	}
	return verdict{}, false
}

func (torchtitanLayout) notes(*scan) []string { return nil }

// checkHFExport judges a Hugging Face safetensors export: the index is a regular file
// holding a JSON object whose weight_map names each tensor's file, and every file it
// names is a whole safetensors file in dir (checkSafetensorsFile). torchtitan's
// _find_load_step looks only for the index, written after every shard; loading then
// reads each file the index names, so a missing or cut shard (storage that lost it) is
// not resumed from either.
func checkHFExport(dir string, label Format) verdict {
	data, err := userfile.ReadFile(filepath.Join(dir, hfIndex), maxHFIndexBytes)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return notDone(label, "no %s: it is written after every shard", hfIndex)
	case err != nil:
		return notDone(label, "%s: %s", hfIndex, describeFSError(err))
	}
	var index struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(data, &index); err != nil {
		return notDone(label, "%s is not valid JSON (truncated?): it is written in place after every shard", hfIndex)
	}
	if len(index.WeightMap) == 0 {
		return notDone(label, "%s has no weight_map", hfIndex)
	}
	files := map[string]bool{}
	for _, f := range index.WeightMap {
		files[f] = true
	}
	names := make([]string, 0, len(files))
	for f := range files {
		if !validTag(f) {
			return notDone(label, "%s names %q, not a file of the checkpoint", hfIndex, clip(f))
		}
		names = append(names, f)
	}
	sort.Strings(names)
	for _, f := range names {
		if v, ok := checkSafetensorsFile(dir, f, label); !ok {
			return v
		}
	}
	return done(label)
}

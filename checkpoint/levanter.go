package checkpoint

import (
	"encoding/json"
	"errors"
	"io/fs"
	"path/filepath"

	"github.com/gangrun/gangrun/internal/userfile"
)

// FormatLevanter is Levanter's step-N checkpoints (src/levanter/checkpoint.py): tensorstore
// arrays, then metadata.json written last.
const FormatLevanter Format = "levanter"

// levanterMetadata is the file save_checkpoint's commit callback writes (process 0,
// _save_metadata) once tree_serialize_leaves_tensorstore has committed every array:
// {"step", "timestamp", "is_temporary"}.
const levanterMetadata = "metadata.json"

// maxLevanterMetadataBytes bounds how much of metadata.json is read, in bytes.
const maxLevanterMetadataBytes = 1 << 20

// levanterLayout is Levanter's layout: step-N directories. It owns no name; under
// auto-detection a metadata.json inside a step directory decides, after the layouts
// with a more specific marker (Megatron-LM's torch_dist directories hold a
// metadata.json of their own next to `.metadata`).
type levanterLayout struct{}

func (levanterLayout) info() layoutInfo {
	return layoutInfo{format: FormatLevanter, marker: levanterMetadata}
}

func (levanterLayout) candidate(_, name string, typ fs.FileMode) *candidate {
	return stepDirCandidate(name, typ, famStep)
}

func (levanterLayout) reserves(string) bool { return false }

func (levanterLayout) judge(s *scan, c *candidate) verdict { return checkLevanter(s.path(c)) }

func (levanterLayout) claim(*scan, *candidate) nameClaim { return notMine }

// detect: metadata.json in a step directory (or a Verify path of no family).
func (levanterLayout) detect(_ *scan, c *candidate, dir string, entries []fs.DirEntry) (verdict, bool) {
	if (c.fam == famStep || c.fam == famNone) && hasEntry(entries, levanterMetadata) {
		return checkLevanter(dir), true
	}
	return verdict{}, false
}

func (levanterLayout) notes(*scan) []string { return nil }

// checkLevanter applies Levanter's rule: discover_latest_checkpoint takes a directory
// holding metadata.json, and sorts the ones it found by the file's timestamp
// (datetime.fromisoformat) and step, so the file must be a JSON object with a string
// timestamp and a numeric step; it is written in place (fs.open "w", json.dump), so a
// cut write leaves invalid JSON.
func checkLevanter(dir string) verdict {
	data, err := userfile.ReadFile(filepath.Join(dir, levanterMetadata), maxLevanterMetadataBytes)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return notDone(FormatLevanter, "no %s: Levanter writes it once every array is committed, so the save did not finish", levanterMetadata)
	case err != nil:
		return notDone(FormatLevanter, "%s: %s", levanterMetadata, describeFSError(err))
	}
	var md struct {
		Step      *json.Number `json:"step"`
		Timestamp *string      `json:"timestamp"`
	}
	if err := json.Unmarshal(data, &md); err != nil {
		return notDone(FormatLevanter, "%s is not a JSON object (truncated?)", levanterMetadata)
	}
	if md.Step == nil || md.Timestamp == nil || *md.Timestamp == "" {
		return notDone(FormatLevanter, "%s lacks step or timestamp, which discover_latest_checkpoint sorts by", levanterMetadata)
	}
	if _, err := md.Step.Int64(); err != nil {
		return notDone(FormatLevanter, "%s: step %s is not an integer", levanterMetadata, clip(md.Step.String()))
	}
	return done(FormatLevanter)
}

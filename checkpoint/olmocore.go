package checkpoint

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"

	"github.com/gangrun/gangrun/internal/userfile"
)

// FormatOLMoCore is AI2's OLMo-core trainer's stepN checkpoints
// (src/olmo_core/train/checkpoint.py, Checkpointer).
const FormatOLMoCore Format = "olmo-core"

// famOLMoTemp: stepN-tmp, the directory Checkpointer.save writes into and renames to
// stepN once every rank has saved (_get_tmp_dir, _teardown_tmp_dir).
const famOLMoTemp family = "olmo-tmp"

// OLMo-core's files inside stepN (Checkpointer): train/rank{R}.pt (each rank's trainer
// state, torch.save), model_and_optim/ (torch.distributed.checkpoint), and
// .metadata.json (METADATA_FNAME), written by rank 0 once the directory is in place.
const (
	olmoMetadata   = ".metadata.json"
	olmoTrainState = "train/rank0.pt"
	olmoModelDir   = "model_and_optim"
)

// maxOLMoMetadataBytes bounds how much of .metadata.json is read, in bytes.
const maxOLMoMetadataBytes = 1 << 20

var olmoTempRe = regexp.MustCompile(`^step([0-9]+)-tmp$`)

// olmoCoreLayout is OLMo-core's layout: stepN directories (CHECKPOINT_DIR "step{step}")
// and the stepN-tmp staging directory. Under auto-detection it owns the staging name;
// a .metadata.json or model_and_optim/ inside a directory decides.
type olmoCoreLayout struct{}

func (olmoCoreLayout) info() layoutInfo {
	return layoutInfo{format: FormatOLMoCore, names: "OLMo-core's stepN-tmp", marker: olmoMetadata + " or " + olmoModelDir + "/"}
}

func (olmoCoreLayout) candidate(_, name string, typ fs.FileMode) *candidate {
	if c := stepDirCandidate(name, typ, famStep); c != nil {
		return c
	}
	if m := olmoTempRe.FindStringSubmatch(name); m != nil && (typ.IsDir() || typ&fs.ModeSymlink != 0) {
		c := newCandidate(name, famOLMoTemp, typ)
		c.setStep(m[1])
		return c
	}
	return nil
}

func (olmoCoreLayout) reserves(string) bool { return false }

// judge: a staging directory is never complete; otherwise checkOLMoCore.
func (olmoCoreLayout) judge(s *scan, c *candidate) verdict {
	if c.fam == famOLMoTemp {
		return notDone(FormatOLMoCore, "staging directory: OLMo-core renames stepN-tmp to stepN once every rank has saved")
	}
	return checkOLMoCore(s.path(c))
}

func (olmoCoreLayout) claim(_ *scan, c *candidate) nameClaim {
	if c.fam == famOLMoTemp {
		return mineAlone
	}
	return notMine
}

func (olmoCoreLayout) detect(_ *scan, _ *candidate, dir string, entries []fs.DirEntry) (verdict, bool) {
	if hasEntry(entries, olmoMetadata) || hasEntry(entries, olmoModelDir) {
		return checkOLMoCore(dir), true
	}
	return verdict{}, false
}

func (olmoCoreLayout) notes(*scan) []string { return nil }

// checkOLMoCore applies Checkpointer.dir_is_checkpoint, which find_checkpoints and
// latest_checkpoint use to pick the newest stepN: a top-level `.metadata` (model
// weights alone) is a checkpoint; otherwise train/rank0.pt, model_and_optim/.metadata
// and .metadata.json must all exist. Beyond existence: the DCP parts by the dcp rule,
// train/rank0.pt a whole torch.save file, .metadata.json a JSON object
// (CheckpointMetadata.from_file). Checkpointer.save writes the trainer state and the
// model into stepN-tmp, renames it to stepN, then writes .metadata.json; save_async
// renames first and writes model_and_optim/ into stepN afterwards, .metadata.json
// last.
func checkOLMoCore(dir string) verdict {
	if _, err := os.Stat(dir); err != nil {
		return notDone(FormatOLMoCore, "%s", describeFSError(err))
	}
	if _, err := os.Lstat(filepath.Join(dir, dcpMetadata)); err == nil {
		return checkDCP(dir, FormatOLMoCore)
	}
	if v, ok := checkTorchSaveFile(dir, olmoTrainState, FormatOLMoCore); !ok {
		return v
	}
	if v := checkDCP(filepath.Join(dir, olmoModelDir), FormatOLMoCore); !v.complete {
		v.reason = olmoModelDir + "/: " + v.reason
		return v
	}
	data, err := userfile.ReadFile(filepath.Join(dir, olmoMetadata), maxOLMoMetadataBytes)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return notDone(FormatOLMoCore, "no %s: OLMo-core writes it last, once the checkpoint is in place", olmoMetadata)
	case err != nil:
		return notDone(FormatOLMoCore, "%s: %s", olmoMetadata, describeFSError(err))
	}
	var md map[string]json.RawMessage
	if err := json.Unmarshal(data, &md); err != nil {
		return notDone(FormatOLMoCore, "%s is not a JSON object", olmoMetadata)
	}
	return done(FormatOLMoCore)
}

package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"

	"github.com/gangrun/gangrun/internal/userfile"
)

// FormatHF is the Hugging Face Trainer's checkpoint-N directories
// (transformers/trainer.py, Trainer._save_checkpoint).
const FormatHF Format = "hf"

// famHFTemp: tmp-checkpoint-N, the staging name transformers 4.36 renamed to
// checkpoint-N once the save ended.
const famHFTemp family = "tmp-checkpoint"

// hfTrainerState is transformers' TRAINER_STATE_NAME. Trainer._save_checkpoint
// writes it after the model, optimizer, scheduler and RNG state
// (transformers/trainer.py).
const hfTrainerState = "trainer_state.json"

// maxTrainerStateBytes bounds how much of trainer_state.json is read, in bytes (256
// MiB): its log history grows with the run, to a few MiB for a long one.
const maxTrainerStateBytes = 256 << 20

// hfTempRe matches transformers 4.36's staging directory.
var hfTempRe = regexp.MustCompile(`^tmp-checkpoint-([0-9]+)$`)

// hfLayout is the Hugging Face Trainer's layout: checkpoint-N directories
// (PREFIX_CHECKPOINT_DIR, transformers/trainer_utils.py), and tmp-checkpoint-N while
// transformers 4.36 staged a save. Under auto-detection it owns both names; a
// trainer_state.json inside a directory decides after `.complete`.
type hfLayout struct{}

func (hfLayout) info() layoutInfo { return layoutInfo{format: FormatHF, marker: hfTrainerState} }

func (hfLayout) candidate(_, name string, typ fs.FileMode) *candidate {
	if c := stepDirCandidate(name, typ, famCheckpoint); c != nil {
		return c
	}
	if m := hfTempRe.FindStringSubmatch(name); m != nil {
		c := newCandidate(name, famHFTemp, typ)
		c.setStep(m[1])
		return c
	}
	return nil
}

func (hfLayout) reserves(string) bool { return false }

// judge: a staging directory is never complete; otherwise checkHF.
func (hfLayout) judge(s *scan, c *candidate) verdict {
	if c.fam == famHFTemp {
		return notDone(FormatHF, "staging directory: transformers renames tmp-checkpoint-N to checkpoint-N when the save ends")
	}
	return checkHF(s.path(c))
}

func (hfLayout) claim(_ *scan, c *candidate) nameClaim {
	switch c.fam {
	case famHFTemp:
		return mineAlone
	case famCheckpoint:
		return mine
	}
	return notMine
}

func (hfLayout) detect(_ *scan, _ *candidate, dir string, entries []fs.DirEntry) (verdict, bool) {
	if hasEntry(entries, hfTrainerState) {
		return checkHF(dir), true
	}
	return verdict{}, false
}

func (hfLayout) notes(*scan) []string { return nil }

// checkHF applies the Hugging Face Trainer's rule: trainer_state.json exists and parses
// as a JSON object.
func checkHF(dir string) verdict {
	if _, err := os.Stat(dir); err != nil {
		return notDone(FormatHF, "%s", describeFSError(err))
	}
	// Not os.ReadFile: a named pipe there would block the scan for ever.
	data, err := userfile.ReadFile(filepath.Join(dir, hfTrainerState), maxTrainerStateBytes)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return notDone(FormatHF, "no %s: the Trainer writes it after the model and optimizer, so the save did not finish", hfTrainerState)
	case err != nil:
		return notDone(FormatHF, "%s: %s", hfTrainerState, describeFSError(err))
	case len(bytes.TrimSpace(data)) == 0:
		return notDone(FormatHF, "%s is empty", hfTrainerState)
	}
	if !json.Valid(data) {
		return notDone(FormatHF, "%s is not valid JSON (truncated?)", hfTrainerState)
	}
	if bytes.TrimSpace(data)[0] != '{' {
		return notDone(FormatHF, "%s is not a JSON object", hfTrainerState)
	}
	return done(FormatHF)
}

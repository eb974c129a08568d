package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/gangrun/gangrun/internal/userfile"
)

// verdict is a completion rule's answer for one candidate.
type verdict struct {
	format   Format
	complete bool
	reason   string
}

func done(f Format) verdict { return verdict{format: f, complete: true} }

func notDone(f Format, format string, a ...any) verdict {
	return verdict{format: f, reason: fmt.Sprintf(format, a...)}
}

// Marker and state file names the rules look for.
const (
	// genericMarker is the generic layout's completion marker, written last.
	genericMarker = ".complete"
	// dcpMetadata is torch.distributed.checkpoint's metadata file. FileSystemWriter
	// writes and fsyncs `.metadata.tmp` after every data file, then renames it to
	// `.metadata` (torch/distributed/checkpoint/filesystem.py, FileSystemWriter.finish;
	// torch 1.13: torch/distributed/_shard/checkpoint/filesystem.py).
	dcpMetadata = ".metadata"
	// hfTrainerState is transformers' TRAINER_STATE_NAME. Trainer._save_checkpoint
	// writes it after the model, optimizer, scheduler and RNG state
	// (transformers/trainer.py).
	hfTrainerState = "trainer_state.json"
	// maxTrainerStateBytes bounds how much of trainer_state.json is read, in bytes (256
	// MiB): its log history grows with the run, to a few MiB for a long one.
	maxTrainerStateBytes = 256 << 20
)

// describeFSError turns a file-system error met while reading a candidate into a
// reason.
func describeFSError(err error) string {
	switch {
	case errors.Is(err, syscall.ELOOP):
		return "symlink loop"
	case errors.Is(err, fs.ErrNotExist):
		return "missing (a broken symlink, or removed while being read)"
	case errors.Is(err, syscall.ENOTDIR):
		return "not a directory"
	case errors.Is(err, fs.ErrPermission):
		return "unreadable: permission denied"
	case errors.Is(err, userfile.ErrNotRegular), errors.Is(err, userfile.ErrTooLarge):
		var ue *userfile.Error
		if errors.As(err, &ue) {
			return ue.Err.Error()
		}
	}
	return "unreadable: " + err.Error()
}

// checkGeneric applies the generic rule: the directory holds a `.complete` marker.
func checkGeneric(dir string) verdict {
	if _, err := os.Stat(dir); err != nil {
		return notDone(FormatGeneric, "%s", describeFSError(err))
	}
	if _, err := os.Lstat(filepath.Join(dir, genericMarker)); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return notDone(FormatGeneric, "no %s marker: the save did not finish", genericMarker)
		}
		return notDone(FormatGeneric, "%s: %s", genericMarker, describeFSError(err))
	}
	return done(FormatGeneric)
}

// checkDCP applies torch.distributed.checkpoint's rule: a non-empty regular
// `.metadata` file. label is the format reported (dcp, or megatron for torch_dist).
func checkDCP(dir string, label Format) verdict {
	if _, err := os.Stat(dir); err != nil {
		return notDone(label, "%s", describeFSError(err))
	}
	fi, err := os.Stat(filepath.Join(dir, dcpMetadata))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return notDone(label, "no %s: torch.distributed.checkpoint renames it into place after every shard, so the save did not finish", dcpMetadata)
	case err != nil:
		return notDone(label, "%s: %s", dcpMetadata, describeFSError(err))
	case !fi.Mode().IsRegular():
		return notDone(label, "%s is not a regular file", dcpMetadata)
	case fi.Size() == 0:
		return notDone(label, "%s is empty (0 bytes)", dcpMetadata)
	}
	return done(label)
}

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

// classifyDir is FormatAuto's rule for a directory candidate: it lists the directory
// once and applies the rule of the first marker it holds, in this order: `.complete`
// (generic), trainer_state.json (hf), `.metadata` (dcp), *mp_rank_*_model_states.pt
// (deepspeed), mp_rank_* subdirectories (megatron legacy). guess labels a directory
// that holds none of them.
func classifyDir(dir string, guess, dcpLabel Format) verdict {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return notDone(guess, "%s", describeFSError(err))
	}
	names := make(map[string]fs.DirEntry, len(entries))
	for _, e := range entries {
		names[e.Name()] = e
	}
	if _, ok := names[genericMarker]; ok {
		return done(FormatGeneric)
	}
	if _, ok := names[hfTrainerState]; ok {
		return checkHF(dir)
	}
	if _, ok := names[dcpMetadata]; ok {
		return checkDCP(dir, dcpLabel)
	}
	if hasDeepSpeedFiles(entries) {
		return checkDeepSpeedEntries(dir, entries)
	}
	if hasMegatronRanks(entries) {
		return checkMegatronEntries(dir, entries)
	}
	if len(entries) == 0 {
		return notDone(guess, "empty directory: the save did not start or did not finish")
	}
	return notDone(guess, "no completion marker: none of %s (generic), %s (hf), %s (dcp), "+
		"mp_rank_*_model_states.pt (deepspeed), mp_rank_*/model_optim_rng.pt (megatron)",
		genericMarker, hfTrainerState, dcpMetadata)
}

// guessFormat labels an undecided directory candidate from its name.
func guessFormat(fam family) Format {
	switch fam {
	case famCheckpoint, famHFTemp:
		return FormatHF
	case famGlobalStep, famTag:
		return FormatDeepSpeed
	case famIter, famRelease:
		return FormatMegatron
	case famCkpt:
		return FormatLightning
	case famNeMoDir:
		return FormatNeMo
	}
	return FormatGeneric
}

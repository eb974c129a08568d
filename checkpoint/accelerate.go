package checkpoint

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// FormatAccelerate is Hugging Face accelerate's Accelerator.save_state directories:
// checkpoint_N with automatic_checkpoint_naming, or a name of the user's (step_N,
// checkpoint-N) (accelerate/accelerator.py, save_state; accelerate/checkpointing.py,
// save_accelerator_state).
const FormatAccelerate Format = "accelerate"

// accelerate's file names (accelerate/utils/constants.py, checkpointing.py): the i-th
// model, optimizer, scheduler and sampler add "_i" from the second on.
const (
	accelerateRNG    = "random_states_0.pkl" // RNG_STATE_NAME + "_{process_index}.pkl"
	accelerateScaler = "scaler.pt"           // SCALER_NAME
	// accelerateTracker is Megatron-LM's tracker, which Accelerator.save_state's
	// Megatron-LM engine writes into the directory with its iter_ directories.
	accelerateTracker = megatronTracker
)

var (
	// accelerateRNGRe matches random_states_{process_index}.pkl.
	accelerateRNGRe = regexp.MustCompile(`^random_states_([0-9]+)\.pkl$`)
	// accelerateCustomRe matches save_custom_state's custom_checkpoint_{index}.pkl.
	accelerateCustomRe = regexp.MustCompile(`^custom_checkpoint_([0-9]+)\.pkl$`)
	// accelerateTorchRe matches the other files save_accelerator_state writes with
	// torch.save: the models without safetensors, optimizers, schedulers, samplers,
	// stateful dataloaders, FSDP's full state dicts.
	accelerateTorchRe = regexp.MustCompile(`^(?:pytorch_model(?:_fsdp)?|optimizer|scheduler|sampler|dl_state_dict)(?:_[0-9]+)?\.bin$`)
	// accelerateSafeRe matches the models saved with safetensors (SAFE_WEIGHTS_NAME).
	accelerateSafeRe = regexp.MustCompile(`^model(?:_[0-9]+)?\.safetensors$`)
	// accelerateWeightsRe matches what holds a model's weights: a weights file, FSDP's
	// sharded pytorch_model_fsdp_N directory, DeepSpeed's pytorch_model[_N] tag.
	accelerateWeightsRe = regexp.MustCompile(`^(?:model(?:_[0-9]+)?\.safetensors|pytorch_model(?:_[0-9]+)?\.bin|pytorch_model_fsdp(?:_[0-9]+)?(?:\.bin)?|pytorch_model(?:_[0-9]+)?)$`)
	// accelerateDCPRe matches FSDP's sharded state dict directories
	// (FSDP_MODEL_NAME_{i}, OPTIMIZER_NAME_{i}: torch.distributed.checkpoint).
	accelerateDCPRe = regexp.MustCompile(`^(?:pytorch_model_fsdp|optimizer)_[0-9]+$`)
)

// accelerateLayout is accelerate's save_state layout. It owns no name (checkpoint_N is
// taken with the Hugging Face Trainer's checkpoint-N, step_N with the generic names);
// under auto-detection random_states_0.pkl inside a directory decides.
type accelerateLayout struct{}

func (accelerateLayout) info() layoutInfo {
	return layoutInfo{format: FormatAccelerate, marker: "random_states_*.pkl"}
}

func (accelerateLayout) candidate(_, name string, typ fs.FileMode) *candidate {
	return stepDirCandidate(name, typ, famCheckpoint, famStep)
}

func (accelerateLayout) reserves(string) bool { return false }

func (accelerateLayout) judge(s *scan, c *candidate) verdict {
	dir := s.path(c)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return notDone(FormatAccelerate, "%s", describeFSError(err))
	}
	return checkAccelerate(dir, entries)
}

func (accelerateLayout) claim(*scan, *candidate) nameClaim { return notMine }

func (accelerateLayout) detect(_ *scan, _ *candidate, dir string, entries []fs.DirEntry) (verdict, bool) {
	for _, e := range entries {
		if accelerateRNGRe.MatchString(e.Name()) {
			return checkAccelerate(dir, entries), true
		}
	}
	return verdict{}, false
}

func (accelerateLayout) notes(*scan) []string { return nil }

// checkAccelerate applies save_accelerator_state's order to a listed directory. The
// main process writes the models, optimizers, schedulers, samplers and scaler, then its
// random_states_0.pkl; every other process writes only its own
// random_states_{index}.pkl; the main process then writes custom_checkpoint_{i}.pkl
// for each registered object. Every file is written in place. So the save is complete
// when:
//   - random_states_0.pkl exists, and the random-state files are 0..N-1 with no gap;
//   - the directory holds a model's weights: model.safetensors, pytorch_model.bin, FSDP's
//     pytorch_model_fsdp_0(.bin), or DeepSpeed's pytorch_model tag (its `latest` naming
//     a tag complete by DeepSpeed's rule), or Megatron-LM's tracker;
//   - each file is whole: torch.save's files (checkTorchSaveFile), safetensors files
//     (checkSafetensorsFile), FSDP's sharded directories by the dcp rule;
//   - custom_checkpoint_*.pkl, when any, are 0..K-1 with no gap.
//
// accelerate writes no marker after the other processes' files and records neither the
// number of processes nor of custom objects, so a missing last random-state file or
// last custom object cannot be told from a smaller save.
func checkAccelerate(dir string, entries []fs.DirEntry) verdict {
	rng, custom := map[int]bool{}, map[int]bool{}
	weights := false
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	for _, name := range names {
		switch {
		case accelerateRNGRe.MatchString(name):
			rng[atoiSmall(accelerateRNGRe.FindStringSubmatch(name)[1])] = true
		case accelerateCustomRe.MatchString(name):
			custom[atoiSmall(accelerateCustomRe.FindStringSubmatch(name)[1])] = true
		case accelerateSafeRe.MatchString(name):
			if v, ok := checkSafetensorsFile(dir, name, FormatAccelerate); !ok {
				return v
			}
			weights = true
			continue
		case accelerateTorchRe.MatchString(name) || name == accelerateScaler:
		case accelerateDCPRe.MatchString(name):
			if v := checkDCP(filepath.Join(dir, name), FormatAccelerate); !v.complete {
				v.reason = name + "/: " + v.reason
				return v
			}
			weights = weights || strings.HasPrefix(name, "pytorch_model")
			continue
		case name == deepSpeedPointer:
			v := checkAccelerateDeepSpeed(dir)
			if !v.complete {
				return v
			}
			weights = true
			continue
		case name == accelerateTracker:
			weights = true
			continue
		default:
			continue
		}
		if v, ok := checkTorchSaveFile(dir, name, FormatAccelerate); !ok {
			return v
		}
		weights = weights || accelerateWeightsRe.MatchString(name)
	}
	if !rng[0] {
		return notDone(FormatAccelerate, "no %s: save_state writes the main process's random states after its model, optimizer and scheduler, so the save did not finish", accelerateRNG)
	}
	if missing := missingRanks(rng); missing != "" {
		return notDone(FormatAccelerate, "random_states_%s.pkl missing: process %s did not finish its save", missing, missing)
	}
	if missing := missingRanks(custom); missing != "" {
		return notDone(FormatAccelerate, "custom_checkpoint_%s.pkl missing", missing)
	}
	if !weights {
		return notDone(FormatAccelerate, "no model weights (model.safetensors, pytorch_model.bin, pytorch_model_fsdp_0, a DeepSpeed tag): the save did not write the model")
	}
	return done(FormatAccelerate)
}

// checkAccelerateDeepSpeed judges the DeepSpeed tag the directory's `latest` names
// (save_state's DeepSpeed engine saves tag pytorch_model, then writes `latest`).
func checkAccelerateDeepSpeed(dir string) verdict {
	data, err := readSmall(filepath.Join(dir, deepSpeedPointer))
	if err != nil {
		return notDone(FormatAccelerate, "%s: %s", deepSpeedPointer, describeFSError(err))
	}
	tag := strings.TrimSpace(string(data))
	if !validTag(tag) {
		return notDone(FormatAccelerate, "%s holds %q, not a tag name", deepSpeedPointer, clip(tag))
	}
	v := checkDeepSpeed(filepath.Join(dir, tag))
	v.format = FormatAccelerate
	if !v.complete {
		v.reason = fmt.Sprintf("DeepSpeed tag %s: %s", tag, v.reason)
	}
	return v
}

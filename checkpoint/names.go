package checkpoint

import (
	"fmt"
	"io/fs"
	"regexp"
	"strconv"
	"strings"
)

// family is what a candidate's name says about its layout.
type family int

const (
	// famNone: not a candidate name.
	famNone family = iota
	// famStep: step-N, step_N, stepN (torchtitan's step-N, the generic layout).
	famStep
	// famCheckpoint: checkpoint-N (Hugging Face Trainer, generic).
	famCheckpoint
	// famGlobalStep: global_stepN, global_step_N (DeepSpeed's default tag, generic).
	famGlobalStep
	// famIter: iter_N (Megatron-LM's iter_%07d, generic).
	famIter
	// famRelease: Megatron-LM's "release" directory.
	famRelease
	// famTag: a DeepSpeed tag directory with a custom name, named by `latest`.
	famTag
	// famHFTemp: tmp-checkpoint-N, the staging name transformers 4.36 renamed to
	// checkpoint-N once the save ended.
	famHFTemp
	// famCkpt: NAME.ckpt, a file (torch.save) or a directory (Lightning's DeepSpeed
	// and FSDP strategies, NeMo's distributed checkpoints).
	famCkpt
	// famNeMoDir: a NeMo 2 checkpoint directory, named after its metrics with
	// "step=N" and no .ckpt suffix.
	famNeMoDir
)

var (
	// dirNameRe matches the directory families: the prefix, then an optional - or _,
	// then the number.
	dirNameRe = regexp.MustCompile(`^(step|checkpoint|global_step|iter)[-_]?([0-9]+)$`)
	// hfTempRe matches transformers 4.36's staging directory.
	hfTempRe = regexp.MustCompile(`^tmp-checkpoint-([0-9]+)$`)
	// stepEqRe finds Lightning's and NeMo's "step=N" in a file name
	// (ModelCheckpoint's default filename is "{epoch}-{step}" → "epoch=E-step=N").
	stepEqRe = regexp.MustCompile(`step=([0-9]+)`)
	// lightningLastRe matches Lightning's last checkpoint: CHECKPOINT_NAME_LAST
	// ("last"), with the version counter's "-vN" when the name was taken.
	lightningLastRe = regexp.MustCompile(`^last(-v[0-9]+)?$`)
)

const (
	// deepSpeedPointer is the file DeepSpeed's save_checkpoint writes, after every
	// rank saved, holding the newest tag's name.
	deepSpeedPointer = "latest"
	// megatronTracker is Megatron-LM's get_checkpoint_tracker_filename: it holds the
	// newest iteration, or "release", and is written after a barrier.
	megatronTracker = "latest_checkpointed_iteration.txt"
	// megatronRelease is the directory get_checkpoint_name uses for release=True.
	megatronRelease = "release"
	// nemoUnfinishedSuffix is NeMoModelCheckpoint.UNFINISHED_CHECKPOINT_SUFFIX.
	nemoUnfinishedSuffix = "-unfinished"
	// ckptExt is Lightning's ModelCheckpoint.FILE_EXTENSION.
	ckptExt = ".ckpt"
)

// Candidate tiers: how a candidate without a step number orders against stepped ones.
const (
	// tierUnstepped: no step, not named as the latest (e.g. best.ckpt): oldest.
	tierUnstepped = 0
	// tierStepped: the name carries a step.
	tierStepped = 1
	// tierNamedLatest: no step, but the trainer names it as its newest (Lightning's
	// last.ckpt, rewritten at every save; Megatron's release or a custom DeepSpeed tag
	// that the pointer file names).
	tierNamedLatest = 2
)

// candidate is one directory entry that may be a checkpoint.
type candidate struct {
	name string
	fam  family
	// step is the number in the name, -1 when none.
	step int64
	// badStep is set when the name's number does not fit in an int64.
	badStep string
	tier    int
	// link is true when the entry is a symlink.
	link bool
	// typ is the entry's type bits from the directory listing.
	typ fs.FileMode
}

// parseName returns the candidate that name is under format f, or nil. typ is the
// entry's type from the directory listing.
func parseName(name string, typ fs.FileMode, f Format) *candidate {
	c := &candidate{name: name, step: -1, tier: tierUnstepped, link: typ&fs.ModeSymlink != 0, typ: typ}
	if m := dirNameRe.FindStringSubmatch(name); m != nil {
		switch m[1] {
		case "step":
			c.fam = famStep
		case "checkpoint":
			c.fam = famCheckpoint
		case "global_step":
			c.fam = famGlobalStep
		case "iter":
			c.fam = famIter
		}
		if !formatTakes(f, c.fam) {
			return nil
		}
		c.setStep(m[2])
		return c
	}
	if m := hfTempRe.FindStringSubmatch(name); m != nil {
		c.fam = famHFTemp
		if !formatTakes(f, c.fam) {
			return nil
		}
		c.setStep(m[1])
		return c
	}
	if strings.HasSuffix(name, ckptExt) && len(name) > len(ckptExt) {
		c.fam = famCkpt
		if !formatTakes(f, c.fam) {
			return nil
		}
		stem := strings.TrimSuffix(name, ckptExt)
		if m := stepEqRe.FindStringSubmatch(stem); m != nil {
			c.setStep(m[1])
		} else if isLastName(stem) {
			c.tier = tierNamedLatest
		}
		return c
	}
	if m := stepEqRe.FindStringSubmatch(name); m != nil && (typ.IsDir() || c.link) {
		c.fam = famNeMoDir
		if !formatTakes(f, c.fam) {
			return nil
		}
		c.setStep(m[1])
		return c
	}
	return nil
}

// setStep parses digits as the candidate's step.
func (c *candidate) setStep(digits string) {
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil {
		c.badStep = fmt.Sprintf("step number %s does not fit in 64 bits", digits)
		return
	}
	c.step = n
	c.tier = tierStepped
}

// isLastName reports whether a .ckpt stem is a "last" checkpoint: Lightning's
// last / last-vN, or NeMo's "{filename}-last".
func isLastName(stem string) bool {
	return lightningLastRe.MatchString(stem) || strings.HasSuffix(stem, "-last")
}

// formatTakes reports whether format f considers names of family fam.
func formatTakes(f Format, fam family) bool {
	switch f {
	case FormatAuto:
		return true
	case FormatDCP, FormatGeneric:
		return fam == famStep || fam == famCheckpoint || fam == famGlobalStep || fam == famIter
	case FormatHF:
		return fam == famCheckpoint || fam == famHFTemp
	case FormatDeepSpeed:
		return fam == famGlobalStep || fam == famTag
	case FormatMegatron:
		return fam == famIter || fam == famRelease
	case FormatLightning:
		return fam == famCkpt
	case FormatNeMo:
		return fam == famCkpt || fam == famNeMoDir
	}
	return false
}

// nemoMarkerName is NeMo's format_checkpoint_unfinished_marker_path applied to a
// candidate name: drop ".nemo", then ".ckpt", then "-EMA", then add "-unfinished".
func nemoMarkerName(name string) string {
	s := strings.TrimSuffix(name, ".nemo")
	s = strings.TrimSuffix(s, ckptExt)
	s = strings.TrimSuffix(s, "-EMA")
	return s + nemoUnfinishedSuffix
}

// validTag reports whether a pointer file's content can name a directory entry: one
// path element, no separators, not "." or "..". Anything else could escape the
// checkpoint directory and is garbage.
func validTag(s string) bool {
	return s != "" && s != "." && s != ".." && !strings.ContainsAny(s, "/\\\x00\n\r")
}

// megatronIterName is get_checkpoint_name's directory for an iteration: iter_%07d.
func megatronIterName(iteration int64) string { return fmt.Sprintf("iter_%07d", iteration) }

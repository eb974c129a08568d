package checkpoint

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// FormatDeepSpeed is DeepSpeed's engine.save_checkpoint layout: tag directories
// (global_stepN by default) and a `latest` file naming the newest tag
// (deepspeed/runtime/engine.py).
const FormatDeepSpeed Format = "deepspeed"

// famTag: a DeepSpeed tag directory with a custom name, named by `latest`.
const famTag family = "tag"

// deepSpeedPointer is the file DeepSpeed's save_checkpoint writes, after every rank
// saved, holding the newest tag's name.
const deepSpeedPointer = "latest"

// deepSpeedLayout is DeepSpeed's layout: global_stepN tag directories (the default
// tag), the tag of any name that `latest` names, and `latest` itself, a pointer
// (pointer.go). Under auto-detection it owns both kinds of name; a directory holding
// *mp_rank_*_model_states.pt decides after `.complete`, trainer_state.json and
// `.metadata`.
type deepSpeedLayout struct{}

func (deepSpeedLayout) info() layoutInfo {
	return layoutInfo{format: FormatDeepSpeed, names: "DeepSpeed's " + deepSpeedPointer, marker: "mp_rank_*_model_states.pt"}
}

func (deepSpeedLayout) candidate(_, name string, typ fs.FileMode) *candidate {
	return stepDirCandidate(name, typ, famGlobalStep)
}

func (deepSpeedLayout) reserves(name string) bool { return name == deepSpeedPointer }

func (deepSpeedLayout) judge(s *scan, c *candidate) verdict { return checkDeepSpeed(s.path(c)) }

func (deepSpeedLayout) claim(_ *scan, c *candidate) nameClaim {
	if c.fam == famGlobalStep || c.fam == famTag {
		return mine
	}
	return notMine
}

func (deepSpeedLayout) detect(_ *scan, _ *candidate, dir string, entries []fs.DirEntry) (verdict, bool) {
	if hasDeepSpeedFiles(entries) {
		return checkDeepSpeedEntries(dir, entries), true
	}
	return verdict{}, false
}

func (deepSpeedLayout) notes(*scan) []string { return nil }

// readPointer reads DIR/latest when the listing holds it and it is a regular file
// (following a symlink): one tag name, written in place by rank 0 once its own files
// are saved (engine.py, save_checkpoint).
func (deepSpeedLayout) readPointer(s *scan) *pointer {
	if !s.hasReserved(deepSpeedPointer) {
		return nil
	}
	data, err := readSmall(filepath.Join(s.dir, deepSpeedPointer))
	if err != nil {
		return nil
	}
	p := &pointer{file: deepSpeedPointer, who: "DeepSpeed writes " + deepSpeedPointer}
	tag := strings.TrimSpace(string(data))
	switch {
	case tag == "":
		p.problem = "is empty"
	case !validTag(tag):
		p.problem = fmt.Sprintf("holds %q, not a tag name", clip(tag))
	default:
		p.target = tag
	}
	return p
}

// adopt makes the tag `latest` names a candidate when no name rule took it: a tag can
// have any name (save_checkpoint's tag argument). A NeMo marker is never a checkpoint.
func (deepSpeedLayout) adopt(s *scan, p *pointer) {
	if p.target == "" || s.byName[p.target] != nil || isNeMoMarker(p.target) {
		return
	}
	if typ, ok := s.listed[p.target]; ok {
		c := newCandidate(p.target, famTag, typ)
		c.tier = tierNamedLatest
		s.add(c)
	}
}

// governs: a trusted `latest` governs the candidates named like its tag, and every
// custom tag.
func (deepSpeedLayout) governs(c, target *candidate) bool {
	return c.fam == target.fam || c.fam == famTag
}

// DeepSpeed's file names inside a tag directory (deepspeed/runtime/engine.py):
//   - _get_ckpt_name: mp_rank_{mp:02d}_model_states.pt, or with ZeRO-3
//     zero_pp_rank_{dp}_mp_rank_{mp:02d}_model_states.pt;
//   - _get_zero_ckpt_name: {bf16_}zero_pp_rank_{dp}_mp_rank_{mp:02d}_optim_states.pt;
//   - pipeline modules add layer_{idx:02d}-model_{mp:02d}-model_states.pt.
//
// save_checkpoint has every rank write its model states, then its ZeRO optimizer
// states, then rank 0 writes `latest` and all ranks meet at a barrier. Rank 0 writes
// `latest` once its own files are saved, not after the others', so the tag `latest`
// names is still checked file by file (pointer.go).
var (
	dsModelRe = regexp.MustCompile(`^(?:zero_pp_rank_([0-9]+)_)?mp_rank_([0-9]+)_model_states\.pt$`)
	dsOptimRe = regexp.MustCompile(`^(?:bf16_)?zero_pp_rank_([0-9]+)_mp_rank_([0-9]+)_optim_states\.pt$`)
)

// hasDeepSpeedFiles reports whether a directory listing holds DeepSpeed model states.
func hasDeepSpeedFiles(entries []fs.DirEntry) bool {
	for _, e := range entries {
		if dsModelRe.MatchString(e.Name()) {
			return true
		}
	}
	return false
}

// checkDeepSpeed applies DeepSpeed's rule to a tag directory.
func checkDeepSpeed(dir string) verdict {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return notDone(FormatDeepSpeed, "%s", describeFSError(err))
	}
	return checkDeepSpeedEntries(dir, entries)
}

// checkDeepSpeedEntries is DeepSpeed's rule on a listed tag directory: at least one
// mp_rank_*_model_states.pt; every *model_states.pt and *optim_states.pt a non-empty
// regular file; model-parallel ranks 0..M-1 all present; and ZeRO files, when there
// are any, forming a full data-parallel × model-parallel grid (ranks 0..D-1 for every
// model-parallel rank). A ZeRO run that crashed before writing any optimizer file
// cannot be told from a run without ZeRO (whose optimizer state lives in the model
// states file); `latest` covers that case (see pointer.go).
func checkDeepSpeedEntries(dir string, entries []fs.DirEntry) verdict {
	plainMP := map[int]bool{}
	zeroModel := grid{}
	zeroOptim := grid{}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, "model_states.pt") && !strings.HasSuffix(name, "optim_states.pt") {
			continue
		}
		if v, ok := nonEmptyFile(dir, e, FormatDeepSpeed); !ok {
			return v
		}
		if m := dsModelRe.FindStringSubmatch(name); m != nil {
			mp := atoiSmall(m[2])
			if m[1] == "" {
				plainMP[mp] = true
			} else {
				zeroModel.add(atoiSmall(m[1]), mp)
			}
		} else if m := dsOptimRe.FindStringSubmatch(name); m != nil {
			zeroOptim.add(atoiSmall(m[1]), atoiSmall(m[2]))
		}
	}
	if len(plainMP) == 0 && zeroModel.empty() {
		return notDone(FormatDeepSpeed, "no mp_rank_*_model_states.pt: the save did not write the model")
	}
	if missing := missingRanks(plainMP); missing != "" {
		return notDone(FormatDeepSpeed, "model states of model-parallel rank %s missing", missing)
	}
	for _, g := range []struct {
		what string
		g    grid
	}{{"ZeRO model states", zeroModel}, {"ZeRO optimizer states", zeroOptim}} {
		if g.g.empty() {
			continue
		}
		if why := g.g.incomplete(); why != "" {
			return notDone(FormatDeepSpeed, "%s incomplete: %s", g.what, why)
		}
		if len(plainMP) > 0 && !sameKeys(plainMP, g.g.mpRanks()) {
			return notDone(FormatDeepSpeed, "%s cover model-parallel ranks %s, model states cover %s",
				g.what, rankList(g.g.mpRanks()), rankList(plainMP))
		}
	}
	if !zeroModel.empty() && !zeroOptim.empty() && !zeroModel.equal(zeroOptim) {
		return notDone(FormatDeepSpeed, "ZeRO model and optimizer states cover different ranks")
	}
	return done(FormatDeepSpeed)
}

// nonEmptyFile checks that entry e of dir is a non-empty regular file (following a
// symlink). On failure it returns the verdict to report, labelled f.
func nonEmptyFile(dir string, e fs.DirEntry, f Format) (verdict, bool) {
	fi, err := os.Stat(dir + string(os.PathSeparator) + e.Name())
	switch {
	case err != nil:
		return notDone(f, "%s: %s", e.Name(), describeFSError(err)), false
	case !fi.Mode().IsRegular():
		return notDone(f, "%s is not a regular file", e.Name()), false
	case fi.Size() == 0:
		return notDone(f, "%s is empty (0 bytes)", e.Name()), false
	}
	return verdict{}, true
}

// grid is a set of (data-parallel rank, model-parallel rank) pairs.
type grid map[int]map[int]bool // mp → dp set

func (g grid) add(dp, mp int) {
	if g[mp] == nil {
		g[mp] = map[int]bool{}
	}
	g[mp][dp] = true
}

func (g grid) empty() bool { return len(g) == 0 }

func (g grid) mpRanks() map[int]bool {
	out := make(map[int]bool, len(g))
	for mp := range g {
		out[mp] = true
	}
	return out
}

// incomplete says what keeps g from being the full grid 0..D-1 × 0..M-1, or "".
func (g grid) incomplete() string {
	if missing := missingRanks(g.mpRanks()); missing != "" {
		return "model-parallel rank " + missing + " missing"
	}
	width := -1
	for _, mp := range sortedKeys(g.mpRanks()) {
		dps := g[mp]
		if missing := missingRanks(dps); missing != "" {
			return "data-parallel rank " + missing + " of model-parallel rank " + strconv.Itoa(mp) + " missing"
		}
		if width >= 0 && len(dps) != width {
			return "model-parallel ranks hold different numbers of data-parallel files"
		}
		width = len(dps)
	}
	return ""
}

func (g grid) equal(o grid) bool {
	if len(g) != len(o) {
		return false
	}
	for mp, dps := range g {
		if !sameKeys(dps, o[mp]) {
			return false
		}
	}
	return true
}

// missingRanks returns the lowest rank in 0..max(set) absent from set, as text, or
// "" when the set is 0..N-1 (or empty).
func missingRanks(set map[int]bool) string {
	for i := 0; i < len(set); i++ {
		if !set[i] {
			return strconv.Itoa(i)
		}
	}
	return ""
}

func sameKeys(a, b map[int]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}

func sortedKeys(set map[int]bool) []int {
	out := make([]int, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}

func rankList(set map[int]bool) string {
	parts := make([]string, 0, len(set))
	for _, k := range sortedKeys(set) {
		parts = append(parts, strconv.Itoa(k))
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// atoiSmall parses a rank number from a matched file name; ranks beyond int range
// (never written by a trainer) read as -1, which no grid check accepts.
func atoiSmall(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil || n > 1<<20 {
		return -1
	}
	return n
}

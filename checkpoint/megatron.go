package checkpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// FormatMegatron is Megatron-LM's layout: iter_NNNNNNN directories and
// latest_checkpointed_iteration.txt (megatron/training/checkpointing.py).
const FormatMegatron Format = "megatron"

// famRelease: Megatron-LM's "release" directory.
const famRelease family = "release"

const (
	// megatronTracker is Megatron-LM's get_checkpoint_tracker_filename: it holds the
	// newest iteration, or "release", and is written after a barrier.
	megatronTracker = "latest_checkpointed_iteration.txt"
	// megatronRelease is the directory get_checkpoint_name uses for release=True.
	megatronRelease = "release"
)

// megatronLayout is Megatron-LM's layout: iter_NNNNNNN directories, the release
// directory, and the tracker file naming the newest (a pointer, pointer.go). Under
// auto-detection it owns both kinds of name; mp_rank_* directories inside a directory
// decide last, and a `.metadata` directory of its own (torch_dist) is reported as
// megatron when the tracker is there.
type megatronLayout struct{}

func (megatronLayout) info() layoutInfo {
	return layoutInfo{format: FormatMegatron, names: "Megatron's " + megatronTracker, marker: "mp_rank_*/" + megatronModelFile}
}

func (megatronLayout) candidate(_, name string, typ fs.FileMode) *candidate {
	return stepDirCandidate(name, typ, famIter)
}

// reserves takes the tracker and the release directory: release is a candidate only
// when the tracker was read or the format is forced (readPointer).
func (megatronLayout) reserves(name string) bool {
	return name == megatronTracker || name == megatronRelease
}

func (megatronLayout) judge(s *scan, c *candidate) verdict { return checkMegatron(s.path(c)) }

func (megatronLayout) claim(_ *scan, c *candidate) nameClaim {
	if c.fam == famIter || c.fam == famRelease {
		return mine
	}
	return notMine
}

func (megatronLayout) detect(_ *scan, _ *candidate, dir string, entries []fs.DirEntry) (verdict, bool) {
	if hasMegatronRanks(entries) {
		return checkMegatronEntries(dir, entries), true
	}
	return verdict{}, false
}

func (megatronLayout) notes(*scan) []string { return nil }

// writesDCP: an iter_ or release directory next to a tracker is Megatron-LM's, in the
// torch_dist (DCP) format when it holds `.metadata`.
func (megatronLayout) writesDCP(s *scan, c *candidate) bool {
	return s.pointerOf(FormatMegatron) != nil && (c.fam == famIter || c.fam == famRelease)
}

// readPointer reads DIR/latest_checkpointed_iteration.txt when the listing holds it
// and it is a regular file. Like Megatron's read_metadata it accepts an integer
// (iteration ≥ 0), naming the iter_ directory iterNameFor finds, or "release". It
// then makes the release directory a candidate when the tracker was read or the
// format is forced; ranked first when the tracker names it.
func (megatronLayout) readPointer(s *scan) *pointer {
	var p *pointer
	if s.hasReserved(megatronTracker) {
		p = readMegatronTracker(s)
	}
	if typ, ok := s.listed[megatronRelease]; ok && (p != nil || s.opts.Format == FormatMegatron) {
		c := newCandidate(megatronRelease, famRelease, typ)
		if p != nil && p.target == megatronRelease {
			c.tier = tierNamedLatest
		}
		s.add(c)
	}
	return p
}

// adopt adds nothing: the tracker names an iteration or release, candidates already.
func (megatronLayout) adopt(*scan, *pointer) {}

// governs: a trusted tracker governs every iter_ and release candidate.
func (megatronLayout) governs(c, _ *candidate) bool {
	return c.fam == famIter || c.fam == famRelease
}

// readMegatronTracker reads the tracker; nil when it is not a readable regular file.
func readMegatronTracker(s *scan) *pointer {
	data, err := readSmall(filepath.Join(s.dir, megatronTracker))
	if err != nil {
		return nil
	}
	p := &pointer{file: megatronTracker, who: "Megatron-LM writes " + megatronTracker}
	text := strings.TrimSpace(string(data))
	if text == "" {
		p.problem = "is empty"
		return p
	}
	if text == megatronRelease {
		p.target = megatronRelease
		return p
	}
	n, err := strconv.ParseInt(text, 10, 64)
	if err != nil || n < 0 {
		p.problem = fmt.Sprintf("holds %q, neither an iteration nor \"release\"", clip(text))
		return p
	}
	p.target = s.iterNameFor(n)
	return p
}

// iterNameFor returns the iter_ candidate holding iteration n, preferring Megatron's
// own iter_%07d spelling, or that spelling when none exists.
func (s *scan) iterNameFor(n int64) string {
	want := megatronIterName(n)
	if s.byName[want] != nil {
		return want
	}
	for _, c := range s.cands {
		if c.fam == famIter && c.step == n {
			return c.name
		}
	}
	return want
}

// megatronIterName is get_checkpoint_name's directory for an iteration: iter_%07d.
func megatronIterName(iteration int64) string { return fmt.Sprintf("iter_%07d", iteration) }

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

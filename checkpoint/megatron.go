package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/gangrun/gangrun/internal/userfile"
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
// decide after the other layouts' markers, and a `.metadata` directory of its own
// (torch_dist, torch_dcp) is judged by its rule (judgeDCP).
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

func (megatronLayout) judge(s *scan, c *candidate) verdict { return checkMegatron(s, c) }

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

// judgeDCP: an iter_ or release directory holding `.metadata` is Megatron-LM's when
// the tracker is there, when it holds dist_checkpointing's own files (metadata.json,
// common.pt), or when a nearby iteration holds metadata.json (the run saves torch_dist);
// it is then judged by checkMegatronDCP.
func (megatronLayout) judgeDCP(s *scan, c *candidate, dir string, entries []fs.DirEntry) (verdict, bool) {
	if c.fam != famIter && c.fam != famRelease {
		return verdict{}, false
	}
	distFiles := hasEntry(entries, megatronDistConfig) || hasEntry(entries, megatronDistCommon)
	if s.pointerOf(FormatMegatron) == nil && !distFiles && !s.megatronRunSavesDist(c) {
		return verdict{}, false
	}
	return checkMegatronDCP(s, c, dir, entries), true
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

// Megatron-LM's dist_checkpointing files (megatron/core/dist_checkpointing/core.py,
// strategies/common.py): metadata.json (CONFIG_FNAME, {"sharded_backend": ...}) is
// written last, by rank 0 after every shard and `.metadata` (serialization.py save,
// step 7, metadata_finalize_fn); common.pt (COMMON_STATE_FNAME) is written first, by
// rank 0, in the versions that keep the common state apart.
const (
	megatronDistConfig = "metadata.json"
	megatronDistCommon = "common.pt"
)

// maxDistConfigBytes bounds how much of metadata.json is read, in bytes: it holds two
// short fields.
const maxDistConfigBytes = 1 << 20

// checkMegatron applies Megatron-LM's rule to an iter_NNNNNNN (or release) directory,
// as its _get_checkpoint_format decides the format (megatron/training/checkpointing.py):
// metadata.json or `.metadata` or common.pt — a distributed checkpoint,
// checkMegatronDCP; otherwise the legacy torch format, checkMegatronEntries.
func checkMegatron(s *scan, c *candidate) verdict {
	dir := s.path(c)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return notDone(FormatMegatron, "%s", describeFSError(err))
	}
	if hasEntry(entries, dcpMetadata) || hasEntry(entries, megatronDistConfig) || hasEntry(entries, megatronDistCommon) {
		return checkMegatronDCP(s, c, dir, entries)
	}
	if !hasMegatronRanks(entries) {
		return notDone(FormatMegatron, "no %s (torch_dist) and no mp_rank_*/%s (legacy torch format): the save did not finish", dcpMetadata, megatronModelFile)
	}
	return checkMegatronEntries(dir, entries)
}

// checkMegatronDCP is the rule for Megatron-LM's distributed formats.
// _get_checkpoint_format takes a directory as torch_dist only when
// dist_checkpointing.check_is_distributed_checkpoint holds — metadata.json exists and
// loads as a CheckpointingConfig (a JSON object with sharded_backend) — and as torch_dcp
// or fsdp_dtensor when it holds only torch.distributed.checkpoint's `.metadata`. So:
//   - with metadata.json: it must be such an object, and its torch backend's shards
//     need `.metadata` (the dcp rule; the retired zarr backend has none);
//   - without it, a directory that is torch_dist's — it holds common.pt, or the run's
//     other iterations hold metadata.json — is a save cut before its last step;
//   - otherwise (torch_dcp, fsdp_dtensor) the dcp rule.
//
// A torch_dist save cut before metadata.json, with no common.pt (current versions keep
// the common state among the shards) and no earlier torch_dist iteration to compare
// with, cannot be told from a torch_dcp checkpoint; the tracker covers it when present.
func checkMegatronDCP(s *scan, c *candidate, dir string, entries []fs.DirEntry) verdict {
	if hasEntry(entries, megatronDistConfig) {
		backend, why := readDistConfig(filepath.Join(dir, megatronDistConfig))
		if why != "" {
			return notDone(FormatMegatron, "%s %s: dist_checkpointing writes it last, so the save did not finish", megatronDistConfig, why)
		}
		if backend == "zarr" {
			return done(FormatMegatron)
		}
		return checkDCP(dir, FormatMegatron)
	}
	if hasEntry(entries, megatronDistCommon) || s.megatronRunSavesDist(c) {
		return notDone(FormatMegatron, "no %s: dist_checkpointing writes it after every shard and %s, and Megatron-LM's check_is_distributed_checkpoint needs it, so the torch_dist save did not finish",
			megatronDistConfig, dcpMetadata)
	}
	return checkDCP(dir, FormatMegatron)
}

// readDistConfig reads dist_checkpointing's metadata.json as maybe_load_config does
// (json.load, then CheckpointingConfig(**fields), whose sharded_backend has no default)
// and returns the backend, or why it cannot be loaded.
func readDistConfig(path string) (backend, why string) {
	data, err := userfile.ReadFile(path, maxDistConfigBytes)
	if err != nil {
		return "", describeFSError(err)
	}
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(data, &cfg); err != nil {
		return "", "is not a JSON object (truncated?)"
	}
	raw, ok := cfg["sharded_backend"]
	if !ok || json.Unmarshal(raw, &backend) != nil {
		return "", "has no sharded_backend"
	}
	return backend, ""
}

// megatronRunSavesDist reports whether the directory's Megatron-LM run saves torch_dist
// checkpoints, as far as other iterations say: the one the tracker names, or one of the
// two nearest iterations to c, holds metadata.json. It reads at most three entries.
func (s *scan) megatronRunSavesDist(c *candidate) bool {
	var look []string
	if p := s.pointerOf(FormatMegatron); p != nil && p.target != "" && p.target != c.name {
		look = append(look, p.target)
	}
	at := -1
	for i, o := range s.cands {
		if o == c || o.name == c.name {
			at = i
			break
		}
	}
	for d := 1; len(look) < 3 && at >= 0 && (at-d >= 0 || at+d < len(s.cands)); d++ {
		for _, i := range []int{at + d, at - d} {
			if i >= 0 && i < len(s.cands) && (s.cands[i].fam == famIter || s.cands[i].fam == famRelease) && len(look) < 3 {
				look = append(look, s.cands[i].name)
			}
		}
	}
	for _, name := range look {
		if fi, err := os.Stat(filepath.Join(s.dir, name, megatronDistConfig)); err == nil && fi.Mode().IsRegular() {
			return true
		}
	}
	return false
}

// checkMegatronEntries is the legacy torch format's rule: every mp_rank_* directory
// holds a whole model_optim_rng.pt (and distrib_optim.pt, when present, is whole: both
// written in place by torch.save, checkTorchSaveFile), and the rank tuples form a full
// grid — every combination of the tensor, pipeline and expert ranks seen, from 0.
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
		if v, ok := checkTorchSaveFile(dir, e.Name()+"/"+megatronModelFile, FormatMegatron); !ok {
			return v
		}
		if _, err := os.Lstat(filepath.Join(dir, e.Name(), megatronOptimFile)); !errors.Is(err, fs.ErrNotExist) {
			if v, ok := checkTorchSaveFile(dir, e.Name()+"/"+megatronOptimFile, FormatMegatron); !ok {
				return v
			}
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

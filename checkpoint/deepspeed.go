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
// *mp_rank_*_model_states.pt decides after `.complete`, trainer_state.json,
// `.metadata` and the OLMo-core, torchtitan and accelerate markers.
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

// DeepSpeed's file names inside a tag directory (deepspeed/runtime/engine.py, and
// deepspeed/runtime/pipe/module.py for pipeline modules):
//   - _get_ckpt_name: mp_rank_{mp:02d}_model_states.pt, or with ZeRO-3
//     zero_pp_rank_{dp}_mp_rank_{mp:02d}_model_states.pt;
//   - _get_zero_ckpt_name: {bf16_}zero_pp_rank_{dp}_mp_rank_{mp:02d}_optim_states.pt;
//   - MoE (_save_moe_checkpoint): _get_expert_ckpt_name's
//     layer_{moe_layer}_expert_{expert}_mp_rank_{mp:02d}_model_states.pt for each MoE
//     layer and global expert, and _get_optimizer_ckpt_name's
//     expp_rank_{ep}_mp_rank_{mp:02d}_optim_states.pt for each expert-parallel rank;
//   - pipeline modules (PipelineModule.ckpt_layer_path):
//     layer_{idx:02d}[-{rank_repr}]-model_states.pt, rank_repr being the topology's
//     non-data, non-pipe coordinates ("model_00").
//
// save_checkpoint has every rank write its model states (a MoE rank its experts first,
// then its optimizer file), then its ZeRO optimizer states; then rank 0 writes `latest`
// and all ranks meet at a barrier. Rank 0 writes `latest` once its own files are saved,
// not after the others', so the tag `latest` names is still checked file by file
// (pointer.go). Every file is written in place by torch.save (TorchCheckpointEngine).
var (
	dsModelRe  = regexp.MustCompile(`^(?:zero_pp_rank_([0-9]+)_)?mp_rank_([0-9]+)_model_states\.pt$`)
	dsOptimRe  = regexp.MustCompile(`^(?:bf16_)?zero_pp_rank_([0-9]+)_mp_rank_([0-9]+)_optim_states\.pt$`)
	dsExppRe   = regexp.MustCompile(`^expp_rank_([0-9]+)_mp_rank_([0-9]+)_optim_states\.pt$`)
	dsExpertRe = regexp.MustCompile(`^layer_([0-9]+)_expert_([0-9]+)_mp_rank_([0-9]+)_model_states\.pt$`)
	dsLayerRe  = regexp.MustCompile(`^layer_([0-9]+)(?:-(.+))?-model_states\.pt$`)
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

// dsTag is what a tag directory's file names say about the save that wrote it.
type dsTag struct {
	plainMP   map[int]bool // mp_rank_MM_model_states.pt
	zeroModel grid         // ZeRO-3's zero_pp_rank_D_mp_rank_MM_model_states.pt
	zeroOptim grid         // {bf16_}zero_pp_rank_D_mp_rank_MM_optim_states.pt
	expp      grid         // MoE: expp_rank_R_mp_rank_MM_optim_states.pt (R in the dp slot)
	// experts: MoE layer → model-parallel rank → global experts saved.
	experts map[int]map[int]map[int]bool
	// layers: pipeline layer index → rank_repr ("" or "model_00") saved.
	layers map[int]map[string]bool
	// rec is what the first model states file records, when it could be read.
	rec *dsRecorded
}

// dsRecorded is what DeepSpeed records in a tag's model states (_save_checkpoint,
// _save_moe_checkpoint): the world sizes its loader counts files by.
type dsRecorded struct {
	file string
	// mp is mp_world_size: the model-parallel ranks (pipeline × tensor) each writing
	// model states; 0 when not recorded.
	mp int
	// dp is dp_world_size (seq_dp_world_size): the data-parallel ranks each writing ZeRO
	// optimizer states; load's _get_all_zero_checkpoint_names counts them by it. 0
	// when not recorded or not to be counted (a MiCS shard group saves fewer).
	dp int
	// zero is true when param_shapes is recorded (not None): _save_checkpoint records
	// it exactly when the optimizer state lives in ZeRO files (zero_optimization() or
	// bfloat16_enabled()), so those files must exist.
	zero bool
	// experts is num_experts, each MoE layer's global experts (MoE saves only).
	experts []int
}

// readDSRecorded reads the recorded sizes from model states file name of dir; nil when
// it cannot be read as a torch.save pickle of a dict (another checkpoint engine's
// format: the names alone then decide).
func readDSRecorded(dir, name string) *dsRecorded {
	d, err := readTorchSaveDict(filepath.Join(dir, name))
	if err != nil {
		return nil
	}
	r := &dsRecorded{file: name}
	if v, ok := d.pyInt("mp_world_size"); ok && v > 0 && v <= 1<<20 {
		r.mp = int(v)
	}
	if v, ok := d.pyInt("dp_world_size"); ok && v > 0 && v <= 1<<20 && !usesMiCS(d) {
		r.dp = int(v)
	}
	if v, ok := d.m["param_shapes"]; ok && v != nil {
		r.zero = true
	}
	if l, ok := d.m["num_experts"].(*pyList); ok {
		for _, e := range l.items {
			n, ok := e.(int64)
			if !ok || n < 0 || n > 1<<20 {
				r.experts = nil
				break
			}
			r.experts = append(r.experts, int(n))
		}
	}
	return r
}

// usesMiCS reports whether the recorded ds_config shards ZeRO over MiCS groups
// (zero_optimization.mics_shard_size > 0): then only the first shard group writes
// optimizer files, fewer than dp_world_size.
func usesMiCS(d *pyDict) bool {
	cfg, ok := d.m["ds_config"].(*pyDict)
	if !ok {
		return false
	}
	zero, ok := cfg.m["zero_optimization"].(*pyDict)
	if !ok {
		return false
	}
	n, ok := zero.pyInt("mics_shard_size")
	return ok && n > 0
}

// checkDeepSpeedEntries is DeepSpeed's rule on a listed tag directory, counting the
// files the other ranks' files say must exist:
//   - at least one mp_rank_*_model_states.pt (or ZeRO-3's per-rank model states);
//   - every *model_states.pt and *optim_states.pt a whole torch.save file
//     (checkTorchSaveFile: written in place, so a cut save leaves a file without its
//     zip end record);
//   - model-parallel ranks 0..M-1 all present;
//   - ZeRO files, when there are any, a full data-parallel × model-parallel grid from 0,
//     over the model states' model-parallel ranks;
//   - MoE: expert-parallel optimizer files a full grid from 0 over the same
//     model-parallel ranks; each MoE layer (0..L-1) holding experts 0..E-1 for every
//     model-parallel rank, E a multiple of the expert-parallel ranks (MoE asserts
//     num_experts % ep_size == 0: a rank that saved its experts and not its optimizer
//     file breaks it); expert files without any expert-parallel optimizer file is a
//     save cut short;
//   - pipeline layer files: every layer saved for every rank_repr seen (the layer
//     files of the other model-parallel ranks say the layer must exist).
//
// What the names cannot tell: a rank that wrote nothing when it is the last of its
// dimension (the last data-parallel ZeRO rank, the last model-parallel rank, the last
// expert-parallel rank with all its experts, a pipeline layer missing for every rank);
// a ZeRO run that crashed before writing any optimizer file, which looks like a run
// without ZeRO (whose optimizer state lives in the model states file). `latest` covers
// them when the save that left them is newer than the tag it names (pointer.go).
func checkDeepSpeedEntries(dir string, entries []fs.DirEntry) verdict {
	t := dsTag{plainMP: map[int]bool{}, zeroModel: grid{}, zeroOptim: grid{}, expp: grid{},
		experts: map[int]map[int]map[int]bool{}, layers: map[int]map[string]bool{}}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, "model_states.pt") && !strings.HasSuffix(name, "optim_states.pt") {
			continue
		}
		if v, ok := checkTorchSaveFile(dir, name, FormatDeepSpeed); !ok {
			return v
		}
		t.add(name)
	}
	if len(t.plainMP) == 0 && t.zeroModel.empty() {
		return notDone(FormatDeepSpeed, "no mp_rank_*_model_states.pt: the save did not write the model")
	}
	if t.plainMP[0] {
		t.rec = readDSRecorded(dir, "mp_rank_00_model_states.pt")
	} else if t.zeroModel[0][0] {
		t.rec = readDSRecorded(dir, "zero_pp_rank_0_mp_rank_00_model_states.pt")
	}
	if why := t.incomplete(); why != "" {
		return notDone(FormatDeepSpeed, "%s", why)
	}
	return done(FormatDeepSpeed)
}

// add records file name, one of a tag directory's *_states.pt files.
func (t *dsTag) add(name string) {
	if m := dsModelRe.FindStringSubmatch(name); m != nil {
		mp := atoiSmall(m[2])
		if m[1] == "" {
			t.plainMP[mp] = true
		} else {
			t.zeroModel.add(atoiSmall(m[1]), mp)
		}
	} else if m := dsOptimRe.FindStringSubmatch(name); m != nil {
		t.zeroOptim.add(atoiSmall(m[1]), atoiSmall(m[2]))
	} else if m := dsExppRe.FindStringSubmatch(name); m != nil {
		t.expp.add(atoiSmall(m[1]), atoiSmall(m[2]))
	} else if m := dsExpertRe.FindStringSubmatch(name); m != nil {
		layer, expert, mp := atoiSmall(m[1]), atoiSmall(m[2]), atoiSmall(m[3])
		if t.experts[layer] == nil {
			t.experts[layer] = map[int]map[int]bool{}
		}
		if t.experts[layer][mp] == nil {
			t.experts[layer][mp] = map[int]bool{}
		}
		t.experts[layer][mp][expert] = true
	} else if m := dsLayerRe.FindStringSubmatch(name); m != nil {
		idx := atoiSmall(m[1])
		if t.layers[idx] == nil {
			t.layers[idx] = map[string]bool{}
		}
		t.layers[idx][m[2]] = true
	}
}

// incomplete says which files the tag's other files say are missing, or "".
func (t *dsTag) incomplete() string {
	if missing := missingRanks(t.plainMP); missing != "" {
		return "model states of model-parallel rank " + missing + " missing"
	}
	for _, g := range []struct {
		what string
		g    grid
	}{{"ZeRO model states", t.zeroModel}, {"ZeRO optimizer states", t.zeroOptim}, {"MoE optimizer states (expp_rank_*)", t.expp}} {
		if g.g.empty() {
			continue
		}
		if why := g.g.incomplete(); why != "" {
			return g.what + " incomplete: " + strings.Replace(why, "data-parallel", dimOf(g.what), 1)
		}
		if len(t.plainMP) > 0 && !sameKeys(t.plainMP, g.g.mpRanks()) {
			return fmt.Sprintf("%s cover model-parallel ranks %s, model states cover %s",
				g.what, rankList(g.g.mpRanks()), rankList(t.plainMP))
		}
	}
	if !t.zeroModel.empty() && !t.zeroOptim.empty() && !t.zeroModel.equal(t.zeroOptim) {
		return "ZeRO model and optimizer states cover different ranks"
	}
	if why := t.recordedIncomplete(); why != "" {
		return why
	}
	if why := t.moeIncomplete(); why != "" {
		return why
	}
	return t.pipelineIncomplete()
}

// recordedIncomplete counts the files the recorded world sizes say must exist: every
// model-parallel rank's model states (and its MoE and ZeRO files), every
// data-parallel rank's ZeRO optimizer states, every MoE layer's experts. "" when they
// are all there, or nothing was recorded.
func (t *dsTag) recordedIncomplete() string {
	r := t.rec
	if r == nil {
		return ""
	}
	if r.mp > 0 {
		for _, g := range []struct {
			what string
			mps  map[int]bool
		}{{"model states", t.plainMP}, {"ZeRO model states", t.zeroModel.mpRanks()}, {"ZeRO optimizer states", t.zeroOptim.mpRanks()},
			{"MoE optimizer states (expp_rank_*)", t.expp.mpRanks()}} {
			if len(g.mps) > 0 && len(g.mps) != r.mp {
				return fmt.Sprintf("%s of %d model-parallel ranks, %s records mp_world_size %d", g.what, len(g.mps), r.file, r.mp)
			}
		}
	}
	if r.zero && t.zeroOptim.empty() {
		return fmt.Sprintf("no ZeRO optimizer states (*zero_pp_rank_*_optim_states.pt): %s records param_shapes, so the optimizer state lives in them", r.file)
	}
	if r.dp > 0 && !t.zeroOptim.empty() {
		for _, mp := range sortedKeys(t.zeroOptim.mpRanks()) {
			if n := len(t.zeroOptim[mp]); n != r.dp {
				return fmt.Sprintf("ZeRO optimizer states of %d data-parallel ranks for model-parallel rank %d, %s records dp_world_size %d", n, mp, r.file, r.dp)
			}
		}
	}
	if len(r.experts) > 0 {
		for l, n := range r.experts {
			byMP := t.experts[l]
			if len(byMP) == 0 && n > 0 {
				return fmt.Sprintf("MoE layer %d's expert files missing: %s records %d experts", l, r.file, n)
			}
			for _, mp := range sortedKeys(mpSet(byMP)) {
				if have := len(byMP[mp]); have != n {
					return fmt.Sprintf("MoE layer %d holds %d expert files for model-parallel rank %d, %s records %d experts", l, have, mp, r.file, n)
				}
			}
		}
		if len(t.experts) > len(r.experts) {
			return fmt.Sprintf("expert files of %d MoE layers, %s records %d", len(t.experts), r.file, len(r.experts))
		}
	}
	return ""
}

// dimOf names the dimension a grid's first index counts, for messages.
func dimOf(what string) string {
	if strings.HasPrefix(what, "MoE") {
		return "expert-parallel"
	}
	return "data-parallel"
}

// moeIncomplete checks the MoE expert files against each other and the
// expert-parallel optimizer files; "" when they agree (or there are none).
func (t *dsTag) moeIncomplete() string {
	if len(t.experts) == 0 {
		return ""
	}
	if t.expp.empty() {
		return "MoE expert files without any expp_rank_*_optim_states.pt: each expert-parallel rank writes its optimizer file after its experts"
	}
	layers := map[int]bool{}
	for l := range t.experts {
		layers[l] = true
	}
	if missing := missingRanks(layers); missing != "" {
		return "MoE layer " + missing + "'s expert files missing"
	}
	ep := 0
	for _, dps := range t.expp {
		ep = len(dps)
	}
	for _, l := range sortedKeys(layers) {
		byMP := t.experts[l]
		if !sameKeys(mpSet(byMP), t.expp.mpRanks()) {
			return fmt.Sprintf("MoE layer %d's experts cover model-parallel ranks %s, expp_rank_* files cover %s",
				l, rankList(mpSet(byMP)), rankList(t.expp.mpRanks()))
		}
		count := -1
		for _, mp := range sortedKeys(mpSet(byMP)) {
			ex := byMP[mp]
			if missing := missingRanks(ex); missing != "" {
				return fmt.Sprintf("MoE layer %d expert %s of model-parallel rank %d missing", l, missing, mp)
			}
			if count >= 0 && len(ex) != count {
				return fmt.Sprintf("MoE layer %d holds different numbers of experts per model-parallel rank", l)
			}
			count = len(ex)
		}
		if count%ep != 0 {
			return fmt.Sprintf("MoE layer %d holds %d experts for %d expert-parallel optimizer files: DeepSpeed's experts divide evenly among expert-parallel ranks, so a rank's optimizer file is missing",
				l, count, ep)
		}
	}
	return ""
}

// mpSet returns the keys of a map keyed by model-parallel rank.
func mpSet(m map[int]map[int]bool) map[int]bool {
	out := make(map[int]bool, len(m))
	for k := range m {
		out[k] = true
	}
	return out
}

// pipelineIncomplete checks that every pipeline layer file exists for every rank_repr
// any layer was saved under; "" when they agree (or there are none).
func (t *dsTag) pipelineIncomplete() string {
	reprs := map[string]bool{}
	for _, rs := range t.layers {
		for r := range rs {
			reprs[r] = true
		}
	}
	idx := make(map[int]bool, len(t.layers))
	for l := range t.layers {
		idx[l] = true
	}
	for _, l := range sortedKeys(idx) {
		for r := range reprs {
			if !t.layers[l][r] {
				return fmt.Sprintf("pipeline layer %02d saved by other model-parallel ranks but not for %q (%s missing)",
					l, r, dsLayerName(l, r))
			}
		}
	}
	return ""
}

// dsLayerName is PipelineModule.ckpt_layer_path's file name.
func dsLayerName(idx int, repr string) string {
	name := fmt.Sprintf("layer_%02d", idx)
	if repr != "" {
		name += "-" + repr
	}
	return name + "-model_states.pt"
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

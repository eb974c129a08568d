package checkpoint

import (
	"archive/zip"
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// tree describes a fixture directory: each key is a path relative to the root. A key
// ending in "/" is a directory; a key ending in "@" is a symlink whose value is its
// target; any other key is a file with the value as its content.
type tree map[string]string

// fixtureEpoch is the modification time fixtures start from; build gives each entry a
// time from it so ordering by time and golden output are deterministic.
var fixtureEpoch = time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)

// build writes t under root, parents first.
func build(tb testing.TB, root string, t tree) {
	tb.Helper()
	keys := make([]string, 0, len(t))
	for k := range t {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := t[k]
		switch {
		case strings.HasSuffix(k, "/"):
			mustMkdir(tb, filepath.Join(root, k))
		case strings.HasSuffix(k, "@"):
			p := filepath.Join(root, strings.TrimSuffix(k, "@"))
			mustMkdir(tb, filepath.Dir(p))
			if err := os.Symlink(v, p); err != nil {
				tb.Fatal(err)
			}
		default:
			p := filepath.Join(root, k)
			mustMkdir(tb, filepath.Dir(p))
			if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
				tb.Fatal(err)
			}
		}
	}
	// Fixed times: every entry at fixtureEpoch, so only explicit touch() calls order
	// candidates by time.
	_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type()&os.ModeSymlink == 0 {
			_ = os.Chtimes(p, fixtureEpoch, fixtureEpoch)
		}
		return nil
	})
}

func mustMkdir(tb testing.TB, p string) {
	tb.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		tb.Fatal(err)
	}
}

// touch sets path's modification time to fixtureEpoch plus d.
func touch(tb testing.TB, path string, d time.Duration) {
	tb.Helper()
	at := fixtureEpoch.Add(d)
	if err := os.Chtimes(path, at, at); err != nil {
		tb.Fatal(err)
	}
}

// merge returns the union of trees.
func merge(ts ...tree) tree {
	out := tree{}
	for _, t := range ts {
		for k, v := range t {
			out[k] = v
		}
	}
	return out
}

// Layout fixtures: small files standing in for real weights, named as each trainer
// names them.

func generic(name string, complete bool) tree {
	t := tree{name + "/model.pt": "weights"}
	if complete {
		t[name+"/.complete"] = ""
	}
	return t
}

func dcp(name string, complete bool) tree {
	t := tree{name + "/__0_0.distcp": "shard"}
	if complete {
		t[name+"/.metadata"] = "\x80\x04metadata."
	}
	return t
}

// deepspeedTag is a ZeRO-2 tag with dp data-parallel ranks and mp model-parallel ranks.
func deepspeedTag(tag string, dp, mp int) tree {
	t := tree{}
	for m := 0; m < mp; m++ {
		t[fmt.Sprintf("%s/mp_rank_%02d_model_states.pt", tag, m)] = ptFile()
		for d := 0; d < dp; d++ {
			t[fmt.Sprintf("%s/zero_pp_rank_%d_mp_rank_%02d_optim_states.pt", tag, d, m)] = ptFile()
		}
	}
	return t
}

// megatronIter is a legacy-format Megatron-LM iteration with tp tensor-parallel and pp
// pipeline-parallel ranks.
func megatronIter(iteration int64, tp, pp int) tree {
	t := tree{}
	name := megatronIterName(iteration)
	for a := 0; a < tp; a++ {
		for b := 0; b < pp; b++ {
			rank := fmt.Sprintf("mp_rank_%02d", a)
			if pp > 1 {
				rank += fmt.Sprintf("_%03d", b)
			}
			t[name+"/"+rank+"/model_optim_rng.pt"] = ptFile()
		}
	}
	return t
}

func hf(step int, state string) tree {
	name := fmt.Sprintf("checkpoint-%d", step)
	t := tree{name + "/model.safetensors": "weights", name + "/optimizer.pt": "optim"}
	if state != "" {
		t[name+"/trainer_state.json"] = state
	}
	return t
}

const validTrainerState = `{"global_step": 10, "log_history": [{"loss": 1.5, "step": 10}]}`

// ptFile is a small whole torch.save file (torchZip's layout, archive "archive"), for
// the trainers' rank files.
func ptFile() string {
	z, err := buildTorchZip("archive")
	if err != nil {
		panic(err) // writing to a bytes.Buffer cannot fail
	}
	return z
}

// torchZip returns bytes laid out like torch.save's zip (ARCHIVE/data.pkl,
// ARCHIVE/data/0, ARCHIVE/version), stored uncompressed as torch does.
func torchZip(tb testing.TB, archive string) string {
	tb.Helper()
	z, err := buildTorchZip(archive)
	if err != nil {
		tb.Fatal(err)
	}
	return z
}

// buildTorchZip is torchZip's archive, or the zip writer's error.
func buildTorchZip(archive string) (string, error) {
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, f := range []struct{ name, body string }{
		{archive + "/data.pkl", "\x80\x02}q\x00.\n"},
		{archive + "/data/0", "\x00\x00\x80?"},
		{archive + "/version", "3\n"},
	} {
		w, err := zw.CreateHeader(&zip.FileHeader{Name: f.name, Method: zip.Store})
		if err != nil {
			return "", err
		}
		if _, err := w.Write([]byte(f.body)); err != nil {
			return "", err
		}
	}
	if err := zw.Close(); err != nil {
		return "", err
	}
	return buf.String(), nil
}

// lightningName is ModelCheckpoint's default file name for an epoch and step.
func lightningName(epoch, step int) string {
	return fmt.Sprintf("epoch=%d-step=%d.ckpt", epoch, step)
}

// names returns the base names of cps.
func names(cps []Checkpoint) []string {
	out := make([]string, len(cps))
	for i, c := range cps {
		out[i] = filepath.Base(c.Path)
	}
	return out
}

// Trainers' saves as sequences of steps (savecut_test.go cuts them short).

// saveOpKind is what one step of a save does to the checkpoint directory.
type saveOpKind int

const (
	opWrite  saveOpKind = iota // write body to path (parents created)
	opRename                   // rename path to to
	opLink                     // make path a symlink to body, replacing what is there
	opRemove                   // remove path
)

// saveOp is one step of a trainer's save, paths relative to the checkpoint directory.
type saveOp struct {
	kind saveOpKind
	path string
	body string
	to   string
	// inPlace: the trainer writes the file in place (open, write, close), so a save cut
	// short can leave a prefix of it under its own name.
	inPlace bool
}

func wr(path, body string) saveOp { return saveOp{kind: opWrite, path: path, body: body} }
func wrIn(path, body string) saveOp {
	return saveOp{kind: opWrite, path: path, body: body, inPlace: true}
}
func mv(path, to string) saveOp       { return saveOp{kind: opRename, path: path, to: to} }
func ln(path, target string) saveOp   { return saveOp{kind: opLink, path: path, body: target} }
func rmEntry(path string) saveOp      { return saveOp{kind: opRemove, path: path} }
func ops(groups ...[]saveOp) []saveOp { return concatOps(groups...) }

func concatOps(groups ...[]saveOp) []saveOp {
	var out []saveOp
	for _, g := range groups {
		out = append(out, g...)
	}
	return out
}

// apply performs op under root.
func (op saveOp) apply(tb testing.TB, root string) {
	tb.Helper()
	p := filepath.Join(root, op.path)
	var err error
	switch op.kind {
	case opWrite:
		if err = os.MkdirAll(filepath.Dir(p), 0o755); err == nil {
			err = os.WriteFile(p, []byte(op.body), 0o644)
		}
	case opRename:
		err = os.Rename(p, filepath.Join(root, op.to))
	case opLink:
		if err = os.Remove(p); err != nil && os.IsNotExist(err) {
			err = nil
		}
		if err == nil {
			err = os.Symlink(op.body, p)
		}
	case opRemove:
		err = os.RemoveAll(p)
	}
	if err != nil {
		tb.Fatal(err)
	}
}

// Fixture files, built as the trainers' writers lay them out.

// cutPT is a torch.save file (zip archive, ARCHIVE/data.pkl) holding the pickle of d
// (ints, strings, nil, []int, nested map[string]any), as torch.save's protocol 2.
func cutPT(d map[string]any) string {
	var pk bytes.Buffer
	pk.Write([]byte{0x80, 2})
	picklePut(&pk, d)
	pk.WriteByte('.')
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, f := range []struct{ name, body string }{
		{"archive/data.pkl", pk.String()}, {"archive/data/0", "\x00\x00\x80?"}, {"archive/version", "3\n"},
	} {
		w, err := zw.CreateHeader(&zip.FileHeader{Name: f.name, Method: zip.Store})
		if err == nil {
			_, err = w.Write([]byte(f.body))
		}
		if err != nil {
			panic(err) // writing to a bytes.Buffer cannot fail
		}
	}
	if err := zw.Close(); err != nil {
		panic(err)
	}
	return buf.String()
}

// picklePut appends v's pickle (protocol 2 opcodes) to b.
func picklePut(b *bytes.Buffer, v any) {
	switch x := v.(type) {
	case nil:
		b.WriteByte('N')
	case bool:
		b.WriteByte(map[bool]byte{true: 0x88, false: 0x89}[x])
	case int:
		b.WriteByte('J')
		_ = binary.Write(b, binary.LittleEndian, int32(x))
	case string:
		b.WriteByte('X')
		_ = binary.Write(b, binary.LittleEndian, uint32(len(x)))
		b.WriteString(x)
	case []int:
		b.WriteString("](")
		for _, n := range x {
			picklePut(b, n)
		}
		b.WriteByte('e')
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b.WriteString("}(")
		for _, k := range keys {
			picklePut(b, k)
			picklePut(b, x[k])
		}
		b.WriteByte('u')
	default:
		panic(fmt.Sprintf("picklePut: %T", v))
	}
}

// pt is a torch.save file of an empty dict.
func pt() string { return cutPT(map[string]any{}) }

// dsStates is a DeepSpeed model states file recording the world sizes: mp_world_size,
// dp_world_size, param_shapes (a list when the optimizer state lives in ZeRO files),
// num_experts for a MoE save.
func dsStates(mp, dp int, zero bool, experts []int) string {
	d := map[string]any{"module": nil, "mp_world_size": mp, "dp_world_size": dp, "global_steps": 20, "ds_version": "0.16.4"}
	if zero {
		d["param_shapes"] = []int{}
	} else {
		d["param_shapes"] = nil
	}
	if experts != nil {
		delete(d, "param_shapes")
		d["num_experts"] = experts
	}
	return cutPT(d)
}

// safetensorsBody is a safetensors file of one float32 tensor of n elements.
func safetensorsBody(name string, n int) string {
	header := fmt.Sprintf(`{"%s":{"dtype":"F32","shape":[%d],"data_offsets":[0,%d]}}`, name, n, 4*n)
	for len(header)%8 != 0 {
		header += " "
	}
	var b bytes.Buffer
	_ = binary.Write(&b, binary.LittleEndian, uint64(len(header)))
	b.WriteString(header)
	b.Write(make([]byte, 4*n))
	return b.String()
}

// distcp is a torch.distributed.checkpoint shard, and dcpMeta its metadata pickle.
const (
	distcpBody  = "PK\x03\x04 a storage shard written by FileSystemWriter"
	dcpMetaBody = "\x80\x04\x95 torch.distributed.checkpoint Metadata"
)

// dcpSave is FileSystemWriter's order in dir: every rank's shard, then the coordinator's
// .metadata.tmp renamed to .metadata (torch/distributed/checkpoint/filesystem.py).
func dcpSave(dir string, ranks int) []saveOp {
	var out []saveOp
	for r := 0; r < ranks; r++ {
		out = append(out, wrIn(fmt.Sprintf("%s/__%d_0.distcp", dir, r), distcpBody))
	}
	return append(out, wrIn(dir+"/.metadata.tmp", dcpMetaBody), mv(dir+"/.metadata.tmp", dir+"/.metadata"))
}

// dsZeRO2 is a DeepSpeed ZeRO-2 tag saved by dp data-parallel ranks: rank 0's model
// states and optimizer shard, `latest`, then the other ranks' shards
// (engine.py save_checkpoint: _save_checkpoint, _save_zero_checkpoint, latest).
func dsZeRO2(root, tag string, dp int) []saveOp {
	p := root + tag + "/"
	out := []saveOp{wrIn(p+"mp_rank_00_model_states.pt", dsStates(1, dp, true, nil)), wrIn(p+"zero_pp_rank_0_mp_rank_00_optim_states.pt", pt()),
		wr(root+"latest", tag)}
	for r := 1; r < dp; r++ {
		out = append(out, wrIn(fmt.Sprintf("%szero_pp_rank_%d_mp_rank_00_optim_states.pt", p, r), pt()))
	}
	return out
}

// dsMoE is a DeepSpeed MoE tag (_save_moe_checkpoint) with ep expert-parallel ranks, one
// expert each in each of layers MoE layers: each rank writes its experts, then its
// expp_rank optimizer file; rank 0 then the model states recording num_experts, and
// `latest`; then the other ranks.
func dsMoE(tag string, ep, layers int) []saveOp {
	experts := make([]int, layers)
	for i := range experts {
		experts[i] = ep
	}
	rank := func(r int) []saveOp {
		var out []saveOp
		for l := 0; l < layers; l++ {
			out = append(out, wrIn(fmt.Sprintf("%s/layer_%d_expert_%d_mp_rank_00_model_states.pt", tag, l, r), pt()))
		}
		return append(out, wrIn(fmt.Sprintf("%s/expp_rank_%d_mp_rank_00_optim_states.pt", tag, r), pt()))
	}
	out := append(rank(0), wrIn(tag+"/mp_rank_00_model_states.pt", dsStates(1, ep, false, experts)), wr("latest", tag))
	for r := 1; r < ep; r++ {
		out = append(out, rank(r)...)
	}
	return out
}

// dsPipe is a DeepSpeed pipeline tag (PipelineModule.save_state_dict, pipe × tensor
// parallel): each (stage, model rank) writes its stage's layer files
// layer_NN-model_MM-model_states.pt, then mp_rank_XX_model_states.pt recording
// mp_world_size = stages × tp; rank 0 then writes `latest`.
func dsPipe(tag string, stageLayers [][]int, tp int) []saveOp {
	mp := len(stageLayers) * tp
	var out []saveOp
	for s, layers := range stageLayers {
		for m := 0; m < tp; m++ {
			for _, l := range layers {
				out = append(out, wrIn(fmt.Sprintf("%s/layer_%02d-model_%02d-model_states.pt", tag, l, m), pt()))
			}
			out = append(out, wrIn(fmt.Sprintf("%s/mp_rank_%02d_model_states.pt", tag, s*tp+m), dsStates(mp, 1, false, nil)))
			if s == 0 && m == 0 {
				out = append(out, wr("latest", tag))
			}
		}
	}
	return out
}

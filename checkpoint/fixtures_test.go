package checkpoint

import (
	"archive/zip"
	"bytes"
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
		t[fmt.Sprintf("%s/mp_rank_%02d_model_states.pt", tag, m)] = "model"
		for d := 0; d < dp; d++ {
			t[fmt.Sprintf("%s/zero_pp_rank_%d_mp_rank_%02d_optim_states.pt", tag, d, m)] = "optim"
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
			t[name+"/"+rank+"/model_optim_rng.pt"] = "state"
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

// torchZip returns bytes laid out like torch.save's zip (ARCHIVE/data.pkl,
// ARCHIVE/data/0, ARCHIVE/version), stored uncompressed as torch does.
func torchZip(tb testing.TB, archive string) string {
	tb.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, f := range []struct{ name, body string }{
		{archive + "/data.pkl", "\x80\x02}q\x00.\n"},
		{archive + "/data/0", "\x00\x00\x80?"},
		{archive + "/version", "3\n"},
	} {
		w, err := zw.CreateHeader(&zip.FileHeader{Name: f.name, Method: zip.Store})
		if err != nil {
			tb.Fatal(err)
		}
		if _, err := w.Write([]byte(f.body)); err != nil {
			tb.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		tb.Fatal(err)
	}
	return buf.String()
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

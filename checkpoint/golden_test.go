package checkpoint

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

// layoutZoo is one directory per layout, each with complete and corrupt checkpoints.
func layoutZoo(tb testing.TB) map[string]tree {
	zip := torchZip(tb, "archive")
	return map[string]tree{
		"generic": merge(generic("step-9", true), generic("step-10", true), generic("step-11", false)),
		"dcp":     merge(dcp("step-100", true), dcp("step-200", false)),
		"deepspeed": merge(deepspeedTag("global_step100", 2, 1), deepspeedTag("global_step200", 2, 1),
			deepspeedTag("global_step300", 2, 1),
			tree{"global_step200/zero_pp_rank_1_mp_rank_00_optim_states.pt": "", "latest": "global_step200"}),
		"megatron": merge(megatronIter(1000, 2, 1), megatronIter(2000, 2, 1), tree{megatronTracker: "3000"}),
		"hf":       merge(hf(50, validTrainerState), hf(100, `{"global_step": 1`)),
		"lightning": tree{lightningName(0, 100): zip, lightningName(1, 200): zip[:40], "last.ckpt@": "last.ckpt",
			"best.ckpt": zip},
		"nemo": tree{"gpt--val_loss=1.0-step=10.ckpt": zip, "gpt--val_loss=0.9-step=20.ckpt": zip,
			"gpt--val_loss=0.9-step=20-unfinished": ""},
		"torchtitan": merge(dcp("step-10", true), tree{
			"step-20/model-00001-of-00001.safetensors": safetensorsBody("w", 4),
			"step-20/" + hfIndex:                       `{"weight_map": {"w": "model-00001-of-00001.safetensors"}}`,
			"step-30/model-00001-of-00001.safetensors": safetensorsBody("w", 4)[:20],
			"step-30/" + hfIndex:                       `{"weight_map": {"w": "model-00001-of-00001.safetensors"}}`,
		}),
		"accelerate": tree{
			"checkpoint_0/model.safetensors": safetensorsBody("w", 4), "checkpoint_0/optimizer.bin": zip,
			"checkpoint_0/random_states_0.pkl": zip, "checkpoint_0/random_states_1.pkl": zip,
			"checkpoint_1/model.safetensors": safetensorsBody("w", 4), "checkpoint_1/random_states_1.pkl": zip,
		},
		"composer": tree{"ep0-ba100-rank0.pt": zip, "ep0-ba200-rank0.pt": zip, "ep1-ba300-rank0.pt": zip[:50],
			"latest-rank0.pt@": "ep0-ba100-rank0.pt"},
		"levanter": tree{"step-100/model/manifest.ocdbt": "m", "step-100/metadata.json": `{"step": 100, "timestamp": "2025-03-01T10:00:00"}`,
			"step-200/model/manifest.ocdbt": "m", "step-200/metadata.json": `{"step": 200, "timest`},
		"olmo-core": merge(dcp("step100/model_and_optim", true), dcp("step200-tmp/model_and_optim", false), tree{
			"step100/train/rank0.pt": zip, "step100/.metadata.json": `{"ephemeral": false}`, "step200-tmp/train/rank0.pt": zip}),
	}
}

// TestInspectGolden compares Inspect's JSON for every layout with
// testdata/inspect.golden (go test -run InspectGolden -update rewrites it).
func TestInspectGolden(t *testing.T) {
	root := t.TempDir()
	out := map[string]Listing{}
	for layout, tr := range layoutZoo(t) {
		dir := filepath.Join(root, layout)
		build(t, dir, tr)
		l, err := Inspect(dir, Options{})
		if err != nil {
			t.Fatal(err)
		}
		for i := range l.Checkpoints {
			if l.Checkpoints[i].Link != "" { // a symlink's own time cannot be set portably
				l.Checkpoints[i].ModTime = time.Time{}
			}
		}
		out[layout] = l
	}
	got, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = bytes.ReplaceAll(got, []byte(root), []byte("ROOT"))
	got = append(got, '\n')
	golden := filepath.Join("testdata", "inspect.golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		gl, wl := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
		for i := 0; i < len(gl) && i < len(wl); i++ {
			if gl[i] != wl[i] {
				t.Fatalf("Inspect output differs from %s at line %d:\n got: %s\nwant: %s\n(run with -update if the change is intended)", golden, i+1, gl[i], wl[i])
			}
		}
		t.Fatalf("Inspect output differs from %s in length (%d vs %d lines)", golden, len(gl), len(wl))
	}
}

package checkpoint

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/torchtest"
)

// These tests judge files written by real torch (Debian's torch 1.13 and PyPI's torch
// 2.x, internal/torchtest), and check each verdict against torch's own: a checkpoint is
// complete exactly when torch loads it.

// runPython runs script with args and decodes its last stdout line as JSON into v.
func runPython(t *testing.T, py, script string, v any, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, append([]string{"-c", script}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), v); err != nil {
		t.Fatalf("python output %q: %v", out, err)
	}
}

// lightningScript writes Lightning-shaped checkpoints with torch.save — two complete,
// last.ckpt cut in half (a crash during Lightning's in-place write), one cut 10 bytes
// short, and a self-referencing symlink — then prints which ones torch.load accepts.
const lightningScript = `
import io, json, os, sys, torch
root = sys.argv[1]
def state(step):
    return {"epoch": step // 100, "global_step": step, "pytorch-lightning_version": "2.1.0",
            "state_dict": {"layer.weight": torch.randn(64, 64), "layer.bias": torch.zeros(64)},
            "optimizer_states": [{"state": {}, "param_groups": [{"lr": 0.1, "params": [0, 1]}]}],
            "lr_schedulers": [], "callbacks": {}, "loops": {}}
def cut(step, name, keep):
    buf = io.BytesIO()
    torch.save(state(step), buf)
    data = buf.getvalue()
    with open(os.path.join(root, name), "wb") as f:
        f.write(data[:keep(len(data))])
torch.save(state(100), os.path.join(root, "epoch=0-step=100.ckpt"))
torch.save(state(200), os.path.join(root, "epoch=1-step=200.ckpt"))
cut(250, "epoch=2-step=250.ckpt", lambda n: n - 10)
cut(300, "last.ckpt", lambda n: n // 2)
os.symlink("loop.ckpt", os.path.join(root, "loop.ckpt"))
loads = {}
for name in sorted(os.listdir(root)):
    try:
        torch.load(os.path.join(root, name))
        loads[name] = True
    except Exception:
        loads[name] = False
print(json.dumps(loads))
`

func TestTorchWrittenLightning(t *testing.T) {
	torchtest.Each(t, func(t *testing.T, tp torchtest.Python) {
		py := tp.Path
		root := t.TempDir()
		var loads map[string]bool
		runPython(t, py, lightningScript, &loads, root)
		if len(loads) != 5 || !loads["epoch=1-step=200.ckpt"] || loads["last.ckpt"] {
			t.Fatalf("torch's own verdicts are not the fixture's: %v", loads)
		}
		cps, err := List(root, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if len(cps) != len(loads) {
			t.Fatalf("List found %v; torch wrote %v", names(cps), loads)
		}
		for _, c := range cps {
			if want := loads[filepath.Base(c.Path)]; c.Complete != want {
				t.Errorf("%s: complete=%v (%s); torch.load succeeds=%v", filepath.Base(c.Path), c.Complete, c.Reason, want)
			}
			if c.Format != FormatLightning {
				t.Errorf("%s: format %s", c.Path, c.Format)
			}
		}
		got, err := Latest(root, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Base(got.Path) != "epoch=1-step=200.ckpt" || got.Step != 200 {
			t.Fatalf("Latest = %s step %d; want epoch=1-step=200.ckpt", got.Path, got.Step)
		}
	})
}

// dcpScript saves with torch.distributed.checkpoint (torch ≥ 2.0) or, on torch 1.13,
// torch.distributed._shard.checkpoint: step-10 completes; step-20 crashes at the
// rename of .metadata.tmp (the save's last act); step-30 completes with its .metadata
// emptied afterwards (storage lost it). Then it prints which directories torch loads.
const dcpScript = `
import dataclasses, json, os, pathlib, sys, torch
root = sys.argv[1]
def import_dcp():
    try:
        import torch.distributed.checkpoint as dcp
        return dcp
    except ImportError:
        pass
    # torch 1.13 under Python 3.11: _shard's TensorProperties is an unhashable dataclass
    # used as a field default, which 3.11's dataclasses reject; make it hashable while
    # importing.
    orig = dataclasses.dataclass
    def patched(cls=None, /, **kw):
        def wrap(c):
            k = dict(kw)
            if c.__name__ == "TensorProperties":
                k["unsafe_hash"] = True
            return orig(c, **k)
        return wrap if cls is None else wrap(cls)
    dataclasses.dataclass = patched
    try:
        import torch.distributed._shard.checkpoint as dcp
    finally:
        dataclasses.dataclass = orig
    return dcp
dcp = import_dcp()
def state(step):
    return {"model": {"w": torch.full((16, 16), float(step))}, "step": step}
def save(step):
    path = os.path.join(root, "step-%d" % step)
    os.makedirs(path)
    dcp.save_state_dict(state(step), dcp.FileSystemWriter(path), no_dist=True)
save(10)
real_rename = pathlib.Path.rename
def crash(self, target):
    raise RuntimeError("simulated crash before the rename")
pathlib.Path.rename = crash
try:
    save(20)
except BaseException:  # torch's CheckpointException derives from BaseException
    pass
pathlib.Path.rename = real_rename
save(30)
open(os.path.join(root, "step-30", ".metadata"), "wb").close()
loads = {}
for step in (10, 20, 30):
    sd = {"model": {"w": torch.zeros(16, 16)}, "step": 0}
    try:
        dcp.load_state_dict(sd, dcp.FileSystemReader(os.path.join(root, "step-%d" % step)), no_dist=True)
        loads["step-%d" % step] = bool(sd["step"] == step and float(sd["model"]["w"][0][0]) == step)
    except BaseException:
        loads["step-%d" % step] = False
print(json.dumps(loads))
`

func TestTorchWrittenDCP(t *testing.T) {
	torchtest.Each(t, func(t *testing.T, tp torchtest.Python) {
		py := tp.Path
		root := t.TempDir()
		var loads map[string]bool
		runPython(t, py, dcpScript, &loads, root)
		if !loads["step-10"] || loads["step-20"] || loads["step-30"] {
			t.Fatalf("torch's own verdicts are not the fixture's: %v", loads)
		}
		if _, err := os.Stat(filepath.Join(root, "step-20", ".metadata.tmp")); err != nil {
			t.Fatalf("the simulated crash did not leave .metadata.tmp: %v", err)
		}
		for _, format := range []Format{FormatAuto, FormatDCP} {
			cps, err := List(root, Options{Format: format})
			if err != nil {
				t.Fatal(err)
			}
			if len(cps) != 3 {
				t.Fatalf("%q: List found %v", format, names(cps))
			}
			for _, c := range cps {
				if want := loads[filepath.Base(c.Path)]; c.Complete != want || c.Format != FormatDCP && c.Complete {
					t.Errorf("%q: %s complete=%v format %s (%s); torch loads it: %v", format, filepath.Base(c.Path), c.Complete, c.Format, c.Reason, want)
				}
			}
			got, err := Latest(root, Options{Format: format})
			if err != nil {
				t.Fatal(err)
			}
			if filepath.Base(got.Path) != "step-10" || got.Format != FormatDCP {
				t.Fatalf("%q: Latest = %s (%s); want step-10 (dcp)", format, got.Path, got.Format)
			}
		}
	})
}

package checkpoint

import (
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"

	"github.com/gangrun/gangrun/internal/torchtest"
)

// plainOf renders a value readPickle returned in a fixed notation, to compare with
// what Python prints of the same object (pyPlain in pickleScript).
func plainOf(v any) string {
	switch x := v.(type) {
	case nil:
		return "None"
	case bool:
		if x {
			return "True"
		}
		return "False"
	case int64:
		return fmt.Sprint(x)
	case float64:
		return fmt.Sprintf("%g", x)
	case string:
		return fmt.Sprintf("%q", x)
	case []byte:
		return fmt.Sprintf("b%x", x)
	case *pyList:
		return "[" + plainList(x.items) + "]"
	case []any:
		return "(" + plainList(x) + ")"
	case *pyDict:
		keys := make([]string, 0, len(x.m))
		for k := range x.m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = fmt.Sprintf("%q: %s", k, plainOf(x.m[k]))
		}
		return "{" + strings.Join(parts, ", ") + "}"
	case pyObject:
		return "<" + x.class + ">"
	}
	return fmt.Sprintf("?%T", v)
}

func plainList(items []any) string {
	parts := make([]string, len(items))
	for i, it := range items {
		parts[i] = plainOf(it)
	}
	return strings.Join(parts, ", ")
}

// pickleScript pickles one object with every protocol Python has, and prints for each
// the pickle (base64) and the rendering plainOf must give: classes and instances as
// <module.name>, collections.OrderedDict as a dict, sets as <builtins.set>.
const pickleScript = `
import base64, collections, json, pickle, sys
class Thing:
    def __init__(self): self.x = 1
obj = {
    "mp_world_size": 4, "dp_world_size": 128, "neg": -3, "big": 2**40, "huge": 2**100, "f": 0.5,
    "none": None, "t": True, "fl": False, "s": "héllo", "b": b"\x00\x01", "num_experts": [8, 8, 16],
    "tup": (1, "two", None), "nested": collections.OrderedDict([("a", 1), ("b", [1, 2])]),
    "shared": None, "thing": Thing(), "cls": Thing, "set": {1, 2}, "fs": frozenset([3]), 7: "int key",
}
shared = [1, 2]
obj["shared"] = [shared, shared]
def plain(v):
    if v is None: return "None"
    if v is True: return "True"
    if v is False: return "False"
    if isinstance(v, int): return str(v) if -2**63 <= v < 2**63 else "<builtins.int>"
    if isinstance(v, float): return "%g" % v
    if isinstance(v, str): return json.dumps(v, ensure_ascii=False)
    if isinstance(v, bytes): return "b" + v.hex()
    if isinstance(v, list): return "[" + ", ".join(plain(x) for x in v) + "]"
    if isinstance(v, tuple): return "(" + ", ".join(plain(x) for x in v) + ")"
    if isinstance(v, dict):
        return "{" + ", ".join("%s: %s" % (json.dumps(k), plain(v[k])) for k in sorted(k for k in v if isinstance(k, str))) + "}"
    if isinstance(v, frozenset): return "<builtins.frozenset>"
    if isinstance(v, set): return "<builtins.set>"
    if isinstance(v, type): return "<%s.%s>" % (v.__module__, v.__qualname__)
    return "<%s.%s>" % (type(v).__module__, type(v).__qualname__)
out = {}
for proto in range(0, pickle.HIGHEST_PROTOCOL + 1):
    out[str(proto)] = base64.b64encode(pickle.dumps(obj, protocol=proto)).decode()
out["want"] = plain(obj)
print(json.dumps(out))
`

// TestReadPickleFromPython: Python's own pickle module writes one object of every kind a
// trainer records, with each protocol from 0 to the highest; readPickle reads each back
// to what Python holds, classes and instances left opaque.
func TestReadPickleFromPython(t *testing.T) {
	py := os.Getenv("GANGRUN_PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	var out map[string]string
	runPython(t, py, pickleScript, &out)
	want := out["want"]
	if len(out) < 6 {
		t.Fatalf("python gave %d protocols", len(out)-1)
	}
	for proto, b64 := range out {
		if proto == "want" {
			continue
		}
		data, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			t.Fatal(err)
		}
		v, err := readPickle(data)
		if err != nil {
			t.Errorf("protocol %s: %v", proto, err)
			continue
		}
		if got := plainOf(v); got != want {
			t.Errorf("protocol %s:\n got %s\nwant %s", proto, got, want)
		}
	}
}

// TestReadPickleRefusesBrokenInput: cut pickles, unknown opcodes, stack underflows and
// memo misses are errors wrapping errPickle, never panics or hangs.
func TestReadPickleRefusesBrokenInput(t *testing.T) {
	whole := "\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01K\x01u."
	if v, err := readPickle([]byte(whole)); err != nil || plainOf(v) != `{"a": 1}` {
		t.Fatalf("whole pickle: %v, %v", plainOf(v), err)
	}
	for name, data := range map[string]string{
		"cut short":          whole[:len(whole)-3],
		"empty":              "",
		"unknown opcode":     "\x80\x02\xff.",
		"stack underflow":    "\x80\x02s.",
		"memo miss":          "\x80\x02h\x05.",
		"length past end":    "\x80\x02X\xff\xff\x00\x00ab.",
		"two values at STOP": "\x80\x02K\x01K\x02.",
		"popped mark":        "\x80\x02(0.",
		"no newline":         "\x80\x02I12",
		"out of band buffer": "\x80\x05\x97.",
	} {
		if _, err := readPickle([]byte(data)); !errors.Is(err, errPickle) {
			t.Errorf("%s: %v, want an error wrapping errPickle", name, err)
		}
	}
}

// FuzzReadPickle: readPickle never panics, and what it accepts it accepts again the
// same (no state kept between runs).
func FuzzReadPickle(f *testing.F) {
	for _, seed := range []string{
		"\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01K\x01u.",
		"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00]\x94(K\x01K\x02e.",
		"(dp0\nS'a'\np1\nI1\ns.",
		"\x80\x02ccollections\nOrderedDict\nq\x00)Rq\x01X\x01\x00\x00\x00kK\x07s.",
		"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n(X\x01\x00\x00\x000Q}tR.",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v1, err1 := readPickle(data)
		v2, err2 := readPickle(data)
		if (err1 == nil) != (err2 == nil) || plainOf(v1) != plainOf(v2) {
			t.Fatalf("two reads differ: %v %v / %v %v", plainOf(v1), err1, plainOf(v2), err2)
		}
		if err1 != nil && !errors.Is(err1, errPickle) {
			t.Fatalf("error %v does not wrap errPickle", err1)
		}
	})
}

// deepspeedTorchScript writes, with real torch.save, the model states files of a
// DeepSpeed ZeRO-2 run and of a MoE run as DeepSpeed's _save_checkpoint and
// _save_moe_checkpoint fill them (tensors, an OrderedDict module, torch.Size shapes,
// the config dict), and prints what the reader must find in them.
const deepspeedTorchScript = `
import collections, json, os, sys, torch
root = sys.argv[1]
module = collections.OrderedDict([("layer.weight", torch.randn(8, 8)), ("layer.bias", torch.zeros(8))])
zero = dict(module=module, buffer_names=[], optimizer=None,
    param_shapes=[collections.OrderedDict([("layer.weight", torch.Size([8, 8])), ("layer.bias", torch.Size([8]))])],
    frozen_param_shapes=None, shared_params={}, frozen_param_fragments=None,
    lr_scheduler={"last_epoch": 20}, data_sampler=None, random_ltd=None, sparse_tensor_module_names=set(),
    skipped_steps=0, global_steps=20, global_samples=640, dp_world_size=16, mp_world_size=2,
    ds_config={"train_batch_size": 32, "zero_optimization": {"stage": 2}}, ds_version="0.16.4")
moe = dict(module=module, lr_scheduler=None, data_sampler=None, random_ltd=None, sparse_tensor_module_names=set(),
    skipped_steps=0, global_steps=20, global_samples=640, dp_world_size=8, mp_world_size=1, num_experts=[8, 8, 16])
mics = dict(zero, ds_config={"zero_optimization": {"stage": 3, "mics_shard_size": 4}})
for name, state in [("zero", zero), ("moe", moe), ("mics", mics)]:
    torch.save(state, os.path.join(root, name + ".pt"))
data = open(os.path.join(root, "zero.pt"), "rb").read()
for name, keep in [("zero-half.pt", len(data) // 2), ("zero-short.pt", len(data) - 10), ("zero-1.pt", len(data) - 1)]:
    open(os.path.join(root, name), "wb").write(data[:keep])
loads = {}
for name in sorted(os.listdir(root)):
    try:
        torch.load(os.path.join(root, name))
        loads[name] = True
    except Exception:
        loads[name] = False
print(json.dumps(loads))
`

// TestTorchWrittenDeepSpeedStates: the recorded sizes of model states files torch.save
// wrote are read back without torch: mp_world_size, dp_world_size, param_shapes set,
// num_experts; a MiCS run's dp_world_size is not counted. And the end-record check
// takes a torch.save file as whole exactly when torch.load loads it (whole, cut in half,
// cut 10 bytes and 1 byte short).
func TestTorchWrittenDeepSpeedStates(t *testing.T) {
	py := torchtest.Debian(t).Path
	root := t.TempDir()
	var loads map[string]bool
	runPython(t, py, deepspeedTorchScript, &loads, root)
	if len(loads) != 6 || !loads["zero.pt"] || loads["zero-half.pt"] {
		t.Fatalf("torch's own verdicts are not the fixture's: %v", loads)
	}
	for name, want := range loads {
		if _, whole := checkTorchSaveFile(root, name, FormatDeepSpeed); whole != want {
			t.Errorf("%s: whole=%v, torch.load loads it: %v", name, whole, want)
		}
	}
	for _, tc := range []struct {
		file    string
		mp, dp  int
		zero    bool
		experts string
	}{
		{"zero.pt", 2, 16, true, "[]"},
		{"moe.pt", 1, 8, false, "[8 8 16]"},
		{"mics.pt", 2, 0, true, "[]"},
	} {
		r := readDSRecorded(root, tc.file)
		if r == nil {
			t.Errorf("%s: not read", tc.file)
			continue
		}
		if r.mp != tc.mp || r.dp != tc.dp || r.zero != tc.zero || fmt.Sprint(r.experts) != tc.experts && !(tc.experts == "[]" && r.experts == nil) {
			t.Errorf("%s: read mp %d dp %d zero %v experts %v; want %d %d %v %s", tc.file, r.mp, r.dp, r.zero, r.experts, tc.mp, tc.dp, tc.zero, tc.experts)
		}
	}
}

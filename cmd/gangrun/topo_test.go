package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const inventories = "../../topology/testdata/inventories"

func runCLI(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	e := &env{stdout: &out, stderr: &errb, getenv: func(string) string { return "" }}
	code = dispatch(context.Background(), e, args)
	return out.String(), errb.String(), code
}

// TestTopoGolden runs every output mode of `gangrun topo --topology-file` on every
// recorded inventory and compares with testdata/topo/<fixture>.<mode>.
func TestTopoGolden(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(inventories, "*.json"))
	if err != nil || len(files) < 5 {
		t.Fatalf("recorded inventories: %v %v", files, err)
	}
	modes := []struct {
		ext  string
		args []string
	}{
		{"txt", nil},
		{"json", []string{"--json"}},
		{"env", []string{"--nccl-env"}},
		{"xml", []string{"--nccl-topo-xml", "-"}},
	}
	for _, f := range files {
		fixture := strings.TrimSuffix(filepath.Base(f), ".json")
		for _, m := range modes {
			t.Run(fixture+"."+m.ext, func(t *testing.T) {
				args := append([]string{"topo", "--topology-file", f}, m.args...)
				stdout, stderr, code := runCLI(t, args...)
				if code != exitOK || stderr != "" {
					t.Fatalf("exit %d, stderr %q", code, stderr)
				}
				golden := filepath.Join("testdata", "topo", fixture+"."+m.ext)
				if *update {
					if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(golden, []byte(stdout), 0o644); err != nil {
						t.Fatal(err)
					}
				}
				want, err := os.ReadFile(golden)
				if err != nil {
					t.Fatalf("%v (run go test ./cmd/gangrun -run TestTopoGolden -update)", err)
				}
				if stdout != string(want) {
					t.Errorf("output differs from %s (run with -update and review the diff)", golden)
				}
			})
		}
	}
}

// TestTopoJSONRoundTrip: --topology-file of a --json output reproduces it exactly, and
// the --json of a recording is the recording.
func TestTopoJSONRoundTrip(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(inventories, "*.json"))
	for _, f := range files {
		first, _, code := runCLI(t, "topo", "--topology-file", f, "--json")
		if code != exitOK {
			t.Fatalf("%s: exit %d", f, code)
		}
		orig, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if first != string(orig) {
			t.Errorf("%s: --json differs from the recording", f)
		}
		tmp := filepath.Join(t.TempDir(), "inv.json")
		if err := os.WriteFile(tmp, []byte(first), 0o644); err != nil {
			t.Fatal(err)
		}
		second, _, code := runCLI(t, "topo", "--topology-file", tmp, "--json")
		if code != exitOK || second != first {
			t.Errorf("%s: --topology-file of the --json output does not reproduce it (exit %d)", f, code)
		}
	}
}

func TestTopoXMLToFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "topo.xml")
	stdout, stderr, code := runCLI(t, "topo", "--topology-file", filepath.Join(inventories, "dgx-h100.json"), "--nccl-topo-xml", path)
	if code != exitOK || stdout != "" || stderr != "" {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join("testdata", "topo", "dgx-h100.xml"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Error("the file differs from the golden XML")
	}
}

func TestTopoErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.json")
	tests := []struct {
		args   []string
		code   int
		stderr string
	}{
		{[]string{"topo", "--json", "--nccl-env"}, exitUsage, "gangrun topo: --json and --nccl-env are exclusive\n"},
		{[]string{"topo", "extra"}, exitUsage, "gangrun topo: unexpected argument \"extra\"\n"},
		{[]string{"topo", "--bogus"}, exitUsage, "gangrun topo: unknown flag: --bogus\n"},
		{[]string{"topo", "--topology-file", missing}, exitUsage, "gangrun topo: --topology-file " + missing + ": no such file\n"},
		{[]string{"topo", "--topology-file", "x.json", "--sysfs-root", "/"}, exitUsage, "gangrun topo: --topology-file and --sysfs-root are exclusive\n"},
		{[]string{"topo", "--json", "--nccl-topo-xml", "-"}, exitUsage, "gangrun topo: --nccl-topo-xml - writes to stdout and cannot be combined with --json or --nccl-env\n"},
	}
	for _, tc := range tests {
		stdout, stderr, code := runCLI(t, tc.args...)
		if code != tc.code || stderr != tc.stderr || stdout != "" {
			t.Errorf("%v: exit %d, stderr %q, stdout %q; want exit %d, stderr %q", tc.args, code, stderr, stdout, tc.code, tc.stderr)
		}
	}
}

// checkProbeJSON checks `gangrun topo --json` output of a real probe: valid, and either
// GPUs or a note saying why there are none.
func checkProbeJSON(t *testing.T, out string) {
	t.Helper()
	var inv struct {
		SchemaVersion int               `json:"schema_version"`
		Node          string            `json:"node"`
		GPUs          []json.RawMessage `json:"gpus"`
		RDMA          []json.RawMessage `json:"rdma_devices"`
		Netdevs       []json.RawMessage `json:"netdevs"`
		Notes         []string          `json:"notes"`
	}
	if err := json.Unmarshal([]byte(out), &inv); err != nil {
		t.Fatalf("--json output is not JSON: %v", err)
	}
	if inv.SchemaVersion != 1 || inv.Node == "" || inv.GPUs == nil || inv.RDMA == nil || inv.Netdevs == nil {
		t.Errorf("incomplete inventory: %s", out)
	}
	if len(inv.GPUs) == 0 && !strings.Contains(strings.Join(inv.Notes, "\n"), "no GPUs: ") {
		t.Errorf("no GPUs and no note saying why: %q", inv.Notes)
	}
}

// TestTopoProbesThisMachine runs `gangrun topo` and `gangrun topo --json` in process
// against this machine (no NVIDIA driver on CI: exit 0, no GPUs, a note).
func TestTopoProbesThisMachine(t *testing.T) {
	stdout, stderr, code := runCLI(t, "topo")
	if code != exitOK || stderr != "" || !strings.HasPrefix(stdout, "Node ") {
		t.Fatalf("topo: exit %d, stderr %q, stdout %q", code, stderr, stdout)
	}
	stdout, _, code = runCLI(t, "topo", "--json")
	if code != exitOK {
		t.Fatalf("topo --json: exit %d", code)
	}
	checkProbeJSON(t, stdout)
}

// TestTopoSysfsRoot probes an empty tree: no RDMA devices, no interfaces, exit 0.
func TestTopoSysfsRoot(t *testing.T) {
	stdout, stderr, code := runCLI(t, "topo", "--sysfs-root", t.TempDir(), "--json")
	if code != exitOK || stderr != "" {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	checkProbeJSON(t, stdout)
	if !strings.Contains(stdout, `"no RDMA devices: /sys/class/infiniband does not exist (no RDMA driver loaded)"`) {
		t.Errorf("no RDMA note in %s", stdout)
	}
}

// TestTopoBinaryWithoutDriver builds the gangrun binary (cgo, go-nvml) and runs it:
// on a machine without libnvidia-ml it must start, and `topo` and `topo --json` exit 0.
func TestTopoBinaryWithoutDriver(t *testing.T) {
	bin := gangrunBin
	for _, args := range [][]string{{"topo"}, {"topo", "--json"}} {
		cmd := exec.Command(bin, args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("gangrun %v: %v\nstderr: %s", args, err, stderr.String())
		}
		if stderr.Len() > 0 {
			t.Errorf("gangrun %v wrote to stderr: %s", args, stderr.String())
		}
		if len(args) == 2 {
			checkProbeJSON(t, stdout.String())
		}
	}
}

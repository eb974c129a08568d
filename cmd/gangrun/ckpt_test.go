package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/gangrun/gangrun/checkpoint"
)

// ckptRun runs `gangrun ARGS...` in-process.
func ckptRun(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	e := &env{stdout: &out, stderr: &errb, getenv: func(string) string { return "" }}
	code = dispatch(context.Background(), e, args)
	return code, out.String(), errb.String()
}

// ckptTree makes step-N directories under a fresh directory: complete ones with the
// generic layout's .complete marker, incomplete ones without.
func ckptTree(t *testing.T, complete []int, incomplete []int) string {
	t.Helper()
	dir := t.TempDir()
	for _, n := range append(append([]int{}, complete...), incomplete...) {
		d := filepath.Join(dir, fmt.Sprintf("step-%d", n))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "model.pt"), []byte("weights"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range complete {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("step-%d", n), ".complete"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func listNames(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		if e.Name() != ".gangrun" {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out
}

func TestCkptLatest(t *testing.T) {
	dir := ckptTree(t, []int{9, 10}, []int{11})
	code, out, errs := ckptRun(t, "ckpt", "latest", dir)
	if code != 0 || out != filepath.Join(dir, "step-10")+"\n" || errs != "" {
		t.Fatalf("latest: code %d stdout %q stderr %q", code, out, errs)
	}

	code, out, _ = ckptRun(t, "ckpt", "latest", "--json", dir)
	var cp checkpoint.Checkpoint
	if code != 0 || json.Unmarshal([]byte(out), &cp) != nil || cp.Path != filepath.Join(dir, "step-10") ||
		cp.Step != 10 || cp.Format != checkpoint.FormatGeneric || !cp.Complete {
		t.Fatalf("latest --json: code %d %q", code, out)
	}

	// Forced to torch.distributed.checkpoint's rule, none of these is complete.
	code, out, errs = ckptRun(t, "ckpt", "latest", "--format", "dcp", dir)
	lines := strings.Split(strings.TrimSpace(errs), "\n")
	if code != 1 || out != "" || len(lines) != 4 ||
		lines[0] != fmt.Sprintf("gangrun ckpt latest: no complete checkpoint in %s (3 candidates)", dir) ||
		lines[1] != "  "+filepath.Join(dir, "step-11")+": no .metadata: torch.distributed.checkpoint renames it into place after every shard, so the save did not finish" {
		t.Fatalf("latest --format dcp: code %d stdout %q stderr:\n%s", code, out, errs)
	}

	code, _, errs = ckptRun(t, "ckpt", "latest", t.TempDir())
	if code != 1 || !strings.Contains(errs, "(0 candidates)\n  no candidates: see 'gangrun ckpt --help'") {
		t.Fatalf("latest on an empty directory: code %d stderr %q", code, errs)
	}

	code, out, _ = ckptRun(t, "ckpt", "latest", "--json", "--format", "dcp", dir)
	var none struct {
		Error    string                  `json:"error"`
		Rejected []checkpoint.Checkpoint `json:"rejected"`
	}
	if code != 1 || json.Unmarshal([]byte(out), &none) != nil || none.Error != "no complete checkpoint" || len(none.Rejected) != 3 ||
		none.Rejected[0].Step != 11 || none.Rejected[0].Reason == "" {
		t.Fatalf("latest --json with none complete: code %d %q", code, out)
	}
}

func TestCkptLsVerify(t *testing.T) {
	dir := ckptTree(t, []int{9, 10}, []int{100})
	code, out, errs := ckptRun(t, "ckpt", "ls", dir)
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if code != 0 || errs != "" || len(lines) != 4 || !strings.HasPrefix(lines[0], "STEP") {
		t.Fatalf("ls: code %d stderr %q stdout:\n%s", code, errs, out)
	}
	for i, want := range []string{"100 generic incomplete 7", "10 generic complete 7", "9 generic complete 7"} {
		f := strings.Fields(lines[i+1])
		if len(f) < 6 || strings.Join(f[:4], " ") != want || f[5] != filepath.Join(dir, "step-"+strings.Fields(want)[0]) {
			t.Errorf("ls line %d: %q; want %q ...", i+1, lines[i+1], want)
		}
	}
	if !strings.Contains(lines[1], "no completion marker") {
		t.Errorf("ls does not say why step-100 is incomplete: %q", lines[1])
	}

	code, out, _ = ckptRun(t, "ckpt", "ls", "--json", dir)
	var l checkpoint.Listing
	if code != 0 || json.Unmarshal([]byte(out), &l) != nil || len(l.Checkpoints) != 3 || l.Checkpoints[0].Step != 100 || l.Checkpoints[0].Complete {
		t.Fatalf("ls --json: code %d %q", code, out)
	}

	code, out, _ = ckptRun(t, "ckpt", "verify", filepath.Join(dir, "step-10"))
	if code != 0 || out != filepath.Join(dir, "step-10")+": complete (generic, step 10)\n" {
		t.Fatalf("verify complete: code %d %q", code, out)
	}
	code, out, _ = ckptRun(t, "ckpt", "verify", filepath.Join(dir, "step-100"))
	if code != 1 || !strings.HasPrefix(out, filepath.Join(dir, "step-100")+": incomplete (generic, step 100): no completion marker") {
		t.Fatalf("verify incomplete: code %d %q", code, out)
	}
	code, out, _ = ckptRun(t, "ckpt", "verify", "--json", filepath.Join(dir, "step-100"))
	var cp checkpoint.Checkpoint
	if code != 1 || json.Unmarshal([]byte(out), &cp) != nil || cp.Complete || cp.Step != 100 {
		t.Fatalf("verify --json: code %d %q", code, out)
	}
}

func TestCkptPrune(t *testing.T) {
	dir := ckptTree(t, []int{1, 2, 3, 4}, []int{0, 5})
	before := listNames(t, dir)

	code, out, errs := ckptRun(t, "ckpt", "prune", dir, "--keep", "2")
	if code != 0 || !strings.Contains(errs, "dry run: 3 to delete, 3 kept; run again with --yes to delete") {
		t.Fatalf("prune dry run: code %d stderr %q", code, errs)
	}
	for _, name := range []string{"step-0", "step-1", "step-2"} {
		if !strings.Contains(out, "would delete  "+filepath.Join(dir, name)+"  ") {
			t.Errorf("dry run output lacks %s:\n%s", name, out)
		}
	}
	if after := listNames(t, dir); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("dry run changed the directory: %v -> %v", before, after)
	}

	code, out, _ = ckptRun(t, "ckpt", "prune", dir, "--keep", "2", "--yes", "--json")
	var plan struct {
		Delete []struct {
			Path string `json:"path"`
			Why  string `json:"why"`
		} `json:"delete"`
		Kept    []struct{ Path string } `json:"kept"`
		Applied bool                    `json:"applied"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &plan) != nil || !plan.Applied || len(plan.Delete) != 3 || len(plan.Kept) != 3 {
		t.Fatalf("prune --yes --json: code %d %q", code, out)
	}
	if after := listNames(t, dir); fmt.Sprint(after) != "[step-3 step-4 step-5]" {
		t.Fatalf("after prune --yes: %v", after)
	}
}

// TestCkptBadInput: every bad input is one line on stderr naming the bad value, exit
// 2, nothing on stdout and nothing deleted.
func TestCkptBadInput(t *testing.T) {
	dir := ckptTree(t, []int{1, 2, 3}, nil)
	file := filepath.Join(dir, "step-1", "model.pt")
	loop := filepath.Join(t.TempDir(), "loop")
	if err := os.Symlink(loop, loop); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")
	before := listNames(t, dir)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"ckpt"}, "gangrun ckpt: missing subcommand"},
		{[]string{"ckpt", "frob"}, `gangrun ckpt: unknown subcommand "frob"`},
		{[]string{"ckpt", "latest"}, "gangrun ckpt latest: missing checkpoint directory DIR"},
		{[]string{"ckpt", "latest", dir, dir}, "gangrun ckpt latest: want one checkpoint directory DIR, got 2 arguments"},
		{[]string{"ckpt", "latest", missing}, fmt.Sprintf("gangrun ckpt latest: checkpoint dir %q: does not exist", missing)},
		{[]string{"ckpt", "latest", file}, fmt.Sprintf("gangrun ckpt latest: checkpoint dir %q: is a file, not a directory", file)},
		{[]string{"ckpt", "latest", loop}, fmt.Sprintf("gangrun ckpt latest: checkpoint dir %q: symlink loop", loop)},
		{[]string{"ckpt", "latest", "--format", "keras", dir}, `gangrun ckpt latest: --format: unknown checkpoint format "keras"`},
		{[]string{"ckpt", "latest", "--bogus", dir}, "gangrun ckpt latest: unknown flag: --bogus"},
		{[]string{"ckpt", "ls", loop}, fmt.Sprintf("gangrun ckpt ls: checkpoint dir %q: symlink loop", loop)},
		{[]string{"ckpt", "verify", missing}, fmt.Sprintf("gangrun ckpt verify: checkpoint %q: does not exist", missing)},
		{[]string{"ckpt", "verify", ""}, "gangrun ckpt verify: checkpoint PATH is an empty string"},
		{[]string{"ckpt", "prune", "", "--keep", "1", "--yes"}, "gangrun ckpt prune: checkpoint directory DIR is an empty string"},
		{[]string{"ckpt", "prune", dir}, "gangrun ckpt prune: --keep N is required"},
		{[]string{"ckpt", "prune", dir, "--keep", "-1", "--yes"}, "gangrun ckpt prune: --keep -1: must be at least 1"},
		{[]string{"ckpt", "prune", dir, "--keep", "0", "--yes"}, "gangrun ckpt prune: --keep 0: must be at least 1"},
		{[]string{"ckpt", "prune", dir, "--keep", "two", "--yes"}, `gangrun ckpt prune: --keep "two": must be an integer`},
		{[]string{"ckpt", "prune", file, "--keep", "1", "--yes"}, fmt.Sprintf("gangrun ckpt prune: checkpoint dir %q: is a file, not a directory", file)},
		{[]string{"ckpt", "prune", loop, "--keep", "1", "--yes"}, fmt.Sprintf("gangrun ckpt prune: checkpoint dir %q: symlink loop", loop)},
	}
	for _, tc := range cases {
		code, out, errs := ckptRun(t, tc.args...)
		if code != 2 || out != "" || strings.Count(errs, "\n") != 1 || !strings.HasPrefix(errs, tc.want) {
			t.Errorf("%v: code %d stdout %q stderr %q; want exit 2 and one line starting %q", tc.args[1:], code, out, errs, tc.want)
		}
	}
	if after := listNames(t, dir); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("bad input changed the directory: %v -> %v", before, after)
	}
}

func TestCkptHelp(t *testing.T) {
	code, out, _ := ckptRun(t, "ckpt", "--help")
	if code != 0 || !strings.Contains(out, "prune DIR --keep N") {
		t.Fatalf("ckpt --help: %d %q", code, out)
	}
	code, out, _ = ckptRun(t, "ckpt", "prune", "--help")
	if code != 0 || !strings.Contains(out, "--keep") || !strings.Contains(out, "--yes") {
		t.Fatalf("ckpt prune --help: %d %q", code, out)
	}
}

package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// decisionNames returns "name: why-fragment" style maps of a plan's decisions.
func decisionNames(ds []Decision) map[string]string {
	out := map[string]string{}
	for _, d := range ds {
		out[filepath.Base(d.Path)] = d.Why
	}
	return out
}

// entries lists a directory's names, without gangrun's state directory.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		if e.Name() != stateDirName {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out
}

func TestPrune(t *testing.T) {
	zip := torchZip(t, "archive")
	cases := []struct {
		name   string
		tree   tree
		keep   int
		pin    []string // names pinned by this process
		delete map[string]string
		kept   map[string]string
		after  []string // the directory's entries after Apply
	}{
		{
			name: "pinned checkpoint and a newer incomplete one",
			tree: merge(generic("step-50", false), generic("step-100", true), generic("step-200", true), generic("step-300", true),
				generic("step-400", true), generic("step-500", true), generic("step-600", false)),
			keep: 2,
			pin:  []string{"step-100"},
			delete: map[string]string{
				"step-300": "complete, older than the newest 2 complete",
				"step-200": "complete, older than the newest 2 complete",
				"step-50":  "incomplete, older than the newest complete checkpoint step-500",
			},
			kept: map[string]string{
				"step-600": "incomplete, newer than the newest complete checkpoint",
				"step-500": "one of the newest 2 complete",
				"step-400": "one of the newest 2 complete",
				"step-100": "pinned by job test-job",
			},
			after: []string{"step-100", "step-400", "step-500", "step-600"},
		},
		{
			name: "a pinned checkpoint among the newest counts once",
			tree: merge(generic("step-1", true), generic("step-2", true), generic("step-3", true)),
			keep: 1,
			pin:  []string{"step-3"},
			delete: map[string]string{
				"step-2": "complete, older", "step-1": "complete, older",
			},
			kept:  map[string]string{"step-3": "one of the newest 1 complete; pinned by job test-job"},
			after: []string{"step-3"},
		},
		{
			name: "a step too large for 64 bits is kept: its order is unknown",
			tree: merge(generic("step-1", true), generic("step-2", true), generic("step-3", true),
				generic("step-99999999999999999999", true)),
			keep:   1,
			delete: map[string]string{"step-2": "complete, older", "step-1": "complete, older"},
			kept: map[string]string{
				"step-3":                    "one of the newest 1 complete",
				"step-99999999999999999999": "step number 99999999999999999999 does not fit in 64 bits: its place among the checkpoints is unknown, so it is kept",
			},
			after: []string{"step-3", "step-99999999999999999999"},
		},
		{
			name:  "nothing complete: nothing deleted",
			tree:  merge(generic("step-1", false), generic("step-2", false)),
			keep:  1,
			kept:  map[string]string{"step-1": "no checkpoint is complete", "step-2": "no checkpoint is complete"},
			after: []string{"step-1", "step-2"},
		},
		{
			name: "Lightning: last.ckpt link and its target survive",
			tree: tree{lightningName(0, 100): zip, lightningName(1, 200): zip, lightningName(2, 300): zip,
				"last.ckpt@": lightningName(0, 100)},
			keep:   1,
			delete: map[string]string{lightningName(1, 200): "complete, older"},
			kept: map[string]string{
				lightningName(2, 300): "one of the newest 1",
				"last.ckpt":           "symlink to " + lightningName(0, 100),
				lightningName(0, 100): "target of symlink last.ckpt",
			},
			after: []string{lightningName(0, 100), lightningName(2, 300), "last.ckpt"},
		},
		{
			name: "Megatron: the tracker's target is kept even when untrusted",
			tree: merge(megatronIter(200, 1, 1), megatronIter(400, 1, 1), tree{"iter_0000300/": "", megatronTracker: "300"}),
			keep: 1,
			delete: map[string]string{
				"iter_0000200": "complete, older",
			},
			kept: map[string]string{
				"iter_0000400": "one of the newest 1",
				"iter_0000300": "named by latest_checkpointed_iteration.txt",
			},
			after: []string{"iter_0000300", "iter_0000400", megatronTracker},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			build(t, root, tc.tree)
			for _, p := range tc.pin {
				release, err := Pin(root, filepath.Join(root, p), "test-job")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = release() })
			}
			plan, err := Prune(root, tc.keep, Options{})
			if err != nil {
				t.Fatal(err)
			}
			checkDecisions(t, "delete", decisionNames(plan.Delete), tc.delete)
			checkDecisions(t, "keep", decisionNames(plan.Kept), tc.kept)
			before := entries(t, root)
			// A dry run deletes nothing: Prune only plans.
			if got := entries(t, root); fmt.Sprint(got) != fmt.Sprint(before) {
				t.Fatalf("Prune changed the directory: %v -> %v", before, got)
			}
			if err := plan.Apply(); err != nil {
				t.Fatalf("Apply: %v", err)
			}
			if got := entries(t, root); fmt.Sprint(got) != fmt.Sprint(tc.after) {
				t.Fatalf("after Apply: %v; want %v", got, tc.after)
			}
			if left, _ := os.ReadDir(filepath.Join(root, stateDirName, trashDirName)); len(left) != 0 {
				t.Errorf("trash not emptied: %d entries", len(left))
			}
		})
	}
}

func checkDecisions(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: got %v; want %v", what, got, want)
	}
	for name, frag := range want {
		if why, ok := got[name]; !ok || !strings.Contains(why, frag) {
			t.Errorf("%s %s: why %q (present %v); want %q", what, name, why, ok, frag)
		}
	}
}

func TestPruneBadInput(t *testing.T) {
	root := t.TempDir()
	build(t, root, merge(generic("step-1", true), generic("step-2", true)))
	for _, keep := range []int{0, -1} {
		if _, err := Prune(root, keep, Options{}); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("keep %d", keep)) {
			t.Errorf("Prune keep %d: %v", keep, err)
		}
	}
	// An unreadable pin: which checkpoint it protects is unknown, so nothing is planned.
	build(t, root, tree{".gangrun/pins/pin-bad.json": "{not json"})
	if _, err := Prune(root, 1, Options{}); err == nil || !strings.Contains(err.Error(), "pin-bad.json") {
		t.Errorf("Prune with an unreadable pin: %v", err)
	}
	if got := entries(t, root); fmt.Sprint(got) != "[step-1 step-2]" {
		t.Errorf("entries changed: %v", got)
	}
}

// TestApplyRechecksPins: a pin taken after the plan was made keeps its checkpoint.
func TestApplyRechecksPins(t *testing.T) {
	root := t.TempDir()
	build(t, root, merge(generic("step-1", true), generic("step-2", true), generic("step-3", true)))
	plan, err := Prune(root, 1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	release, err := Pin(root, filepath.Join(root, "step-1"), "late-job")
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	err = plan.Apply()
	if !errors.Is(err, ErrPinned) || !strings.Contains(err.Error(), "step-1") || !strings.Contains(err.Error(), "late-job") {
		t.Fatalf("Apply = %v; want ErrPinned naming step-1 and late-job", err)
	}
	if got := entries(t, root); fmt.Sprint(got) != "[step-1 step-3]" {
		t.Fatalf("after Apply: %v; want [step-1 step-3]", got)
	}
}

// TestApplyRefusesAChangedDirectory: when the newest complete checkpoint is one the
// plan deletes, Apply deletes nothing.
func TestApplyRefusesAChangedDirectory(t *testing.T) {
	root := t.TempDir()
	build(t, root, merge(generic("step-1", true), generic("step-2", true)))
	plan, err := Prune(root, 1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(root, "step-2", ".complete")); err != nil {
		t.Fatal(err)
	}
	if err := plan.Apply(); err == nil || !strings.Contains(err.Error(), "changed since the plan") {
		t.Fatalf("Apply on a changed directory: %v", err)
	}
	if got := entries(t, root); fmt.Sprint(got) != "[step-1 step-2]" {
		t.Fatalf("after a refused Apply: %v", got)
	}
}

// TestApplyStaysInsideItsDirectory: a hand-built plan cannot delete outside Dir.
func TestApplyStaysInsideItsDirectory(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	build(t, root, merge(generic("step-1", true), generic("step-2", true)))
	build(t, outside, generic("step-1", true))
	plan := Plan{Dir: root, Keep: 1, Delete: []Decision{
		{Checkpoint: Checkpoint{Path: filepath.Join(outside, "step-1")}},
		{Checkpoint: Checkpoint{Path: filepath.Join(root, "notes.txt")}},
	}}
	err := plan.Apply()
	if err == nil || !strings.Contains(err.Error(), "not a checkpoint of this directory") {
		t.Fatalf("Apply of a hand-built plan: %v", err)
	}
	if _, err := os.Stat(filepath.Join(outside, "step-1")); err != nil {
		t.Fatalf("Apply reached outside its directory: %v", err)
	}
}

func TestPlanJSON(t *testing.T) {
	root := t.TempDir()
	build(t, root, merge(generic("step-1", true), generic("step-2", true)))
	plan, err := Prune(root, 1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(plan)
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		Dir    string `json:"dir"`
		Keep   int    `json:"keep"`
		Delete []struct {
			Path     string `json:"path"`
			Step     int64  `json:"step"`
			Complete bool   `json:"complete"`
			Why      string `json:"why"`
		} `json:"delete"`
		Kept []struct {
			Path string `json:"path"`
		} `json:"kept"`
	}
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if back.Dir != root || back.Keep != 1 || len(back.Delete) != 1 || back.Delete[0].Step != 1 || !back.Delete[0].Complete ||
		back.Delete[0].Why == "" || len(back.Kept) != 1 || back.Kept[0].Path != filepath.Join(root, "step-2") {
		t.Fatalf("plan JSON: %s", data)
	}
}

func TestPinLifecycle(t *testing.T) {
	root := t.TempDir()
	build(t, root, merge(generic("step-1", true), generic("step-2", true), generic("step-3", true)))

	// Bad input.
	for _, tc := range []struct{ path, holder, want string }{
		{filepath.Join(root, "step-1"), "", "holder"},
		{filepath.Join(root, "step-1"), "job\n1", "control characters"},
		{filepath.Join(root, "step-9"), "job", "does not exist"},
		{filepath.Join(t.TempDir(), "step-1"), "job", "not directly inside"},
		{filepath.Join(root, "step-1", "model.pt"), "job", "not directly inside"},
	} {
		if _, err := Pin(root, tc.path, tc.holder); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Pin(%s, %q) = %v; want an error with %q", tc.path, tc.holder, err, tc.want)
		}
	}
	if _, err := Pin(filepath.Join(root, "missing"), filepath.Join(root, "missing", "step-1"), "job"); err == nil {
		t.Error("Pin in a missing directory succeeded")
	}

	// A pin shows in List and holds against Prune until released; release is idempotent.
	release, err := Pin(root, filepath.Join(root, "step-1"), "job-7")
	if err != nil {
		t.Fatal(err)
	}
	cps, err := List(root, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cps {
		if c.Pinned != (filepath.Base(c.Path) == "step-1") {
			t.Errorf("%s pinned=%v", c.Path, c.Pinned)
		}
	}
	plan, err := Prune(root, 1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := decisionNames(plan.Delete); len(got) != 1 || got["step-2"] == "" {
		t.Fatalf("with step-1 pinned, plan deletes %v; want only step-2", got)
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	if err := release(); err != nil {
		t.Fatalf("second release: %v", err)
	}
	plan, err = Prune(root, 1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := decisionNames(plan.Delete); len(got) != 2 {
		t.Fatalf("after release, plan deletes %v; want step-1 and step-2", got)
	}
}

// TestPinHeldByAnotherProcess: a pin lives as long as the process that took it; once
// that process is killed the pin is stale, prune ignores it and Apply removes it.
func TestPinHeldByAnotherProcess(t *testing.T) {
	root := t.TempDir()
	build(t, root, merge(generic("step-1", true), generic("step-2", true)))
	helper := pinHelper(t, root, filepath.Join(root, "step-1"))

	plan, err := Prune(root, 1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Delete) != 0 || !strings.Contains(decisionNames(plan.Kept)["step-1"], "pinned by job helper-job (pid "+fmt.Sprint(helper.Process.Pid)) {
		t.Fatalf("live pin of another process: delete %v, kept %v", decisionNames(plan.Delete), decisionNames(plan.Kept))
	}

	if err := helper.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = helper.Wait()
	plan, err = Prune(root, 1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if decisionNames(plan.Delete)["step-1"] == "" {
		t.Fatalf("stale pin still protects step-1: kept %v", decisionNames(plan.Kept))
	}
	if !strings.Contains(strings.Join(plan.Notes, "\n"), fmt.Sprintf("stale pin on step-1 by job helper-job (pid %d", helper.Process.Pid)) {
		t.Errorf("notes %q do not report the stale pin", plan.Notes)
	}
	if err := plan.Apply(); err != nil {
		t.Fatal(err)
	}
	if pins, _ := os.ReadDir(filepath.Join(root, stateDirName, pinsDirName)); len(pins) != 0 {
		t.Errorf("stale pin file not removed: %d left", len(pins))
	}
	if got := entries(t, root); fmt.Sprint(got) != "[step-2]" {
		t.Fatalf("after Apply: %v", got)
	}
}

func TestPinStaleness(t *testing.T) {
	self := localHost()
	me := os.Getpid()
	myStart, _ := processStartTicks(me)
	cases := []struct {
		name string
		pin  pinRecord
		want string // fragment of the staleness reason; "" = live
	}{
		{"this process", pinRecord{Host: self.name, PID: me, PIDStartTicks: myStart, BootID: self.bootID}, ""},
		{"another host is never judged", pinRecord{Host: self.name + "-elsewhere", PID: 1 << 22}, ""},
		{"a dead pid", pinRecord{Host: self.name, PID: deadPID(t)}, "is gone"},
		{"a reused pid", pinRecord{Host: self.name, PID: me, PIDStartTicks: myStart + 1}, "belongs to another process"},
		{"a reboot", pinRecord{Host: self.name, PID: me, BootID: "not-" + self.bootID}, "rebooted"},
	}
	for _, tc := range cases {
		got := staleness(tc.pin, self)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: staleness %q; want %q", tc.name, got, tc.want)
		}
	}
}

// deadPID returns the pid of a process that has exited and been reaped.
func deadPID(t *testing.T) int {
	t.Helper()
	p, err := os.StartProcess("/bin/true", []string{"true"}, &os.ProcAttr{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Wait(); err != nil {
		t.Fatal(err)
	}
	return p.Pid
}

// TestPinWaitsForApply: Pin and Apply's move-aside share a lock; a pin attempted while
// the lock is held completes after it is released.
func TestPinWaitsForApply(t *testing.T) {
	root := t.TempDir()
	build(t, root, generic("step-1", true))
	st, err := openState(root, true)
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	unlock, err := lockDir(t.Context(), st)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		release, err := Pin(root, filepath.Join(root, "step-1"), "job")
		if err == nil {
			err = release()
		}
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("Pin finished while the lock was held: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	unlock()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

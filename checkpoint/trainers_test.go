package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/torchtest"
)

// These tests have the trainers themselves write the checkpoints (requirements/trainers.txt,
// over torch 2.x from PyPI): each script under testdata/trainers trains a tiny model on
// CPU with its library and saves twice the library's normal way; the second save is made
// once per write event in a forked child that SIGKILLs itself at that event
// (testdata/trainers/cutsave.py: after each file is created, half-way through each of a
// file's first writes, after each close, rename, mkdir, symlink and removal). The script
// then asks the library about every tree it left: which checkpoint the library's own
// resume picks, and whether the library's own loader restores, from each candidate, the
// state that was saved there. Latest must answer a checkpoint the library restores
// fully, and the newest such one.

// trainerReport is what a script in testdata/trainers writes to RESULTS/report.json.
type trainerReport struct {
	// Library names the library and version that wrote the trees.
	Library string `json:"library"`
	// Subdir is where the checkpoints lie inside each tree ("" for the tree itself).
	Subdir string `json:"subdir"`
	// Older and Newer name the first and the second (cut) save's checkpoints.
	Older string `json:"older"`
	Newer string `json:"newer"`
	// Trees holds the tree before the second save, each cut, and the whole save.
	Trees []trainerTree `json:"trees"`
}

// trainerTree is one tree the second save left, judged by the library.
type trainerTree struct {
	// Name is "before", "cut-NNN" or "whole"; Event the write event the cut followed.
	Name  string `json:"name"`
	Event string `json:"event"`
	Dir   string `json:"dir"`
	// Pick is the checkpoint the library's own resume takes (transformers'
	// get_last_checkpoint, accelerate's load_state() with automatic naming, DeepSpeed's
	// `latest`, Lightning's ckpt_path="last"); null where the library has none (DCP).
	Pick *string `json:"pick"`
	// Loads is, per candidate, "ok" when the library's loader restores the state saved
	// there, else what went wrong.
	Loads map[string]string `json:"loads"`
	// Steps is the training step each candidate holds, where its name does not say
	// (Lightning's last.ckpt).
	Steps map[string]int64 `json:"steps"`
}

// trailingNumberRe finds the step (or save number) a checkpoint's name ends with.
var trailingNumberRe = regexp.MustCompile(`([0-9]+)(?:\.ckpt)?$`)

// step is the training step (for accelerate, the save number) candidate name holds.
func (tr trainerTree) step(name string) int64 {
	if s, ok := tr.Steps[name]; ok {
		return s
	}
	m := trailingNumberRe.FindStringSubmatch(name)
	if m == nil {
		return -1
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	return n
}

// newestRestored is the newest step any candidate restores fully, and those candidates.
func (tr trainerTree) newestRestored() (int64, []string) {
	best, names := int64(-1), []string(nil)
	for name, verdict := range tr.Loads {
		if verdict != "ok" {
			continue
		}
		switch s := tr.step(name); {
		case s > best:
			best, names = s, []string{name}
		case s == best:
			names = append(names, name)
		}
	}
	return best, names
}

// trainerRun is one script's run: the library, how its save is made, and the tree's
// expected shape.
type trainerRun struct {
	name   string
	script string
	args   []string
	// env adds to the script's environment; tmpdirOtherFS puts TMPDIR on /dev/shm.
	env           []string
	tmpdirOtherFS bool
	// atomic: every file of the save is written elsewhere and renamed into place, so no
	// cut leaves a half-written checkpoint (asserted).
	atomic bool
	// newer names the cuts ("cut-001") after which gangrun's documented order answers a
	// newer complete checkpoint than the one the library's own resume takes, and why;
	// there Latest is asserted to answer the newest checkpoint the loader restores, and
	// the library's pick an older one it restores.
	newer map[string]string
}

func trainerRuns() []trainerRun {
	return []trainerRun{
		{name: "transformers Trainer", script: "hf_trainer.py"},
		// The rotation removes checkpoint-5 after checkpoint-10 is saved.
		{name: "transformers Trainer (save_total_limit 1)", script: "hf_trainer.py", args: []string{"1"}},
		{name: "accelerate save_state", script: "accelerate_state.py"},
		// save_state removes checkpoint_0 before it writes checkpoint_1.
		{name: "accelerate save_state (total_limit 1)", script: "accelerate_state.py", args: []string{"1"}},
		{name: "DeepSpeed ZeRO-0", script: "deepspeed_ckpt.py", args: []string{"0"}},
		{name: "DeepSpeed ZeRO-2", script: "deepspeed_ckpt.py", args: []string{"2"}},
		{name: "Lightning ModelCheckpoint", script: "lightning_ckpt.py", atomic: true},
		{name: "Lightning ModelCheckpoint (save_last link)", script: "lightning_ckpt.py", args: []string{"link"}, atomic: true,
			newer: map[string]string{"cut-001": "epoch=0-step=8.ckpt is in place, last.ckpt still links to epoch=0-step=4.ckpt: " +
				"a last.ckpt symlink takes its target's step (ckptfile.go, ckptCandidate), where Lightning's ckpt_path=\"last\" follows the link"}},
		// fsspec's local transaction writes a temporary file in TMPDIR and moves it into
		// place: a rename on one file system, a copy from another.
		{name: "Lightning ModelCheckpoint (TMPDIR on another file system)", script: "lightning_ckpt.py", tmpdirOtherFS: true},
		{name: "torch DCP async_save", script: "dcp_save.py", args: []string{"async"}},
		{name: "torch DCP save", script: "dcp_save.py", args: []string{"sync"}},
	}
}

// runTrainer runs one script into a fresh directory and returns its report.
func runTrainer(t *testing.T, py torchtest.Python, trainers string, r trainerRun) trainerReport {
	t.Helper()
	results := filepath.Join(t.TempDir(), "results")
	tmp := t.TempDir()
	if r.tmpdirOtherFS {
		tmp = otherFSTempDir(t, tmp)
	}
	script, err := filepath.Abs(filepath.Join("testdata", "trainers", r.script))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py.Path, append([]string{script, results}, r.args...)...)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+trainers, "TMPDIR="+tmp, "HF_HUB_OFFLINE=1",
		"TOKENIZERS_PARALLELISM=false", "TRANSFORMERS_VERBOSITY=error", "DS_ACCELERATOR=cpu",
		"PYTHONDONTWRITEBYTECODE=1")
	cmd.Env = append(cmd.Env, r.env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", r.script, err, tail(string(out), 4000))
	}
	data, err := os.ReadFile(filepath.Join(results, "report.json"))
	if err != nil {
		t.Fatalf("%s wrote no report: %v\n%s", r.script, err, tail(string(out), 4000))
	}
	var rep trainerReport
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatalf("report.json: %v", err)
	}
	return rep
}

// otherFSTempDir returns a directory on /dev/shm when that is another file system than
// dir's, and fails the test otherwise.
func otherFSTempDir(t *testing.T, dir string) string {
	t.Helper()
	var a, b syscall.Stat_t
	if err := syscall.Stat(dir, &a); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat("/dev/shm", &b); err != nil || a.Dev == b.Dev {
		t.Fatalf("this test needs /dev/shm on a file system other than %s's (stat: %v)", dir, err)
	}
	shm, err := os.MkdirTemp("/dev/shm", "gangrun-trainers-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(shm) })
	return shm
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// TestTrainersWriteCutSaves runs every library's save cut at each of its write events
// and checks Latest on each tree against the library: Latest answers what the library's
// own resume takes when its loader restores that, else the newest checkpoint the loader
// restores. It logs, per library, the cuts after which the library's own resume takes a
// checkpoint it cannot restore (where gangrun's answer is the better one).
func TestTrainersWriteCutSaves(t *testing.T) {
	py := torchtest.PyPI(t)
	trainers := torchtest.Trainers(t)
	var summary []string
	for _, r := range trainerRuns() {
		t.Run(r.name, func(t *testing.T) {
			rep := runTrainer(t, py, trainers, r)
			checkTrainerReport(t, rep, r, &summary)
		})
	}
	t.Logf("cut saves, as the libraries wrote and judged them:\n%s", strings.Join(summary, "\n"))
}

// checkTrainerReport checks the fixture is what it claims, then Latest on every tree.
func checkTrainerReport(t *testing.T, rep trainerReport, r trainerRun, summary *[]string) {
	t.Helper()
	var cuts, halfWritten, nothing, newerThanPick, noPick int
	resolves := len(rep.Trees) > 0 && rep.Trees[0].Pick != nil // DCP has no resume choice
	var brokenPick []string
	for i, tr := range rep.Trees {
		switch {
		case i == 0 && (tr.Name != "before" || tr.Loads[rep.Older] != "ok" || len(tr.Loads) > 2):
			t.Fatalf("%s: the tree before the cut save is not one complete %s: %+v", rep.Library, rep.Older, tr)
		case i == len(rep.Trees)-1 && (tr.Name != "whole" || tr.Loads[rep.Newer] != "ok"):
			t.Fatalf("%s: the whole save does not restore %s: %+v", rep.Library, rep.Newer, tr)
		case tr.Name != "before" && tr.Name != "whole":
			cuts++
			if v, ok := tr.Loads[rep.Newer]; ok && v != "ok" {
				halfWritten++
			}
		}
		root := filepath.Join(tr.Dir, rep.Subdir)
		label := tr.Name
		if tr.Event != "" {
			label += " (" + tr.Event + ")"
		}
		// The answer: what the library's own resume takes, when its loader restores it;
		// else the newest checkpoint the loader restores.
		best, want := tr.newestRestored()
		if best < 0 {
			// Nothing left to resume from (a rotation removed the older checkpoint first).
			nothing++
			if got, err := Latest(root, Options{}); !errors.Is(err, ErrNoComplete) {
				t.Errorf("%s: the library restores no checkpoint (%v); Latest = %v, %v", label, tr.Loads, got.Path, err)
			}
			continue
		}
		if why, ok := r.newer[tr.Name]; ok {
			if tr.Pick == nil || tr.Loads[*tr.Pick] != "ok" || tr.step(*tr.Pick) >= best {
				t.Errorf("%s (documented: %s): the library's own resume takes %v, restoring %q; update newer", label, why, tr.Pick, tr.Loads[deref(tr.Pick)])
			}
			newerThanPick++
		} else if resolves && tr.Pick == nil {
			noPick++
		} else if tr.Pick != nil {
			if pick := *tr.Pick; tr.Loads[pick] == "ok" {
				best, want = tr.step(pick), []string{pick}
			} else if tr.Name != "before" && tr.Name != "whole" {
				why := tr.Loads[pick]
				if why == "" {
					why = "no such checkpoint"
				}
				brokenPick = append(brokenPick, fmt.Sprintf("%s: %q: %s", label, pick, why))
			}
		}
		got, err := Latest(root, Options{})
		if err != nil {
			t.Errorf("%s: Latest: %v; the library restores step %d from %v", label, err, best, want)
			continue
		}
		name := filepath.Base(got.Path)
		if v := tr.Loads[name]; v != "ok" || tr.step(name) != best {
			t.Errorf("%s: Latest = %s (%s; the library's loader: %q); the library resumes from step %d (%v)",
				label, name, got.Format, v, best, want)
		}
	}
	switch {
	case cuts == 0:
		t.Fatalf("%s: no cut was made", rep.Library)
	case r.atomic && halfWritten > 0:
		t.Errorf("%s: %d of %d cuts left a half-written %s; the save was atomic", rep.Library, halfWritten, cuts, rep.Newer)
	case !r.atomic && halfWritten == 0:
		t.Fatalf("%s: %d cuts, none leaving a half-written %s", rep.Library, cuts, rep.Newer)
	}
	if len(brokenPick) > 0 {
		t.Logf("%s: its own resume takes a checkpoint it cannot restore after %d of %d cuts (Latest answers the newest it restores):\n  %s",
			rep.Library,
			len(brokenPick), cuts, strings.Join(brokenPick, "\n  "))
	}
	if newerThanPick != len(r.newer) {
		t.Errorf("%s: the documented cuts %v are not all there (%d found)", rep.Library, r.newer, newerThanPick)
	}
	if noPick > 0 {
		t.Logf("%s: its own resume finds no checkpoint after %d of %d cuts (Latest answers the newest it restores)", rep.Library, noPick, cuts)
	}
	if nothing > 0 {
		t.Logf("%s: %d of %d cuts left no checkpoint the library restores (Latest: %s)", rep.Library, nothing, cuts, ErrNoComplete)
	}
	*summary = append(*summary, fmt.Sprintf("%s (%s): %d cuts; its own resume takes a checkpoint it cannot restore after %d, none after %d, an older one than Latest after %d; nothing left to restore after %d",
		r.name, rep.Library, cuts, len(brokenPick), noPick, newerThanPick, nothing))
}

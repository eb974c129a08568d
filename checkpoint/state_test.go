package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// snapshot returns every path under root with its type and content hash: what must
// not change.
func snapshot(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		switch {
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			out[rel] = "file " + hex.EncodeToString(sum[:8])
		default:
			out[rel] = d.Type().String()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// outsideTree makes a directory of files outside any checkpoint directory: what an
// attacker would have prune delete.
func outsideTree(t *testing.T) string {
	t.Helper()
	out := t.TempDir()
	build(t, out, tree{"precious.txt": "mine", "sub/deeper.txt": "also mine", "step-9/model.pt": "not yours"})
	return out
}

// TestPruneNeverDeletesOutside: links put at .gangrun, .gangrun/trash, .gangrun/pins, at
// a checkpoint's name after the plan, or inside a checkpoint's tree, and the checkpoint
// directory's own path swapped after the plan: prune deletes nothing outside the
// directory it was given, and either refuses in one error or deletes only beneath it.
func TestPruneNeverDeletesOutside(t *testing.T) {
	ckpts := merge(generic("step-1", true), generic("step-2", true), generic("step-3", true))
	for _, tc := range []struct {
		name string
		// before runs before the plan, after between the plan and Apply.
		before, after func(t *testing.T, root, outside string)
		// planErr / applyErr: a fragment of the refusal expected, "" for none.
		planErr, applyErr string
		// gone lists the checkpoints deleted (the rest stay).
		gone []string
	}{
		{name: ".gangrun a link to outside",
			before:  func(t *testing.T, root, out string) { symlink(t, out, filepath.Join(root, ".gangrun")) },
			planErr: ".gangrun: is a symbolic link"},
		{name: "trash a link to outside",
			before: func(t *testing.T, root, out string) {
				mustMkdir(t, filepath.Join(root, ".gangrun"))
				symlink(t, out, filepath.Join(root, ".gangrun", "trash"))
			},
			planErr: "trash: is a symbolic link"},
		{name: "pins a link to outside",
			before: func(t *testing.T, root, out string) {
				mustMkdir(t, filepath.Join(root, ".gangrun"))
				symlink(t, out, filepath.Join(root, ".gangrun", "pins"))
			},
			planErr: "pins: is a symbolic link"},
		{name: "trash swapped for a link after the plan",
			after: func(t *testing.T, root, out string) {
				mustMkdir(t, filepath.Join(root, ".gangrun"))
				os.RemoveAll(filepath.Join(root, ".gangrun", "trash"))
				symlink(t, out, filepath.Join(root, ".gangrun", "trash"))
			},
			applyErr: "trash: is a symbolic link"},
		{name: ".gangrun swapped for a link after the plan",
			after: func(t *testing.T, root, out string) {
				os.RemoveAll(filepath.Join(root, ".gangrun"))
				symlink(t, out, filepath.Join(root, ".gangrun"))
			},
			applyErr: ".gangrun: is a symbolic link"},
		{name: "a doomed checkpoint swapped for a link to outside after the plan",
			after: func(t *testing.T, root, out string) {
				os.RemoveAll(filepath.Join(root, "step-1"))
				symlink(t, out, filepath.Join(root, "step-1"))
			},
			gone: []string{"step-1", "step-2"}}, // step-1 is now a link: the link goes, not its target
		{name: "links inside a doomed checkpoint",
			before: func(t *testing.T, root, out string) {
				symlink(t, out, filepath.Join(root, "step-1", "escape"))
				symlink(t, filepath.Join(out, "precious.txt"), filepath.Join(root, "step-2", "file-link"))
			},
			gone: []string{"step-1", "step-2"}},
		{name: "the directory's path swapped after the plan",
			after: func(t *testing.T, root, out string) {
				if err := os.Rename(root, root+".old"); err != nil {
					t.Fatal(err)
				}
				symlink(t, out, root)
				t.Cleanup(func() { os.Remove(root); os.Rename(root+".old", root) })
			},
			applyErr: "the directory changed since the plan"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "ckpt")
			build(t, root, ckpts)
			out := outsideTree(t)
			before := snapshot(t, out)
			if tc.before != nil {
				tc.before(t, root, out)
			}
			plan, err := Prune(root, 1, Options{})
			if tc.planErr != "" {
				var de *DirError
				if err == nil || !strings.Contains(err.Error(), tc.planErr) || !errors.As(err, &de) {
					t.Fatalf("Prune: %v; want a *DirError with %q", err, tc.planErr)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				if tc.after != nil {
					tc.after(t, root, out)
				}
				err = plan.Apply()
				if (tc.applyErr == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.applyErr) {
					t.Errorf("Apply: %v; want %q", err, tc.applyErr)
				}
			}
			if after := snapshot(t, out); !equalMaps(before, after) {
				t.Errorf("outside changed:\nbefore %v\nafter  %v", before, after)
			}
			if tc.gone == nil {
				return
			}
			for _, name := range []string{"step-1", "step-2", "step-3"} {
				_, err := os.Lstat(filepath.Join(root, name))
				if wantGone := contains(tc.gone, name); wantGone != errors.Is(err, fs.ErrNotExist) {
					t.Errorf("%s: gone %v, want %v", name, err != nil, wantGone)
				}
			}
		})
	}
}

// TestBadPinsAreRefusedNotFollowed: pin files that are FIFOs, links to /dev/zero, too
// long or not written by gangrun (empty holder, pid -1, zero time) never block a
// listing and never count as live: ls notes each, prune refuses naming one.
func TestBadPinsAreRefusedNotFollowed(t *testing.T) {
	self := localHost()
	good := func(mod func(*pinRecord)) string {
		p := pinRecord{Checkpoint: "step-1", Holder: "job", Host: self.name, PID: os.Getpid(), Created: time.Now()}
		mod(&p)
		b, _ := json.Marshal(p)
		return string(b)
	}
	for _, tc := range []struct {
		name string
		make func(t *testing.T, pins string)
		want string
	}{
		{"a FIFO", func(t *testing.T, pins string) { mkfifo(t, filepath.Join(pins, "pin-f.json")) }, "pin-f.json: is a named pipe (FIFO)"},
		{"a link to /dev/zero", func(t *testing.T, pins string) { symlink(t, "/dev/zero", filepath.Join(pins, "pin-z.json")) }, "pin-z.json: is a symbolic link"},
		{"a directory", func(t *testing.T, pins string) { mustMkdir(t, filepath.Join(pins, "pin-d.json")) }, "pin-d.json: is a directory"},
		{"too long", func(t *testing.T, pins string) {
			build(t, pins, tree{"pin-l.json": strings.Repeat(" ", maxPinBytes+1)})
		}, "pin-l.json: file too large"},
		{"an empty holder", func(t *testing.T, pins string) {
			build(t, pins, tree{"pin-h.json": good(func(p *pinRecord) { p.Holder = "" })})
		}, `holder "" is not a job id`},
		{"pid -1", func(t *testing.T, pins string) {
			build(t, pins, tree{"pin-p.json": good(func(p *pinRecord) { p.PID = -1 })})
		}, "pid -1"},
		{"zero time", func(t *testing.T, pins string) {
			build(t, pins, tree{"pin-t.json": good(func(p *pinRecord) { p.Created = time.Time{} })})
		}, "no creation time"},
		{"a path as checkpoint", func(t *testing.T, pins string) {
			build(t, pins, tree{"pin-c.json": good(func(p *pinRecord) { p.Checkpoint = "../step-1" })})
		}, "is not a name inside the directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			build(t, root, merge(generic("step-1", true), generic("step-2", true)))
			pins := filepath.Join(root, ".gangrun", "pins")
			mustMkdir(t, pins)
			tc.make(t, pins)
			done := make(chan struct{})
			var l Listing
			var err error
			go func() { defer close(done); l, err = Inspect(root, Options{}) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Inspect blocked")
			}
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(strings.Join(l.Notes, "\n"), tc.want) {
				t.Errorf("notes %q; want %q", l.Notes, tc.want)
			}
			for _, cp := range l.Checkpoints {
				if cp.Pinned {
					t.Errorf("%s counted as pinned", cp.Path)
				}
			}
			if _, err := Prune(root, 1, Options{}); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Prune: %v; want a refusal naming %q", err, tc.want)
			}
			if _, err := Latest(root, Options{}); err != nil {
				t.Errorf("Latest: %v", err)
			}
		})
	}
}

// TestFenceAndPinRefuseLinks: WriteFence replaces a link at the fence's name instead of
// writing through it, ReadFence refuses one, and Pin refuses a .gangrun that is a link.
func TestFenceAndPinRefuseLinks(t *testing.T) {
	root := t.TempDir()
	build(t, root, generic("step-1", true))
	out := outsideTree(t)
	before := snapshot(t, out)
	mustMkdir(t, filepath.Join(root, ".gangrun"))
	symlink(t, filepath.Join(out, "precious.txt"), FencePath(root))
	if _, _, err := ReadFence(root); err == nil || !strings.Contains(err.Error(), "is a symbolic link") {
		t.Errorf("ReadFence through a link: %v", err)
	}
	if err := WriteFence(root, Fence{Job: "j", Attempt: 1}); err != nil {
		t.Fatal(err)
	}
	if f, ok, err := ReadFence(root); err != nil || !ok || f.Job != "j" {
		t.Errorf("ReadFence: %+v %v %v", f, ok, err)
	}
	os.RemoveAll(filepath.Join(root, ".gangrun"))
	symlink(t, out, filepath.Join(root, ".gangrun"))
	if _, err := Pin(root, filepath.Join(root, "step-1"), "job"); err == nil || !strings.Contains(err.Error(), ".gangrun: is a symbolic link") {
		t.Errorf("Pin with .gangrun a link: %v", err)
	}
	if err := WriteFence(root, Fence{Job: "j", Attempt: 2}); err == nil {
		t.Error("WriteFence wrote through a link at .gangrun")
	}
	if after := snapshot(t, out); !equalMaps(before, after) {
		t.Errorf("outside changed:\nbefore %v\nafter  %v", before, after)
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func mkfifo(t *testing.T, path string) {
	t.Helper()
	if err := syscall.Mkfifo(path, 0o644); err != nil {
		t.Fatal(err)
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

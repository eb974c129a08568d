package checkpoint

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fuzzBytes hands out the fuzz input one byte at a time, then zeros.
type fuzzBytes struct {
	data []byte
	pos  int
}

func (b *fuzzBytes) next() int {
	if b.pos >= len(b.data) {
		return 0
	}
	b.pos++
	return int(b.data[b.pos-1])
}

func (b *fuzzBytes) str(max int) string {
	n := b.next() % (max + 1)
	out := make([]byte, 0, n)
	for i := 0; i < n; i++ {
		out = append(out, byte(b.next()))
	}
	return string(out)
}

// genTree builds, from the fuzz input, a checkpoint directory of every layout, each
// candidate either written whole or with one of that layout's corruptions, and
// returns which candidates the generator wrote whole (the ground truth, decided by
// construction, not by the code under test) and whether it wrote pointer files.
func genTree(t *testing.T, root string, b *fuzzBytes) (whole map[string]bool, steps map[string]int64, pointers bool) {
	whole = map[string]bool{}
	steps = map[string]int64{}
	zip := torchZip(t, "archive")
	n := b.next() % 10
	for i := 0; i < n; i++ {
		kind, step, state := b.next()%8, int64(b.next()%24), b.next()
		var name string
		var tr tree
		ok := false
		switch kind {
		case 0: // generic, under every name issue 2 lists
			name = []string{"step-%d", "step_%d", "checkpoint-%d", "global_step%d", "iter_%07d"}[state%5]
			name = fmt.Sprintf(name, step)
			ok = state/5%3 == 0
			tr = generic(name, ok)
			if state/5%3 == 2 {
				tr = tree{name + "/": ""}
			}
		case 1: // torch.distributed.checkpoint
			name = fmt.Sprintf("step-%d", step)
			ok = state%3 == 0
			switch state % 3 {
			case 0:
				tr = dcp(name, true)
			case 1:
				tr = tree{name + "/.metadata": "", name + "/__0_0.distcp": "x"}
			case 2:
				tr = tree{name + "/.metadata.tmp": "m", name + "/__0_0.distcp": "x"}
			}
		case 2: // Hugging Face
			name = fmt.Sprintf("checkpoint-%d", step)
			ok = state%4 == 0
			switch state % 4 {
			case 0:
				tr = hf(int(step), validTrainerState)
			case 1:
				tr = hf(int(step), validTrainerState[:b.next()%len(validTrainerState)])
			case 2:
				tr = hf(int(step), "")
			case 3:
				tr = hf(int(step), "[]")
			}
		case 3: // DeepSpeed
			name = fmt.Sprintf("global_step%d", step)
			dp, mp := 1+b.next()%3, 1+b.next()%2
			ok = state%4 == 0
			if state%4 == 2 {
				// Removing the only ZeRO file leaves a tag that cannot be told from a
				// run without ZeRO (documented in checkDeepSpeedEntries): keep two.
				dp = max(dp, 2)
			}
			tr = deepspeedTag(name, dp, mp)
			switch state % 4 {
			case 1:
				tr[name+"/mp_rank_00_model_states.pt"] = ""
			case 2:
				delete(tr, name+"/zero_pp_rank_0_mp_rank_00_optim_states.pt")
			case 3:
				for k := range tr {
					if strings.HasSuffix(k, "_model_states.pt") {
						delete(tr, k)
					}
				}
			}
		case 4: // Megatron-LM, legacy torch format
			name = megatronIterName(step)
			tp, pp := 1+b.next()%2, 1+b.next()%2
			tr = megatronIter(step, tp, pp)
			ok = state%3 == 0
			switch state % 3 {
			case 1:
				for k := range tr {
					tr[k] = ""
					break
				}
			case 2:
				for k := range tr {
					if strings.HasPrefix(k, name+"/mp_rank_00/") || strings.HasPrefix(k, name+"/mp_rank_00_000/") {
						delete(tr, k)
					}
				}
				tr[name+"/"] = ""
			}
		case 5: // Lightning
			name = lightningName(int(step/10), int(step))
			ok = state%5 == 0
			switch state % 5 {
			case 0:
				tr = tree{name: zip}
			case 1:
				tr = tree{name: zip[:b.next()%len(zip)]}
			case 2:
				tr = tree{name: ""}
			case 3:
				tr = tree{name + "@": name}
			case 4:
				tr = tree{name + "@": "gone.ckpt"}
			}
		case 6: // NeMo
			name = fmt.Sprintf("gpt--val_loss=1.00-step=%d.ckpt", step)
			ok = state%2 == 0
			tr = tree{name: zip}
			if !ok {
				tr[fmt.Sprintf("gpt--val_loss=1.00-step=%d-unfinished", step)] = ""
			}
		case 7: // pointer files, with arbitrary content
			pointers = true
			if state%2 == 0 {
				tr = tree{deepSpeedPointer: b.str(24)}
			} else {
				tr = tree{megatronTracker: b.str(12)}
			}
		}
		if name != "" {
			if _, dup := whole[name]; dup {
				continue
			}
			whole[name] = ok
			steps[name] = step
		}
		build(t, root, tr)
	}
	return whole, steps, pointers
}

// genRaw builds a directory of arbitrary names, files, directories and symlinks.
func genRaw(t *testing.T, root string, b *fuzzBytes) {
	n := b.next() % 12
	for i := 0; i < n; i++ {
		name := b.str(20)
		if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
			continue
		}
		p := filepath.Join(root, name)
		switch b.next() % 4 {
		case 0:
			_ = os.WriteFile(p, []byte(b.str(30)), 0o644)
		case 1:
			_ = os.Mkdir(p, 0o755)
			if inner := b.str(12); inner != "" && !strings.ContainsAny(inner, "/\x00") && inner != "." && inner != ".." {
				_ = os.WriteFile(filepath.Join(p, inner), []byte(b.str(16)), 0o644)
			}
		case 2:
			_ = os.Symlink(b.str(12), p)
		case 3:
			_ = os.Mkdir(p, 0o755)
			_ = os.WriteFile(filepath.Join(p, []string{".complete", ".metadata", "trainer_state.json", "mp_rank_00_model_states.pt"}[b.next()%4]), []byte(b.str(8)), 0o644)
		}
	}
}

// FuzzLatest checks, over random trees, that Latest never panics, never fails with
// anything but ErrNoComplete on a usable directory, never returns a checkpoint written
// incomplete, agrees with List and Verify, and — without pointer files to distrust
// newer saves — returns the highest step written whole.
func FuzzLatest(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{3, 0, 5, 0, 0, 9, 5, 1})
	f.Add([]byte{4, 3, 10, 0, 1, 1, 3, 11, 1, 1, 1, 7, 0, 3, 'a', 'b', 'c'})
	f.Add([]byte{5, 5, 20, 1, 9, 5, 21, 0, 6, 22, 1, 2, 23, 1, 4, 23, 2, 1})
	f.Add([]byte{4, 0, 12, 0, 0, 12, 10, 0, 7, 1, 3, '1', '2', 0, 7, 2})
	f.Add([]byte{0x80, 6, 3, 'a', 'b', 'c', 1, 2, 'x', 'y'})
	f.Fuzz(func(t *testing.T, data []byte) {
		root := t.TempDir()
		b := &fuzzBytes{data: data}
		raw := len(data) > 0 && data[0]&0x80 != 0
		var whole map[string]bool
		var steps map[string]int64
		pointers := true
		if raw {
			b.next()
			genRaw(t, root, b)
		} else {
			whole, steps, pointers = genTree(t, root, b)
		}

		got, err := Latest(root, Options{})
		if err != nil && !errors.Is(err, ErrNoComplete) {
			t.Fatalf("Latest: %v", err)
		}
		list, lerr := List(root, Options{})
		if lerr != nil {
			t.Fatalf("List: %v", lerr)
		}
		first := ""
		for _, c := range list {
			if c.Complete {
				first = c.Path
				break
			}
		}
		if err == nil {
			name := filepath.Base(got.Path)
			if !raw && !whole[name] {
				t.Fatalf("Latest returned %s, which was written incomplete (%v)", name, whole)
			}
			v, verr := Verify(got.Path, Options{})
			if verr != nil || !v.Complete {
				t.Fatalf("Verify(Latest) = %+v, %v", v, verr)
			}
			if first != got.Path {
				t.Fatalf("Latest %s, List's first complete %s", got.Path, first)
			}
		} else if first != "" {
			t.Fatalf("Latest found none, List has complete %s", first)
		}
		if !raw && !pointers {
			best := int64(-1)
			for name, ok := range whole {
				if ok && steps[name] > best {
					best = steps[name]
				}
			}
			switch {
			case best < 0 && err == nil:
				t.Fatalf("nothing written whole, Latest returned %s", got.Path)
			case best >= 0 && err != nil:
				t.Fatalf("step %d written whole, Latest: %v", best, err)
			case best >= 0 && got.Step != best:
				t.Fatalf("Latest returned step %d (%s); the highest written whole is %d", got.Step, got.Path, best)
			}
		}
		if _, err := Prune(root, 1, Options{}); err != nil {
			var de *DirError
			if errors.As(err, &de) {
				t.Fatalf("Prune: %v", err)
			}
		}
	})
}

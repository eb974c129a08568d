package checkpoint

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// benchCheckpoints is the performance case: a directory of 10,000 checkpoints.
const benchCheckpoints = 10000

// writeBenchTree writes n checkpoints of the given layout into dir, the newest
// `incomplete` of them unfinished, the way each trainer leaves an interrupted save.
func writeBenchTree(b *testing.B, dir, layout string, n, incomplete int) {
	b.Helper()
	write := func(p, content string) {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	for i := 1; i <= n; i++ {
		step := i * 10
		done := i <= n-incomplete
		switch layout {
		case "generic":
			d := filepath.Join(dir, fmt.Sprintf("step-%d", step))
			write(filepath.Join(d, "model.pt"), "w")
			if done {
				write(filepath.Join(d, genericMarker), "")
			}
		case "dcp":
			d := filepath.Join(dir, fmt.Sprintf("step-%d", step))
			write(filepath.Join(d, "__0_0.distcp"), "w")
			if done {
				write(filepath.Join(d, dcpMetadata), "m")
			}
		case "hf":
			d := filepath.Join(dir, fmt.Sprintf("checkpoint-%d", step))
			write(filepath.Join(d, "model.safetensors"), "w")
			if done {
				write(filepath.Join(d, hfTrainerState), validTrainerState)
			}
		case "deepspeed":
			d := filepath.Join(dir, fmt.Sprintf("global_step%d", step))
			write(filepath.Join(d, "mp_rank_00_model_states.pt"), ptFile())
			if done {
				for dp := 0; dp < 4; dp++ {
					write(filepath.Join(d, fmt.Sprintf("zero_pp_rank_%d_mp_rank_00_optim_states.pt", dp)), ptFile())
				}
			} else {
				write(filepath.Join(d, "zero_pp_rank_1_mp_rank_00_optim_states.pt"), ptFile())
			}
		case "megatron":
			d := filepath.Join(dir, megatronIterName(int64(step)))
			for tp := 0; tp < 2; tp++ {
				content := ptFile()
				if !done && tp == 1 {
					content = ""
				}
				write(filepath.Join(d, fmt.Sprintf("mp_rank_%02d", tp), megatronModelFile), content)
			}
		}
	}
	switch layout {
	case "deepspeed":
		write(filepath.Join(dir, deepSpeedPointer), fmt.Sprintf("global_step%d", (n-incomplete)*10))
	case "megatron":
		write(filepath.Join(dir, megatronTracker), fmt.Sprint((n-incomplete)*10))
	}
}

// BenchmarkLatest measures Latest on 10,000 checkpoint directories: every layout with
// the newest one complete, and the generic layout with the newest 100 unfinished (the
// cost then grows with the incomplete candidates checked before the answer).
func BenchmarkLatest(b *testing.B) {
	for _, bc := range []struct {
		layout     string
		incomplete int
	}{
		{"generic", 0}, {"generic", 1}, {"generic", 100}, {"dcp", 1}, {"hf", 1}, {"deepspeed", 1}, {"megatron", 1},
	} {
		b.Run(fmt.Sprintf("%s/10000/newest-%d-incomplete", bc.layout, bc.incomplete), func(b *testing.B) {
			dir := b.TempDir()
			writeBenchTree(b, dir, bc.layout, benchCheckpoints, bc.incomplete)
			want := benchCheckpoints - bc.incomplete
			b.ResetTimer()
			for b.Loop() {
				cp, err := Latest(dir, Options{})
				if err != nil {
					b.Fatal(err)
				}
				if cp.Step != int64(want*10) {
					b.Fatalf("Latest = %s", cp.Path)
				}
			}
		})
	}
}

// BenchmarkList measures List, which verifies every candidate, for comparison.
func BenchmarkList(b *testing.B) {
	dir := b.TempDir()
	writeBenchTree(b, dir, "generic", benchCheckpoints, 1)
	b.ResetTimer()
	for b.Loop() {
		cps, err := List(dir, Options{})
		if err != nil || len(cps) != benchCheckpoints {
			b.Fatal(len(cps), err)
		}
	}
}

package checkpoint

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Each trainer's save, rebuilt file by file from the trainer's own save code, and cut
// short after every step: every prefix of the write order (and, for a file the trainer
// writes in place, that file half written) must leave the checkpoint incomplete, so
// that Latest answers the previous checkpoint, as the trainer's loader would; the
// whole save must be complete. Where several ranks write at once, the order is the one
// the issue names: rank 0 through its pointer file, then the other ranks.

// trainerSave is one trainer's save of a newer checkpoint over an older complete one.
type trainerSave struct {
	name string
	// source names the trainer code the order and the names come from.
	source string
	// older is an earlier complete save (with its pointer file), applied first; olderName
	// is what Latest must answer until the new save is whole ("" for a first save).
	older     []saveOp
	olderName string
	// save is the new save's steps in order; newName and format are Latest's answer
	// once all of them are done.
	save    []saveOp
	newName string
	format  Format
	// whole is how many steps of save make the new checkpoint whole when the steps after
	// are the trainer's bookkeeping that needs no earlier pointer to be right (0: all of
	// them): Megatron-LM's first tracker, written after the checkpoint it names.
	whole int
	// blind names the cut saves the rules cannot tell from whole ones ("3": after the
	// first 3 steps; "3/cut": the third step's file half written), and why; Latest is
	// asserted to answer the new checkpoint there, as documented.
	blind map[string]string
}

// cutCase is one state of a cut save: the steps applied, the last one half written
// when cut.
type cutCase struct {
	key  string
	n    int
	cut  bool
	want string
}

func (ts trainerSave) cases() []cutCase {
	whole := ts.whole
	if whole == 0 {
		whole = len(ts.save)
	}
	var out []cutCase
	for n := 0; n <= len(ts.save); n++ {
		want := ts.olderName
		if n >= whole {
			want = ts.newName
		}
		out = append(out, cutCase{key: fmt.Sprint(n), n: n, want: want})
		if n > 0 && ts.save[n-1].inPlace && len(ts.save[n-1].body) >= 2 {
			out = append(out, cutCase{key: fmt.Sprintf("%d/cut", n), n: n, cut: true, want: ts.olderName})
		}
	}
	return out
}

// build writes the older save and the first c.n steps of the new one under root.
func (ts trainerSave) build(tb testing.TB, root string, c cutCase) {
	tb.Helper()
	for _, op := range ts.older {
		op.apply(tb, root)
	}
	for i, op := range ts.save[:c.n] {
		if c.cut && i == c.n-1 {
			op.body = op.body[:len(op.body)/2]
		}
		op.apply(tb, root)
	}
}

// TestTrainerSavesCutShort runs every trainer's save cut after each step and checks
// Latest's answer, then logs how many layouts are answered as their trainer would.
func TestTrainerSavesCutShort(t *testing.T) {
	saves := trainerSaves()
	answered := 0
	var summary []string
	for _, ts := range saves {
		ok := true
		t.Run(ts.name, func(t *testing.T) {
			for _, c := range ts.cases() {
				root := t.TempDir()
				ts.build(t, root, c)
				got, err := Latest(root, Options{})
				name, format := "", Format("")
				if err == nil {
					name, format = filepath.Base(got.Path), got.Format
				}
				if why, isBlind := ts.blind[c.key]; isBlind {
					ok = false
					if name != ts.newName {
						t.Errorf("after %s (a blind spot: %s): Latest = %q, the documented answer is %q; update blind", c.key, why, name, ts.newName)
					}
					continue
				}
				if name != c.want {
					ok = false
					t.Errorf("cut after %s of %d steps: Latest = %q (%v); the trainer's loader takes %q", c.key, len(ts.save), name, err, c.want)
				} else if name == ts.newName && format != ts.format {
					t.Errorf("whole save: format %q, want %q", format, ts.format)
				}
			}
		})
		if ok {
			answered++
		}
		summary = append(summary, fmt.Sprintf("%-46s %v", ts.name, ok))
	}
	t.Logf("%d of %d trainer layouts answered as the trainer would (every cut incomplete, the whole complete):\n%s",
		answered, len(saves), strings.Join(summary, "\n"))
}

const distConfig = `{"sharded_backend": "torch_dist", "sharded_backend_version": 1}`

// trainerSaves is every trainer layout the rules are checked on.
func trainerSaves() []trainerSave {
	lev := func(step int) []saveOp {
		d := fmt.Sprintf("step-%d/", step)
		return []saveOp{wrIn(d+"model/manifest.ocdbt", "ocdbt manifest"), wrIn(d+"model/d/5f3a", "array chunk"),
			wrIn(d+"opt_state/manifest.ocdbt", "ocdbt manifest"),
			wrIn(d+"metadata.json", fmt.Sprintf(`{"step": %d, "timestamp": "2025-03-01T10:00:00.123456", "is_temporary": true}`, step))}
	}
	olmo := func(step int) []saveOp {
		tmp, dir := fmt.Sprintf("step%d-tmp", step), fmt.Sprintf("step%d", step)
		return ops([]saveOp{wrIn(tmp+"/train/rank0.pt", pt()), wrIn(tmp+"/train/rank1.pt", pt())},
			dcpSave(tmp+"/model_and_optim", 2),
			[]saveOp{mv(tmp, dir), wr(dir+"/tmpk2j3h4", `{"ephemeral": false}`), mv(dir+"/tmpk2j3h4", dir+"/.metadata.json")})
	}
	accel := func(n int, procs int) []saveOp {
		d := fmt.Sprintf("checkpoint_%d/", n)
		var out []saveOp
		for p := 1; p < procs; p++ { // the other processes write only their random states
			out = append(out, wrIn(fmt.Sprintf("%srandom_states_%d.pkl", d, p), pt()))
		}
		return append(out, wrIn(d+"model.safetensors", safetensorsBody("lm.weight", 64)), wrIn(d+"optimizer.bin", pt()),
			wrIn(d+"scheduler.bin", pt()), wrIn(d+"random_states_0.pkl", pt()))
	}
	ltDS := func(ckpt string, dp int) []saveOp { // Lightning's DeepSpeedStrategy: tag "checkpoint" inside NAME.ckpt/
		return dsZeRO2(ckpt+"/", "checkpoint", dp)
	}
	hfExport := func(dir string) []saveOp {
		return []saveOp{
			wrIn(dir+"/sharded/shard-00001-model-00001-of-00002.safetensors", safetensorsBody("a", 16)),
			wrIn(dir+"/sharded/shard-00002-model-00002-of-00002.safetensors", safetensorsBody("b", 16)),
			wrIn(dir+"/model-00001-of-00002.safetensors", safetensorsBody("a", 32)),
			wrIn(dir+"/model-00002-of-00002.safetensors", safetensorsBody("b", 32)),
			wrIn(dir+"/"+hfIndex, `{"metadata": {"total_size": 256}, "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}`),
		}
	}
	return []trainerSave{
		{
			name: "gangrun generic (.complete)", source: "docs/checkpoint.md, scripts/examples/train_ddp.py",
			older: []saveOp{wr("step-1/model.pt", pt()), wr("step-1/.complete", "")}, olderName: "step-1",
			save: []saveOp{wrIn("step-2/model.pt", pt()), wr("step-2/.complete", "")}, newName: "step-2", format: FormatGeneric,
		},
		{
			name: "Hugging Face Trainer", source: "transformers/trainer.py Trainer._save_checkpoint",
			older: []saveOp{wr("checkpoint-10/model.safetensors", safetensorsBody("w", 8)), wr("checkpoint-10/trainer_state.json", validTrainerState)}, olderName: "checkpoint-10",
			save: []saveOp{wrIn("checkpoint-20/model.safetensors", safetensorsBody("w", 8)), wrIn("checkpoint-20/config.json", `{"model_type": "llama"}`),
				wrIn("checkpoint-20/optimizer.pt", pt()), wrIn("checkpoint-20/scheduler.pt", pt()), wrIn("checkpoint-20/rng_state.pth", pt()),
				wrIn("checkpoint-20/trainer_state.json", validTrainerState)},
			newName: "checkpoint-20", format: FormatHF,
		},
		{
			name: "torchtitan (DCP)", source: "torchtitan checkpointer/dcp.py dcp_save; torch FileSystemWriter.finish",
			older: dcpSave("step-10", 2), olderName: "step-10",
			save: dcpSave("step-20", 2), newName: "step-20", format: FormatDCP,
		},
		{
			name: "torchtitan (last_save_in_hf)", source: "torchtitan dcp_save(to_hf); torch consolidate_safetensors_files",
			older: dcpSave("step-10", 2), olderName: "step-10",
			save: hfExport("step-20"), newName: "step-20", format: FormatTorchtitan,
		},
		{
			name: "DeepSpeed ZeRO-2 (dp 2)", source: "deepspeed/runtime/engine.py save_checkpoint",
			older: dsZeRO2("", "global_step10", 2), olderName: "global_step10",
			save: dsZeRO2("", "global_step20", 2), newName: "global_step20", format: FormatDeepSpeed,
		},
		{
			name: "DeepSpeed ZeRO-3 (dp 2)", source: "engine.py _save_checkpoint (zero_pp_rank model states), _save_zero_checkpoint",
			older: []saveOp{wr("global_step10/zero_pp_rank_0_mp_rank_00_model_states.pt", dsStates(1, 2, true, nil)), wr("global_step10/zero_pp_rank_1_mp_rank_00_model_states.pt", dsStates(1, 2, true, nil)),
				wr("global_step10/zero_pp_rank_0_mp_rank_00_optim_states.pt", pt()), wr("global_step10/zero_pp_rank_1_mp_rank_00_optim_states.pt", pt()), wr("latest", "global_step10")},
			olderName: "global_step10",
			save: []saveOp{wrIn("global_step20/zero_pp_rank_0_mp_rank_00_model_states.pt", dsStates(1, 2, true, nil)), wrIn("global_step20/zero_pp_rank_0_mp_rank_00_optim_states.pt", pt()),
				wr("latest", "global_step20"),
				wrIn("global_step20/zero_pp_rank_1_mp_rank_00_model_states.pt", dsStates(1, 2, true, nil)), wrIn("global_step20/zero_pp_rank_1_mp_rank_00_optim_states.pt", pt())},
			newName: "global_step20", format: FormatDeepSpeed,
		},
		{
			name: "DeepSpeed tensor parallel (mp 2, no ZeRO)", source: "engine.py _get_ckpt_name (mp_rank_MM)",
			older:     []saveOp{wr("global_step10/mp_rank_00_model_states.pt", dsStates(2, 1, false, nil)), wr("global_step10/mp_rank_01_model_states.pt", dsStates(2, 1, false, nil)), wr("latest", "global_step10")},
			olderName: "global_step10",
			save: []saveOp{wrIn("global_step20/mp_rank_00_model_states.pt", dsStates(2, 1, false, nil)), wr("latest", "global_step20"),
				wrIn("global_step20/mp_rank_01_model_states.pt", dsStates(2, 1, false, nil))},
			newName: "global_step20", format: FormatDeepSpeed,
		},
		{
			name: "DeepSpeed MoE (ep 4, 2 MoE layers)", source: "engine.py _save_moe_checkpoint, _get_expert_ckpt_name, _get_optimizer_ckpt_name",
			older: dsMoE("global_step10", 4, 2), olderName: "global_step10",
			save: dsMoE("global_step20", 4, 2), newName: "global_step20", format: FormatDeepSpeed,
		},
		{
			name: "DeepSpeed pipeline (pp 2, tp 2)", source: "deepspeed/runtime/pipe/module.py save_state_dict, ckpt_layer_path",
			older: dsPipe("global_step10", [][]int{{1, 3}, {4, 5, 7}}, 2), olderName: "global_step10",
			save: dsPipe("global_step20", [][]int{{1, 3}, {4, 5, 7}}, 2), newName: "global_step20", format: FormatDeepSpeed,
		},
		{
			name: "Megatron-LM legacy torch (tp 2)", source: "megatron/training/checkpointing.py save_checkpoint, get_checkpoint_name",
			older:     []saveOp{wr("iter_0000100/mp_rank_00/model_optim_rng.pt", pt()), wr("iter_0000100/mp_rank_01/model_optim_rng.pt", pt()), wr(megatronTracker, "100")},
			olderName: "iter_0000100",
			save:      []saveOp{wrIn("iter_0000200/mp_rank_00/model_optim_rng.pt", pt()), wrIn("iter_0000200/mp_rank_01/model_optim_rng.pt", pt()), wr(megatronTracker, "200")},
			newName:   "iter_0000200", format: FormatMegatron,
		},
		{
			name: "Megatron-LM torch_dist with common.pt (first save)", source: "megatron/core/dist_checkpointing/serialization.py save (core_r0.9)",
			save: ops([]saveOp{wrIn("iter_0000100/common.pt", pt())}, dcpSave("iter_0000100", 2),
				[]saveOp{wrIn("iter_0000100/metadata.json", distConfig), wr(megatronTracker, "100")}),
			newName: "iter_0000100", format: FormatMegatron, whole: 6,
		},
		{
			name: "Megatron-LM torch_dist (first save)", source: "megatron/core/dist_checkpointing/serialization.py save (current)",
			save:    ops(dcpSave("iter_0000100", 2), []saveOp{wrIn("iter_0000100/metadata.json", distConfig), wr(megatronTracker, "100")}),
			newName: "iter_0000100", format: FormatMegatron, whole: 5,
			blind: map[string]string{"4": "no common.pt, no tracker and no earlier torch_dist iteration: a torch_dcp checkpoint looks the same"},
		},
		{
			name: "Megatron-LM torch_dist (later save)", source: "megatron/core/dist_checkpointing/serialization.py save (current)",
			older: ops(dcpSave("iter_0000100", 2), []saveOp{wr("iter_0000100/metadata.json", distConfig), wr(megatronTracker, "100")}), olderName: "iter_0000100",
			save:    ops(dcpSave("iter_0000200", 2), []saveOp{wrIn("iter_0000200/metadata.json", distConfig), wr(megatronTracker, "200")}),
			newName: "iter_0000200", format: FormatMegatron,
		},
		{
			name: "PyTorch Lightning (one file)", source: "lightning/pytorch/callbacks/model_checkpoint.py; fabric cloud_io._atomic_save",
			older: []saveOp{wr(lightningName(0, 50), pt())}, olderName: lightningName(0, 50),
			save: []saveOp{wrIn(lightningName(0, 100), pt())}, newName: lightningName(0, 100), format: FormatLightning,
		},
		{
			name: "Lightning FSDP sharded (NAME.ckpt/)", source: "lightning/pytorch/strategies/fsdp.py save_checkpoint; fabric fsdp.py _is_sharded_checkpoint",
			older: ops(dcpSave(lightningName(0, 50), 2), []saveOp{wr(lightningName(0, 50)+"/meta.pt", pt())}), olderName: lightningName(0, 50),
			save:    ops(dcpSave(lightningName(0, 100), 2), []saveOp{wrIn(lightningName(0, 100)+"/meta.pt", pt())}),
			newName: lightningName(0, 100), format: FormatLightning,
		},
		{
			name: "Lightning DeepSpeed strategy (dp 2)", source: "lightning/pytorch/strategies/deepspeed.py save_checkpoint (tag \"checkpoint\")",
			older: ltDS(lightningName(0, 50), 2), olderName: lightningName(0, 50),
			save: ltDS(lightningName(0, 100), 2), newName: lightningName(0, 100), format: FormatLightning,
		},
		{
			name: "NeMo (-unfinished marker)", source: "nemo/utils/callbacks/nemo_model_checkpoint.py",
			older: []saveOp{wr("gpt--val_loss=1.00-step=50.ckpt", pt())}, olderName: "gpt--val_loss=1.00-step=50.ckpt",
			save:    []saveOp{wr("gpt--val_loss=0.90-step=100-unfinished", ""), wrIn("gpt--val_loss=0.90-step=100.ckpt", pt()), rmEntry("gpt--val_loss=0.90-step=100-unfinished")},
			newName: "gpt--val_loss=0.90-step=100.ckpt", format: FormatNeMo,
		},
		{
			name: "accelerate save_state (2 processes)", source: "accelerate/accelerator.py save_state; checkpointing.py save_accelerator_state",
			older: accel(0, 2), olderName: "checkpoint_0",
			save: accel(1, 2), newName: "checkpoint_1", format: FormatAccelerate,
		},
		{
			name: "Composer (monolithic)", source: "composer/utils/checkpoint.py _save_checkpoint; callbacks/checkpoint_saver.py",
			older: []saveOp{wr("ep0-ba100-rank0.pt", pt()), ln("latest-rank0.pt", "ep0-ba100-rank0.pt")}, olderName: "ep0-ba100-rank0.pt",
			save:    []saveOp{wrIn("ep0-ba200-rank0.pt", pt()), ln("latest-rank0.pt", "ep0-ba200-rank0.pt")},
			newName: "ep0-ba200-rank0.pt", format: FormatComposer,
		},
		{
			name: "Composer (FSDP sharded)", source: "composer/utils/checkpoint.py _save_checkpoint (dist_cp.save), get_save_filename",
			older: ops(dcpSave("ep0-ba100", 2), []saveOp{ln("latest-rank0.pt", "ep0-ba100")}), olderName: "ep0-ba100",
			save: ops(dcpSave("ep0-ba200", 2), []saveOp{ln("latest-rank0.pt", "ep0-ba200")}), newName: "ep0-ba200", format: FormatComposer,
		},
		{
			name: "Levanter", source: "levanter/checkpoint.py save_checkpoint, _save_metadata, discover_latest_checkpoint",
			older: lev(100), olderName: "step-100",
			save: lev(200), newName: "step-200", format: FormatLevanter,
		},
		{
			name: "OLMo-core", source: "olmo_core/train/checkpoint.py Checkpointer.save, dir_is_checkpoint",
			older: olmo(100), olderName: "step100",
			save: olmo(200), newName: "step200", format: FormatOLMoCore,
		},
	}
}

// TestTrainerSaveFixtures checks the fixtures themselves: the model states pickles read
// back with the sizes written, the safetensors bodies are whole.
func TestTrainerSaveFixtures(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "m.pt"), []byte(dsStates(4, 8, true, []int{16, 16})), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := readTorchSaveDict(filepath.Join(dir, "m.pt"))
	if err != nil {
		t.Fatal(err)
	}
	mp, _ := d.pyInt("mp_world_size")
	dp, _ := d.pyInt("dp_world_size")
	ex, _ := d.m["num_experts"].(*pyList)
	if mp != 4 || dp != 8 || ex == nil || len(ex.items) != 2 || ex.items[1] != int64(16) {
		t.Errorf("read back mp %d dp %d experts %v", mp, dp, ex)
	}
	if err := os.WriteFile(filepath.Join(dir, "w.safetensors"), []byte(safetensorsBody("w", 10)), 0o644); err != nil {
		t.Fatal(err)
	}
	if v, ok := checkSafetensorsFile(dir, "w.safetensors", FormatHF); !ok {
		t.Errorf("whole safetensors file: %s", v.reason)
	}
	var header map[string]any
	body := safetensorsBody("w", 10)
	if err := json.Unmarshal([]byte(body[8:8+binary.LittleEndian.Uint64([]byte(body[:8]))]), &header); err != nil {
		t.Errorf("safetensors header: %v", err)
	}
}

package checkpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// latestCase is one fixture tree and what Latest, List and Verify must say about it.
type latestCase struct {
	name    string
	tree    tree
	format  Format
	exclude []string // names inside the root
	setup   func(tb testing.TB, root string)
	// want is the base name Latest returns; "" means none is complete.
	want       string
	wantStep   int64
	wantFormat Format
	// rejected maps a candidate name to a fragment of its Reason.
	rejected map[string]string
	// notes are fragments that must appear in Inspect's notes.
	notes []string
	// order, when set, is List's exact newest-first order of names.
	order []string
}

func latestCases(tb testing.TB) []latestCase {
	zip := torchZip(tb, "archive")
	return []latestCase{
		// generic: step-N directories with a .complete marker
		{
			name: "generic/newest without its marker",
			tree: merge(generic("step-100", true), generic("step-200", false)),
			want: "step-100", wantStep: 100, wantFormat: FormatGeneric,
			rejected: map[string]string{"step-200": "no completion marker"},
		},
		{
			name: "generic/step-9 vs step-10 compare as numbers",
			tree: merge(generic("step-9", true), generic("step-10", true)),
			want: "step-10", wantStep: 10, wantFormat: FormatGeneric,
			order: []string{"step-10", "step-9"},
		},
		{
			name: "generic/issue 2 names: checkpoint-N, global_stepN, iter_N",
			tree: merge(generic("checkpoint-5", true), generic("global_step7", true), generic("iter_0000003", true)),
			want: "global_step7", wantStep: 7, wantFormat: FormatGeneric,
			order: []string{"global_step7", "checkpoint-5", "iter_0000003"},
		},
		{
			name:   "generic/forced format ignores .metadata",
			tree:   merge(dcp("step-100", true), generic("step-50", true)),
			format: FormatGeneric,
			want:   "step-50", wantStep: 50, wantFormat: FormatGeneric,
			rejected: map[string]string{"step-100": "no .complete marker"},
		},
		{
			name: "generic/duplicate step: the newer modification time wins",
			tree: merge(generic("step-10", true), generic("step_10", true)),
			setup: func(tb testing.TB, root string) {
				touch(tb, filepath.Join(root, "step_10"), time.Minute)
			},
			want: "step_10", wantStep: 10, wantFormat: FormatGeneric,
			order: []string{"step_10", "step-10"},
		},
		{
			name: "generic/step number beyond 64 bits, a file, a symlink loop",
			tree: merge(generic("step-1", true), generic("step-99999999999999999999", true),
				tree{"step-300": "a file", "step-400@": "step-400"}),
			want: "step-1", wantStep: 1, wantFormat: FormatGeneric,
			rejected: map[string]string{
				"step-99999999999999999999": "does not fit in 64 bits",
				"step-300":                  "not a directory",
				"step-400":                  "symlink loop",
			},
		},
		{
			name: "generic/nothing complete",
			tree: merge(generic("step-1", false), generic("step-2", false), tree{"step-3/": ""}),
			rejected: map[string]string{
				"step-1": "no completion marker", "step-2": "no completion marker", "step-3": "empty directory",
			},
		},
		{
			name: "generic/no candidates at all",
			tree: tree{"notes.txt": "hello", "logs/": ""},
		},
		{
			name:    "generic/excluded newest falls back to the previous complete",
			tree:    merge(generic("step-100", true), generic("step-200", true)),
			exclude: []string{"step-200"},
			want:    "step-100", wantStep: 100, wantFormat: FormatGeneric,
		},

		// torch.distributed.checkpoint (torchtitan step-N)
		{
			name: "dcp/.metadata only in an older step",
			tree: merge(dcp("step-1000", true), dcp("step-2000", false)),
			want: "step-1000", wantStep: 1000, wantFormat: FormatDCP,
			rejected: map[string]string{"step-2000": "no completion marker"},
		},
		{
			name:   "dcp/forced: .metadata missing, empty, and present",
			tree:   merge(dcp("step-10", true), dcp("step-20", false), tree{"step-30/.metadata": "", "step-30/__0_0.distcp": "x"}),
			format: FormatDCP,
			want:   "step-10", wantStep: 10, wantFormat: FormatDCP,
			rejected: map[string]string{"step-20": "no .metadata", "step-30": ".metadata is empty"},
		},

		// DeepSpeed
		{
			name: "deepspeed/latest names a tag whose files are empty",
			tree: merge(deepspeedTag("global_step100", 2, 1), deepspeedTag("global_step200", 2, 1),
				tree{"global_step200/mp_rank_00_model_states.pt": "", "latest": "global_step200"}),
			want: "global_step100", wantStep: 100, wantFormat: FormatDeepSpeed,
			rejected: map[string]string{"global_step200": "mp_rank_00_model_states.pt is empty"},
			notes:    []string{"latest names global_step200, which is incomplete"},
		},
		{
			name: "deepspeed/latest names a missing tag",
			tree: merge(deepspeedTag("global_step100", 2, 2), deepspeedTag("global_step200", 2, 2),
				tree{"latest": "global_step300\n"}),
			want: "global_step200", wantStep: 200, wantFormat: FormatDeepSpeed,
			notes: []string{"latest names global_step300, which does not exist: not trusted"},
		},
		{
			name: "deepspeed/a tag newer than latest's is an unfinished save",
			tree: merge(deepspeedTag("global_step100", 2, 1), deepspeedTag("global_step200", 2, 1),
				tree{"latest": "global_step100"}),
			want: "global_step100", wantStep: 100, wantFormat: FormatDeepSpeed,
			rejected: map[string]string{"global_step200": "newer than global_step100, which latest names"},
		},
		{
			name: "deepspeed/a missing ZeRO rank file and a missing model-parallel rank",
			tree: merge(deepspeedTag("global_step10", 4, 2), deepspeedTag("global_step20", 4, 2), deepspeedTag("global_step30", 2, 3)),
			setup: func(tb testing.TB, root string) {
				f := filepath.Join(root, "global_step20", "zero_pp_rank_1_mp_rank_01_optim_states.pt")
				os.Remove(f)
				if err := os.Symlink("nowhere", f); err != nil {
					tb.Fatal(err)
				}
				os.Remove(filepath.Join(root, "global_step30", "mp_rank_01_model_states.pt"))
			},
			want: "global_step10", wantStep: 10, wantFormat: FormatDeepSpeed,
			rejected: map[string]string{
				"global_step20": "zero_pp_rank_1_mp_rank_01_optim_states.pt: missing",
				"global_step30": "model states of model-parallel rank 1 missing",
			},
		},
		{
			name: "deepspeed/dp rank gap",
			tree: merge(deepspeedTag("global_step10", 1, 1), deepspeedTag("global_step20", 3, 1)),
			setup: func(tb testing.TB, root string) {
				os.Remove(filepath.Join(root, "global_step20", "zero_pp_rank_1_mp_rank_00_optim_states.pt"))
			},
			want: "global_step10", wantStep: 10, wantFormat: FormatDeepSpeed,
			rejected: map[string]string{"global_step20": "data-parallel rank 1 of model-parallel rank 0 missing"},
		},
		{
			name: "deepspeed/empty and garbage latest are reported and ignored",
			tree: merge(deepspeedTag("global_step1", 1, 1), deepspeedTag("global_step2", 1, 1), tree{"latest": "  \n"}),
			want: "global_step2", wantStep: 2, wantFormat: FormatDeepSpeed,
			notes: []string{"latest is empty: not trusted"},
		},
		{
			name: "deepspeed/latest escaping the directory is garbage",
			tree: merge(deepspeedTag("global_step1", 1, 1), tree{"latest": "../../etc"}),
			want: "global_step1", wantStep: 1, wantFormat: FormatDeepSpeed,
			notes: []string{`latest holds "../../etc", not a tag name`},
		},
		{
			name: "deepspeed/custom tag named by latest",
			tree: merge(deepspeedTag("global_step50", 1, 1), deepspeedTag("mytag", 2, 1), tree{"latest": "mytag"}),
			want: "mytag", wantStep: -1, wantFormat: FormatDeepSpeed,
			order: []string{"mytag", "global_step50"},
		},
		{
			name: "deepspeed/ZeRO-3 model states per data-parallel rank",
			tree: tree{
				"global_step5/zero_pp_rank_0_mp_rank_00_model_states.pt": ptFile(),
				"global_step5/zero_pp_rank_1_mp_rank_00_model_states.pt": ptFile(),
				"global_step5/zero_pp_rank_0_mp_rank_00_optim_states.pt": ptFile(),
				"global_step5/zero_pp_rank_1_mp_rank_00_optim_states.pt": ptFile(),
				"global_step9/zero_pp_rank_0_mp_rank_00_model_states.pt": ptFile(),
				"global_step9/zero_pp_rank_0_mp_rank_00_optim_states.pt": ptFile(),
				"global_step9/zero_pp_rank_1_mp_rank_00_optim_states.pt": ptFile(),
				"latest": "global_step9",
			},
			want: "global_step5", wantStep: 5, wantFormat: FormatDeepSpeed,
			rejected: map[string]string{"global_step9": "ZeRO model and optimizer states cover different ranks"},
		},

		{
			name: "deepspeed/MoE: one expert-parallel rank's optimizer file missing, latest naming the tag",
			tree: merge(opsTree(dsMoE("global_step10", 4, 2)), opsTree(dsMoE("global_step20", 4, 2))),
			setup: func(tb testing.TB, root string) {
				os.Remove(filepath.Join(root, "global_step20", "expp_rank_2_mp_rank_00_optim_states.pt"))
			},
			want: "global_step10", wantStep: 10, wantFormat: FormatDeepSpeed,
			rejected: map[string]string{"global_step20": "MoE optimizer states (expp_rank_*) incomplete: expert-parallel rank 2 of model-parallel rank 0 missing"},
			notes:    []string{"latest names global_step20, which is incomplete"},
		},
		{
			name: "deepspeed/MoE: the last rank's experts saved, its optimizer file not",
			tree: merge(opsTree(dsMoE("global_step10", 4, 2)), opsTree(dsMoE("global_step20", 4, 2))),
			setup: func(tb testing.TB, root string) {
				os.Remove(filepath.Join(root, "global_step20", "expp_rank_3_mp_rank_00_optim_states.pt"))
			},
			want: "global_step10", wantStep: 10, wantFormat: FormatDeepSpeed,
			rejected: map[string]string{"global_step20": "MoE layer 0 holds 4 experts for 3 expert-parallel optimizer files"},
		},
		{
			name: "deepspeed/MoE: a layer's experts short of the recorded num_experts",
			tree: merge(opsTree(dsMoE("global_step10", 4, 2)), opsTree(dsMoE("global_step20", 4, 2))),
			setup: func(tb testing.TB, root string) {
				for _, f := range []string{"layer_0_expert_3_mp_rank_00_model_states.pt", "layer_1_expert_3_mp_rank_00_model_states.pt", "expp_rank_3_mp_rank_00_optim_states.pt"} {
					os.Remove(filepath.Join(root, "global_step20", f))
				}
			},
			want: "global_step10", wantStep: 10, wantFormat: FormatDeepSpeed,
			rejected: map[string]string{"global_step20": "MoE layer 0 holds 3 expert files for model-parallel rank 0, mp_rank_00_model_states.pt records 4 experts"},
		},
		{
			name: "deepspeed/pipeline: a layer file missing for one model-parallel rank",
			tree: merge(opsTree(dsPipe("global_step10", [][]int{{1, 3}, {4, 5}}, 2)), opsTree(dsPipe("global_step20", [][]int{{1, 3}, {4, 5}}, 2))),
			setup: func(tb testing.TB, root string) {
				os.Remove(filepath.Join(root, "global_step20", "layer_05-model_01-model_states.pt"))
			},
			want: "global_step10", wantStep: 10, wantFormat: FormatDeepSpeed,
			rejected: map[string]string{"global_step20": `pipeline layer 05 saved by other model-parallel ranks but not for "model_01"`},
		},
		{
			name: "deepspeed/recorded sizes: the last model-parallel and data-parallel ranks missing, ZeRO files never written",
			tree: merge(opsTree(dsZeRO2("", "global_step10", 4)), tree{
				"global_step20/mp_rank_00_model_states.pt":                dsStates(2, 1, false, nil),
				"global_step30/mp_rank_00_model_states.pt":                dsStates(1, 4, true, nil),
				"global_step30/zero_pp_rank_0_mp_rank_00_optim_states.pt": ptFile(),
				"global_step30/zero_pp_rank_1_mp_rank_00_optim_states.pt": ptFile(),
				"global_step40/mp_rank_00_model_states.pt":                dsStates(1, 4, true, nil),
				"latest": "global_step10",
			}),
			setup: func(tb testing.TB, root string) { os.Remove(filepath.Join(root, "latest")) },
			want:  "global_step10", wantStep: 10, wantFormat: FormatDeepSpeed,
			rejected: map[string]string{
				"global_step20": "model states of 1 model-parallel ranks, mp_rank_00_model_states.pt records mp_world_size 2",
				"global_step30": "ZeRO optimizer states of 2 data-parallel ranks for model-parallel rank 0, mp_rank_00_model_states.pt records dp_world_size 4",
				"global_step40": "no ZeRO optimizer states (*zero_pp_rank_*_optim_states.pt): mp_rank_00_model_states.pt records param_shapes",
			},
		},
		{
			name: "deepspeed/a model states file cut short",
			tree: merge(deepspeedTag("global_step10", 2, 1), deepspeedTag("global_step20", 2, 1),
				tree{"global_step20/mp_rank_00_model_states.pt": ptFile()[:100]}),
			want: "global_step10", wantStep: 10, wantFormat: FormatDeepSpeed,
			rejected: map[string]string{"global_step20": "mp_rank_00_model_states.pt has no zip end record: torch.save writes it in place"},
		},

		// Megatron-LM
		{
			name: "megatron/torch_dcp iterations alone: the dcp rule",
			tree: merge(dcp("iter_0000100", true), dcp("iter_0000200", false)),
			want: "iter_0000100", wantStep: 100, wantFormat: FormatDCP,
			rejected: map[string]string{"iter_0000200": "no completion marker"},
		},
		{
			name: "megatron/torch_dist without metadata.json: common.pt, a sibling's metadata.json",
			tree: merge(dcp("iter_0000100", true), dcp("iter_0000200", true), dcp("iter_0000300", true), tree{
				"iter_0000100/metadata.json": `{"sharded_backend": "torch_dist", "sharded_backend_version": 1}`,
				"iter_0000300/common.pt":     ptFile(),
			}),
			want: "iter_0000100", wantStep: 100, wantFormat: FormatMegatron,
			rejected: map[string]string{
				"iter_0000200": "no metadata.json: dist_checkpointing writes it after every shard",
				"iter_0000300": "check_is_distributed_checkpoint needs it",
			},
		},
		{
			name: "megatron/torch_dist metadata.json cut or without sharded_backend",
			tree: merge(dcp("iter_0000100", true), dcp("iter_0000200", true), dcp("iter_0000300", true),
				tree{"iter_0000100/metadata.json": `{"sharded_backend": "torch_dist"}`,
					"iter_0000200/metadata.json": `{"sharded_backend": "tor`, "iter_0000300/metadata.json": `{}`}),
			want: "iter_0000100", wantStep: 100, wantFormat: FormatMegatron,
			rejected: map[string]string{
				"iter_0000200": "metadata.json is not a JSON object (truncated?)",
				"iter_0000300": "metadata.json has no sharded_backend",
			},
		},
		{
			name: "megatron/tracker names an iteration that does not exist",
			tree: merge(megatronIter(100, 2, 1), megatronIter(200, 2, 1), tree{megatronTracker: "300"}),
			want: "iter_0000200", wantStep: 200, wantFormat: FormatMegatron,
			notes: []string{"latest_checkpointed_iteration.txt names iter_0000300, which does not exist: not trusted"},
		},
		{
			name: "megatron/tracker holds garbage",
			tree: merge(megatronIter(100, 1, 1), megatronIter(200, 1, 1), tree{megatronTracker: "2oo"}),
			want: "iter_0000200", wantStep: 200, wantFormat: FormatMegatron,
			notes: []string{`latest_checkpointed_iteration.txt holds "2oo", neither an iteration nor "release"`},
		},
		{
			name: "megatron/tracker empty",
			tree: merge(megatronIter(100, 1, 1), tree{megatronTracker: ""}),
			want: "iter_0000100", wantStep: 100, wantFormat: FormatMegatron,
			notes: []string{"latest_checkpointed_iteration.txt is empty: not trusted"},
		},
		{
			name: "megatron/an iteration newer than the tracker's is an unfinished save",
			tree: merge(megatronIter(100, 1, 2), megatronIter(200, 1, 2), tree{megatronTracker: "100"}),
			want: "iter_0000100", wantStep: 100, wantFormat: FormatMegatron,
			rejected: map[string]string{"iter_0000200": "newer than iter_0000100, which latest_checkpointed_iteration.txt names"},
		},
		{
			name: "megatron/a tensor-parallel rank missing, a rank file empty",
			tree: merge(megatronIter(100, 2, 2), megatronIter(200, 2, 2), megatronIter(300, 2, 1)),
			setup: func(tb testing.TB, root string) {
				os.RemoveAll(filepath.Join(root, "iter_0000200", "mp_rank_01_001"))
				os.WriteFile(filepath.Join(root, "iter_0000300", "mp_rank_01", "model_optim_rng.pt"), nil, 0o644)
			},
			want: "iter_0000100", wantStep: 100, wantFormat: FormatMegatron,
			rejected: map[string]string{
				"iter_0000200": "3 of 4 rank directories present",
				"iter_0000300": "mp_rank_01/model_optim_rng.pt is empty",
			},
		},
		{
			name: "megatron/torch_dist iterations are DCP directories",
			tree: merge(dcp("iter_0000100", true), dcp("iter_0000200", false), tree{megatronTracker: "200"}),
			want: "iter_0000100", wantStep: 100, wantFormat: FormatMegatron,
			notes: []string{"names iter_0000200, which is incomplete"},
		},
		{
			name: "megatron/release named by the tracker",
			tree: merge(megatronIter(100, 1, 1), tree{"release/mp_rank_00/model_optim_rng.pt": ptFile(), megatronTracker: "release"}),
			want: "release", wantStep: -1, wantFormat: FormatMegatron,
			order: []string{"release", "iter_0000100"},
		},

		// Hugging Face Trainer
		{
			name: "hf/truncated trainer_state.json",
			tree: merge(hf(10, validTrainerState), hf(20, `{"global_step": 20, "log_hist`), hf(30, "")),
			want: "checkpoint-10", wantStep: 10, wantFormat: FormatHF,
			rejected: map[string]string{"checkpoint-20": "not valid JSON", "checkpoint-30": "no completion marker"},
		},
		{
			name:   "hf/forced: no trainer_state.json, a JSON array, transformers' staging directory",
			tree:   merge(hf(9, validTrainerState), hf(10, ""), hf(11, "[1,2]"), tree{"tmp-checkpoint-12/model.safetensors": "w"}),
			format: FormatHF,
			want:   "checkpoint-9", wantStep: 9, wantFormat: FormatHF,
			rejected: map[string]string{
				"checkpoint-10":     "no trainer_state.json",
				"checkpoint-11":     "not a JSON object",
				"tmp-checkpoint-12": "staging directory",
			},
			order: []string{"tmp-checkpoint-12", "checkpoint-11", "checkpoint-10", "checkpoint-9"},
		},

		// PyTorch Lightning
		{
			name: "lightning/last.ckpt truncated",
			tree: tree{lightningName(0, 100): zip, "last.ckpt": zip[:len(zip)-30]},
			want: lightningName(0, 100), wantStep: 100, wantFormat: FormatLightning,
			rejected: map[string]string{"last.ckpt": "not a readable zip archive"},
			order:    []string{"last.ckpt", lightningName(0, 100)},
		},
		{
			name: "lightning/last.ckpt a symlink to itself",
			tree: tree{lightningName(0, 100): zip, "last.ckpt@": "last.ckpt"},
			want: lightningName(0, 100), wantStep: 100, wantFormat: FormatLightning,
			rejected: map[string]string{"last.ckpt": "symlink loop"},
		},
		{
			name: "lightning/last.ckpt a broken symlink, an empty file, a zip not from torch.save",
			tree: tree{lightningName(0, 100): zip, "last.ckpt@": "gone.ckpt", lightningName(1, 200): "",
				lightningName(2, 300): zipWithout(tb)},
			want: lightningName(0, 100), wantStep: 100, wantFormat: FormatLightning,
			rejected: map[string]string{
				"last.ckpt":           "broken symlink to gone.ckpt",
				lightningName(1, 200): "empty file",
				lightningName(2, 300): "without data.pkl",
			},
		},
		{
			name: "lightning/last.ckpt linking the newest step: the real file is returned",
			tree: tree{lightningName(0, 100): zip, lightningName(1, 200): zip, "last.ckpt@": lightningName(1, 200)},
			want: lightningName(1, 200), wantStep: 200, wantFormat: FormatLightning,
		},
		{
			name: "lightning/a regular last.ckpt is the newest",
			tree: tree{lightningName(0, 100): zip, "last.ckpt": zip, "best.ckpt": zip},
			want: "last.ckpt", wantStep: -1, wantFormat: FormatLightning,
			order: []string{"last.ckpt", lightningName(0, 100), "best.ckpt"},
		},

		{
			name: "lightning/FSDP sharded directory without meta.pt, and with it cut",
			tree: merge(dcp(lightningName(0, 100), true), dcp(lightningName(0, 200), true), dcp(lightningName(0, 300), true),
				tree{lightningName(0, 100) + "/meta.pt": zip, lightningName(0, 300) + "/meta.pt": zip[:40]}),
			want: lightningName(0, 100), wantStep: 100, wantFormat: FormatLightning,
			rejected: map[string]string{
				lightningName(0, 200): "sharded checkpoint without meta.pt",
				lightningName(0, 300): "meta.pt has no zip end record",
			},
		},

		// NeMo
		{
			name: "nemo/-unfinished marker",
			tree: tree{
				"gpt--val_loss=1.20-step=100.ckpt":       zip,
				"gpt--val_loss=1.10-step=200.ckpt":       zip,
				"gpt--val_loss=1.10-step=200-unfinished": "",
			},
			want: "gpt--val_loss=1.20-step=100.ckpt", wantStep: 100, wantFormat: FormatNeMo,
			rejected: map[string]string{"gpt--val_loss=1.10-step=200.ckpt": "marker gpt--val_loss=1.10-step=200-unfinished exists"},
		},
		{
			name: "nemo/NeMo 2 directories with weights/.metadata",
			tree: merge(
				dcp("gpt--reduced_train_loss=0.50-epoch=0-step=99/weights", true),
				dcp("gpt--reduced_train_loss=0.40-epoch=0-step=199/weights", true),
				tree{"gpt--reduced_train_loss=0.40-epoch=0-step=199-unfinished": "", "gpt--reduced_train_loss=0.40-epoch=0-step=199/context/": ""},
				dcp("gpt--reduced_train_loss=0.45-epoch=0-step=149/weights", false),
			),
			want: "gpt--reduced_train_loss=0.50-epoch=0-step=99", wantStep: 99, wantFormat: FormatNeMo,
			rejected: map[string]string{
				"gpt--reduced_train_loss=0.40-epoch=0-step=199": "-unfinished exists",
				"gpt--reduced_train_loss=0.45-epoch=0-step=149": "without .metadata, weights/.metadata",
			},
		},
		{
			name: "nemo/orphan marker is a note",
			tree: tree{"gpt--step=5.ckpt": zip, "gpt--step=7-unfinished": ""},
			want: "gpt--step=5.ckpt", wantStep: 5, wantFormat: FormatNeMo,
			notes: []string{"NeMo marker gpt--step=7-unfinished has no checkpoint next to it"},
		},
	}
}

// opsTree is the tree a sequence of write steps leaves (savecut_test.go's saves).
func opsTree(steps []saveOp) tree {
	t := tree{}
	for _, op := range steps {
		if op.kind != opWrite {
			panic("opsTree: only writes")
		}
		t[op.path] = op.body
	}
	return t
}

// zipWithout is a valid zip archive that torch.save did not write.
func zipWithout(tb testing.TB) string {
	z := torchZip(tb, "x")
	return strings.ReplaceAll(z, "data.pkl", "other.pk")
}

func TestLatestListVerify(t *testing.T) {
	for _, tc := range latestCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			build(t, root, tc.tree)
			if tc.setup != nil {
				tc.setup(t, root)
			}
			opts := Options{Format: tc.format}
			for _, ex := range tc.exclude {
				opts.Exclude = append(opts.Exclude, filepath.Join(root, ex))
			}

			got, err := Latest(root, opts)
			if tc.want == "" {
				var nc *NoCompleteError
				if !errors.Is(err, ErrNoComplete) || !errors.As(err, &nc) {
					t.Fatalf("Latest = %+v, %v; want ErrNoComplete", got, err)
				}
				for name, frag := range tc.rejected {
					if !strings.Contains(err.Error(), name+": ") || !strings.Contains(err.Error(), frag) {
						t.Errorf("error %q does not give %s's reason %q", err, name, frag)
					}
				}
			} else {
				if err != nil {
					t.Fatalf("Latest: %v", err)
				}
				if got.Path != filepath.Join(root, tc.want) || got.Step != tc.wantStep || got.Format != tc.wantFormat || !got.Complete {
					t.Fatalf("Latest = %s step %d %s complete=%v; want %s step %d %s",
						filepath.Base(got.Path), got.Step, got.Format, got.Complete, tc.want, tc.wantStep, tc.wantFormat)
				}
				if got.ModTime.IsZero() || got.SizeBytes <= 0 {
					t.Errorf("Latest did not fill time and size: %+v", got)
				}
			}

			l, err := Inspect(root, Options{Format: tc.format})
			if err != nil {
				t.Fatalf("Inspect: %v", err)
			}
			byName := map[string]Checkpoint{}
			for _, c := range l.Checkpoints {
				byName[filepath.Base(c.Path)] = c
			}
			for name, frag := range tc.rejected {
				c, ok := byName[name]
				if !ok {
					t.Errorf("List lacks %s; has %v", name, names(l.Checkpoints))
					continue
				}
				if c.Complete || !strings.Contains(c.Reason, frag) {
					t.Errorf("%s: complete=%v reason %q; want incomplete with %q", name, c.Complete, c.Reason, frag)
				}
			}
			for _, frag := range tc.notes {
				if !strings.Contains(strings.Join(l.Notes, "\n"), frag) {
					t.Errorf("notes %q lack %q", l.Notes, frag)
				}
			}
			if tc.order != nil && fmt.Sprint(names(l.Checkpoints)) != fmt.Sprint(tc.order) {
				t.Errorf("List order %v; want %v", names(l.Checkpoints), tc.order)
			}
			// Latest is List's first complete candidate that is not excluded.
			excl := map[string]bool{}
			for _, ex := range tc.exclude {
				excl[ex] = true
			}
			first := ""
			for _, c := range l.Checkpoints {
				if c.Complete && !excl[filepath.Base(c.Path)] {
					first = filepath.Base(c.Path)
					break
				}
			}
			if first != tc.want {
				t.Errorf("List's first complete is %q, Latest's answer %q", first, tc.want)
			}
			// Verify agrees with List on every candidate.
			for _, c := range l.Checkpoints {
				v, err := Verify(c.Path, Options{Format: tc.format})
				if err != nil {
					t.Errorf("Verify(%s): %v", c.Path, err)
					continue
				}
				if v.Complete != c.Complete || v.Reason != c.Reason || v.Format != c.Format || v.Step != c.Step {
					t.Errorf("Verify(%s) = %v %q %s %d; List says %v %q %s %d", filepath.Base(c.Path),
						v.Complete, v.Reason, v.Format, v.Step, c.Complete, c.Reason, c.Format, c.Step)
				}
			}
		})
	}
}

func TestLatestExcludeAll(t *testing.T) {
	root := t.TempDir()
	build(t, root, merge(generic("step-1", true), generic("step-2", true)))
	_, err := Latest(root, Options{Exclude: []string{filepath.Join(root, "step-1"), filepath.Join(root, "step-2")}})
	if !errors.Is(err, ErrNoComplete) || !strings.Contains(err.Error(), "step-2: excluded by the caller") {
		t.Fatalf("Latest with everything excluded: %v", err)
	}
}

func TestBadDirectories(t *testing.T) {
	root := t.TempDir()
	build(t, root, tree{"file": "x", "loop@": "loop", "a@": "b", "b@": "a", "broken@": "nowhere"})
	cases := []struct {
		name, dir, want string
	}{
		{"missing", filepath.Join(root, "missing"), "does not exist"},
		{"a file", filepath.Join(root, "file"), "is a file, not a directory"},
		{"self symlink loop", filepath.Join(root, "loop"), "symlink loop"},
		{"two-link loop", filepath.Join(root, "a"), "symlink loop"},
		{"broken symlink", filepath.Join(root, "broken"), "broken symlink"},
		{"a file as a path component", filepath.Join(root, "file", "sub"), "not a directory"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for fn, call := range map[string]func() error{
				"Latest": func() error { _, err := Latest(tc.dir, Options{}); return err },
				"List":   func() error { _, err := List(tc.dir, Options{}); return err },
				"Prune":  func() error { _, err := Prune(tc.dir, 1, Options{}); return err },
			} {
				err := call()
				var de *DirError
				if !errors.As(err, &de) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.dir) {
					t.Errorf("%s(%s) = %v; want a DirError naming the directory and %q", fn, tc.name, err, tc.want)
				}
				if strings.Contains(err.Error(), "\n") {
					t.Errorf("%s: error is not one line: %q", fn, err)
				}
			}
		})
	}
	if _, err := Latest(filepath.Join(root, "missing"), Options{}); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Latest on a missing directory: %v does not wrap fs.ErrNotExist", err)
	}
	if _, err := Latest(root, Options{Format: "tensorflow"}); err == nil || !strings.Contains(err.Error(), `"tensorflow"`) {
		t.Errorf("unknown format: %v", err)
	}
	if _, err := Verify(filepath.Join(root, "missing"), Options{}); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("Verify missing: %v", err)
	}
}

func TestParseFormat(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Format
		ok   bool
	}{
		{"", FormatAuto, true}, {"auto", FormatAuto, true}, {"dcp", FormatDCP, true},
		{"deepspeed", FormatDeepSpeed, true}, {"megatron", FormatMegatron, true}, {"hf", FormatHF, true},
		{"lightning", FormatLightning, true}, {"nemo", FormatNeMo, true}, {"generic", FormatGeneric, true},
		{"DCP", "", false}, {"torch", "", false},
	} {
		got, err := ParseFormat(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseFormat(%q) = %q, %v", tc.in, got, err)
		}
	}
}

func TestNeMoMarkerName(t *testing.T) {
	for in, want := range map[string]string{
		"a--step=1.ckpt":     "a--step=1-unfinished",
		"a--step=1-EMA.ckpt": "a--step=1-unfinished",
		"a--step=1.nemo":     "a--step=1-unfinished",
		"a--step=1-last":     "a--step=1-last-unfinished",
	} {
		if got := nemoMarkerName(in); got != want {
			t.Errorf("nemoMarkerName(%q) = %q; want %q", in, got, want)
		}
	}
}

// TestUnreadableDirectory needs a permission error, which root never gets: as root it
// runs Latest in a copy of the test binary under uid 65534.
func TestUnreadableDirectory(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{root, filepath.Dir(root)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(root, "ckpt")
	build(t, dir, generic("step-1", true))
	if err := os.Chmod(dir, 0o000); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(dir, 0o755) })
	var got string
	if os.Geteuid() == 0 {
		got = runAsNobody(t, envLatestHelper+"="+dir)
	} else {
		_, err := Latest(dir, Options{})
		got = fmt.Sprint("error: ", err)
	}
	want := fmt.Sprintf("error: checkpoint dir %q: unreadable: permission denied", dir)
	if got != want {
		t.Fatalf("Latest on an unreadable directory printed %q; want %q", got, want)
	}
}

// TestNamedPipesNeverBlock: a named pipe where a rule reads a file (HF's
// trainer_state.json, DeepSpeed's latest, Megatron's tracker) or given as the directory
// is judged at once, never opened for a blocking read.
func TestNamedPipesNeverBlock(t *testing.T) {
	root := t.TempDir()
	mkfifo := func(rel string) string {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mkfifo(p, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	mkfifo("hf/checkpoint-10/trainer_state.json")
	mkfifo("ds/latest")
	if err := os.MkdirAll(filepath.Join(root, "ds", "global_step5"), 0o755); err != nil {
		t.Fatal(err)
	}
	mkfifo("mg/latest_checkpointed_iteration.txt")
	mkfifo("pipe")
	for _, tc := range []struct {
		dir, want string
	}{
		{"hf", "trainer_state.json: is a named pipe (FIFO), want a regular file"},
		{"ds", "no complete checkpoint"},
		{"mg", "no complete checkpoint"},
		{"pipe", "is a named pipe (FIFO), not a directory"},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			done := make(chan error, 1)
			go func() { _, err := Latest(filepath.Join(root, tc.dir), Options{}); done <- err }()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("Latest(%s) = %v, want %q", tc.dir, err, tc.want)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("Latest(%s) blocked", tc.dir)
			}
		})
	}
}

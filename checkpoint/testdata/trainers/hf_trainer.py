"""transformers' Trainer saves a tiny Llama on CPU every 5 steps (checkpoint-5,
checkpoint-10, safetensors); its second save is cut at every write event (cutsave.py).
Each tree is then judged by transformers itself: get_last_checkpoint (what
train(resume_from_checkpoint=True) resumes from) and, for every checkpoint-N, whether the
Trainer's own load calls, in train()'s order, restore the state saved at step N.

With LIMIT, save_total_limit=LIMIT: after the second save the Trainer's rotation removes
checkpoint-5 (shutil.rmtree), and those removals are cut too.

Usage: python hf_trainer.py RESULTS [LIMIT]
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
results = os.path.abspath(sys.argv[1])
limit = int(sys.argv[2]) if len(sys.argv) > 2 else None
out = os.path.join(results, "out")
os.makedirs(out)
import cutsave  # noqa: E402  (before transformers: it binds safetensors' save_file at import)
cutsave.install(out)

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments  # noqa: E402
from transformers.trainer_callback import TrainerState  # noqa: E402
from transformers.trainer_utils import get_last_checkpoint  # noqa: E402

import common  # noqa: E402

torch.set_num_threads(1)
STEPS, EVERY = 10, 5
config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
data = [{"input_ids": torch.randint(0, 64, (8,)), "labels": torch.randint(0, 64, (8,))} for _ in range(64)]


def args(output_dir):
    return TrainingArguments(output_dir=output_dir, max_steps=STEPS, save_strategy="steps", save_steps=EVERY,
                             per_device_train_batch_size=2, learning_rate=1e-2, logging_steps=EVERY,
                             report_to=[], use_cpu=True, seed=1, disable_tqdm=True, dataloader_num_workers=0,
                             save_total_limit=limit)


def state_fingerprint(trainer, step):
    return common.fingerprint(dict(trainer.model.state_dict()), common.optimizer_state(trainer.optimizer),
                              trainer.lr_scheduler.state_dict(), step)


saved = {}
real_save = Trainer._save_checkpoint


def save_checkpoint(self, model, trial):
    step = self.state.global_step
    saved["checkpoint-%d" % step] = state_fingerprint(self, step)
    if step == STEPS:
        saved["cuts"] = cutsave.fork_cuts(lambda: real_save(self, model, trial), out, results)
    return real_save(self, model, trial)


Trainer._save_checkpoint = save_checkpoint
torch.manual_seed(0)
Trainer(model=LlamaForCausalLM(config), args=args(out), train_dataset=data).train()
cuts, whole = saved.pop("cuts")


def judge(root):
    pick = get_last_checkpoint(root)
    loads = {}
    for name in sorted(os.listdir(root)):
        if not name.startswith("checkpoint-"):
            continue
        cand, step = os.path.join(root, name), int(name.split("-")[1])
        torch.manual_seed(1)  # a fresh model whose weights differ from every saved one
        t = Trainer(model=LlamaForCausalLM(config), args=args(tempfile.mkdtemp()), train_dataset=data)
        try:
            # train(resume_from_checkpoint=...)'s loads, in its order.
            t._load_from_checkpoint(cand)
            t.state = TrainerState.load_from_json(os.path.join(cand, "trainer_state.json"))
            t.create_optimizer_and_scheduler(num_training_steps=STEPS)
            t._load_optimizer_and_scheduler(cand)
            t._load_rng_state(cand)
            got = state_fingerprint(t, t.state.global_step)
            loads[name] = "ok" if got == saved[name] else "loads, but not the state saved at step %d" % step
        except Exception as e:  # noqa: BLE001: the loader's failure is the verdict
            loads[name] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:200] if str(e) else "")
    return {"pick": os.path.basename(pick) if pick else None, "loads": loads}


common.write_report(results, library="transformers " + transformers.__version__, older="checkpoint-5",
                    newer="checkpoint-10", trees=common.judge_all(results, cuts, whole, judge))
print("ok")

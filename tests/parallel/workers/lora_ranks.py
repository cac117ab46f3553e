"""msrun worker (2 ranks) for tests/parallel/test_lora_msrun.py: LoRA adapters on the tensor-parallel policy
(training tp2) against the one-device model, and the adapter-only sync to the inference layout (dp2) against a
full-weight sync of the merged weights.

    msrun --worker_num=2 ... lora_ranks.py OUT_DIR

(a) the reference under tp2: the policy's log-probs with its adapters off against a tp2 model without adapters;
(b) two GRPO updates of the adapters (the first moves B off zero, the second gives A a gradient): one device and
training tp2, the same loss, metrics and adapters; (c) the adapters resharded to inference dp2 (`ParallelPlacement.
weight_sync` with the adapters' names, as `grpo/builder.py` calls it) once before the updates and once after,
against the tp2 policy's merged weights (W + s B A per piece) resharded whole into a model without adapters:
greedy and sampled rollouts of both, the sync's metrics; (d) the tp2 policy's checkpoint as the trainer saves it
(every rank its adapters' and moments' pieces, the base by path and sha256, written once whole since it was drawn at
random, the PEFT folder gathered whole by rank 0), one more update, the base spoilt, the checkpoint resumed and the
update again; (e) training pp2 (rank 0 holds layer 0 and the embedding, rank 1 layer 1, the final norm and the
head), each stage with its layers' adapters: drawn as one device's, the reference with adapters off against pp2
stages without adapters, two updates through 1F1B, the adapter-only sync out of the stages into inference dp2 and its
greedy rollouts, then (d)'s checkpoint, update, spoilt base and resume under pp2 (the test computes the one-device
model itself).
Writes OUT_DIR/rank_<k>.npz (arrays) and OUT_DIR/rank_<k>.json (metrics); the test compares.
(b)'s one-device updates run on rank 0 alone: they take no collective and are the same on every rank, and the test
compares every rank's tp2 results with rank 0's.
"""

import gc
import json
import os
import sys
from types import SimpleNamespace

import numpy as np
import mindspore as ms
from mindspore import Tensor

ms.set_context(mode=ms.GRAPH_MODE)
ms.set_device("CPU")

from mindgrpo.grpo.actor import PolicyUpdater, Scorer  # noqa: E402
from mindgrpo.grpo.lora_checkpoint import LoraCheckpoint, base_parameters, fingerprint  # noqa: E402
from mindgrpo.grpo.experience import pack  # noqa: E402
from mindgrpo.grpo.ms_objective import GRPOLoss  # noqa: E402
from mindgrpo.inference.engine import RolloutEngine  # noqa: E402
from mindgrpo.inference.sampling import SamplingParams  # noqa: E402
from mindgrpo.models.checkpoint import load_state  # noqa: E402
from mindgrpo.models.lora import (ALL_LINEAR, LoraSpec, adapter_names, adapter_shapes, adapter_state,  # noqa: E402
                                  adapters_off, add_adapters, merge_state)
from mindgrpo.models.qwen2 import Qwen2ForCausalLM  # noqa: E402
from mindgrpo.models.scoring import TokenLogProbs  # noqa: E402
from mindgrpo.parallel.comm import init_comm  # noqa: E402
from mindgrpo.parallel.data_parallel import DataParallelEngine  # noqa: E402
from mindgrpo.parallel.layout import ParallelLayout  # noqa: E402
from mindgrpo.parallel.colocated import ParallelPlacement  # noqa: E402
from mindgrpo.parallel.one_device import OneDevice  # noqa: E402
from mindgrpo.parallel.reshard import named_parameters  # noqa: E402
from mindgrpo.parallel.tp_layers import TensorParallelLayers  # noqa: E402

from parallel_cases import CFG, CFG_PP2, LOSS, SEED, experience_arrays, prompts, token_batch  # noqa: E402
from parallel_cases import sampling_logprobs, updater_kwargs  # noqa: E402
from worker_clock import Clock  # noqa: E402

gc.collect()
gc.freeze()

clock = Clock("lora_ranks")
out_dir = sys.argv[1]
train, infer = ParallelLayout(dp=1, tp=2), ParallelLayout(dp=2, tp=1)
comm = init_comm(train=train, infer=infer)
rank = comm.rank
arrays, metrics = {}, {}
SPEC = LoraSpec(rank=4, alpha=8.0, targets=ALL_LINEAR)  # every projection: column- and row-parallel ones


def parallel_config(layout):
    return SimpleNamespace(data_parallel=layout.dp, model_parallel=layout.tp, pipeline_stage=layout.pp,
                           optimizer_shard=False)


# the placement the run's builder uses (its layouts read from the config's three sections)
placement = ParallelPlacement(SimpleNamespace(
    actor_config=SimpleNamespace(parallel_config=parallel_config(train)),
    generate_config=SimpleNamespace(parallel_config=parallel_config(infer)),
    ref_config=SimpleNamespace(parallel_config=parallel_config(train)), rl_config=SimpleNamespace(beta=0.0)), comm)

dense = Qwen2ForCausalLM(CFG, seed=SEED, max_positions=128)
tp = Qwen2ForCausalLM(CFG, seed=SEED, max_positions=128, layers=TensorParallelLayers(comm.train_tp))
base_tp = Qwen2ForCausalLM(CFG, seed=SEED, max_positions=128, layers=TensorParallelLayers(comm.train_tp))
for lm in (dense, tp):
    add_adapters(lm, SPEC, seed=3)
arrays["init/dense"] = np.concatenate([v.ravel() for v in adapter_state(dense).values()])
for name, value in adapter_state(tp).items():
    arrays[f"init/tp/{name}"] = value

# the inference model (dp2: whole on each rank): the same base, other adapters until the first sync
inference = Qwen2ForCausalLM(CFG, seed=SEED, max_positions=128)
add_adapters(inference, SPEC, seed=4)
sync = placement.weight_sync(tp, inference, "inference", names=adapter_names(tp))
metrics["sync/first"] = sync()
for name, value in adapter_state(inference).items():
    arrays[f"sync0/{name}"] = value
clock.mark("first adapter sync")

# (a) the reference: the tp2 policy with its adapters off is the tp2 base model
ids, mask, pos, labels = (Tensor(a) for a in token_batch())
with adapters_off(tp):
    logp, _ = TokenLogProbs(tp)(ids, pos, labels)
arrays["a/logp_off"] = logp.asnumpy()
arrays["a/logp_base"] = TokenLogProbs(base_tp)(ids, pos, labels)[0].asnumpy()
clock.mark("(a) reference")

# (b) two updates of the adapters: one device and training tp2
exp = pack(*experience_arrays())
exp.sampling_logp = sampling_logprobs(exp.mask)
updaters = {}
for key, lm in (("dense", dense), ("tp", tp)):
    if key == "dense" and comm.rank != 0:  # the one-device reference: rank 0's (rank 1 compiled it again)
        continue
    updater = updaters[key] = PolicyUpdater(lm, GRPOLoss(**LOSS), grad_reducer=None, chunk=0, **updater_kwargs())
    for i in range(2):
        metrics[f"update{i}/{key}"] = updater.update(exp, lr=1e-2)
    metrics[f"trainable/{key}"] = sorted(p.name for p in lm.trainable_params())
    metrics[f"optimizer/{key}"] = sorted(p.name for p in updater.state_parameters())
    for name, value in adapter_state(lm).items():
        arrays[f"b/{key}/{name}"] = value
    clock.mark(f"(b) updates {key}")

# (c) the adapters resharded again (the policy's have trained) ...
metrics["sync/adapters"] = sync()
for name, value in adapter_state(inference).items():
    arrays[f"c/adapters/{name}"] = value
# ... against the merged weights moved whole: each tp2 piece's W + s B A into a tp2 model without adapters, resharded
merged_tp = Qwen2ForCausalLM(CFG, seed=SEED, max_positions=128, layers=TensorParallelLayers(comm.train_tp))
base = {n: p.asnumpy() for n, p in named_parameters(tp).items() if ".lora_" not in n}
load_state(merged_tp, merge_state(base, adapter_state(tp), SPEC.scaling))
merged_inference = Qwen2ForCausalLM(CFG, seed=SEED + 1, max_positions=128)
full_sync = placement.weight_sync(merged_tp, merged_inference, "inference")
metrics["sync/full"] = full_sync()
clock.mark("(c) syncs")

greedy = SamplingParams(max_tokens=8, temperature=0.0, n=2)
sampled = SamplingParams(max_tokens=8, temperature=1.0, n=2, seed=5)
for key, lm in (("adapters", inference), ("merged", merged_inference)):
    engine = DataParallelEngine(RolloutEngine(lm, max_num_seqs=2), comm, comm.infer_dp)
    metrics[f"rollout/greedy/{key}"] = [c.token_ids for c in engine.generate(prompts(), greedy)]
    comps = engine.generate(prompts(), sampled)
    metrics[f"rollout/sampled/{key}"] = [c.token_ids for c in comps]
    arrays[f"c/sampled_logp_{key}"] = np.concatenate([c.logprobs for c in comps])
    clock.mark(f"(c) rollouts {key}")

# (d) the tp2 policy's checkpoint as the trainer saves it under msrun (`GRPOTrainer.save`: LoRA's groups, state.json's
# lora_base, the PEFT folder) with its base drawn at random (so written once, whole, by rank 0), a third update, the
# base spoilt, then the checkpoint resumed (`GRPOTrainer.resume`) and the third update again
root = os.path.join(out_dir, "checkpoints")
checkpoints = placement.checkpoints(root, 2, CFG, adapters=adapter_shapes(tp))
lora, updater = LoraCheckpoint(tp, root, None, placement), updaters["tp"]
groups = lora.groups(updater.state_parameters())


def spoil_and_resume(lm, updater, checkpoints, lora, cfg) -> str:
    """The base spoilt and the step count reset, then the last checkpoint loaded into the adapters, the moments and
    the base (LoRA's restore) as a resumed run does; returns the checkpoint's folder."""
    for p in base_parameters(lm):
        p.set_data(Tensor(np.full(p.shape, 0.5, np.float32)).astype(p.dtype))
    updater.optimizer_steps = 0
    found = checkpoints.find()
    restored = checkpoints.load(found, lora.groups(updater.state_parameters()), cfg.to_hf_dict())
    lora.restore(restored["lora_base"], found)
    updater.optimizer_steps = restored["optimizer_steps"]
    return found


def snapshot(prefix, lm=tp, optimizer=groups["optimizer"]):
    for name, p in named_parameters(lm).items():
        if ".lora_" in name and not name.endswith("lora_scaling"):
            arrays[f"{prefix}/{name}"] = p.asnumpy().copy()
    for p in optimizer:
        arrays[f"{prefix}/{p.name}"] = p.asnumpy().copy()


state = {"step": 2, "optimizer_steps": updater.optimizer_steps, "train_prompts": {"epoch": 0, "index": 0},
         "val_history": [], "bad_steps": {"total": 0, "in_a_row": 0}, "config": {}, "lora_base": lora.state()}
saved = checkpoints.save(2, groups, state, CFG.to_hf_dict(), extra=lora.write_adapter)
metrics["d/saved"], metrics["d/lora_base"] = saved, state["lora_base"]
metrics["d/sha_one_device"] = fingerprint(OneDevice().whole(base_parameters(dense)))
snapshot("d/saved")
clock.mark("(d) save")
metrics["d/update/straight"] = updater.update(exp, lr=1e-2)
snapshot("d/straight")
metrics["d/found"] = spoil_and_resume(tp, updater, checkpoints, lora, CFG)
snapshot("d/restored")
arrays["d/base_restored"] = np.concatenate([p.asnumpy().ravel() for p in base_parameters(tp)])
arrays["d/base_tp"] = np.concatenate([p.asnumpy().ravel() for p in base_parameters(base_tp)])
metrics["d/update/resumed"] = updater.update(exp, lr=1e-2)
snapshot("d/resumed")
clock.mark("(d) resume")

# (e) pipeline stages: training pp2 (rank k is stage k, a layer each), each stage with its layers' adapters
PP2 = ParallelLayout(dp=1, tp=1, pp=2)
placement_pp = ParallelPlacement(SimpleNamespace(
    actor_config=SimpleNamespace(parallel_config=parallel_config(PP2)),
    generate_config=SimpleNamespace(parallel_config=parallel_config(infer)),
    ref_config=SimpleNamespace(parallel_config=parallel_config(PP2)), rl_config=SimpleNamespace(beta=0.0)), comm)
pipe = placement_pp.pipeline("policy", ms.float32)
stage, base_pp = (placement_pp.model("policy", CFG_PP2, None, False, SEED, 128) for _ in range(2))
add_adapters(stage, SPEC, seed=3)
for name, value in adapter_state(stage).items():
    arrays[f"e/init/{name}"] = value
updater_pp = PolicyUpdater(stage, GRPOLoss(**LOSS), pipeline=pipe, **updater_kwargs())
for i in range(2):
    metrics[f"e/update{i}"] = updater_pp.update(exp, lr=1e-3)
metrics["e/trainable"] = sorted(p.name for p in stage.trainable_params())
metrics["e/optimizer"] = sorted(p.name for p in updater_pp.state_parameters())
for name, value in adapter_state(stage).items():
    arrays[f"e/trained/{name}"] = value
clock.mark("(e) pp2 updates")
# the reference (the trainer's: the policy's stages with their adapters off) against pp2 stages without adapters
scorer = Scorer(stage, 3, pipeline=pipe)
with adapters_off(stage):
    arrays["e/logp_off"] = scorer(exp)
arrays["e/logp_on"] = scorer(exp)
arrays["e/logp_base"] = Scorer(base_pp, 3, pipeline=pipe)(exp)
clock.mark("(e) pp2 reference")
# the adapter-only sync out of the stages (as grpo/builder.py: the whole model's adapter names) into inference dp2
inference_pp = Qwen2ForCausalLM(CFG_PP2, seed=SEED, max_positions=128)
add_adapters(inference_pp, SPEC, seed=4)  # other adapters until the sync
metrics["e/sync"] = placement_pp.weight_sync(stage, inference_pp, "inference", names=list(adapter_shapes(stage)))()
for name, value in adapter_state(inference_pp).items():
    arrays[f"e/synced/{name}"] = value
engine = DataParallelEngine(RolloutEngine(inference_pp, max_num_seqs=2), comm, comm.infer_dp)
metrics["e/rollout/greedy"] = [c.token_ids for c in engine.generate(prompts(), greedy)]
clock.mark("(e) pp2 sync and rollouts")
# (d) under pp2: the checkpoint (each stage its adapters and moments, the base and the PEFT folder whole by rank 0),
# a third update, the base spoilt, the checkpoint resumed, the third update again
root_pp = os.path.join(out_dir, "checkpoints_pp")
checkpoints_pp = placement_pp.checkpoints(root_pp, 2, CFG_PP2, adapters=adapter_shapes(stage))
lora_pp = LoraCheckpoint(stage, root_pp, None, placement_pp)
moments_pp = lora_pp.groups(updater_pp.state_parameters())["optimizer"]
state = dict(state, optimizer_steps=updater_pp.optimizer_steps, lora_base=lora_pp.state())
saved = checkpoints_pp.save(2, lora_pp.groups(updater_pp.state_parameters()), state, CFG_PP2.to_hf_dict(),
                            extra=lora_pp.write_adapter)
metrics["e/saved"], metrics["e/lora_base"] = saved, state["lora_base"]
snapshot("e/saved", stage, moments_pp)
clock.mark("(e) pp2 save")
metrics["e/update/straight"] = updater_pp.update(exp, lr=1e-3)
snapshot("e/straight", stage, moments_pp)
metrics["e/found"] = spoil_and_resume(stage, updater_pp, checkpoints_pp, lora_pp, CFG_PP2)
snapshot("e/restored", stage, moments_pp)
arrays["e/base_restored"] = np.concatenate([p.asnumpy().ravel() for p in base_parameters(stage)])
arrays["e/base"] = np.concatenate([p.asnumpy().ravel() for p in base_parameters(base_pp)])  # the stage's base
metrics["e/update/resumed"] = updater_pp.update(exp, lr=1e-3)
snapshot("e/resumed", stage, moments_pp)
clock.mark("(e) pp2 resume")

np.savez(os.path.join(out_dir, f"rank_{rank}.npz"), **arrays)
with open(os.path.join(out_dir, f"rank_{rank}.json"), "w") as f:
    json.dump(metrics, f)
clock.mark("done")

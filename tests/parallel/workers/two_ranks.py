"""msrun worker (2 ranks) for tests/parallel/test_msrun.py: the tensor- and data-parallel model,
update, resharding and rollouts against the one-device model computed in the same process.

    msrun --worker_num=2 ... two_ranks.py OUT_DIR SHARDS_DIR

(c) reshards with one bucket per decoder layer (or the embedding, the norm, the head), then again in one
bucket; (d) repeats the update and the resharding (in one bucket) on a Qwen3 (QK-norm, no q/k/v bias,
head_dim != H / nh); (e) scores with a reward model split like training tp2 and whole.
Writes OUT_DIR/rank_<k>.npz (arrays) and OUT_DIR/rank_<k>.json (metrics); the test compares.
The one-device references (the keys named dense, dp1) are computed on rank 0 alone: they take no collective and
are the same on every rank (same seeds, same inputs), so rank 1 compiled the same graphs again for nothing (about
20 s of CPU a job); the test compares every rank's parallel results with rank 0's references.
"""

import dataclasses
import gc
import json
import os
import sys

import numpy as np
import mindspore as ms
from mindspore import Tensor

ms.set_context(mode=ms.GRAPH_MODE)
ms.set_device("CPU")

from mindgrpo.grpo.actor import PolicyUpdater  # noqa: E402
from mindgrpo.grpo.experience import pack  # noqa: E402
from mindgrpo.grpo.ms_objective import GRPOLoss  # noqa: E402
from mindgrpo.inference.engine import RolloutEngine  # noqa: E402
from mindgrpo.inference.sampling import SamplingParams  # noqa: E402
from mindgrpo.models.checkpoint import load_state  # noqa: E402
from mindgrpo.models.convert import expected_shapes  # noqa: E402
from mindgrpo.models.qwen2 import Qwen2ForCausalLM  # noqa: E402
from mindgrpo.models.scoring import SequenceLogits, TokenLogProbs  # noqa: E402
from mindgrpo.parallel.model_pieces import load_shard  # noqa: E402
from mindgrpo.parallel.comm import init_comm  # noqa: E402
from mindgrpo.parallel.data_parallel import DataParallelEngine, DataParallelGrads  # noqa: E402
from mindgrpo.parallel.layout import ParallelLayout  # noqa: E402
from mindgrpo.parallel.reshard import Reshard, named_parameters  # noqa: E402
from mindgrpo.parallel.tp_layers import TensorParallelLayers  # noqa: E402

from parallel_cases import CFG, CFG_QWEN3, LOSS, SEED, experience_arrays, prompts, token_batch  # noqa: E402
from parallel_cases import sampling_logprobs, updater_kwargs  # noqa: E402
from worker_clock import Clock, graphs_compiled  # noqa: E402

# what the imports made stays out of the full collection MindSpore runs before each compile (tests/conftest.py)
gc.collect()
gc.freeze()

clock = Clock("two_ranks")
out_dir, shards_dir = sys.argv[1], sys.argv[2]
comm = init_comm(train=ParallelLayout(dp=1, tp=2), infer=ParallelLayout(dp=2, tp=1))
rank = comm.rank
REFERENCE = rank == 0  # this rank computes the one-device references
clock.mark("init")
arrays, metrics = {}, {}


def weights(lm, prefix):
    for name, p in named_parameters(lm).items():  # a copy: asnumpy() is a view, and later loads write in place
        arrays[f"{prefix}/{name}"] = p.asnumpy().copy()


dense = Qwen2ForCausalLM(CFG, seed=SEED, max_positions=128)
tp = Qwen2ForCausalLM(CFG, seed=SEED, max_positions=128, layers=TensorParallelLayers(comm.train_tp))

# (a) logits, token log-probs and entropy
ids, mask, pos, labels = (Tensor(a) for a in token_batch())
tp_logits = SequenceLogits(tp)
if REFERENCE:
    arrays["a/logits_dense"] = SequenceLogits(dense)(ids, mask).asnumpy()
arrays["a/logits_tp"] = tp_logits(ids, mask).asnumpy()
for key, lm in (("dense", dense), ("tp", tp))[0 if REFERENCE else 1:]:
    logp, ent = TokenLogProbs(lm)(ids, pos, labels)
    arrays[f"a/logp_{key}"], arrays[f"a/ent_{key}"] = logp.asnumpy(), ent.asnumpy()
logp, ent = TokenLogProbs(tp, chunk=5)(ids, pos, labels)  # the fused, chunked head over the vocab slice
arrays["a/logp_tp_chunked"], arrays["a/ent_tp_chunked"] = logp.asnumpy(), ent.asnumpy()

clock.mark("(a) logits, log-probs, entropy")
# sampled rollouts of the tensor-parallel model (greedy ones after the update, below)
engines = {"dense": RolloutEngine(dense), "tp": RolloutEngine(tp)}
for key, engine in engines.items():
    if key == "dense" and not REFERENCE:
        continue
    comps = engine.generate(prompts(), SamplingParams(max_tokens=8, temperature=1.0, n=2, seed=3))
    metrics[f"rollout/sampled/{key}"] = [c.token_ids for c in comps]

clock.mark("sampled rollouts")
# (b) one GRPO update: one device, training tp=2, training dp=2 (each rank a whole model)
exp = pack(*experience_arrays())
exp.sampling_logp = sampling_logprobs(exp.mask)  # the rollout engine's, for the mismatch
dp_model = Qwen2ForCausalLM(CFG, seed=SEED, max_positions=128)
dp_comm = dataclasses.replace(comm, train=ParallelLayout(dp=2, tp=1))
tp_chunked = Qwen2ForCausalLM(CFG, seed=SEED, max_positions=128, layers=TensorParallelLayers(comm.train_tp))
# packed rows under tp=2 (three rows of 32 in one micro-batch); token budgets under dp=2 (replicas split by tokens)
tp_packed = Qwen2ForCausalLM(CFG, seed=SEED, max_positions=128, layers=TensorParallelLayers(comm.train_tp))
dp_budget = Qwen2ForCausalLM(CFG, seed=SEED, max_positions=128)
for key, lm, reducer, chunk, batching in (
        ("dense", dense, None, 0, {}), ("tp", tp, None, 0, {}),
        ("dp", dp_model, DataParallelGrads(dp_comm, dp_comm.train_dp), 0, {}),
        ("tp_chunked", tp_chunked, None, 24, {}),  # (2, 32) micro-batches: chunks of 24, 24 and 16 rows
        ("tp_packed", tp_packed, None, 0, dict(max_tokens=96, packing=True)),
        ("dp_budget", dp_budget, DataParallelGrads(dp_comm, dp_comm.train_dp), 0, dict(max_tokens=64))):
    if key == "dense" and not REFERENCE:
        continue
    updater = PolicyUpdater(lm, GRPOLoss(**LOSS), grad_reducer=reducer, chunk=chunk, **updater_kwargs(**batching))
    metrics[f"update/{key}"] = updater.update(exp, lr=1e-3)
    weights(lm, f"b/{key}")
    clock.mark(f"(b) update {key}")

# (c) resharding: training (dp1, tp2) -> inference (dp2, tp1), then greedy rollouts
inference = Qwen2ForCausalLM(CFG, seed=SEED + 1, max_positions=128)  # other values until the sync
sync = Reshard(tp, inference, comm.train, comm.infer, comm, expected_shapes(CFG))
before = graphs_compiled()
metrics["reshard"] = sync()
after_first = graphs_compiled()
sync()  # warm: no compile
metrics["reshard_compiled"] = [after_first - before, graphs_compiled() - after_first]  # graphs each sync compiled
weights(inference, "c/infer")
# the same in one bucket (rl_config.weight_sync_bucket_mb): every parameter in one exchange and one assembly
one_bucket = Qwen2ForCausalLM(CFG, seed=SEED + 2, max_positions=128)
sync_one = Reshard(tp, one_bucket, comm.train, comm.infer, comm, expected_shapes(CFG), bucket_bytes=2 ** 30)
metrics["reshard_one_bucket"] = sync_one()
metrics["reshard_buckets"] = [len(sync.buckets), len(sync_one.buckets)]
weights(one_bucket, "c/infer_one_bucket")
greedy = SamplingParams(max_tokens=8, temperature=0.0, n=2)
if REFERENCE:
    metrics["rollout/greedy/dense"] = [c.token_ids for c in engines["dense"].generate(prompts(), greedy)]
dp_engine = DataParallelEngine(RolloutEngine(inference, max_num_seqs=2), comm, comm.infer_dp)
metrics["rollout/greedy/resharded"] = [c.token_ids for c in dp_engine.generate(prompts(), greedy)]
# sampled on the resharded weights: inference dp2 (each replica its share of the prompts, 2 slots) against
# one process with every prompt (the dense engine, given the same weights; its graphs are compiled already)
load_state(dense, {n: p.asnumpy() for n, p in named_parameters(inference).items()})
sampled = SamplingParams(max_tokens=8, temperature=1.0, n=2, seed=5)
for key, engine in (("dp2", dp_engine), ("dp1", engines["dense"]))[:2 if REFERENCE else 1]:
    comps = engine.generate(prompts(), sampled)
    metrics[f"rollout/sampled_resharded/{key}"] = [c.token_ids for c in comps]
    arrays[f"c/sampled_logp_{key}"] = np.concatenate([c.logprobs for c in comps])

clock.mark("(c) resharding and rollouts")
# (a) shards written by scripts/transform_checkpoint.py, loaded into the tp=2 model
load_shard(tp, os.path.join(shards_dir, f"rank_{rank}"))
arrays["a/shard_logits"] = tp_logits(ids, mask).asnumpy()

# (d) Qwen3 (QK-norm weights replicated over the tp ranks, their gradient summed over them): one update on
# one device and with training tp=2, then tp2 -> inference (dp2, tp1) resharding of the updated weights
qwen3 = {"dense": Qwen2ForCausalLM(CFG_QWEN3, seed=SEED, max_positions=128),
         "tp": Qwen2ForCausalLM(CFG_QWEN3, seed=SEED, max_positions=128, layers=TensorParallelLayers(comm.train_tp))}
for key, lm in qwen3.items():
    if key == "dense" and not REFERENCE:
        continue
    updater = PolicyUpdater(lm, GRPOLoss(**LOSS), grad_reducer=None, chunk=0, **updater_kwargs())
    metrics[f"update/qwen3_{key}"] = updater.update(exp, lr=1e-3)
    weights(lm, f"d/{key}")
inference3 = Qwen2ForCausalLM(CFG_QWEN3, seed=SEED + 1, max_positions=128)
Reshard(qwen3["tp"], inference3, comm.train, comm.infer, comm, expected_shapes(CFG_QWEN3), bucket_bytes=2 ** 30)()
weights(inference3, "d/infer")

clock.mark("(a) shards, (d) qwen3 updates and resharding")
# (e) a reward model split like training tp2 (parallel.model_pieces.reward_model_piece, the trainer's path) against the
# whole one built from the same seed: the scores of padded and packed rows
from mindgrpo.models.checkpoint import save_ms_checkpoint  # noqa: E402
from mindgrpo.models.reward_model import RewardModel, RewardScorer  # noqa: E402
from mindgrpo.parallel.model_pieces import reward_model_piece  # noqa: E402

rm_dense = RewardModel(CFG, seed=SEED)
rm_dir = os.path.join(out_dir, f"rm_rank_{rank}")  # each rank its own copy of the same weights: no shared write
os.makedirs(rm_dir, exist_ok=True)
with open(os.path.join(rm_dir, "config.json"), "w") as f:
    json.dump(CFG.to_hf_dict(), f)
save_ms_checkpoint({n: ("F32", p.asnumpy()) for n, p in rm_dense.named_parameters().items()},
                   os.path.join(rm_dir, "rm.ckpt"))
rm_tp = reward_model_piece(os.path.join(rm_dir, "rm.ckpt"), None, comm.train, comm.train_tp, "float32")
metrics["e/rm_tp_embedding_rows"] = int(rm_tp.named_parameters()["model.tok_embeddings.embedding_weight"].shape[0])
rng = np.random.default_rng(4)
sequences = [rng.integers(1, 96, n).tolist() for n in (5, 17, 9, 30, 2, 12)]
if REFERENCE:  # the whole model's scores of padded rows: the reference of both of the split one's
    arrays["e/rm_padded_dense"] = RewardScorer(rm_dense, 4)(sequences)
arrays["e/rm_padded_tp"] = RewardScorer(rm_tp, 4)(sequences)
arrays["e/rm_packed_tp"] = RewardScorer(rm_tp, 4, 64)(sequences)
clock.mark("(e) reward model tp2")
np.savez(os.path.join(out_dir, f"rank_{rank}.npz"), **arrays)
with open(os.path.join(out_dir, f"rank_{rank}.json"), "w") as f:
    json.dump(metrics, f)

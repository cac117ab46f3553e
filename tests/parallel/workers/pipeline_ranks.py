"""msrun worker (4 ranks) for tests/parallel/test_pipeline.py: pipeline stages on the inputs of
parallel_cases (the test computes the one-device model's results itself, once).

    msrun --worker_num=4 ... pipeline_ranks.py OUT_DIR

Layouts: training (dp1, tp2, pp2) and (dp2, tp1, pp2) on 4 decoder layers (stage 0 holds layers 0-1 and
the embedding, stage 1 layers 2-3, the final norm and the lm_head), and (dp1, tp1, pp4) (a layer per
stage, with 3 micro-batches: fewer than the first stage's warm-up); packed rows through (dp1, tp2, pp2);
inference (dp4, tp1), resharded into from (dp1, tp2, pp2) by a bucket per layer, from the others in one
bucket; a Qwen3's update through (dp1, tp2, pp2).
Writes OUT_DIR/rank_<k>.npz (arrays) and OUT_DIR/rank_<k>.json (metrics).
"""

import gc
import json
import os
import sys

import numpy as np
import mindspore as ms

ms.set_context(mode=ms.GRAPH_MODE)
ms.set_device("CPU")

from mindgrpo.grpo.actor import PolicyUpdater, Scorer  # noqa: E402
from mindgrpo.grpo.experience import pack  # noqa: E402
from mindgrpo.grpo.ms_objective import GRPOLoss  # noqa: E402
from mindgrpo.inference.engine import RolloutEngine  # noqa: E402
from mindgrpo.inference.sampling import SamplingParams  # noqa: E402
from mindgrpo.models.convert import expected_shapes  # noqa: E402
from mindgrpo.models.qwen2 import Qwen2ForCausalLM  # noqa: E402
from mindgrpo.parallel.comm import init_comm  # noqa: E402
from mindgrpo.parallel.data_parallel import DataParallelEngine, DataParallelGrads  # noqa: E402
from mindgrpo.parallel.layout import ParallelLayout  # noqa: E402
from mindgrpo.parallel.pipeline import Pipeline, stage_spec  # noqa: E402
from mindgrpo.parallel.reshard import Reshard, named_parameters  # noqa: E402
from mindgrpo.parallel.tp_layers import TensorParallelLayers  # noqa: E402

from parallel_cases import CFG_PP, CFG_PP_QWEN3, LOSS, SEED, experience_arrays, prompts, updater_kwargs  # noqa: E402
from parallel_cases import sampling_logprobs  # noqa: E402
from worker_clock import Clock  # noqa: E402

# what the imports made stays out of the full collection MindSpore runs before each compile (tests/conftest.py)
gc.collect()
gc.freeze()

clock = Clock("pipeline_ranks")
out_dir = sys.argv[1]
TP_PP, DP_PP, PP4 = ParallelLayout(dp=1, tp=2, pp=2), ParallelLayout(dp=2, tp=1, pp=2), ParallelLayout(pp=4)
DP4 = ParallelLayout(dp=4, tp=1)
# the reference slot creates the (dp2, pp2) groups
comm = init_comm(train=TP_PP, infer=DP4, ref=DP_PP, reshards=[(DP_PP, DP4), (PP4, DP4)])
rank = comm.rank
clock.mark("init")
arrays, metrics = {}, {}
shapes = expected_shapes(CFG_PP)


def stage_model(layout, seed=SEED, cfg=CFG_PP):
    stage = stage_spec(layout, layout.stage(rank), cfg.num_hidden_layers)
    return Qwen2ForCausalLM(cfg, seed=seed, max_positions=128, layers=TensorParallelLayers(comm.tp_group(layout)),
                            stage=stage)


def weights(lm, prefix):
    for name, p in named_parameters(lm).items():
        arrays[f"{prefix}/{name}"] = p.asnumpy().copy()


exp = pack(*experience_arrays())
exp.sampling_logp = sampling_logprobs(exp.mask)  # the rollout engine's, for the mismatch in (b)

# (a) log-probs: the pipeline's (every stage returns them); the test computes one device's
for key, layout in (("tp_pp", TP_PP), ("dp_pp", DP_PP), ("pp4", PP4)):
    lm = stage_model(layout)
    arrays[f"a/logp_{key}"] = Scorer(lm, 3, pipeline=Pipeline(comm, layout))(exp)
    weights(lm, f"a/initial_{key}")
# packed rows through (dp1, tp2, pp2): three rows of 32 in two micro-batches of (2, 32), one row empty
PACKED = dict(max_tokens=64, packing=True)
arrays["a/logp_tp_pp_packed"] = Scorer(stage_model(TP_PP), 3, pipeline=Pipeline(comm, TP_PP), **PACKED)(exp)

clock.mark("(a) log-probs of four layouts")
# (b) one GRPO update: micro-batches of 2 (four of them through the pipeline), clipping active
policies = {}
for key, layout, reducer, micro, batching in (
        ("tp_pp", TP_PP, None, 2, {}), ("dp_pp", DP_PP, DataParallelGrads(comm, comm.dp_group(DP_PP)), 2, {}),
        ("pp4", PP4, None, 3, {}), ("tp_pp_packed", TP_PP, None, 2, PACKED)):
    lm = stage_model(layout)
    updater = PolicyUpdater(lm, GRPOLoss(**LOSS), grad_reducer=reducer,
                            pipeline=Pipeline(comm, layout), **updater_kwargs(micro, **batching))
    metrics[f"update/{key}"] = updater.update(exp, lr=1e-3)
    weights(lm, f"b/{key}")
    policies[key] = lm
    clock.mark(f"(b) update {key}")

# a Qwen3 (QK-norm weights replicated over the tp pieces, in their layer's stage) through (dp1, tp2, pp2)
lm = stage_model(TP_PP, cfg=CFG_PP_QWEN3)
updater = PolicyUpdater(lm, GRPOLoss(**LOSS), pipeline=Pipeline(comm, TP_PP), **updater_kwargs())
metrics["update/qwen3_tp_pp"] = updater.update(exp, lr=1e-3)
weights(lm, "b/qwen3_tp_pp")

clock.mark("(b) update qwen3_tp_pp")
# (c) resharding the updated stages into inference layouts, and greedy rollouts after one of them
greedy = SamplingParams(max_tokens=8, temperature=0.0, n=2)
for key, src_layout, dst_layout in (("tp_pp_to_dp4", TP_PP, DP4), ("dp_pp_to_dp4", DP_PP, DP4),
                                    ("pp4_to_dp4", PP4, DP4)):
    dst = Qwen2ForCausalLM(CFG_PP, seed=SEED + 1, max_positions=128,  # other values until the sync
                           layers=TensorParallelLayers(comm.tp_group(dst_layout)))
    # tp_pp_to_dp4 a bucket per layer; the others in one bucket (rl_config.weight_sync_bucket_mb, the trainer's
    # default for a model this small): 3 graphs to compile, not 3 per bucket
    sync = Reshard(policies[key.split("_to_")[0]], dst, src_layout, dst_layout, comm, shapes,
                   bucket_bytes=0 if key == "tp_pp_to_dp4" else 2 ** 30)
    metrics[f"reshard/{key}"] = sync()
    weights(dst, f"c/{key}")
    if key == "tp_pp_to_dp4":  # the others' weights are checked bit for bit; a rollout compiles for ~25 s
        engine = DataParallelEngine(RolloutEngine(dst), comm, comm.dp_group(dst_layout))
        metrics[f"rollout/greedy/{key}"] = [c.token_ids for c in engine.generate(prompts(), greedy)]
    clock.mark(f"(c) {key}")

np.savez(os.path.join(out_dir, f"rank_{rank}.npz"), **arrays)
with open(os.path.join(out_dir, f"rank_{rank}.json"), "w") as f:
    json.dump(metrics, f)

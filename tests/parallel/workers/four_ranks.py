"""msrun worker (4 ranks) for tests/parallel/test_pipeline.py: resharding from the training layout
(dp2, tp2) to (dp4, tp1) and to (dp1, tp4), and the tp=4 model's logits.

    msrun --worker_num=4 ... four_ranks.py OUT_DIR

Writes OUT_DIR/rank_<k>.npz (weights after each resharding, logits) and OUT_DIR/rank_<k>.json.
"""

import gc
import json
import os
import sys

import numpy as np
import mindspore as ms
from mindspore import Tensor

ms.set_context(mode=ms.GRAPH_MODE)  # the CPU device is the default; several.py runs this after a script that set it

from mindgrpo.models.convert import expected_shapes  # noqa: E402
from mindgrpo.models.qwen2 import Qwen2ForCausalLM  # noqa: E402
from mindgrpo.models.scoring import SequenceLogits  # noqa: E402
from mindgrpo.parallel.comm import init_comm  # noqa: E402
from mindgrpo.parallel.layout import ParallelLayout  # noqa: E402
from mindgrpo.parallel.reshard import Reshard, named_parameters  # noqa: E402
from mindgrpo.parallel.tp_layers import TensorParallelLayers  # noqa: E402

from parallel_cases import CFG4, SEED, token_batch  # noqa: E402
from worker_clock import Clock  # noqa: E402

# what the imports made stays out of the full collection MindSpore runs before each compile (tests/conftest.py)
gc.collect()
gc.freeze()

clock = Clock("four_ranks")
out_dir = sys.argv[1]
train, infer, tp4 = ParallelLayout(dp=2, tp=2), ParallelLayout(dp=4, tp=1), ParallelLayout(dp=1, tp=4)
comm = init_comm(train=train, infer=infer)
clock.mark("init")
arrays, metrics = {}, {}
shapes = expected_shapes(CFG4)

policy = Qwen2ForCausalLM(CFG4, seed=SEED, max_positions=128, layers=TensorParallelLayers(comm.train_tp))
for name, p in named_parameters(policy).items():
    arrays[f"policy/{name}"] = p.asnumpy().copy()
for key, layout in (("dp4", infer), ("tp4", tp4)):
    layers = TensorParallelLayers(comm.tp_group(layout))
    dst = Qwen2ForCausalLM(CFG4, seed=SEED + 1, max_positions=128, layers=layers)  # other values until the sync
    metrics[key] = Reshard(policy, dst, train, layout, comm, shapes)()
    for name, p in named_parameters(dst).items():
        arrays[f"{key}/{name}"] = p.asnumpy().copy()
    clock.mark(f"reshard to {key}")
ids, mask, _, _ = token_batch()
arrays["logits_tp4"] = SequenceLogits(dst)(Tensor(ids), Tensor(mask)).asnumpy()
clock.mark("tp4 logits")

# a reward model in layouts of its own (parallel/replica_scores.py): four whole replicas (dp4) and two tp2 replicas
# (dp2 x tp2), each scoring its share of the sequences, every rank getting every score
from mindgrpo.models.checkpoint import save_ms_checkpoint  # noqa: E402
from mindgrpo.models.reward_model import RewardModel, RewardScorer  # noqa: E402
from mindgrpo.parallel.model_pieces import reward_model_piece  # noqa: E402
from mindgrpo.parallel.replica_scores import ReplicaScores, replica_of  # noqa: E402

from parallel_cases import rm_sequences  # noqa: E402

rm_dir = os.path.join(out_dir, f"rm_rank_{comm.rank}")  # each rank its own copy of the same weights: no shared write
os.makedirs(rm_dir, exist_ok=True)
with open(os.path.join(rm_dir, "config.json"), "w") as f:
    json.dump(CFG4.to_hf_dict(), f)
save_ms_checkpoint({n: ("F32", p.asnumpy()) for n, p in RewardModel(CFG4, seed=SEED).named_parameters().items()},
                   os.path.join(rm_dir, "rm.ckpt"))
for key, layout in (("rm_dp4", infer), ("rm_dp2tp2", train)):
    piece = reward_model_piece(os.path.join(rm_dir, "rm.ckpt"), None, layout, comm.tp_group(layout), "float32")
    scorer = ReplicaScores(RewardScorer(piece, 4), comm, replica_of(layout, comm.rank))
    arrays[key] = scorer(rm_sequences())
    metrics[f"{key}/share"] = scorer.share(rm_sequences()).tolist()
    metrics[f"{key}/replica"] = [scorer.replica.index, scorer.replica.count]
clock.mark("reward model replicas")

np.savez(os.path.join(out_dir, f"rank_{comm.rank}.npz"), **arrays)
with open(os.path.join(out_dir, f"rank_{comm.rank}.json"), "w") as f:
    json.dump(metrics, f)

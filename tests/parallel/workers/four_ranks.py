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
    arrays[f"policy/{name}"] = p.asnumpy()
for key, layout in (("dp4", infer), ("tp4", tp4)):
    layers = TensorParallelLayers(comm.tp_group(layout))
    dst = Qwen2ForCausalLM(CFG4, seed=SEED + 1, max_positions=128, layers=layers)  # other values until the sync
    metrics[key] = Reshard(policy, dst, train, layout, comm, shapes)()
    for name, p in named_parameters(dst).items():
        arrays[f"{key}/{name}"] = p.asnumpy()
    clock.mark(f"reshard to {key}")
ids, mask, _, _ = token_batch()
arrays["logits_tp4"] = SequenceLogits(dst)(Tensor(ids), Tensor(mask)).asnumpy()
clock.mark("tp4 logits")

np.savez(os.path.join(out_dir, f"rank_{comm.rank}.npz"), **arrays)
with open(os.path.join(out_dir, f"rank_{comm.rank}.json"), "w") as f:
    json.dump(metrics, f)

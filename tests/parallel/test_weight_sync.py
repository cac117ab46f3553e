"""mindgrpo/parallel/weight_sync.py (one device): the policy's weights reach a differently initialised
copy bit for bit, whatever the buckets: one per decoder layer, a few layers each, or the whole model in
one; a second sync after the policy changed copies the new values through the same graphs."""

import numpy as np

from mindgrpo.models.checkpoint import load_state, model_state
from mindgrpo.models.qwen2 import Qwen2ForCausalLM
from mindgrpo.parallel.weight_sync import WeightSync
from parallel_cases import CFG_PP, SEED


def copied(model):
    """The model's weights, copied: on the CPU `asnumpy` can share the parameter's memory."""
    return {n: v.copy() for n, v in model_state(model).items()}


def test_buckets_by_bytes_copy_the_same_bits_as_one_bucket_per_layer():
    initial = model_state(Qwen2ForCausalLM(CFG_PP, seed=SEED))  # four layers, untied: 7 buckets of one layer
    other = model_state(Qwen2ForCausalLM(CFG_PP, seed=SEED + 1))  # (or the embedding, the norm, the head)
    moved = model_state(Qwen2ForCausalLM(CFG_PP, seed=SEED + 2))  # the policy's values after an "update"
    assert sum(not np.array_equal(initial[n], other[n]) for n in initial) >= 4 * 7 + 2  # the sync has work
    layer = sum(4 * v.size for n, v in initial.items() if n.startswith("model.layers.0."))
    total = sum(4 * v.size for v in initial.values())
    for budget, buckets in ((0, 7), (2 * layer, 3), (total, 1)):  # 2 layers: emb + 1, 2, 1 + norm + head
        src, dst = Qwen2ForCausalLM(CFG_PP, seed=SEED), Qwen2ForCausalLM(CFG_PP, seed=SEED + 1)
        sync = WeightSync(src, dst, bucket_bytes=budget)
        assert len(sync.buckets) == buckets and sync.total_bytes == total, budget
        assert (sync.max_bucket_bytes == total) == (buckets == 1)
        sync()
        first = copied(dst)
        load_state(src, moved)
        sync()
        second = copied(dst)
        for n in initial:
            assert first[n].tobytes() == initial[n].tobytes(), (budget, n)
            assert second[n].tobytes() == moved[n].tobytes(), (budget, n)

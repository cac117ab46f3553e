"""mindgrpo/parallel/layout.py: ranks, the split table, slicing by hand, round trips, clear errors."""

import re

import numpy as np
import pytest

from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.convert import expected_shapes
from mindgrpo.parallel.layout import LayoutError, ParallelLayout

SMALL = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2)


def full_state(cfg, seed=0):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in expected_shapes(cfg).items()}


def test_world_and_rank_coordinates():
    lay = ParallelLayout(dp=2, tp=4)
    assert lay.world_size == 8
    # tp groups are consecutive ranks
    assert [lay.coords(r) for r in range(8)] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (1, 3)]
    assert [lay.rank(*lay.coords(r)) for r in range(8)] == list(range(8))
    assert lay.tp_group(5) == [4, 5, 6, 7]
    assert lay.dp_group(5) == [1, 5]
    with pytest.raises(LayoutError, match="rank 8 is outside the world of 8 ranks"):
        lay.coords(8)


def test_pipeline_stages_are_the_outer_axis():
    """MindSpore's order: stage s holds ranks [s*dp*tp, (s+1)*dp*tp), (dp, tp) inside a stage as without stages."""
    lay = ParallelLayout(dp=2, tp=2, pp=2)
    assert lay.world_size == 8 and lay.stage_size == 4
    assert [lay.stage(r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [lay.coords(r) for r in range(4, 8)] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [lay.rank(*lay.coords(r), lay.stage(r)) for r in range(8)] == list(range(8))
    assert lay.tp_group(6) == [6, 7] and lay.dp_group(6) == [4, 6]
    assert lay.pp_group(6) == [2, 6] and lay.replica_group(6) == [2, 3, 6, 7]


def test_stage_layers_and_parameter_stages():
    lay = ParallelLayout(pp=3)
    assert [list(lay.stage_layers(s, 7)) for s in range(3)] == [[0, 1, 2], [3, 4], [5, 6]]
    assert lay.param_stage("model.tok_embeddings.embedding_weight", 7) == 0
    assert lay.param_stage("model.layers.3.attention.wq.weight", 7) == 1
    assert lay.param_stage("adam_v.model.layers.6.ffn_norm.weight", 7) == 2
    assert lay.param_stage("model.norm_out.weight", 7) == lay.param_stage("lm_head.weight", 7) == 2
    cfg = Qwen2Config(**SMALL)
    names = list(expected_shapes(cfg))
    two = ParallelLayout(pp=2)
    first, last = two.stage_names(names, 0, 2), two.stage_names(names, 1, 2)
    assert sorted(first + last) == sorted(names) and not set(first) & set(last)
    assert "model.norm_out.weight" in last and "model.layers.1.ffn_norm.weight" in last
    assert first == [n for n in names if n.startswith(("model.tok_embeddings.", "model.layers.0."))]
    with pytest.raises(LayoutError, match="pipeline_stage = 3 is more than the 2 decoder layers"):
        lay.stage_layers(0, 2)
    # Qwen3's QK-norm weights go with their layer's stage and are replicated over tensor-parallel ranks
    qwen3 = list(expected_shapes(Qwen2Config(**{**SMALL, "model_type": "qwen3"})))
    assert "model.layers.0.attention.q_norm.weight" in two.stage_names(qwen3, 0, 2)
    assert "adam_m.model.layers.1.attention.k_norm.weight" in two.stage_names(["adam_m." + n for n in qwen3], 1, 2)
    assert two.param_split("model.layers.1.attention.k_norm.weight") is None


def test_pipeline_stages_need_untied_embeddings_and_enough_layers():
    ParallelLayout(pp=2).check_divisible(Qwen2Config(**SMALL))
    with pytest.raises(LayoutError, match="pipeline_stage = 2 needs tie_word_embeddings = false"):
        ParallelLayout(pp=2).check_divisible(Qwen2Config(**{**SMALL, "tie_word_embeddings": True}))
    with pytest.raises(LayoutError, match="pipeline_stage = 4 is more than num_hidden_layers = 2"):
        ParallelLayout(pp=4).check_divisible(Qwen2Config(**SMALL))


def test_check_world_message():
    ParallelLayout(2, 2).check_world(4)
    with pytest.raises(LayoutError) as e:
        ParallelLayout(2, 2).check_world(8)
    assert str(e.value) == ("actor_config.parallel_config: data_parallel*model_parallel*pipeline_stage = 4, "
                            "but the world size is 8")


@pytest.mark.parametrize("kwargs, message", [
    (dict(dp=0, tp=1), "data_parallel must be an integer >= 1, got 0"),
    (dict(dp=1, tp=-2), "model_parallel must be an integer >= 1, got -2"),
    (dict(dp=1, tp=1.5), "model_parallel must be an integer >= 1, got 1.5"),
    (dict(dp=1, tp=1, pp=0), "pipeline_stage must be an integer >= 1, got 0"),
])
def test_invalid_layouts(kwargs, message):
    with pytest.raises(LayoutError, match=re.escape(message)):
        ParallelLayout(**kwargs)


def test_from_parallel_config():
    from mindgrpo.config.sections import ParallelConfig

    assert ParallelLayout.from_config(ParallelConfig(data_parallel=2, model_parallel=4)) == ParallelLayout(2, 4)


def test_split_table():
    split = ParallelLayout.param_split
    expect = {
        "model.tok_embeddings.embedding_weight": 0, "lm_head.weight": 0, "model.norm_out.weight": None,
        "model.layers.3.attention_norm.weight": None, "model.layers.3.ffn_norm.weight": None,
        "model.layers.3.attention.wq.weight": 0, "model.layers.3.attention.wq.bias": 0,
        "model.layers.3.attention.wk.weight": 0, "model.layers.3.attention.wk.bias": 0,
        "model.layers.3.attention.wv.weight": 0, "model.layers.3.attention.wv.bias": 0,
        "model.layers.3.attention.wo.weight": 1, "model.layers.12.feed_forward.w1.weight": 0,
        "model.layers.12.feed_forward.w3.weight": 0, "model.layers.12.feed_forward.w2.weight": 1,
        "adam_m.model.layers.0.attention.wo.weight": 1, "adam_v.lm_head.weight": 0,
    }
    assert {name: split(name) for name in expect} == expect
    with pytest.raises(LayoutError, match="'model.layers.0.attention.wo.bias' has no tensor-parallel rule"):
        split("model.layers.0.attention.wo.bias")


def test_shard_by_hand():
    lay = ParallelLayout(dp=1, tp=2)
    w = np.arange(12).reshape(4, 3)  # (out, in)
    np.testing.assert_array_equal(lay.shard("model.layers.0.attention.wq.weight", w, 1), [[6, 7, 8], [9, 10, 11]])
    w2 = np.arange(8).reshape(2, 4)
    np.testing.assert_array_equal(lay.shard("model.layers.0.feed_forward.w2.weight", w2, 0), [[0, 1], [4, 5]])
    np.testing.assert_array_equal(lay.shard("model.layers.0.attention.wk.bias", np.arange(4), 1), [2, 3])
    norm = np.arange(3)
    assert lay.shard("model.norm_out.weight", norm, 1) is norm
    assert lay.shard_shape("model.layers.0.attention.wo.weight", (32, 16)) == (32, 8)


@pytest.mark.parametrize("tp, kv_heads", [(1, 2), (2, 2), (4, 4)])
def test_shard_then_merge_is_bit_exact(tp, kv_heads):
    cfg = Qwen2Config(**{**SMALL, "num_key_value_heads": kv_heads})
    lay = ParallelLayout(dp=2, tp=tp)
    lay.check_divisible(cfg)
    for name, full in full_state(cfg).items():
        shards = [lay.shard(name, full, t) for t in range(tp)]
        for s in shards:
            assert s.shape == lay.shard_shape(name, full.shape)
        back = lay.merge(name, shards)
        assert back.dtype == full.dtype and back.tobytes() == full.tobytes()
        if lay.param_split(name) is not None and tp > 1:
            assert not np.array_equal(shards[0], shards[1])  # distinct pieces, not copies


@pytest.mark.parametrize("overrides, tp, message", [
    (dict(), 4, "model_parallel = 4 must divide num_key_value_heads = 2"),
    (dict(num_attention_heads=2, num_key_value_heads=2, hidden_size=32), 4,
     "model_parallel = 4 must divide num_attention_heads = 2"),
    (dict(num_key_value_heads=4, intermediate_size=66), 4,
     "'model.layers.0.feed_forward.w1.weight' of shape [66, 32]: dim 0"),
    (dict(vocab_size=129), 2, "'model.tok_embeddings.embedding_weight' of shape [129, 32]: dim 0"),
])
def test_check_divisible_names_the_problem(overrides, tp, message):
    cfg = Qwen2Config(**{**SMALL, **overrides})
    with pytest.raises(LayoutError) as e:
        ParallelLayout(1, tp).check_divisible(cfg)
    assert message in str(e.value)


def test_merge_rejects_wrong_shards():
    lay = ParallelLayout(1, 2)
    with pytest.raises(LayoutError, match="got 1 shards for model_parallel = 2"):
        lay.merge("lm_head.weight", [np.zeros((2, 2))])
    with pytest.raises(LayoutError, match="shards have different shapes"):
        lay.merge("lm_head.weight", [np.zeros((2, 2)), np.zeros((3, 2))])


def test_optimizer_shard_parts():
    # dim 0 of this rank's piece must divide by dp; with tp > 1 only tp-split parameters are split
    q, norm, o = "model.layers.0.attention.wq.weight", "model.layers.0.attention_norm.weight", \
        "model.layers.0.attention.wo.weight"
    assert ParallelLayout(dp=2, tp=1).opt_shard_parts(q, (32, 32)) == 2
    assert ParallelLayout(dp=2, tp=1).opt_shard_parts(norm, (32,)) == 2
    assert ParallelLayout(dp=2, tp=2).opt_shard_parts(q, (32, 32)) == 2  # piece (16, 32)
    assert ParallelLayout(dp=2, tp=2).opt_shard_parts(o, (32, 32)) == 2  # piece (32, 16)
    assert ParallelLayout(dp=2, tp=2).opt_shard_parts(norm, (32,)) == 1  # replicated over tp
    assert ParallelLayout(dp=4, tp=2).opt_shard_parts(q, (12, 32)) == 1  # piece (6, 32): 6 % 4
    assert ParallelLayout(dp=1, tp=2).opt_shard_parts(q, (32, 32)) == 1

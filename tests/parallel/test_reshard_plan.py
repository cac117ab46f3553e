"""mindgrpo/parallel/reshard.py's plan, in numpy: for every pair of layouts of worlds up to 8 ranks,
executing every rank's plan gives each destination rank exactly ParallelLayout.shard of the full
weights; bytes received never fall below the minimum, and meet it where the plan says so."""

import itertools

import numpy as np
import pytest

from mindgrpo.parallel.layout import LayoutError, ParallelLayout
from mindgrpo.parallel.reshard import apply_plans, layer_buckets, plan_parameter

SHAPES = {"model.tok_embeddings.embedding_weight": (48, 8), "model.layers.0.attention.wq.weight": (24, 8),
          "model.layers.0.attention.wq.bias": (24,), "model.layers.0.attention.wo.weight": (8, 24),
          "model.layers.0.attention_norm.weight": (8,), "model.layers.0.feed_forward.w2.weight": (8, 48)}


def layouts(world):
    return [ParallelLayout(world // tp, tp) for tp in range(1, world + 1) if world % tp == 0 and 24 % tp == 0]


def run_all(src, dst, full):
    """Every source group's plans executed; returns (pieces by rank, plans by rank)."""
    names = list(SHAPES)
    out, plans_of = {}, {}
    for d in range(src.dp):
        group = src.tp_group(src.rank(d, 0))
        plans = [[plan_parameter(n, SHAPES[n], 4, src, dst, r) for n in names] for r in group]
        pieces = [[src.shard(n, full[n], src.coords(r)[1]) for n in names] for r in group]
        for r, row, p in zip(group, apply_plans(plans, pieces), plans):
            out[r], plans_of[r] = dict(zip(names, row)), p
    return out, plans_of


CASES = [(w, a, b) for w in (1, 2, 3, 4, 6, 8) for a, b in itertools.product(layouts(w), layouts(w))]


@pytest.mark.parametrize("world, src, dst", CASES, ids=[f"{a.dp}x{a.tp}->{b.dp}x{b.tp}" for _, a, b in CASES])
def test_every_rank_gets_its_destination_piece(world, src, dst):
    rng = np.random.default_rng(world)
    full = {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}
    out, plans = run_all(src, dst, full)
    assert sorted(out) == list(range(world))
    for r in range(world):
        for name in SHAPES:
            assert np.array_equal(out[r][name], dst.shard(name, full[name], dst.coords(r)[1])), (r, name)
        for p in plans[r]:
            assert p.received >= p.minimum
            if src.tp == dst.tp and src.dp == dst.dp:
                assert p.is_copy and p.received == 0
            if dst.tp == 1 or dst.tp % src.tp == 0 and src.tp == 1:  # a whole copy, or a piece of what is held
                assert p.received == p.minimum


def test_hand_computed_tp2_to_tp4_plan():
    """(dp2, tp2) -> (dp1, tp4) of wq (24, 8): rank 1 holds rows 12..23 and needs rows 6..11, which
    rank 0 holds; rank 0 holds what it needs (rows 0..5) and sends rows 6..11."""
    src, dst = ParallelLayout(2, 2), ParallelLayout(1, 4)
    p0, p1 = (plan_parameter("model.layers.0.attention.wq.weight", (24, 8), 4, src, dst, r) for r in (0, 1))
    assert p0.slot == p1.slot == 6
    assert p0.send == ((6, 12),)  # rows 6..11 of its piece (rows 0..11)
    assert p1.send == ((0, 6),)  # nothing anyone lacks: padding of the same size
    assert p0.take == ((-1, 0, 6),) and p1.take == ((0, 0, 6),)  # its own rows 0..5; rank 0's slot
    assert (p0.minimum, p1.minimum) == (0, 6 * 8 * 4)
    assert p1.received == 6 * 8 * 4 and p0.received == 6 * 8 * 4  # rank 0 gets rank 1's padding
    norm = plan_parameter("model.layers.0.attention_norm.weight", (8,), 4, src, dst, 1)
    assert norm.dim is None and norm.is_copy and norm.received == 0
    wo = plan_parameter("model.layers.0.attention.wo.weight", (8, 24), 4, ParallelLayout(1, 2), ParallelLayout(2, 1), 1)
    assert wo.dim == 1 and wo.send == ((0, 12),) and wo.take == ((0, 0, 12), (-1, 0, 12))  # columns: 0's, then own


def test_layouts_of_different_worlds_or_unsplittable_shapes_fail():
    with pytest.raises(ValueError, match="one world"):
        plan_parameter("model.layers.0.attention.wq.weight", (24, 8), 4, ParallelLayout(1, 2), ParallelLayout(1, 4), 0)
    with pytest.raises(LayoutError, match="cannot be split"):
        plan_parameter("model.layers.0.attention.wq.weight", (6, 8), 4, ParallelLayout(1, 4), ParallelLayout(4, 1), 0)


def test_layer_buckets():
    assert layer_buckets(list(SHAPES)) == [
        ["model.tok_embeddings.embedding_weight"],
        ["model.layers.0.attention.wq.weight", "model.layers.0.attention.wq.bias", "model.layers.0.attention.wo.weight",
         "model.layers.0.attention_norm.weight", "model.layers.0.feed_forward.w2.weight"]]

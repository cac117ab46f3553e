"""mindgrpo/parallel/reshard_plan.py, in numpy: for every pair of layouts of worlds up to 8 ranks
(pipeline stages included), executing every rank's plan gives each destination rank exactly
ParallelLayout.shard of the full weights its stage holds; bytes received never fall below the
minimum, and meet it where the plan says so."""

import itertools

import numpy as np
import pytest

from mindgrpo.parallel.layout import LayoutError, ParallelLayout
from mindgrpo.parallel.reshard_plan import (apply_plans, exchange_bytes, layer_buckets, merge_buckets, plan_parameter,
                                            sync_buckets)

LAYER = {"attention.wq.weight": (24, 8), "attention.wq.bias": (24,), "attention.wo.weight": (8, 24),
         "attention_norm.weight": (8,), "feed_forward.w2.weight": (8, 48)}
SHAPES = {"model.tok_embeddings.embedding_weight": (48, 8),
          **{f"model.layers.{i}.{k}": s for i in range(2) for k, s in LAYER.items()},
          "model.norm_out.weight": (8,), "lm_head.weight": (48, 8)}
LAYERS = 2


def layouts(world):
    return [ParallelLayout(world // (tp * pp), tp, pp) for pp in (1, 2) for tp in range(1, world + 1)
            if world % (tp * pp) == 0 and 24 % tp == 0]


def held(layout, rank, name):
    return layout.param_stage(name, LAYERS) == layout.stage(rank)


def run_all(src, dst, full):
    """Every source replica group's plans executed; returns (pieces by rank, plans by rank)."""
    names = list(SHAPES)
    out, plans_of = {}, {}
    for d in range(src.dp):
        group = src.replica_group(src.rank(d, 0))
        plans = {r: [plan_parameter(n, SHAPES[n], 4, src, dst, r, LAYERS) for n in names] for r in group}
        for r in group:  # every plan's exchange group lies inside the replica and knows its members alike
            for i, p in enumerate(plans[r]):
                assert r in p.group and set(p.group) <= set(group)
                assert all((plans[m][i].group, plans[m][i].mode, plans[m][i].gives) == (p.group, p.mode, p.gives)
                           for m in p.group)
                assert p.mode == "gather" or all(plans[m][i].width == p.width for m in p.group)
        pieces = {r: [src.shard(n, full[n], src.coords(r)[1]) if held(src, r, n) else None for n in names]
                  for r in group}
        for r, row in apply_plans(plans, pieces, [SHAPES[n] for n in names]).items():
            out[r], plans_of[r] = dict(zip(names, row)), plans[r]
    return out, plans_of


CASES = [(w, a, b) for w in (1, 2, 3, 4, 6, 8) for a, b in itertools.product(layouts(w), layouts(w))]


@pytest.mark.parametrize("world, src, dst", CASES,
                         ids=[f"{a.dp}x{a.tp}x{a.pp}->{b.dp}x{b.tp}x{b.pp}" for _, a, b in CASES])
def test_every_rank_gets_its_destination_piece(world, src, dst):
    rng = np.random.default_rng(world)
    full = {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}
    out, plans = run_all(src, dst, full)
    assert sorted(out) == list(range(world))
    for r in range(world):
        for name in SHAPES:
            if held(dst, r, name):
                assert np.array_equal(out[r][name], dst.shard(name, full[name], dst.coords(r)[1])), (r, name)
            else:
                assert out[r][name] is None, (r, name)
        for p in plans[r]:
            assert p.received >= p.minimum
            assert p.held == held(src, r, p.name) and p.needed == held(dst, r, p.name)
            if src == dst:
                assert p.is_copy == p.held and p.received == 0
            if src.pp == dst.pp == 1 and (dst.tp == 1 or dst.tp % src.tp == 0 and src.tp == 1):
                assert p.received == p.minimum  # a whole copy, or a piece of what is held
            if dst.pp == 1 and dst.tp == src.tp and dst.dp == src.dp * src.pp and p.split:
                # stages to tensor-parallel pieces: pair by pair (the giver gets the taker's padding back)
                assert len(p.group) <= 2 and (p.minimum == 0 or p.received == p.minimum)


def test_pipeline_stages_to_tensor_parallel_pieces_move_the_minimum():
    """The 7B layouts in small: train (tp4, pp2) -> infer (dp2, tp4). Rank t of stage 0 and rank 4+t of stage 1
    swap their stage's piece t: each split parameter moves between two ranks only, and the taker receives the
    least the layouts need (`exchange_bytes`: how buckets pair the stages so that the giver's row is not padding)."""
    src, dst = ParallelLayout(1, 4, 2), ParallelLayout(2, 4, 1)
    for r in range(8):
        for name in ("model.layers.0.attention.wq.weight", "model.layers.1.feed_forward.w2.weight", "lm_head.weight"):
            p = plan_parameter(name, SHAPES[name], 4, src, dst, r, LAYERS)
            taker = src.stage(r) != src.param_stage(name, LAYERS)
            assert p.group == tuple(sorted((r % 4, r % 4 + 4)))
            assert p.minimum == p.received and (p.minimum > 0) == taker
        norm = plan_parameter("model.layers.1.ffn_norm.weight", (8,), 4, src, dst, r, LAYERS)
        # held by every stage-1 rank; its tp 0 (rank 4) gives it to stage 0, the other holders stay out
        assert norm.group == ((0, 1, 2, 3, 4) if r <= 4 else (r,))


def test_hand_computed_tp2_to_tp4_plan():
    """(dp2, tp2) -> (dp1, tp4) of wq (24, 8): rank 1 holds rows 12..23 and needs rows 6..11, which
    rank 0 holds; rank 0 holds what it needs (rows 0..5) and gives rows 6..11."""
    src, dst = ParallelLayout(2, 2), ParallelLayout(1, 4)
    p0, p1 = (plan_parameter("model.layers.0.attention.wq.weight", (24, 8), 4, src, dst, r) for r in (0, 1))
    assert p0.group == p1.group == (0, 1) and p0.mode == p1.mode == "gather"  # 2 slots of 1 atom <= 2 x 1 atom
    assert p0.gives == p1.gives == (6, 0) and (p0.width, p1.width) == (6, 0)
    assert p0.give == ((0, 6, 6),) and p0.fill() == ((6, 6),)  # rows 6..11 of its piece (rows 0..11)
    assert p1.give == () and p1.fill() == ()  # nothing anyone lacks
    assert p0.take == ((-1, 0, 6),) and p1.take == ((0, 0, 6),)  # its own rows 0..5; rank 0's block
    assert (p0.minimum, p1.minimum) == (0, 6 * 8 * 4) and (p0.received, p1.received) == (0, 6 * 8 * 4)
    # alone in a bucket, the AllGather pads rank 1's empty row: rank 0 receives as many bytes of padding
    assert exchange_bytes([p0], [(24, 8)]) == exchange_bytes([p1], [(24, 8)]) == 6 * 8 * 4
    norm = plan_parameter("model.layers.0.attention_norm.weight", (8,), 4, src, dst, 1)
    assert not norm.split and norm.is_copy and norm.received == 0 and not norm.exchanged
    wo = plan_parameter("model.layers.0.attention.wo.weight", (8, 24), 4, ParallelLayout(1, 2), ParallelLayout(2, 1), 1)
    assert wo.dim == 1 and wo.mode == "gather" and wo.give == ((0, 0, 12),)
    assert wo.take == ((0, 0, 12), (-1, 0, 12))  # columns: rank 0's slot, then its own


def test_hand_computed_pipeline_to_one_stage_plan():
    """(tp1, pp2) -> (dp2, tp1), 2 layers: rank 1 (stage 1) holds layer 1 and the head, rank 0
    layer 0 and the embedding; each gives the other what it holds, whole, and takes the rest."""
    src, dst = ParallelLayout(1, 1, 2), ParallelLayout(2, 1, 1)
    w0 = [plan_parameter("model.layers.0.attention.wq.weight", (24, 8), 4, src, dst, r, 2) for r in (0, 1)]
    assert [p.held for p in w0] == [True, False] and [p.needed for p in w0] == [True, True]
    assert w0[0].mode == "gather" and w0[0].give == ((0, 0, 24),) and w0[0].is_copy
    assert w0[1].give == () and w0[1].take == ((0, 0, 24),) and w0[1].gives == (24, 0)
    assert w0[1].minimum == w0[1].received == 24 * 8 * 4
    norm = plan_parameter("model.norm_out.weight", (8,), 4, src, dst, 0, 2)  # replicated: moves whole
    assert not norm.split and not norm.held and norm.take == ((1, 0, 8),) and norm.minimum == 32
    with pytest.raises(ValueError, match="needs num_layers"):
        plan_parameter("model.norm_out.weight", (8,), 4, src, dst, 0)


def test_few_givers_to_many_takers_sum_one_buffer():
    """(tp2, pp2) -> (dp4, tp1): layer 1's wq is held by ranks 2 and 3 (rows 0..11, 12..23); ranks 0 and 1 lack
    all of it, ranks 2 and 3 half. Four slots of one atom cost as much as summing a buffer of two: gather. With
    four stages of one layer each, (tp1, pp4) -> (dp4, tp1), one rank gives layer 3 to three: four slots of
    one atom against a buffer of one, so the holder fills in a (24, 8) buffer that the four sum."""
    src, dst = ParallelLayout(1, 2, 2), ParallelLayout(4, 1, 1)
    plans = [plan_parameter("model.layers.1.attention.wq.weight", (24, 8), 4, src, dst, r, 2) for r in range(4)]
    assert {p.mode for p in plans} == {"gather"} and {p.group for p in plans} == {(0, 1, 2, 3)}
    assert [p.give for p in plans] == [(), (), ((0, 0, 12),), ((0, 0, 12),)] and plans[0].gives == (0, 0, 12, 12)
    assert plans[0].take == ((2, 0, 12), (3, 0, 12)) and plans[2].take == ((-1, 0, 12), (3, 0, 12))
    src = ParallelLayout(1, 1, 4)
    plans = [plan_parameter("model.layers.3.attention.wq.weight", (24, 8), 4, src, dst, r, 4) for r in range(4)]
    assert {p.mode for p in plans} == {"sum"} and {p.group for p in plans} == {(0, 1, 2, 3)}
    assert [p.give for p in plans] == [(), (), (), ((0, 0, 24),)] and plans[0].fill() == ((-1, 24),)
    assert [p.take for p in plans] == [((0, 0, 24),)] * 3 + [((-1, 0, 24),)]
    assert all(p.received == p.width * 8 * 4 == 24 * 8 * 4 for p in plans)
    assert plans[0].minimum == 24 * 8 * 4 and plans[3].minimum == 0


def test_stages_share_buckets_so_rows_carry_data_both_ways():
    """(tp4, pp2) -> (dp2, tp4), the 7B layouts: a bucket of each stage go together, largest with largest, and
    in each pair's AllGather rank t sends its stage-0 piece while rank 4+t sends its stage-1 piece: a rank
    receives the minimum when the two buckets are the same size (layer with layer, embedding with head)."""
    src, dst = ParallelLayout(1, 4, 2), ParallelLayout(2, 4, 1)
    names = list(SHAPES)
    buckets = sync_buckets(SHAPES, src)  # layers (1928 elements) > embedding = head (384) > norm
    assert buckets == [[f"model.layers.0.{k}" for k in LAYER] + [f"model.layers.1.{k}" for k in LAYER],
                       ["model.tok_embeddings.embedding_weight", "lm_head.weight"], ["model.norm_out.weight"]]
    assert sorted(n for b in buckets for n in b) == sorted(names)
    emb_head = [plan_parameter(n, SHAPES[n], 4, src, dst, 0, LAYERS) for n in buckets[1]]
    assert exchange_bytes(emb_head, [SHAPES[n] for n in buckets[1]]) == sum(p.minimum for p in emb_head) == 12 * 8 * 4
    layers = [f"model.layers.{i}.{k}" for i in (0, 1) for k in LAYER if not k.endswith("norm.weight")]
    for r in range(8):
        plans = [plan_parameter(n, SHAPES[n], 4, src, dst, r, LAYERS) for n in layers]
        assert exchange_bytes(plans, [SHAPES[n] for n in layers]) == sum(p.minimum for p in plans) > 0
    assert sync_buckets(SHAPES, ParallelLayout(2, 1)) == layer_buckets(names)


def test_layouts_of_different_worlds_or_unsplittable_shapes_fail():
    with pytest.raises(ValueError, match="one world"):
        plan_parameter("model.layers.0.attention.wq.weight", (24, 8), 4, ParallelLayout(1, 2), ParallelLayout(1, 4), 0)
    with pytest.raises(LayoutError, match="cannot be split"):
        plan_parameter("model.layers.0.attention.wq.weight", (6, 8), 4, ParallelLayout(1, 4), ParallelLayout(4, 1), 0)


def test_layer_buckets():
    names = ["model.tok_embeddings.embedding_weight"] + [f"model.layers.0.{k}" for k in LAYER] + ["lm_head.weight"]
    assert layer_buckets(names) == [["model.tok_embeddings.embedding_weight"],
                                    [f"model.layers.0.{k}" for k in LAYER], ["lm_head.weight"]]


def test_merge_buckets_joins_consecutive_ones_up_to_the_budget():
    buckets, sizes = [["a"], ["b"], ["c"], ["d"], ["e"]], [4, 3, 10, 2, 2]
    assert merge_buckets(buckets, sizes, 0) == buckets  # 0: as given
    assert merge_buckets(buckets, sizes, 7) == [["a", "b"], ["c"], ["d", "e"]]  # c (10) is over it: alone
    assert merge_buckets(buckets, sizes, 6) == [["a"], ["b"], ["c"], ["d", "e"]]  # 4 + 3 > 6
    assert merge_buckets(buckets, sizes, 21) == [["a", "b", "c", "d", "e"]]


def test_merge_buckets_stop_at_a_span_of_parameters():
    """A bucket's graphs loop over its parameters: LoRA's adapters (a few KB a layer) under a budget of
    megabytes join into buckets of at most SPAN parameters, never one of every adapter of the model."""
    from mindgrpo.utils.spans import SPAN

    buckets = [[f"layers.{i}.{k}" for k in range(14)] for i in range(64)]  # 14 adapters a layer
    merged = merge_buckets(buckets, [1000] * 64, 1 << 30)
    per = SPAN // 14
    assert [len(b) for b in merged] == [14 * per] * (64 // per) + ([14 * (64 % per)] if 64 % per else [])
    assert sum(merged, []) == sum(buckets, [])


def test_sync_buckets_by_bytes_keep_whole_layers_and_the_stages_pairs():
    """One stage: layers joined in order up to the budget (bytes of full fp32 parameters, counted here by
    hand). Two source stages: whole pairs (a bucket of every stage) joined, so every bucket still holds
    both stages' parameters; the joined bucket's exchanges receive no more than the pairs' did."""
    names = list(SHAPES)
    layer = 4 * (24 * 8 + 24 + 8 * 24 + 8 + 8 * 48)  # 3200 bytes
    emb = 4 * 48 * 8  # 1536, as the head
    one = ParallelLayout(2, 1)
    assert sync_buckets(SHAPES, one, 0) == layer_buckets(names)
    assert sync_buckets(SHAPES, one, emb + layer) == [names[:6], names[6:12], names[12:]]  # head: 4768 > 4736
    assert sync_buckets(SHAPES, one, emb + 2 * layer + 32 + emb) == [names]
    src, dst = ParallelLayout(1, 4, 2), ParallelLayout(2, 4, 1)
    pairs = sync_buckets(SHAPES, src)  # the two layers; the embedding with the head; the norm
    assert sync_buckets(SHAPES, src, 2 * emb + 32) == [pairs[0], pairs[1] + pairs[2]]
    joined = sync_buckets(SHAPES, src, 2 * layer + 2 * emb + 32)
    assert joined == [pairs[0] + pairs[1] + pairs[2]]
    for r in range(8):
        plans = [plan_parameter(n, SHAPES[n], 4, src, dst, r, LAYERS) for n in joined[0]]
        by_pair = sum(exchange_bytes([plan_parameter(n, SHAPES[n], 4, src, dst, r, LAYERS) for n in b],
                                     [SHAPES[n] for n in b]) for b in pairs)
        assert sum(p.minimum for p in plans) <= exchange_bytes(plans, [SHAPES[n] for n in joined[0]]) <= by_pair

"""mindgrpo/parallel/strategy.py: our strategy files in MindSpore's format, read back by MindSpore,
and MindSpore's transform_checkpoints slicing by them exactly as ParallelLayout.shard does."""

import os
import shutil

import numpy as np
import pytest
import mindspore as ms
from mindspore.parallel import build_searched_strategy, transform_checkpoints
from mindspore.train.node_strategy_pb2 import ParallelStrategyMap

from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.convert import expected_shapes
from mindgrpo.parallel.layout import LayoutError, ParallelLayout
from mindgrpo.parallel.strategy import (INFER_STRATEGY, TRAIN_STRATEGY, StrategyError, TensorLayout, device_num,
                                        read_strategy, strategy_file, write_layout_strategies, write_layouts,
                                        write_strategy_file)

SMALL = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2)


def full_state(cfg, seed=0):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in expected_shapes(cfg).items()}


def save_full(state, folder):
    """MindSpore's source layout for an unsharded checkpoint: folder/rank_0/*.ckpt."""
    os.makedirs(os.path.join(folder, "rank_0"))
    ms.save_checkpoint([{"name": k, "data": ms.Tensor(v)} for k, v in state.items()],
                       os.path.join(folder, "rank_0", "full.ckpt"))
    return folder


def test_file_fields_as_mindspore_reads_them(tmp_path):
    cfg = Qwen2Config(**SMALL)
    path = write_strategy_file(str(tmp_path / "s.ckpt"), ParallelLayout(dp=2, tp=2), expected_shapes(cfg))
    raw = build_searched_strategy(path)
    assert sorted(raw) == sorted(expected_shapes(cfg))

    def fields(name):
        pl = raw[name]
        return (list(pl.dev_matrix[0].dim), [list(t.dim) for t in pl.tensor_map],
                [list(p.dim) for p in pl.param_split_shape], pl.opt_weight_shard_size, pl.opt_weight_shard_step)

    assert fields("model.layers.1.attention.wq.weight") == ([2, 2], [[0, -1]], [[]], 0, 0)
    assert fields("model.layers.1.attention.wk.bias") == ([2, 2], [[0]], [[]], 0, 0)
    assert fields("model.layers.1.attention.wo.weight") == ([2, 2], [[-1, 0]], [[]], 0, 0)
    assert fields("model.layers.0.feed_forward.w2.weight") == ([2, 2], [[-1, 0]], [[]], 0, 0)
    assert fields("model.tok_embeddings.embedding_weight") == ([2, 2], [[0, -1]], [[]], 0, 0)
    assert fields("model.norm_out.weight") == ([2, 2], [[-1]], [[]], 0, 0)
    smap = ParallelStrategyMap()
    smap.ParseFromString(open(path, "rb").read())
    assert {item.parallel_strategys.stage for item in smap.parallel_strategy_item} == {0}


def test_read_strategy(tmp_path):
    path = write_strategy_file(str(tmp_path / "s.ckpt"), ParallelLayout(dp=2, tp=4),
                               {"lm_head.weight": (8, 4), "model.layers.0.attention.wo.weight": (4, 8),
                                "model.norm_out.weight": (4,)})
    got = read_strategy(path)
    assert got == {"lm_head.weight": TensorLayout((2, 4), (0, -1)),
                   "model.layers.0.attention.wo.weight": TensorLayout((2, 4), (-1, 0)),
                   "model.norm_out.weight": TensorLayout((2, 4), (-1,))}
    assert got["model.layers.0.attention.wo.weight"].splits == (1, 4)
    assert got["model.norm_out.weight"].splits == (1,)
    assert device_num(got, "s") == 8


@pytest.mark.parametrize("dp, tp, kv_heads", [(1, 2, 2), (2, 2, 2), (1, 4, 4), (2, 4, 4)])
def test_mindspore_transform_slices_as_our_layout(tmp_path, dp, tp, kv_heads):
    cfg = Qwen2Config(**{**SMALL, "num_key_value_heads": kv_heads})
    lay = ParallelLayout(dp, tp)
    state = full_state(cfg, seed=tp + dp)
    path = write_strategy_file(str(tmp_path / "s.ckpt"), lay, expected_shapes(cfg))
    transform_checkpoints(save_full(state, str(tmp_path / "src")), str(tmp_path / "out"), "ck_", None, path)
    assert sorted(os.listdir(tmp_path / "out")) == sorted(f"rank_{r}" for r in range(lay.world_size))
    strategy = read_strategy(path)
    for rank in range(lay.world_size):
        got = ms.load_checkpoint(str(tmp_path / "out" / f"rank_{rank}" / f"ck_{rank}.ckpt"))
        assert sorted(got) == sorted(state)
        _, tp_idx = lay.coords(rank)
        for name, full in state.items():
            ours = lay.shard(name, full, tp_idx)
            theirs = got[name].asnumpy()
            assert theirs.dtype == np.float32 and theirs.shape == ours.shape, name
            assert theirs.tobytes() == ours.tobytes(), (rank, name)
            # and the generic strategy slicer the script uses
            assert full[strategy[name].rank_slices(full.shape, rank)].tobytes() == ours.tobytes()


def test_directory_of_per_rank_files(tmp_path):
    path = write_strategy_file(str(tmp_path / "s.ckpt"), ParallelLayout(2, 2), expected_shapes(Qwen2Config(**SMALL)))
    folder = tmp_path / "strategy"
    folder.mkdir()
    for rank in range(4):  # what MindSpore writes: one identical file per rank
        shutil.copyfile(path, folder / f"ckpt_strategy_rank_{rank}.ckpt")
    assert read_strategy(str(folder)) == read_strategy(path)
    merged = strategy_file(str(folder), str(tmp_path))
    assert merged != path and sorted(build_searched_strategy(merged))[0].startswith("0-")
    # a directory holding one file is that file
    single = tmp_path / "single"
    single.mkdir()
    shutil.copyfile(path, single / "merged.ckpt")
    assert strategy_file(str(single), str(tmp_path)) == str(single / "merged.ckpt")


def test_optimizer_sharded_layout_shapes():
    # dev (dp=2, tp=4); dim 0 split by tp and, with optimizer sharding over all replicas, by dp
    tl = TensorLayout((2, 4), (0, -1), opt_shard_step=1, opt_shard_size=-1)
    assert tl.splits == (4, 1) and tl.opt_pieces == 2 and not tl.is_plain
    assert tl.local_shape("w", (16, 8)) == (2, 8)
    assert tl.full_shape((2, 8)) == (16, 8)
    with pytest.raises(StrategyError, match=r"'w' of shape \[12, 8\]: dim 0 \(size 12\) cannot be split into 8"):
        tl.local_shape("w", (12, 8))


def test_write_rejects_unsplittable_shapes_and_writes_nothing(tmp_path):
    target = tmp_path / "s.ckpt"
    with pytest.raises(LayoutError, match=r"'lm_head.weight' of shape \[130, 32\]: dim 0 cannot be split"):
        write_strategy_file(str(target), ParallelLayout(1, 4), {"lm_head.weight": (130, 32)})
    assert os.listdir(tmp_path) == []


def test_write_layout_strategies(tmp_path):
    cfg = Qwen2Config(**SMALL)
    paths = write_layout_strategies(str(tmp_path / "strategy"), cfg, ParallelLayout(2, 2), ParallelLayout(1, 2))
    assert paths == {"train": str(tmp_path / "strategy" / TRAIN_STRATEGY),
                     "infer": str(tmp_path / "strategy" / INFER_STRATEGY)}
    train, infer = read_strategy(paths["train"]), read_strategy(paths["infer"])
    weights = set(expected_shapes(cfg))
    assert set(infer) == weights
    assert set(train) == weights | {f"adam_{m}.{n}" for m in "mv" for n in weights}
    assert train["adam_v.model.layers.0.attention.wo.weight"] == TensorLayout((2, 2), (-1, 0))
    assert infer["model.layers.0.attention.wo.weight"] == TensorLayout((1, 2), (-1, 0))
    assert device_num(train, "train") == 4 and device_num(infer, "infer") == 2
    # a layout the model cannot take: neither file is written
    with pytest.raises(LayoutError, match="model_parallel = 4 must divide num_key_value_heads = 2"):
        write_layout_strategies(str(tmp_path / "bad"), cfg, ParallelLayout(1, 2), ParallelLayout(1, 4))
    assert not (tmp_path / "bad").exists()


def test_read_errors(tmp_path):
    with pytest.raises(StrategyError, match="no such strategy file or directory"):
        read_strategy(str(tmp_path / "missing.ckpt"))
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(StrategyError, match="no strategy files"):
        read_strategy(str(tmp_path / "empty_dir"))
    (tmp_path / "empty.ckpt").write_bytes(b"")
    with pytest.raises(StrategyError, match="not a MindSpore strategy file"):
        read_strategy(str(tmp_path / "empty.ckpt"))
    (tmp_path / "junk.ckpt").write_bytes(b"\xff" * 64)
    with pytest.raises(StrategyError, match="not a MindSpore strategy file"):
        read_strategy(str(tmp_path / "junk.ckpt"))


def test_device_num_mismatch_names_the_parameter(tmp_path):
    path = write_layouts(str(tmp_path / "s.ckpt"), {"a": TensorLayout((1, 2), (0,)), "b": TensorLayout((2, 2), (0,))})
    with pytest.raises(StrategyError, match="parameter 'b' is laid out over 4 devices, but 'a' over 2"):
        device_num(read_strategy(path), "s.ckpt")


@pytest.mark.parametrize("dp, tp, pp", [(1, 2, 2), (2, 1, 2), (1, 1, 2)])
def test_mindspore_slices_and_merges_pipeline_stages_by_our_strategy(tmp_path, dp, tp, pp):
    """With pipeline stages, rank r holds its tp piece of the parameters of stage r // (dp*tp) only;
    MindSpore's transform_checkpoints must cut a full checkpoint that way, and merge it back."""
    cfg = Qwen2Config(**SMALL)
    layout = ParallelLayout(dp=dp, tp=tp, pp=pp)
    full = full_state(cfg, seed=2)
    names = list(full)
    strategy = write_strategy_file(str(tmp_path / "pp.ckpt"), layout, expected_shapes(cfg))
    assert {tl.stages for tl in read_strategy(strategy).values()} == {(0,), (1,)}
    transform_checkpoints(save_full(full, str(tmp_path / "full")), str(tmp_path / "out"), "ck_", None, strategy)
    for rank in range(layout.world_size):
        got = ms.load_checkpoint(str(tmp_path / "out" / f"rank_{rank}" / f"ck_{rank}.ckpt"))
        mine = layout.stage_names(names, layout.stage(rank), cfg.num_hidden_layers)
        assert sorted(got) == sorted(mine), rank
        for name in mine:
            expected = layout.shard(name, full[name], layout.coords(rank)[1])
            assert got[name].asnumpy().tobytes() == np.ascontiguousarray(expected).tobytes(), (rank, name)
    transform_checkpoints(str(tmp_path / "out"), str(tmp_path / "merged"), "m_", strategy, None)
    merged = ms.load_checkpoint(str(tmp_path / "merged" / "rank_0" / "m_0.ckpt"))
    assert sorted(merged) == sorted(full)
    for name, value in full.items():
        np.testing.assert_array_equal(merged[name].asnumpy(), value, err_msg=name)


@pytest.mark.parametrize("dp, tp, pp", [(2, 2, 1), (2, 1, 1), (4, 2, 1), (2, 1, 2)])
def test_mindspore_merges_optimizer_sharded_moments_by_our_strategy(tmp_path, dp, tp, pp):
    """With optimizer_shard, rank (d, t) holds rows [d*n/dp, (d+1)*n/dp) of dim 0 of its tp piece of each split
    moment (mindgrpo.grpo.optim.AdamW), of its pipeline stage's parameters; MindSpore's transform_checkpoints
    must put the pieces back together from our strategy file alone."""
    cfg = Qwen2Config(**SMALL)
    layout = ParallelLayout(dp=dp, tp=tp, pp=pp)
    weights = full_state(cfg, seed=1)
    state = dict(weights, **{f"adam_{m}.{n}": v * (2 if m == "m" else 3) for m in "mv" for n, v in weights.items()})
    shapes = {n: v.shape for n, v in state.items()}
    strategy = write_strategy_file(str(tmp_path / "train.ckpt"), layout, shapes, optimizer_shard=True)
    split = [n for n in state if n.startswith("adam_") and layout.opt_shard_parts(n, shapes[n]) > 1]
    assert split  # moments only (by construction above); the tp-replicated norms stay whole when tp > 1
    assert (tp > 1) != any("norm" in n for n in split)
    assert all(layout.opt_shard_parts(n, shapes[n]) == dp for n in split)
    for rank in range(layout.world_size):
        d, t = layout.coords(rank)
        pieces = {}
        for name, full in state.items():
            if layout.param_stage(name, cfg.num_hidden_layers) != layout.stage(rank):
                continue
            piece = layout.shard(name, full, t)
            if name in split:
                rows = piece.shape[0] // dp
                piece = piece[d * rows:(d + 1) * rows]
            pieces[name] = np.ascontiguousarray(piece)
        os.makedirs(tmp_path / "src" / f"rank_{rank}")
        ms.save_checkpoint([{"name": k, "data": ms.Tensor(v)} for k, v in pieces.items()],
                           str(tmp_path / "src" / f"rank_{rank}" / "x.ckpt"))
    transform_checkpoints(str(tmp_path / "src"), str(tmp_path / "dst"), "full_", strategy, None)
    merged = ms.load_checkpoint(str(tmp_path / "dst" / "rank_0" / "full_0.ckpt"))
    assert sorted(merged) == sorted(state)
    for name, full in state.items():
        np.testing.assert_array_equal(merged[name].asnumpy(), full, err_msg=name)

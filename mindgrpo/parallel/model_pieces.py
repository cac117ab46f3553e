"""A model in pieces: the part of the weights one rank holds in a layout (its pipeline stage's layers, its
tensor-parallel piece of each), built from the seed's whole draw and loaded from the whole weights (sliced by
the layout's split rules, parallel/layout.py) or from this rank's shard folder (`DIR/rank_<k>/*.ckpt`, written
by scripts/transform_checkpoint.py); a reward model's piece; a parameter's fp32 values; the whole values of the
pieces a layout's ranks hold (`whole_parameters`: checkpoints' PEFT folders and base files). The placements' one path
to their pieces (parallel/colocated.py, parallel/separate_placement.py).
"""

from __future__ import annotations

import glob
import os
from typing import Dict, Iterator, Optional, Sequence, Tuple

import numpy as np
import mindspore as ms

from mindgrpo.models.checkpoint import find_config, load_state, read_model_state
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.qwen2 import Qwen2ForCausalLM
from mindgrpo.models.reward_model import RewardModel, load_reward_model
from mindgrpo.parallel.checkpoints import load_params
from mindgrpo.parallel.comm import CPU_CHUNK, Comm
from mindgrpo.parallel.layout import ParallelLayout
from mindgrpo.parallel.pipeline import stage_spec
from mindgrpo.parallel.tp_layers import TensorParallelLayers
from mindgrpo.utils import heartbeat


def shard_dir(path: str, rank: int) -> Optional[str]:
    """path/rank_<rank> when path is a directory of per-rank shards, else None."""
    candidate = os.path.join(path, f"rank_{rank}")
    return candidate if os.path.isdir(path) and os.path.isdir(candidate) else None


def load_shard(lm: Qwen2ForCausalLM, folder: str, params: Optional[Sequence[ms.Parameter]] = None) -> None:
    """Load this rank's shard (the last .ckpt of folder in name order, as MindSpore picks) into params (None:
    every parameter of the model), checking every parameter's name and local shape."""
    files = sorted(glob.glob(os.path.join(folder, "*.ckpt")))
    if not files:
        raise FileNotFoundError(f"{folder}: no .ckpt shard")
    params = [p for _, p in lm.parameters_and_names()] if params is None else params
    load_params(files[-1], params, hint=" (a shard of another layout?)")


def model_piece(mcfg: Qwen2Config, seed: int, max_positions: int, layout: ParallelLayout, group, layout_rank: int,
                path: Optional[str] = None, shard_rank: Optional[int] = None) -> Qwen2ForCausalLM:
    """The piece of the model that rank `layout_rank` of `layout` holds (its number among the layout's ranks: a
    separate placement's rollout ranks follow the training ranks): its pipeline stage's layers, its tensor-parallel
    piece of each over `group` (its tp group in the world, created at start-up), every rank drawing the whole model
    from `seed`; then, with `path`, its pieces of the weights there (`load_pieces`; shard_rank as there). The
    placements' one way to build a model in pieces (the colocated layouts' and a separate placement's sides)."""
    stage = stage_spec(layout, layout.stage(layout_rank), mcfg.num_hidden_layers)
    lm = Qwen2ForCausalLM(mcfg, seed=seed, max_positions=max_positions, layers=TensorParallelLayers(group),
                          stage=stage)
    if path:
        load_pieces(lm, path, layout, group.index, shard_rank)
    heartbeat.beat()  # progress for the collective watchdog: building a big model takes a while
    return lm


def load_pieces(lm: Qwen2ForCausalLM, path: str, layout: ParallelLayout, piece: int,
                shard_rank: Optional[int] = None, names: Optional[Sequence[str]] = None) -> None:
    """The model's pieces of the parameters `names` (None: every one it holds) from the weights at `path`: with
    `shard_rank`, its folder of per-rank shards when `path` is one (`shard_dir`: written for this layout), else
    the full checkpoint or HF directory read and each tensor sliced to tensor-parallel piece `piece` of `layout`
    (its split rules, parallel/layout.py), the parameters of the model's stage kept."""
    mine = dict(lm.parameters_and_names())
    wanted = set(mine) if names is None else set(names)
    shards = shard_dir(path, shard_rank) if shard_rank is not None else None
    if shards:
        load_shard(lm, shards, [mine[n] for n in mine if n in wanted])
        return
    state = read_model_state(path, lm.config)  # every rank reads it and keeps its piece of its stage
    load_state(lm, {n: layout.shard(n, a, piece) for n, a in state.items() if n in wanted and n in mine})


def reward_model_piece(path: str, config: Optional[str], layout: ParallelLayout, group, compute_dtype: str
                       ) -> RewardModel:
    """This rank's tensor-parallel piece of the reward model at `path` over `group`, the tp group of `layout` (every
    layer: a reward model has no pipeline stages): the full checkpoint read, each tensor sliced by SPLIT_RULES."""
    tp = ParallelLayout(dp=1, tp=layout.tp)
    tp.check_divisible(Qwen2Config.load(config or find_config(path)))
    return load_reward_model(path, config, layers=TensorParallelLayers(group),
                             shard=lambda n, a: tp.shard(n, a, group.index), compute_dtype=compute_dtype)


def fp32(p: ms.Parameter) -> np.ndarray:
    """A parameter's values as an fp32 numpy array (a copy)."""
    return p.astype(ms.float32).asnumpy() if p.dtype != ms.float32 else p.asnumpy().copy()


def whole_parameters(comm: Comm, layout: ParallelLayout, rank: int, params: Sequence[ms.Parameter],
                     shapes: Optional[Dict[str, Tuple[int, ...]]] = None) -> Iterator[Tuple[str, np.ndarray]]:
    """(name, the whole fp32 values) of each parameter of a model laid out by `layout` (this rank: `rank` in it), in
    the given order (the same on every rank of the layout: each call is a collective). A tensor-parallel piece goes
    into its place of a buffer of -0.0 that the layout's tp group sums (x + -0.0 is x), in pieces of CPU_CHUNK
    values. With pipeline stages `shapes` names the parameters of the whole model to give (name -> full shape, in
    their order; `params` are this stage's among them): the stage that holds one makes it whole, then the chain of
    stages sums it with -0.0 from the others."""
    if layout.pp == 1:
        yield from _tp_whole(comm, layout, rank, params)
        return
    if shapes is None:
        raise ValueError("placement.whole: with pipeline stages the whole model's names and shapes are needed")
    held = {p.name: p for p in params}
    unknown = sorted(set(held) - set(shapes))
    if unknown:
        raise ValueError(f"placement.whole: {unknown[0]} is not among the parameters asked for")
    chain = comm.group(layout.pp_group(rank))
    for name, shape in shapes.items():
        value = next(_tp_whole(comm, layout, rank, [held[name]]))[1] if name in held else \
            np.full(shape, -0.0, np.float32)
        if value.shape != tuple(shape):
            raise ValueError(f"placement.whole: {name} is {value.shape} whole, the shapes say {tuple(shape)}")
        yield name, _sum(comm, value, chain)


def _tp_whole(comm: Comm, layout: ParallelLayout, rank: int, params: Sequence[ms.Parameter]
              ) -> Iterator[Tuple[str, np.ndarray]]:
    """(name, whole fp32 values) of each parameter of this stage, its pieces summed over the tp group."""
    group = comm.group(layout.tp_group(rank))
    for p in params:
        piece = fp32(p)
        if group.size == 1 or layout.param_split(p.name) is None:
            yield p.name, piece
            continue
        flat = np.full((group.size, piece.size), -0.0, np.float32)
        flat[group.index] = piece.reshape(-1)
        flat = _sum(comm, flat, group)
        yield p.name, layout.merge(p.name, [row.reshape(piece.shape) for row in flat.reshape(group.size, -1)])


def _sum(comm: Comm, values: np.ndarray, group) -> np.ndarray:
    """values summed over the group, in pieces of CPU_CHUNK values (a host sum's one buffer each)."""
    flat = values.reshape(-1).copy()
    for start in range(0, flat.size, CPU_CHUNK):
        flat[start:start + CPU_CHUNK] = comm.host_sum(flat[start:start + CPU_CHUNK], group)
    return flat.reshape(values.shape)

"""MindSpore strategy files: write them for our layouts, read anyone's, slice by them with numpy.

A strategy file is a serialized `mindspore.train.node_strategy_pb2.ParallelStrategyMap`, the file
`mindspore.parallel.build_searched_strategy` reads and `transform_checkpoints` slices by. Each
parameter has a layout (`TensorLayout` below, MindSpore's vocabulary):

    dev_matrix   the devices as an array, e.g. (dp, tp); rank r sits at the row-major
                 coordinate of r (the last axis varies fastest)
    tensor_map   per tensor dim: -1 (not split) or m, split over dev_matrix[-1 - m] equal,
                 contiguous pieces, taken by the rank's coordinate on that axis
    opt_weight_shard_step/size   optimizer-parallel sharding of dim 0 (0: off)

Our `ParallelLayout(dp, tp)` is dev_matrix (dp, tp): tp is axis m = 0, so rank r takes piece
r % tp, and the dp replicas (axis m = 1, never in a tensor map) hold the same piece. A
column-parallel weight is tensor_map (0, -1), a row-parallel one (-1, 0), a norm (-1,).

MindSpore writes one strategy file per rank (identical when there is one pipeline stage) and
`merge_pipeline_strategys` merges them, prefixing names with "<stage>-"; a stage's dev_matrix
covers its own devices, and rank r is on stage r // (devices per stage). We write one file per
layout, in the merged form when it has several stages; `read_strategy` and `strategy_file`
accept a file or a directory of per-rank files.
"""

from __future__ import annotations

import glob
import os
import re
import tempfile
from dataclasses import dataclass, replace
from typing import Dict, Mapping, Optional, Sequence, Tuple

import numpy as np
from mindspore.parallel import build_searched_strategy, merge_pipeline_strategys
from mindspore.train.node_strategy_pb2 import ParallelStrategyMap

from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.convert import atomic_path, expected_shapes
from mindgrpo.parallel.layout import OPTIMIZER_PREFIXES, ParallelLayout, num_layers_of

TRAIN_STRATEGY = "train_strategy.ckpt"  # actor (training) layout, with the Adam moments
INFER_STRATEGY = "infer_strategy.ckpt"  # generation (inference) layout, weights only


class StrategyError(ValueError):
    """A strategy file that cannot be read or does not fit a checkpoint; names the parameter."""


@dataclass(frozen=True)
class TensorLayout:
    """One parameter's entry of a strategy file."""

    dev_matrix: Tuple[int, ...]
    tensor_map: Tuple  # ints, or tuples of ints where one tensor dim is split over several axes
    opt_shard_step: int = 0
    opt_shard_size: int = 0  # -1: over all the devices that hold the same model-parallel piece
    stages: Tuple[int, ...] = (0,)  # pipeline stages holding the parameter

    @property
    def device_num(self) -> int:
        return int(np.prod(self.dev_matrix))

    @property
    def splits(self) -> Tuple[int, ...]:
        """Pieces per tensor dim from model parallelism (MindSpore's `_get_tensor_strategy`)."""
        out = []
        for m in self.tensor_map:
            axes = m if isinstance(m, tuple) else (m,)
            out.append(int(np.prod([self.dev_matrix[-1 - a] for a in axes if a != -1])))
        return tuple(out)

    @property
    def opt_pieces(self) -> int:
        """Extra pieces of dim 0 from optimizer parallelism (1 when off)."""
        if self.opt_shard_size == -1:
            return self.device_num // int(np.prod(self.splits))
        return max(self.opt_shard_size, 1)

    @property
    def is_plain(self) -> bool:
        """What `rank_slices` handles: flat tensor map, no optimizer sharding, no pipeline stages."""
        return (all(isinstance(m, int) for m in self.tensor_map) and self.opt_shard_size == 0
                and self.stages == (0,))

    def local_shape(self, name: str, full: Sequence[int]) -> Tuple[int, ...]:
        """A rank's piece of a full shape; StrategyError naming the parameter if it does not divide."""
        full = tuple(int(s) for s in full)
        splits = self.splits
        if len(splits) != len(full):
            if all(s == 1 for s in splits):  # not split, e.g. a () step counter listed as (-1,)
                return full
            raise StrategyError(f"parameter {name!r} has shape {list(full)} but its strategy tensor_map "
                                f"{list(self.tensor_map)} has {len(splits)} dims")
        pieces = list(splits)
        if full:
            pieces[0] *= self.opt_pieces
        for k, (size, n) in enumerate(zip(full, pieces)):
            if size % n:
                raise StrategyError(f"parameter {name!r} of shape {list(full)}: dim {k} (size {size}) cannot "
                                    f"be split into {n} equal pieces (dev_matrix {list(self.dev_matrix)}, "
                                    f"tensor_map {list(self.tensor_map)})")
        return tuple(s // n for s, n in zip(full, pieces))

    def full_shape(self, local: Sequence[int]) -> Tuple[int, ...]:
        local = tuple(int(s) for s in local)
        if len(self.splits) != len(local):
            return local
        pieces = list(self.splits)
        if local:
            pieces[0] *= self.opt_pieces
        return tuple(s * n for s, n in zip(local, pieces))

    def rank_slices(self, shape: Sequence[int], rank: int) -> Tuple[slice, ...]:
        """Index of rank's piece in the full tensor (plain layouts; as MindSpore's `_load_tensor`)."""
        if not self.is_plain:
            raise StrategyError(f"layout {self} needs MindSpore's transform (nested map, optimizer shard or stages)")
        if len(self.tensor_map) != len(shape):
            return tuple(slice(None) for _ in shape)
        coord, r = [0] * len(self.dev_matrix), rank % self.device_num
        for axis in range(len(self.dev_matrix) - 1, -1, -1):
            coord[axis], r = r % self.dev_matrix[axis], r // self.dev_matrix[axis]
        out = []
        for size, m in zip(shape, self.tensor_map):
            if m == -1:
                out.append(slice(None))
                continue
            axis = len(self.dev_matrix) - 1 - m
            n = size // self.dev_matrix[axis]
            out.append(slice(coord[axis] * n, (coord[axis] + 1) * n))
        return tuple(out)


# ---------------------------------------------------------------------------- writing


def layout_strategy(layout: ParallelLayout, shapes: Mapping[str, Sequence[int]],
                    optimizer_shard: bool = False) -> Dict[str, TensorLayout]:
    """Our layout as per-parameter TensorLayouts; LayoutError naming a parameter tp cannot split.
    optimizer_shard: the adam_m./adam_v. moments are split over the dp replicas as AdamW(shard=...)
    keeps them (`ParallelLayout.opt_shard_parts`): MindSpore's opt_weight_shard_size = dp, step = tp
    (the distance between the ranks of a dp group). With pipeline stages each parameter is laid
    out over its stage's dp x tp devices, on the stage `ParallelLayout.param_stage` gives."""
    num_layers = num_layers_of(list(shapes))
    out = {}
    for name, shape in shapes.items():
        layout.shard_shape(name, shape)
        dim = layout.param_split(name)
        tensor_map = tuple(0 if k == dim else -1 for k in range(len(shape)))
        opt = optimizer_shard and name.startswith(OPTIMIZER_PREFIXES) and layout.opt_shard_parts(name, shape) > 1
        stage = layout.param_stage(name, num_layers) if layout.pp > 1 else 0
        out[name] = TensorLayout((layout.dp, layout.tp), tensor_map, opt_shard_step=layout.tp if opt else 0,
                                 opt_shard_size=layout.dp if opt else 0, stages=(stage,))
    return out


def _strategy_map(entries: Mapping[str, TensorLayout]) -> ParallelStrategyMap:
    """One file for every stage: with several stages in MindSpore's merged form (what
    `merge_pipeline_strategys` makes of the per-stage files), layout names "<stage>-<name>"."""
    smap = ParallelStrategyMap()
    smap.current_stage = 1
    merged = len({s for tl in entries.values() for s in tl.stages}) > 1
    for stage, name in sorted((s, n) for n, tl in entries.items() for s in tl.stages):
        tl = entries[name]
        # MindSpore lists operator strategies here; only the stage is ever read back, so we
        # list one "operator" per parameter with its split counts.
        item = smap.parallel_strategy_item.add()
        item.node_name = name
        item.parallel_strategys.stage = stage
        item.parallel_strategys.parallel_strategy.add().dim.extend(tl.splits)
        layout_item = smap.parallel_layout_item.add()
        layout_item.param_name = f"{stage}-{name}" if merged else name
        pl = layout_item.parallel_layouts
        pl.dev_matrix.add().dim.extend(tl.dev_matrix)
        if any(isinstance(m, tuple) for m in tl.tensor_map):  # one entry per tensor dim
            for m in tl.tensor_map:
                pl.tensor_map.add().dim.extend(m if isinstance(m, tuple) else (m,))
        else:
            pl.tensor_map.add().dim.extend(tl.tensor_map)
        pl.param_split_shape.add()  # empty: equal splits (MindSpore's readers index [0])
        pl.indices_offset.add()
        pl.field = 0
        pl.opt_weight_shard_step = tl.opt_shard_step
        pl.opt_weight_shard_size = tl.opt_shard_size
    return smap


def write_strategy_file(path: str, layout: ParallelLayout, shapes: Mapping[str, Sequence[int]],
                        optimizer_shard: bool = False) -> str:
    """Write our layout for these parameters (name -> full shape) as a strategy file (merged over
    the pipeline stages when there are several). Atomic."""
    return write_layouts(path, layout_strategy(layout, shapes, optimizer_shard))


def write_layouts(path: str, entries: Mapping[str, TensorLayout]) -> str:
    """Write any per-parameter layouts (each on its `stages`) as one strategy file. Atomic."""
    data = _strategy_map(entries).SerializeToString()
    umask = os.umask(0)
    os.umask(umask)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600
    return path


def training_shapes(cfg: Qwen2Config, adapters: Optional[Mapping[str, Sequence[int]]] = None
                    ) -> Dict[str, Tuple[int, ...]]:
    """Full shapes of what the training layout holds: the weights and their adam_m./adam_v. moments; with LoRA's
    adapters (name -> full shape, `models.lora.adapter_shapes`) what its checkpoints hold instead: the adapters and
    their moments (the base is referred to, not saved)."""
    shapes = expected_shapes(cfg) if adapters is None else {n: tuple(s) for n, s in adapters.items()}
    return {prefix + name: shape for prefix in ("",) + OPTIMIZER_PREFIXES for name, shape in shapes.items()}


def write_layout_strategies(out_dir: str, cfg: Qwen2Config, train_layout: ParallelLayout,
                            infer_layout: ParallelLayout, optimizer_shard: bool = False,
                            adapters: Optional[Mapping[str, Sequence[int]]] = None) -> Dict[str, str]:
    """The strategy files of a run: out_dir/train_strategy.ckpt (the actor's layout, weights and
    their adam_m./adam_v. moments, split over dp with optimizer_shard; with LoRA's adapters (name -> full shape)
    the adapters and their moments instead, what a LoRA run's checkpoints hold) and out_dir/infer_strategy.ckpt
    (the generation layout, weights). Both layouts are checked against the model before either file is written.
    Returns {"train": path, "infer": path}."""
    train_layout.check_divisible(cfg)
    infer_layout.check_divisible(cfg)
    return {"train": write_strategy_file(os.path.join(out_dir, TRAIN_STRATEGY), train_layout,
                                         training_shapes(cfg, adapters), optimizer_shard=optimizer_shard),
            "infer": write_strategy_file(os.path.join(out_dir, INFER_STRATEGY), infer_layout, expected_shapes(cfg))}


# ---------------------------------------------------------------------------- reading


def strategy_file(path: str, workdir: str) -> str:
    """One strategy file for MindSpore's API: path itself, the only file of a directory, or the
    directory's per-rank files merged (`merge_pipeline_strategys`) into workdir."""
    if os.path.isfile(path):
        return path
    if not os.path.isdir(path):
        raise StrategyError(f"{path}: no such strategy file or directory")
    files = sorted(glob.glob(os.path.join(path, "*.ckpt")) + glob.glob(os.path.join(path, "*.json")))
    if not files:
        raise StrategyError(f"{path}: no strategy files (*.ckpt or *.json) in the directory")
    if len(files) == 1:
        return files[0]
    merged = os.path.join(workdir, "merged_strategy.ckpt" if files[0].endswith(".ckpt") else "merged_strategy.json")
    try:
        merge_pipeline_strategys(path, merged)
    except (ValueError, TypeError) as e:
        raise StrategyError(f"{path}: cannot merge the strategy files ({str(e).splitlines()[0]})") from None
    return merged


def _parse(proto_layout) -> TensorLayout:
    if len(proto_layout.tensor_map) > 1:  # one tensor dim over several device axes
        tensor_map = tuple(tuple(int(a) for a in tm.dim) for tm in proto_layout.tensor_map if tm.dim)
    else:
        tensor_map = tuple(int(a) for a in proto_layout.tensor_map[0].dim)
    return TensorLayout(tuple(int(d) for d in proto_layout.dev_matrix[0].dim), tensor_map,
                        int(proto_layout.opt_weight_shard_step), int(proto_layout.opt_weight_shard_size))


def read_strategy(path: str) -> Dict[str, TensorLayout]:
    """name -> TensorLayout of a strategy file or directory, read by `build_searched_strategy`.
    Names of merged files lose their "<stage>-" prefix; the stages are kept in the layout."""
    with tempfile.TemporaryDirectory() as work:
        file = strategy_file(path, work)
        try:
            raw = build_searched_strategy(file)
        except (ValueError, TypeError) as e:
            raise StrategyError(f"{path}: not a MindSpore strategy file ({str(e).splitlines()[0]})") from None
    if not raw:
        raise StrategyError(f"{path}: the strategy file has no parameter layouts")
    layouts: Dict[str, TensorLayout] = {}
    stages: Dict[str, set] = {}
    for key, proto_layout in raw.items():
        m = re.match(r"(\d+)-(.+)$", key)
        stage, name = (int(m.group(1)), m.group(2)) if m else (0, key)
        try:
            tl = _parse(proto_layout)
        except IndexError:
            raise StrategyError(f"{path}: parameter {name!r} has an incomplete layout") from None
        if not tl.dev_matrix:
            raise StrategyError(f"{path}: parameter {name!r} has an empty device matrix")
        if name not in layouts or stage < min(stages[name]):  # the lowest stage's layout, as MindSpore
            layouts[name] = tl
        stages.setdefault(name, set()).add(stage)
    return {name: replace(tl, stages=tuple(sorted(stages[name]))) for name, tl in layouts.items()}


def device_num(strategy: Mapping[str, TensorLayout], source: str) -> int:
    """Devices per pipeline stage times stages; StrategyError naming a parameter that disagrees."""
    first = next(iter(strategy))
    n = strategy[first].device_num
    for name, tl in strategy.items():
        if tl.device_num != n:
            raise StrategyError(f"{source}: parameter {name!r} is laid out over {tl.device_num} devices, "
                                f"but {first!r} over {n}")
    stages = sorted({s for tl in strategy.values() for s in tl.stages})
    if stages != list(range(len(stages))):
        raise StrategyError(f"{source}: pipeline stages {stages} are not all present")
    return n * len(stages)

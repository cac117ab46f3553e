"""Moving policy weights into the inference (or reference) model after an update.

Both classes copy in buckets (one decoder layer, or the embedding, the final norm, the head),
inside compiled graphs, never through the host or the disk; the extra device memory at any
moment is one bucket.

`WeightSync`: the same layout on both sides (one process): a copy per bucket.

`Reshard`: any two layouts over the same world (tp 2 -> 1 with dp 2, 1 -> 2, dp2 x tp2 -> tp4, ...).
Along a parameter's split dim the two layouts cut the full tensor into tp_src and tp_dst
pieces; their common refinement cuts it into lcm(tp_src, tp_dst) "atoms". A destination rank
needs the atoms of its piece; those it does not hold already, its source tensor-parallel group
(which holds every atom exactly once) sends: each member contributes the missing atoms it owns,
padded to the same count, in one AllGather per bucket, and every member then picks its piece
from what it holds and what arrived. Replicated parameters (norms) never move. The plan is
plain numpy (`plan_parameter`), so it is tested for every pair of layouts without processes.

Bytes per rank are logged against the minimum the two layouts require (the atoms a rank needs
and does not hold): tp2 -> tp1 and tp1 -> tp2 meet it; dp2 x tp2 -> tp4 meets it on the
receivers, plus the padding the AllGather sends back.
"""

from __future__ import annotations

import math
import re
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from mindgrpo.memory.swap import nbytes
from mindgrpo.parallel.layout import ParallelLayout


def named_parameters(model: nn.Cell) -> Dict[str, Parameter]:
    """The model's parameters by their path in the model (`model.layers.0...`), whatever a
    wrapping cell may have renamed them to."""
    return dict(model.parameters_and_names())


def layer_buckets(names: Sequence[str]) -> List[List[str]]:
    """Group parameter names by decoder layer; embeddings, final norm and head form their own."""
    buckets: Dict[str, List[str]] = {}
    for n in names:
        m = re.match(r"model\.layers\.(\d+)\.", n)
        key = f"layer{m.group(1)}" if m else n
        buckets.setdefault(key, []).append(n)
    return list(buckets.values())


def _check_same_names(src: Dict[str, Parameter], dst: Dict[str, Parameter]) -> None:
    if sorted(src) != sorted(dst):
        diff = sorted(set(src) ^ set(dst))
        raise ValueError(f"weight sync: the two models' parameters differ: {diff[:5]}")


# ---------------------------------------------------------------------------------------
# Same layout
# ---------------------------------------------------------------------------------------


class _CopyBucket(nn.Cell):
    """dst parameters <- the given tensors. The sources come in as graph inputs: the two models'
    parameters share names, and one graph cannot hold two parameters of the same name."""

    def __init__(self, dst: Sequence[Parameter]):
        super().__init__(auto_prefix=False)
        self.dst = ms.ParameterTuple(dst)
        self.n = len(dst)

    def construct(self, src):
        out = ()
        for i in range(self.n):
            out = out + (ops.assign(self.dst[i], src[i].astype(self.dst[i].dtype)),)
        return out


class WeightSync:
    """Same-layout sync: dst parameters take the values of the src parameters of the same name."""

    def __init__(self, src: nn.Cell, dst: nn.Cell, memory=None):
        src_p, dst_p = named_parameters(src), named_parameters(dst)
        _check_same_names(src_p, dst_p)
        self.buckets = []
        for names in layer_buckets(list(src_p)):
            src_b, dst_b = [src_p[n] for n in names], [dst_p[n] for n in names]
            self.buckets.append((_CopyBucket(dst_b), tuple(src_b), nbytes(dst_b)))
        self.memory = memory
        self.total_bytes = sum(b for _, _, b in self.buckets)
        self.max_bucket_bytes = max(b for _, _, b in self.buckets)

    def __call__(self) -> Dict[str, float]:
        t0 = time.perf_counter()
        for graph, src, size in self.buckets:
            with self.memory.transient(size) if self.memory is not None else nullcontext():
                graph(ms.mutable(tuple(p.value() for p in src)))  # inputs, not constants: no recompiling
        return {"sync/seconds": time.perf_counter() - t0, "sync/bytes": float(self.total_bytes),
                "sync/max_bucket_bytes": float(self.max_bucket_bytes)}


# ---------------------------------------------------------------------------------------
# Across layouts: the plan (numpy only)
# ---------------------------------------------------------------------------------------


Run = Tuple[int, int]  # [start, stop) along the split dim


def _runs(indices: Sequence[int]) -> Tuple[Run, ...]:
    """Consecutive indices merged into [start, stop) runs."""
    out: List[List[int]] = []
    for i in indices:
        if out and out[-1][1] == i:
            out[-1][1] = i + 1
        else:
            out.append([i, i + 1])
    return tuple((a, b) for a, b in out)


@dataclass(frozen=True)
class ParamPlan:
    """How one rank makes its destination piece of one parameter; runs are [start, stop) along dim.

    dim    the split dim (None: replicated in both layouts, copied as it is)
    send   runs of this rank's source piece it contributes to the exchange, `slot` elements in
           all (a member with less to send pads with copies of its first atom); () when slot == 0
    take   the destination piece, in order, as (source, start, stop): source -1 is this rank's
           source piece, j >= 0 the slot member j contributed
    slot   elements along dim every member of the source group contributes (0: no exchange)
    received, minimum   bytes this rank receives, and the least it could (atoms it lacks)"""

    name: str
    dim: Optional[int]
    send: Tuple[Run, ...]
    take: Tuple[Tuple[int, int, int], ...]
    slot: int
    group_size: int
    received: int
    minimum: int
    source_len: int = 0  # elements along dim of this rank's source piece

    @property
    def is_copy(self) -> bool:
        """The destination piece is this rank's source piece, unchanged."""
        return self.dim is None or (self.slot == 0 and self.take == ((-1, 0, self.source_len),))


def plan_parameter(name: str, shape: Sequence[int], itemsize: int, src: ParallelLayout, dst: ParallelLayout,
                   rank: int) -> ParamPlan:
    """The plan of parameter `name` (full shape `shape`) for `rank` (see the module docstring)."""
    if src.world_size != dst.world_size:
        raise ValueError(f"resharding needs one world: {src} has {src.world_size} ranks, {dst} {dst.world_size}")
    dim = src.param_split(name)
    dst.shard_shape(name, shape)  # LayoutError if the destination cannot split it
    src.shard_shape(name, shape)
    if dim is None:
        return ParamPlan(name, None, (), (), 0, 1, 0, 0)
    full = int(shape[dim])
    rest = int(np.prod([s for k, s in enumerate(shape) if k != dim]))
    n_atoms = math.lcm(src.tp, dst.tp)
    unit = full // n_atoms
    per_src, per_dst = n_atoms // src.tp, n_atoms // dst.tp
    group = src.tp_group(rank)  # ranks in tp order: member j owns atoms [j*per_src, (j+1)*per_src)

    def needed(r):
        j = dst.coords(r)[1]
        return list(range(j * per_dst, (j + 1) * per_dst))

    def owner(atom):
        return atom // per_src

    wanted = sorted({a for m in group for a in needed(m) if owner(a) != group.index(m)})
    contrib = [[a for a in wanted if owner(a) == j] for j in range(len(group))]
    slot_atoms = max(len(c) for c in contrib)
    me = group.index(rank)

    def elements(atom):  # the atom's elements in its owner's piece
        start = (atom - owner(atom) * per_src) * unit
        return range(start, start + unit)

    send = [i for a in contrib[me] for i in elements(a)]
    send += list(range(unit)) * (slot_atoms - len(contrib[me]))  # padding: the same size for everyone
    take: List[Tuple[int, int, int]] = []
    for a in needed(rank):
        j = owner(a)
        source, start = (-1, elements(a).start) if j == me else (j, contrib[j].index(a) * unit)
        if take and take[-1][0] == source and take[-1][2] == start:
            take[-1] = (source, take[-1][1], start + unit)
        else:
            take.append((source, start, start + unit))
    missing = sum(1 for a in needed(rank) if owner(a) != me)
    slot = slot_atoms * unit
    return ParamPlan(name, dim, _runs(send), tuple(take), slot, len(group), (len(group) - 1) * slot * rest * itemsize,
                     missing * unit * rest * itemsize, per_src * unit)


def _cut(x, dim: int, start: int, stop: int):
    return x[start:stop] if dim == 0 else x[:, start:stop]


def apply_plans(plans: Sequence[Sequence[ParamPlan]], pieces: Sequence[Sequence[np.ndarray]]) -> List[List[np.ndarray]]:
    """numpy twin of `_ReshardBucket`, for tests: pieces[m][i] is member m's source piece of
    parameter i, for the members of one source group in tp order, and plans[m][i] their plans.
    Returns every member's destination pieces."""
    out = []
    for m, member_plans in enumerate(plans):
        row = []
        for i, p in enumerate(member_plans):
            if p.is_copy:
                row.append(pieces[m][i].copy())
                continue
            slots = [np.concatenate([_cut(pieces[j][i], p.dim, a, b) for a, b in plans[j][i].send], axis=p.dim)
                     if p.slot else None for j in range(len(plans))]
            parts = [_cut(pieces[m][i] if source < 0 else slots[source], p.dim, a, b) for source, a, b in p.take]
            row.append(np.concatenate(parts, axis=p.dim))
        out.append(row)
    return out


# ---------------------------------------------------------------------------------------
# Across layouts: the graphs
# ---------------------------------------------------------------------------------------


class _Contribution(nn.Cell):
    """This rank's part of a bucket's exchange: its send runs, flattened into one (1, n) row."""

    def __init__(self, plans: Sequence[ParamPlan]):
        super().__init__(auto_prefix=False)
        self.n = len(plans)
        self.dims = tuple(0 if p.dim is None else p.dim for p in plans)
        self.send = tuple(p.send for p in plans)

    def construct(self, src):
        parts = ()
        for i in range(self.n):
            for run in self.send[i]:
                parts = parts + (_cut(src[i], self.dims[i], run[0], run[1]).reshape(-1),)
        return ops.concat(parts).reshape(1, -1)


class _Assemble(nn.Cell):
    """A bucket's destination pieces from this rank's source pieces and the gathered slots
    (got: (g, contribution), one row per source-group member), assigned to the parameters.
    Only slices and concatenations along the split dim: no element gathers."""

    def __init__(self, dst: Sequence[Parameter], plans: Sequence[ParamPlan]):
        super().__init__(auto_prefix=False)
        self.dst = ms.ParameterTuple(dst)
        self.n = len(plans)
        self.copy = tuple(p.is_copy for p in plans)
        self.dims = tuple(0 if p.dim is None else p.dim for p in plans)
        self.take = tuple(p.take for p in plans)
        # where parameter i's slot sits in a member's contribution row, and the slot's shape
        offsets, shapes, at = [], [], 0
        for p, d in zip(plans, dst):
            shape = (1,)
            if p.slot:
                shape = [int(s) for s in d.shape]  # all dims but `dim` are whole in both pieces
                shape[p.dim] = p.slot
            size = int(np.prod(shape)) if p.slot else 0
            offsets.append((at, at + size))
            shapes.append(tuple(shape))
            at += size
        self.offsets, self.slot_shapes = tuple(offsets), tuple(shapes)

    def construct(self, src, got):
        out = ()
        for i in range(self.n):
            if self.copy[i]:
                value = src[i]
            else:
                lo, hi = self.offsets[i]
                pieces = ()
                for source, start, stop in self.take[i]:
                    whole = src[i] if source < 0 else got[source, lo:hi].reshape(self.slot_shapes[i])
                    pieces = pieces + (_cut(whole, self.dims[i], start, stop),)
                value = pieces[0] if len(pieces) == 1 else ops.concat(pieces, self.dims[i])
            out = out + (ops.assign(self.dst[i], value.astype(self.dst[i].dtype)),)
        return out


class _Bucket:
    """One bucket on one rank: contribution, one AllGather over the source tensor-parallel group
    (when any member lacks something), assembly. Three graphs, not one: with the collective
    inside a larger graph, mccl (MindSpore 2.10's CPU collectives) crashed on ~30 MB buffers
    of four ranks; fed from a graph output it does not."""

    def __init__(self, dst: Sequence[Parameter], plans: Sequence[ParamPlan], gather: Optional[nn.Cell]):
        self.exchange = gather is not None
        self.contribution = _Contribution(plans) if self.exchange else None
        self.gather = gather
        self.assemble = _Assemble(dst, plans)
        self.none = Tensor(np.zeros((1, 1), np.float32))

    def __call__(self, src) -> None:
        got = self.gather(self.contribution(src)) if self.exchange else self.none
        self.assemble(src, got)


class Reshard:
    """Policy (src_layout) -> inference or reference model (dst_layout), bucket by bucket.

    src and dst are this rank's pieces of the two models (tensor-parallel models of the two
    layouts); comm gives the source tensor-parallel group. Calling it returns per-rank metrics:
    seconds, bytes received, the minimum bytes, the largest bucket."""

    def __init__(self, src: nn.Cell, dst: nn.Cell, src_layout: ParallelLayout, dst_layout: ParallelLayout,
                 comm, full_shapes: Dict[str, Tuple[int, ...]], memory=None, prefix: str = "sync"):
        from mindgrpo.parallel.comm import AllGather

        src_p, dst_p = named_parameters(src), named_parameters(dst)
        _check_same_names(src_p, dst_p)
        group = comm.tp_group(src_layout)
        self.buckets = []
        self.received = self.minimum = 0
        for names in layer_buckets(list(src_p)):
            plans = [plan_parameter(n, full_shapes[n], src_p[n].itemsize, src_layout, dst_layout, comm.rank)
                     for n in names]
            exchange = any(p.slot for p in plans)
            graph = _Bucket([dst_p[n] for n in names], plans, AllGather(group) if exchange else None)
            size = nbytes([dst_p[n] for n in names]) + sum(p.received for p in plans)
            self.buckets.append((graph, tuple(src_p[n] for n in names), size))
            self.received += sum(p.received for p in plans)
            self.minimum += sum(p.minimum for p in plans)
        self.memory, self.prefix = memory, prefix
        self.max_bucket_bytes = max(b for _, _, b in self.buckets)
        self.total_bytes = sum(nbytes([dst_p[n]]) for n in dst_p)

    def __call__(self) -> Dict[str, float]:
        t0 = time.perf_counter()
        for graph, src, size in self.buckets:
            with self.memory.transient(size) if self.memory is not None else nullcontext():
                graph(ms.mutable(tuple(p.value() for p in src)))  # inputs, not constants: no recompiling
        k = self.prefix
        return {f"{k}/seconds": time.perf_counter() - t0, f"{k}/bytes": float(self.total_bytes),
                f"{k}/bytes_received": float(self.received), f"{k}/bytes_min": float(self.minimum),
                f"{k}/max_bucket_bytes": float(self.max_bucket_bytes)}

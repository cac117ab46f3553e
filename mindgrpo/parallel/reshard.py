"""Moving policy weights into the inference (or reference) model across layouts: any two layouts
over the same world (tp 2 -> 1 with dp 2, 1 -> 2, dp2 x tp2 -> tp4, pipeline stages on either side,
...), bucket by bucket (a decoder layer, or the embedding, the final norm, the head; consecutive
ones joined up to a byte budget, rl_config.weight_sync_bucket_mb), inside compiled graphs, never
through the host or the disk; the extra device memory at any moment is one bucket. What moves
where is the plan (`mindgrpo.parallel.reshard_plan`); this module runs it: per bucket, each
exchange's contribution, its collective, then the assembly of the destination pieces.

Bytes per rank are logged against the minimum the two layouts require. (MindSpore 2.10's CPU
collectives have no Send/Receive, and AllGather and Broadcast only over the whole world: within a
group they run as sums.) Same layout: `mindgrpo.parallel.weight_sync`.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from mindgrpo.memory.swap import nbytes
from mindgrpo.parallel.comm import AllGather, AllReduce
from mindgrpo.parallel.layout import ParallelLayout, num_layers_of
from mindgrpo.parallel.reshard_plan import (ParamPlan, bucket_exchanges, cut, exchange_bytes, plan_parameter,
                                            row_elements, sync_buckets)
from mindgrpo.parallel.weight_sync import named_parameters


class _Contribution(nn.Cell):
    """This rank's row of one exchange, (1, width): its blocks of the exchange's parameters (the
    runs it gives from its piece, -0.0 elsewhere, along dim), flattened one after another, then
    -0.0 up to the row's width (gather: the longest member's row). src: this rank's held
    parameters of the bucket; index[i]: parameter i's position there (-1: not held)."""

    def __init__(self, plans: Sequence[ParamPlan], shapes: Sequence[Sequence[int]], index: Sequence[int],
                 width: int):
        super().__init__(auto_prefix=False)
        self.index = tuple(index)
        self.dims = tuple(p.dim for p in plans)
        segments, used = [], 0
        for p, full in zip(plans, shapes):
            row = []
            for start, length in p.fill():
                shape = [int(v) for v in full]
                shape[p.dim] = length
                row.append((start, start + length, tuple(shape)))  # start -1: -0.0 of that shape
            segments.append(tuple(row))
            used += p.width * row_elements(p, full)
        self.segments = tuple(segments)
        self.n = len(plans)
        self.pad = width - used

    def construct(self, src):
        parts = ()
        for i in range(self.n):
            runs = ()
            for start, stop, shape in self.segments[i]:
                if start < 0:
                    runs = runs + (ops.zeros(shape, ms.float32) * -1.0,)  # x + (-0.0) == x, bit for bit
                else:
                    runs = runs + (cut(src[self.index[i]], self.dims[i], start, stop),)
            if runs:
                whole = runs[0] if len(runs) == 1 else ops.concat(runs, self.dims[i])
                parts = parts + (whole.reshape(-1),)
        if self.pad > 0:
            parts = parts + (ops.zeros((self.pad,), ms.float32) * -1.0,)
        return (parts[0] if len(parts) == 1 else ops.concat(parts)).reshape(1, -1)


class _Assemble(nn.Cell):
    """A bucket's destination pieces from this rank's held source pieces (src) and the exchanges'
    results (rows[e]: (members, width) gathered or (1, width) summed), assigned to the parameters
    this rank's destination stage holds (dst). Only slices and concatenations along dim: no
    element gathers.

    takes[i]: the pieces of needed parameter i in order, each (-1, src index, start, stop) from
    this rank's source piece or (e, row, lo, hi, block shape, start, stop): the block at [lo, hi)
    of row `row` of exchange e, reshaped, then cut [start, stop) along dim."""

    def __init__(self, dst: Sequence[Parameter], dims: Sequence[int], takes):
        super().__init__(auto_prefix=False)
        self.dst = ms.ParameterTuple(dst)
        self.n = len(dst)
        self.dims, self.takes = tuple(dims), tuple(takes)

    def construct(self, src, rows):
        out = ()
        for i in range(self.n):
            pieces = ()
            for t in self.takes[i]:
                if t[0] < 0:
                    pieces = pieces + (cut(src[t[1]], self.dims[i], t[2], t[3]),)
                else:  # ops.slice: rows[e][row, lo:hi] (an integer index) is ~50x slower on CPU
                    block = ops.slice(rows[t[0]], (t[1], t[2]), (1, t[3] - t[2])).reshape(t[4])
                    pieces = pieces + (cut(block, self.dims[i], t[5], t[6]),)
            value = pieces[0] if len(pieces) == 1 else ops.concat(pieces, self.dims[i])
            out = out + (ops.assign(self.dst[i], value.astype(self.dst[i].dtype)),)
        return out


class _Bucket:
    """One bucket on one rank: per exchange (group and mode, in one global order) a contribution
    and an AllGather or a sum over the group; then the assembly. Separate graphs: with the
    collective inside a larger graph, mccl (MindSpore 2.10's CPU collectives) crashed on ~30 MB
    buffers of four ranks; fed from a graph output it does not. A rank takes part in the
    exchanges of its groups whether or not its stages hold the bucket's parameters.

    plans, shapes: every parameter of the bucket; dst: the destination parameters of those this
    rank needs, in order; group_of(ranks) -> the comm Group."""

    def __init__(self, dst: Sequence[Parameter], plans: Sequence[ParamPlan], shapes: Sequence[Sequence[int]],
                 group_of):
        held = [p.held for p in plans]
        src_index = [sum(held[:i]) if held[i] else -1 for i in range(len(plans))]
        self.exchanges = []  # (contribution graph, collective)
        blocks = {}  # (parameter, member) -> (exchange, row, lo, hi, block shape)
        for e, (group, mode, idx, where, width) in enumerate(bucket_exchanges(plans, shapes)):
            blocks.update({key: (e,) + at for key, at in where.items()})
            collective = AllGather(group_of(group)) if mode == "gather" else AllReduce(group_of(group))
            self.exchanges.append((_Contribution([plans[i] for i in idx], [shapes[i] for i in idx],
                                                 [src_index[i] for i in idx], width), collective))
        takes = []
        for i, p in enumerate(plans):
            if not p.needed:
                continue
            row = []
            for source, start, stop in p.take:
                if source < 0:
                    row.append((-1, src_index[i], start, stop))
                else:
                    row.append(blocks[(i, source)] + (start, stop))
            takes.append(tuple(row))
        self.assemble = _Assemble(dst, [p.dim for p in plans if p.needed], takes) if dst else None
        self.none = (Tensor(np.zeros((1, 1), np.float32)),)

    def __call__(self, src: tuple) -> None:
        # never an empty tuple: MindSpore 2.10 then drops the first assignment of the graph (a rank
        # holding none of a bucket's parameters kept its old value of the first one; measured)
        src = ms.mutable(tuple(src) + self.none)  # inputs, not constants: no recompiling
        rows = tuple(collective(contribution(src)) for contribution, collective in self.exchanges) or self.none
        if self.assemble is not None:
            self.assemble(src, ms.mutable(rows))  # a plain tuple of tensors would be constants: a compile per call


class Reshard:
    """Policy (src_layout) -> inference or reference model (dst_layout), bucket by bucket.

    src and dst are this rank's pieces of the two models (tensor-parallel models of the two
    layouts, holding their pipeline stage's parameters); comm gives the exchange groups;
    bucket_bytes joins consecutive buckets up to that many bytes of full fp32 parameters
    (`reshard_plan.sync_buckets`; 0: one per decoder layer). Calling it returns per-rank metrics:
    seconds, bytes received, the minimum bytes, the largest bucket. names: only these parameters move (LoRA's
    adapters: the base weights were loaded on both sides); full_shapes must hold them."""

    METRICS = ("seconds", "bytes", "bytes_received", "bytes_min", "max_bucket_bytes")  # after "<prefix>/"

    @classmethod
    def metric_names(cls, prefix: str = "sync") -> tuple:
        """The keys of each call's metrics for a sync logged under `prefix`."""
        return tuple(f"{prefix}/{m}" for m in cls.METRICS)

    def __init__(self, src: nn.Cell, dst: nn.Cell, src_layout: ParallelLayout, dst_layout: ParallelLayout,
                 comm, full_shapes: Dict[str, Tuple[int, ...]], memory=None, prefix: str = "sync",
                 bucket_bytes: int = 0, names: Optional[Sequence[str]] = None):
        src_p, dst_p = named_parameters(src), named_parameters(dst)
        if names is not None:
            missing = sorted(set(names) - set(full_shapes))
            if missing:
                raise ValueError(f"weight sync: no full shape for the parameters to move: {missing[:5]}")
            full_shapes = {n: full_shapes[n] for n in names}
            src_p = {n: p for n, p in src_p.items() if n in full_shapes}
            dst_p = {n: p for n, p in dst_p.items() if n in full_shapes}
        for side, params in (("source", src_p), ("destination", dst_p)):
            unknown = sorted(set(params) - set(full_shapes))
            if unknown:
                raise ValueError(f"weight sync: the {side} model has parameters outside the full shapes: {unknown[:5]}")
        num_layers = num_layers_of(list(full_shapes))
        self.buckets = []
        self.received = self.minimum = 0
        for names in sync_buckets(full_shapes, src_layout, bucket_bytes):
            plans = [plan_parameter(n, full_shapes[n], 4, src_layout, dst_layout, comm.rank, num_layers)
                     for n in names]
            for n, p in zip(names, plans):
                if p.held != (n in src_p) or p.needed != (n in dst_p):
                    raise ValueError(f"weight sync: parameter {n!r} is {'' if n in src_p else 'not '}in the source "
                                     f"and {'' if n in dst_p else 'not '}in the destination model, which does not "
                                     f"match {src_layout} -> {dst_layout} on rank {comm.rank}")
            dst_b = [dst_p[n] for n, p in zip(names, plans) if p.needed]
            shapes = [full_shapes[n] for n in names]
            graph = _Bucket(dst_b, plans, shapes, comm.group)
            received = exchange_bytes(plans, shapes)
            size = nbytes(dst_b) + received
            self.buckets.append((graph, tuple(src_p[n] for n, p in zip(names, plans) if p.held), size))
            self.received += received
            self.minimum += sum(p.minimum for p in plans)
        self.memory, self.prefix = memory, prefix
        self.max_bucket_bytes = max(b for _, _, b in self.buckets)
        self.total_bytes = sum(nbytes([dst_p[n]]) for n in dst_p)

    def __call__(self) -> Dict[str, float]:
        t0 = time.perf_counter()
        for graph, src, size in self.buckets:
            with self.memory.transient(size) if self.memory is not None else nullcontext():
                graph(tuple(p.value() for p in src))
        values = (time.perf_counter() - t0, float(self.total_bytes), float(self.received), float(self.minimum),
                  float(self.max_bucket_bytes))
        return dict(zip(self.metric_names(self.prefix), values))

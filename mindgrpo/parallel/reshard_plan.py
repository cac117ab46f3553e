"""The plan of resharding: which pieces of every parameter each rank gives and takes when the
policy's weights move from one parallel layout to another (plain numpy: no MindSpore, no processes).

Along a parameter's split dim the two layouts cut the full tensor into tp_src and tp_dst pieces;
their common refinement cuts it into lcm(tp_src, tp_dst) "atoms" (a parameter tensor parallelism
replicates, such as a norm, is one atom). A destination rank needs the atoms of its piece when its
destination stage holds the parameter. Its source replica (the ranks of its data-parallel replica
over every stage and tensor-parallel piece) holds every atom exactly once; the atoms a rank lacks
come from their holders in the replica. Givers and takers of a parameter form exchange groups
(connected sets: `_Flow.group`). Per bucket and group, one collective moves the lacking atoms: an
AllGather of every member's slot when the givers give about equally, or the sum of one buffer that
only the givers fill in when few give to many (`_exchange_mode`); each member then picks its piece
from what it holds and what arrived.

    plan_parameter(name, shape, itemsize, src, dst, rank, num_layers)   one rank's ParamPlan
    sync_buckets(shapes, src, budget)   the buckets moved one at a time
    exchange_groups(src, dst)           every group an exchange may use (`comm.init_comm` creates them)
    exchange_bytes(plans, shapes)       bytes one rank receives in a bucket's exchanges
    apply_plans(plans, pieces, shapes)  the numpy twin of the bucket graphs (`parallel/reshard.py`), for tests

So every pair of layouts is tested without processes, and the memory plan (`memory/plan.py`)
counts a sync's bytes without building a graph. Bytes per rank are set against the minimum the
two layouts require (the atoms a rank needs and does not hold): tp2 -> tp1 and tp1 -> tp2 meet
it, and so do the takers when stages go to their tensor-parallel pieces (train tp4 x pp2 -> infer
dp2 x tp4 goes pair by pair); dp2 x tp2 -> tp4 meets it on the receivers, plus the padding an
AllGather sends back, and a giver receives the buffer of a sum.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from mindgrpo.parallel.layout import ParallelLayout, num_layers_of
from mindgrpo.utils.spans import SPAN


def layer_buckets(names: Sequence[str]) -> List[List[str]]:
    """Group parameter names by decoder layer; embeddings, final norm and head form their own."""
    buckets: Dict[str, List[str]] = {}
    for n in names:
        m = re.match(r"model\.layers\.(\d+)\.", n)
        key = f"layer{m.group(1)}" if m else n
        buckets.setdefault(key, []).append(n)
    return list(buckets.values())


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

    dim     the dim pieces are cut along: the split dim, or 0 for a parameter both layouts
            replicate over tensor parallelism (it moves whole, between pipeline stages)
    mode    how `group` exchanges the atoms some member lacks (`_exchange_mode`):
              "gather"  every member contributes the atoms it gives (`gives` elements along dim,
                        its block), AllGather: each member's row packs its blocks of a bucket's
                        parameters one after another (`_Bucket`), so rows carry data both ways
              "sum"     one buffer of `width` elements with every lacking atom at its place;
                        each member fills in the atoms it gives and -0.0 elsewhere, AllReduce
                        (x + (-0.0) is x, bit for bit): one row, every atom
    gives   elements along dim each member of `group` gives (gather)
    width   elements along dim of this rank's contribution: its block (gather), the buffer (sum)
    give    (contribution start, piece start, length) runs this rank copies from its source piece
    take    the destination piece, in order, as (source, start, stop): source -1 is this rank's
            source piece, j >= 0 member j's block (gather) or the buffer (sum, j = 0); () when the
            destination stage of this rank does not hold the parameter
    received, minimum   bytes of this parameter that reach this rank (the other members' blocks,
            or the buffer; a bucket's AllGather also pads each row to the longest:
            `exchange_bytes`), and the least it could receive (atoms it lacks)"""

    name: str
    dim: int
    mode: str
    give: Tuple[Tuple[int, int, int], ...]
    take: Tuple[Tuple[int, int, int], ...]
    width: int
    group: Tuple[int, ...]  # the ranks exchanging this parameter with this one (itself included)
    received: int
    minimum: int
    source_len: int = 0  # elements along dim of this rank's source piece (0: it holds none)
    split: bool = True  # False: tensor parallelism replicates it
    gives: Tuple[int, ...] = ()

    @property
    def exchanged(self) -> bool:
        """The group runs an exchange for this parameter (this rank takes part, giving or not)."""
        return sum(self.gives) > 0 if self.mode == "gather" else self.width > 0

    @property
    def held(self) -> bool:
        """This rank's source model has the parameter."""
        return self.source_len > 0

    @property
    def needed(self) -> bool:
        """This rank's destination model has the parameter."""
        return bool(self.take)

    @property
    def is_copy(self) -> bool:
        """The destination piece is this rank's source piece, unchanged."""
        return self.take == ((-1, 0, self.source_len),)

    def fill(self) -> Tuple[Tuple[int, int], ...]:
        """This rank's contribution, in order, as (piece start, length) segments; piece start -1
        is a run of -0.0 (padding, or the atoms other members give)."""
        out, at = [], 0
        for b, a, n in self.give:
            if b > at:
                out.append((-1, b - at))
            out.append((a, n))
            at = b + n
        if self.width > at:
            out.append((-1, self.width - at))
        return tuple(out)


def _exchange_mode(members: int, slot_atoms: int, wanted_atoms: int) -> str:
    """The cheaper collective by the ring cost model (an AllGather of T bytes moves T (g-1)/g per
    rank, an AllReduce 2 T (g-1)/g): slots for every member when the givers give about equally
    (tp2 -> tp1), one shared buffer when few give to many (a stage's tensor-parallel pieces to
    every data-parallel replica)."""
    return "gather" if members * slot_atoms <= 2 * wanted_atoms else "sum"


@dataclass(frozen=True)
class _Flow:
    """Who holds and who needs which atoms of a parameter placed on (stage_src, stage_dst), for
    one source replica: ranks only, no shapes."""

    src: ParallelLayout
    dst: ParallelLayout
    dp_idx: int  # the source replica
    stage_src: int
    stage_dst: int
    split: bool  # False: tensor parallelism replicates the parameter (one atom)

    @property
    def n_atoms(self) -> int:
        return math.lcm(self.src.tp, self.dst.tp) if self.split else 1

    @property
    def per_src(self) -> int:
        return self.n_atoms // self.src.tp if self.split else 1

    @property
    def per_dst(self) -> int:
        return self.n_atoms // self.dst.tp if self.split else 1

    @property
    def members(self) -> List[int]:
        return self.src.replica_group(self.src.rank(self.dp_idx, 0))

    def needed(self, r: int) -> List[int]:
        if self.dst.pp > 1 and self.dst.stage(r) != self.stage_dst:
            return []
        j = self.dst.coords(r)[1] if self.split else 0
        return list(range(j * self.per_dst, (j + 1) * self.per_dst))

    def has(self, r: int, atom: int) -> bool:
        return self.src.stage(r) == self.stage_src and (not self.split or self.src.coords(r)[1] == atom // self.per_src)

    def owner(self, atom: int) -> int:
        """The rank that contributes the atom."""
        return self.src.rank(self.dp_idx, atom // self.per_src if self.split else 0, self.stage_src)

    def group(self, rank: int) -> List[int]:
        """The ranks rank exchanges this parameter with: its connected set of givers and takers
        (a rank that neither gives nor takes stays alone), so the exchange reaches no rank that
        has no part in it."""
        parent = {r: r for r in self.members}

        def root(r):
            while parent[r] != r:
                parent[r] = parent[parent[r]]
                r = parent[r]
            return r

        for r in self.members:
            for a in self.needed(r):
                if not self.has(r, a):
                    parent[root(r)] = root(self.owner(a))
        return sorted(m for m in self.members if root(m) == root(rank))


def _flow(src: ParallelLayout, dst: ParallelLayout, rank: int, stage_src: int, stage_dst: int, split: bool) -> _Flow:
    return _Flow(src, dst, src.coords(rank)[0], stage_src, stage_dst, split)


def exchange_groups(src: ParallelLayout, dst: ParallelLayout) -> List[Tuple[int, ...]]:
    """Every group of more than one rank that resharding src -> dst may exchange over, for any
    model: `init_comm` creates them at start-up."""
    if src.world_size != dst.world_size:
        raise ValueError(f"resharding needs one world: {src} has {src.world_size} ranks, {dst} {dst.world_size}")
    out = set()
    for rank in range(src.world_size):
        for stage_src in range(src.pp):
            for stage_dst in range(dst.pp):
                for split in (True, False):
                    group = tuple(_flow(src, dst, rank, stage_src, stage_dst, split).group(rank))
                    if len(group) > 1:
                        out.add(group)
    return sorted(out)


def plan_parameter(name: str, shape: Sequence[int], itemsize: int, src: ParallelLayout, dst: ParallelLayout,
                   rank: int, num_layers: Optional[int] = None) -> ParamPlan:
    """The plan of parameter `name` (full shape `shape`) for `rank` (see the module docstring).
    num_layers (the model's decoder layers) places parameters on pipeline stages; needed when
    either layout has more than one."""
    if src.world_size != dst.world_size:
        raise ValueError(f"resharding needs one world: {src} has {src.world_size} ranks, {dst} {dst.world_size}")
    if num_layers is None and (src.pp > 1 or dst.pp > 1):
        raise ValueError("resharding between layouts with pipeline stages needs num_layers")
    dst.shard_shape(name, shape)  # LayoutError if the destination cannot split it
    src.shard_shape(name, shape)
    split_dim = src.param_split(name)
    dim = 0 if split_dim is None else split_dim
    flow = _flow(src, dst, rank, src.param_stage(name, num_layers) if src.pp > 1 else 0,
                 dst.param_stage(name, num_layers) if dst.pp > 1 else 0, split_dim is not None)
    full = int(shape[dim])
    rest = int(np.prod([s for k, s in enumerate(shape) if k != dim]))
    unit = full // flow.n_atoms
    group = flow.group(rank)
    wanted = sorted({a for m in group for a in flow.needed(m) if not flow.has(m, a)})
    contrib = [[a for a in wanted if flow.owner(a) == m] for m in group]
    slot_atoms = max(len(c) for c in contrib)
    mode = _exchange_mode(len(group), slot_atoms, len(wanted))
    me = group.index(rank)
    first_atom = src.coords(rank)[1] * flow.per_src if flow.split else 0

    def place(a):  # (row, start) of a lacking atom in the exchange's result
        if mode == "gather":
            j = group.index(flow.owner(a))
            return j, contrib[j].index(a) * unit
        return 0, wanted.index(a) * unit

    give: List[Tuple[int, int, int]] = []
    for a in contrib[me]:
        b, piece = place(a)[1], (a - first_atom) * unit
        if give and give[-1][0] + give[-1][2] == b and give[-1][1] + give[-1][2] == piece:
            give[-1] = (give[-1][0], give[-1][1], give[-1][2] + unit)
        else:
            give.append((b, piece, unit))
    take: List[Tuple[int, int, int]] = []
    for a in flow.needed(rank):
        source, start = (-1, (a - first_atom) * unit) if flow.has(rank, a) else place(a)
        if take and take[-1][0] == source and take[-1][2] == start:
            take[-1] = (source, take[-1][1], start + unit)
        else:
            take.append((source, start, start + unit))
    missing = sum(1 for a in flow.needed(rank) if not flow.has(rank, a))
    gives = tuple(len(c) * unit for c in contrib) if mode == "gather" else ()
    width = gives[me] if mode == "gather" else len(wanted) * unit
    received = sum(gives) - gives[me] if mode == "gather" else width
    holds = src.stage(rank) == flow.stage_src
    return ParamPlan(name, dim, mode, tuple(give), tuple(take), width, tuple(group), received * rest * itemsize,
                     missing * unit * rest * itemsize, flow.per_src * unit if holds else 0, flow.split, gives)


def merge_buckets(buckets: Sequence[List[str]], sizes: Sequence[int], budget: int) -> List[List[str]]:
    """Consecutive buckets joined while their bytes together stay within `budget` and their parameters
    within `utils/spans.SPAN` (a bucket's graphs loop over its parameters); a bucket larger than the
    budget stays alone, and budget 0 keeps every bucket as it is."""
    out: List[List[str]] = []
    total = 0
    for bucket, size in zip(buckets, sizes):
        if out and total + size <= budget and len(out[-1]) + len(bucket) <= SPAN:
            out[-1] = out[-1] + list(bucket)
            total += size
        else:
            out.append(list(bucket))
            total = size
    return out


def sync_buckets(shapes: Dict[str, Sequence[int]], src: ParallelLayout, budget: int = 0,
                 itemsize: int = 4) -> List[List[str]]:
    """The buckets resharding moves one at a time: a decoder layer (or the embedding, the final
    norm, the head). With pipeline stages on the source side, one bucket of every stage together,
    largest with largest (the embedding with the head, layer with layer), so that each exchange
    carries data both ways (a stage gives what it holds and takes the other stages' share) instead
    of a pair's one-way traffic padded back. Then consecutive ones (pairs with stages) joined up to
    `budget` bytes of the full parameters, `itemsize` bytes an element (`merge_buckets`): fewer,
    larger collectives and fewer graphs to compile. Full shapes only: the same on every rank."""
    buckets = layer_buckets(list(shapes))

    def size(bucket):
        return sum(int(np.prod(shapes[n])) for n in bucket)

    if src.pp > 1:
        num_layers = num_layers_of(list(shapes))
        per_stage = [sorted((b for b in buckets if src.param_stage(b[0], num_layers) == s), key=size, reverse=True)
                     for s in range(src.pp)]
        rounds = max(len(b) for b in per_stage)
        buckets = [[n for stage in per_stage if k < len(stage) for n in stage[k]] for k in range(rounds)]
    return merge_buckets(buckets, [itemsize * size(b) for b in buckets], budget)


def row_elements(p: ParamPlan, shape: Sequence[int]) -> int:
    """Elements per index along the plan's dim."""
    return int(np.prod([v for k, v in enumerate(shape) if k != p.dim]))


def bucket_exchanges(plans: Sequence[ParamPlan], shapes: Sequence[Sequence[int]]):
    """A bucket's exchanges, one per (group, mode) in one global order, and how their rows are laid
    out: yields group, mode, the indices of its parameters, blocks {(i, j): (row, lo, hi, block
    shape)} (member j's block of parameter i sits at [lo, hi) of row `row`: member j's row of an
    AllGather, the one buffer of a sum) and the row width (gather: the longest member's row). The
    same on every member of the group."""
    for group, mode in sorted({(p.group, p.mode) for p in plans if p.exchanged}):
        idx = [i for i, p in enumerate(plans) if p.exchanged and (p.group, p.mode) == (group, mode)]
        lengths, blocks = [0] * len(group), {}
        for i in idx:
            p, shape = plans[i], shapes[i]
            for j in range(len(group)):
                along = p.gives[j] if mode == "gather" else p.width
                block_shape = [int(v) for v in shape]
                block_shape[p.dim] = along
                size = along * row_elements(p, shape)
                blocks[(i, j)] = (j if mode == "gather" else 0, lengths[j], lengths[j] + size, tuple(block_shape))
                lengths[j] += size
        yield group, mode, idx, blocks, max(lengths) if mode == "gather" else lengths[0]


def exchange_bytes(plans: Sequence[ParamPlan], shapes: Sequence[Sequence[int]], itemsize: int = 4) -> int:
    """Bytes one rank receives in a bucket's exchanges: an AllGather brings every other member's
    row (each padded to the longest), a sum the whole buffer."""
    return itemsize * sum((len(group) - 1) * width if mode == "gather" else width
                          for group, mode, _, _, width in bucket_exchanges(plans, shapes))


def cut(x, dim: int, start: int, stop: int):
    """x[start:stop] along dim (0 or 1), numpy or graph. The whole of dim is x itself: MindSpore
    2.10's CPU kernel takes ~20x longer for a slice that covers everything (488 against 22 ms for
    a (16000, 1024) fp32 tensor) than for one a row shorter."""
    if start == 0 and stop == x.shape[dim]:
        return x
    return x[start:stop] if dim == 0 else x[:, start:stop]


def apply_plans(plans: Dict[int, Sequence[ParamPlan]], pieces: Dict[int, Sequence[Optional[np.ndarray]]],
                shapes: Sequence[Sequence[int]]) -> Dict[int, List[Optional[np.ndarray]]]:
    """numpy twin of the bucket graphs, for tests: for every rank of a source replica group,
    plans[r][i] is its plan of parameter i, pieces[r][i] its source piece (None where its stage
    does not hold it), shapes[i] the full shapes. Returns every rank's destination pieces (None
    where its destination stage does not hold the parameter)."""
    out = {}
    for r, rank_plans in plans.items():
        row = []
        for i, p in enumerate(rank_plans):
            if not p.needed:
                row.append(None)
            elif p.is_copy:
                row.append(pieces[r][i].copy())
            else:
                def block(j):  # member j's block (gather), or the summed buffer (sum)
                    if p.mode == "sum":
                        return sum(_contribution(plans[m][i], pieces[m][i], shapes[i]) for m in p.group)
                    giver = p.group[j]
                    return _contribution(plans[giver][i], pieces[giver][i], shapes[i])

                parts = [cut(pieces[r][i] if source < 0 else block(source), p.dim, a, b) for source, a, b in p.take]
                row.append(np.concatenate(parts, axis=p.dim))
        out[r] = row
    return out


def _contribution(plan: ParamPlan, piece: Optional[np.ndarray], full_shape: Sequence[int]) -> np.ndarray:
    """A member's contribution to the exchange of one parameter (numpy): its given runs, -0.0 elsewhere."""
    parts = []
    for start, n in plan.fill():
        if start < 0:
            shape = list(full_shape)
            shape[plan.dim] = n
            parts.append(np.full(shape, -0.0, np.float32))
        else:
            parts.append(cut(piece, plan.dim, start, start + n))
    return np.concatenate(parts, axis=plan.dim)

"""The process world of one msrun-launched stage, its groups, and the collectives as graph cells.

This is the only module that imports `mindspore.communication`; the model, the algorithm and
the trainer reach collectives through the cells and helpers here.

    comm = init_parallel(cfg)          # init, check the layouts against the world, create the groups
    comm.train_tp, comm.train_dp       # this rank's groups in the training layout (Group)
    comm.infer_tp, comm.infer_dp       # ... and in the inference layout
    AllReduce(group)(x)                # sum over the group, inside a graph
    AllGather(group)(x)                # pieces concatenated on dim 0, in rank order
    comm.host_sum(array, group)        # a small host array summed over a group (one tiny graph)
    host_gather(comm, value, group)    # every member's picklable value on every member, in group order

MindSpore's CPU backend (mccl) has AllReduce(SUM) on any group but AllGather and Broadcast only on
the world group, and no ReduceScatter, AlltoAll or Send/Receive. So on CPU, `AllGather` over a
group smaller than the world is an AllReduce of a buffer where every other rank's slot holds
-0.0: x + (-0.0) == x for every float x (+0.0 and -0.0 included), so the result is bit-exact
(mccl flushes subnormal floats to zero on the way; weights are never subnormal). On Ascend
the real HCCL AllGather runs.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

from mindgrpo.parallel.layout import LayoutError, ParallelLayout, reward_model_layout
from mindgrpo.parallel.reshard_plan import exchange_groups
from mindgrpo.utils import heartbeat
from mindgrpo.utils.process import die_with_parent

logger = logging.getLogger(__name__)

_CREATED: Dict[Tuple[int, ...], str] = {}  # rank set -> group name, once per process


@dataclass(frozen=True)
class Group:
    """A set of world ranks as seen from one member. name is None for a group of one rank
    (every collective over it is the identity) and MindSpore's world group name for all ranks."""

    ranks: Tuple[int, ...]
    rank: int  # this process's world rank
    name: Optional[str]
    world: bool = False  # the group is the whole world

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def index(self) -> int:
        """This rank's position in the group (its piece, for a tensor-parallel group)."""
        return self.ranks.index(self.rank)


def single_group() -> Group:
    """The group of a single-process run: one rank, no collectives."""
    return Group((0,), 0, None, True)


@dataclass
class Comm:
    rank: int
    world: int
    device: str  # "CPU" | "Ascend" | "GPU"
    train: ParallelLayout
    infer: ParallelLayout
    ref: Optional[ParallelLayout] = None  # None when there is no reference model (beta == 0)
    _host_graphs: Dict[tuple, nn.Cell] = field(default_factory=dict, repr=False)

    def group(self, ranks: Sequence[int]) -> Group:
        ranks = tuple(sorted(int(r) for r in ranks))
        if self.rank not in ranks:
            raise ValueError(f"rank {self.rank} is not in group {list(ranks)}")
        if len(ranks) == 1:
            return Group(ranks, self.rank, None)
        if ranks in _CREATED:  # a group of some ranks (also the world of a `within` Comm: not MindSpore's world group)
            return Group(ranks, self.rank, _CREATED[ranks])
        if len(ranks) == self.world:
            return Group(ranks, self.rank, _world_group_name(), True)
        if ranks not in _CREATED:
            raise RuntimeError(f"group {list(ranks)} was not created at start-up (init_parallel creates "
                               "the groups of every layout: see init_comm)")
        return Group(ranks, self.rank, _CREATED[ranks])

    def within(self, ranks: int) -> "Comm":
        """This Comm seen as a world of the first `ranks` ranks (a separate placement's training group, created at
        start-up): what is written over "the world" (barriers, sharded checkpoints) runs over them only."""
        ranks = int(ranks)
        if ranks > 1 and tuple(range(ranks)) not in _CREATED:
            raise RuntimeError(f"group {list(range(ranks))} was not created at start-up")
        return Comm(self.rank, ranks, self.device, self.train, self.infer, self.ref, self._host_graphs)

    def tp_group(self, layout: ParallelLayout) -> Group:
        return self.group(layout.tp_group(self.rank))

    def dp_group(self, layout: ParallelLayout) -> Group:
        return self.group(layout.dp_group(self.rank))

    @property
    def train_tp(self) -> Group:
        return self.tp_group(self.train)

    @property
    def train_dp(self) -> Group:
        return self.dp_group(self.train)

    @property
    def infer_tp(self) -> Group:
        return self.tp_group(self.infer)

    @property
    def infer_dp(self) -> Group:
        return self.dp_group(self.infer)

    def host_sum(self, values: np.ndarray, group: Group) -> np.ndarray:
        """values summed elementwise over the group's ranks (every member calls this with the
        same shape). float32 on the wire: integers must stay below 2**24 to come back exact.
        Compiles one tiny graph per padded size, so keep the sizes few."""
        values = np.asarray(values)
        if group.size == 1:
            return values.copy()
        flat = values.astype(np.float32).reshape(-1)
        size = max(256, 1 << int(np.ceil(np.log2(max(flat.size, 1)))))  # few distinct shapes
        key = (group.ranks, size)
        if key not in self._host_graphs:
            self._host_graphs[key] = AllReduce(group)
        padded = np.zeros(size, np.float32)
        padded[:flat.size] = flat
        out = self._host_graphs[key](Tensor(padded)).asnumpy()[:flat.size]
        heartbeat.beat()
        return out.reshape(values.shape).astype(values.dtype)

    def barrier(self, group: Optional[Group] = None) -> None:
        """Every rank of `group` (default: the world) waits here for every other (a one-number sum over it)."""
        self.host_sum(np.zeros(1, np.float32), self.group(range(self.world)) if group is None else group)


# a value's bytes go through host_sum as float32: its length (one float32 each) is exact below this
MAX_VALUE_BYTES = 1 << 24


def host_gather(comm: "Comm", value, group: Group) -> List[object]:
    """Every member's `value` (any picklable object: it is this job's own data; None: the member gives nothing) on
    every member, in group order (None where a member gave nothing). Two sums over the group (`Comm.host_sum`), each
    member filling its own slots and the others zeros, so the bytes arrive exactly: the members' lengths, then their
    pickled bytes end to end. The separate placement's value meeting and the conversations of data-parallel
    inference replicas."""
    data = np.frombuffer(pickle.dumps(value), np.uint8) if value is not None else np.zeros(0, np.uint8)
    if len(data) >= MAX_VALUE_BYTES:
        raise ValueError(f"a host value of {len(data)} bytes is over 2**24, which a sum of float32 does not carry "
                         "exactly (with conversations: lower generate_config.tool_response_max_tokens or the batch)")
    lengths = np.zeros(group.size, np.float32)
    lengths[group.index] = len(data)
    lengths = comm.host_sum(lengths, group).astype(np.int64)
    ends = np.cumsum(lengths)
    flat = np.zeros(int(ends[-1]), np.float32)
    flat[ends[group.index] - len(data):ends[group.index]] = data
    flat = comm.host_sum(flat, group).astype(np.uint8)
    return [pickle.loads(flat[end - size:end].tobytes()) if size else None for end, size in zip(ends, lengths)]


def _world_group_name() -> str:
    from mindspore.communication import GlobalComm

    return GlobalComm.WORLD_COMM_GROUP


def layouts_of(cfg) -> Tuple[ParallelLayout, ParallelLayout, Optional[ParallelLayout]]:
    """(training, inference, reference or None) layouts of a GRPOConfig."""
    train = ParallelLayout.from_config(cfg.actor_config.parallel_config)
    infer = ParallelLayout.from_config(cfg.generate_config.parallel_config)
    if infer.pp != 1:
        raise LayoutError(f"generate_config.parallel_config.pipeline_stage = {infer.pp}: generation runs without "
                          "pipeline stages (use data_parallel and model_parallel)")
    # a reference model runs with beta > 0, but not with LoRA (the policy with its adapters off is the reference)
    has_ref = cfg.rl_config.beta > 0 and cfg.actor_config.lora_rank == 0
    ref = ParallelLayout.from_config(cfg.ref_config.parallel_config) if has_ref else None
    return train, infer, ref


def reward_model_layouts(cfg, world: int) -> List[ParallelLayout]:
    """The layouts of reward_config.reward_models whose `model_parallel` is set (`parallel/replica_scores.py`): their
    groups are created at start-up with the others'. The others take the policy's tensor-parallel groups."""
    return [reward_model_layout(world, e.model_parallel) for e in cfg.reward_config.reward_models
            if e.model_parallel is not None]


def check_layouts(cfg, world: int) -> None:
    """LayoutError naming the config section whose data_parallel*model_parallel*pipeline_stage
    is not the world size."""
    train, infer, ref = layouts_of(cfg)
    train.check_world(world, "actor_config.parallel_config")
    infer.check_world(world, "generate_config.parallel_config")
    if ref is not None:
        ref.check_world(world, "ref_config.parallel_config (the reference model runs when rl_config.beta > 0 "
                        "without LoRA)")


def world_size_from_env() -> Optional[int]:
    """The world size msrun announces to its workers, before any communication starts."""
    value = os.environ.get("MS_WORKER_NUM") or os.environ.get("RANK_SIZE")
    return int(value) if value else None


# MindSpore's CPU collectives (mccl) give up on a peer that has not arrived after this many seconds
# (30 by default, measured: "Ring ReduceScatter wait receiving [..] failed"); read at init
CPU_TIMEOUT_ENV = "MS_CPU_COMM_OP_TIMEOUT"


def collective_wait_s(given: Optional[str], timeout_s: float, compile_timeout_s: float) -> int:
    """MS_CPU_COMM_OP_TIMEOUT for a run whose watchdog has these bounds: 60 s past the larger, or `given` (the
    variable's value in the environment) when it is longer. A shorter one is raised, with a warning: a CPU
    collective that gave up first would end the job with MindSpore's error instead of the watchdog's."""
    wanted = int(max(timeout_s, compile_timeout_s)) + 60
    try:
        value = int(given) if given is not None else None
    except ValueError:
        value = None
    if value is not None and value >= wanted:
        return value
    if given is not None:
        logger.warning("%s=%s raised to %d: past rl_config.collective_timeout_s and compile_timeout_s (the watchdog "
                       "names a hung collective's phase and rank)", CPU_TIMEOUT_ENV, given, wanted)
    return wanted


GROUP_KINDS = ("tp", "dp", "pp")  # a layout's groups: tensor-parallel pieces, data-parallel replicas, stage chains


def layout_groups(layout: ParallelLayout, first: int = 0, kinds: Sequence[str] = GROUP_KINDS) -> Set[Tuple[int, ...]]:
    """The rank sets a layout's collectives use, over its ranks numbered from `first` (a separate placement's rollout
    ranks come after the training ranks): each rank's tensor-parallel group ("tp"), data-parallel group ("dp"),
    chain of pipeline stages and the hand-offs between neighbouring stages ("pp"). Groups of one rank included
    (`create_groups` passes them over)."""
    unknown = sorted(set(kinds) - set(GROUP_KINDS))
    if unknown:
        raise ValueError(f"layout_groups: unknown group kind {unknown[0]!r} (one of {', '.join(GROUP_KINDS)})")
    out: Set[Tuple[int, ...]] = set()
    for r in range(layout.world_size):
        if "tp" in kinds:
            out.add(tuple(first + t for t in layout.tp_group(r)))
        if "dp" in kinds:
            out.add(tuple(first + d for d in layout.dp_group(r)))
        if "pp" in kinds:
            chain = tuple(first + p for p in layout.pp_group(r))
            out.add(chain)
            out.update(zip(chain, chain[1:]))  # pipeline hand-offs
    return out


def create_groups(rank: int, groups: Iterable[Sequence[int]], world: int) -> None:
    """Create the groups of `groups` that this rank is in, in sorted order (every member creates a group, and the
    groups they share in the same order: every rank sorts the same set), and record their names (`_CREATED`). A group
    of one rank, the whole world (MindSpore's world group) and one created before are passed over."""
    from mindspore.communication import create_group

    for ranks in sorted({tuple(int(r) for r in g) for g in groups}):
        if 1 < len(ranks) < world and rank in ranks and ranks not in _CREATED:
            name = "g" + "_".join(str(r) for r in ranks)
            create_group(name, list(ranks))
            _CREATED[ranks] = name


def init_parallel(cfg) -> Comm:
    """Initialise communication for a GRPOConfig: its training, inference and (when beta > 0)
    reference layouts must each cover the world; see `init_comm`. With the collective watchdog on
    (rl_config.collective_timeout_s > 0), CPU collectives wait past its bounds (`collective_wait_s`), so
    that a rank compiling while the others wait is not an error and a hang ends with the watchdog's
    message (mindgrpo/parallel/watchdog.py)."""
    train, infer, ref = layouts_of(cfg)  # LayoutError on bad values, e.g. pipeline_stage = 0
    world = world_size_from_env()
    if world is not None:
        check_layouts(cfg, world)  # fail before the cluster set-up when msrun told us the world
    rl = cfg.rl_config
    if rl.collective_timeout_s > 0 and not communication_started():  # read at init(): once per process
        os.environ[CPU_TIMEOUT_ENV] = str(collective_wait_s(os.environ.get(CPU_TIMEOUT_ENV), rl.collective_timeout_s,
                                                            rl.compile_timeout_s))
    comm = init_comm(train, infer, ref, more=reward_model_layouts(cfg, train.world_size))
    check_layouts(cfg, comm.world)
    return comm


def init_separate(cfg) -> Comm:
    """generate_config.placement separate: communication initialised, the world checked to be the training
    layout's ranks (the first ones: D data-parallel replicas) and the rollout layout's (the next ones: R replicas of
    T tensor-parallel pieces, generate_config.parallel_config model_parallel T). The two sides meet over the world
    (mindgrpo/parallel/separate.py); with D > 1 the training ranks also make a group of their own (`Comm.train_dp`),
    created by its members, over which their gradients and rewards are summed as in a colocated data-parallel run,
    and with T > 1 each rollout replica's ranks make theirs (`separate.Meeting.tp_group`), over which its model's
    tensor-parallel layers sum; with partial rollouts or dynamic sampling the rollout ranks make one
    (`separate.Meeting.replica_counts`)."""
    from mindspore.communication import get_group_size, get_rank, init

    train, infer, ref = layouts_of(cfg)
    wanted = train.world_size + infer.world_size

    def check(world: int) -> None:
        if world != wanted:
            raise LayoutError(f"generate_config.placement separate: the world has {world} ranks, "
                              f"actor_config.parallel_config {train.world_size} + generate_config.parallel_config "
                              f"{infer.world_size} = {wanted} (msrun --worker_num)")

    announced = world_size_from_env()
    if announced is not None:
        check(announced)  # before the cluster set-up
    rl = cfg.rl_config
    if rl.collective_timeout_s > 0 and not communication_started():  # as init_parallel
        os.environ[CPU_TIMEOUT_ENV] = str(collective_wait_s(os.environ.get(CPU_TIMEOUT_ENV), rl.collective_timeout_s,
                                                            rl.compile_timeout_s))
    if not communication_started():
        tie_to_msrun()
        init()
    rank, world = get_rank(), get_group_size()
    check(world)
    # the training group, its layout's tensor-, data- and pipeline-parallel groups and hand-offs, and each rollout
    # replica's tensor-parallel pieces (T consecutive ranks after the training ranks), and with partial rollouts or
    # dynamic sampling decided by the rollout ranks the rollout ranks' group (their counts: Meeting.replica_counts)
    groups = {tuple(range(train.world_size))} | layout_groups(train)
    groups |= layout_groups(infer, first=train.world_size, kinds=("tp",))
    if cfg.generate_config.partial_rollout or cfg.rollout_ranks_resample():
        groups.add(tuple(range(train.world_size, world)))
    create_groups(rank, groups, world)
    device = ms.get_context("device_target")
    logger.info("rank %d of %d on %s: %s (separate placement: train %s, rollout %s)", rank, world, device,
                "training" if rank < train.world_size else "rollout", train, infer)
    return Comm(rank, world, device, train, infer, ref)


def communication_started() -> bool:
    """Whether this process has run MindSpore's `init()` (once per process)."""
    from mindspore.communication import GlobalComm

    return bool(GlobalComm.INITED)


# what msrun sets in the environment of the processes it starts: its scheduler and its workers
ROLE_ENV, MSRUN_ROLES = "MS_ROLE", ("MS_SCHED", "MS_WORKER")


def tie_to_msrun() -> None:
    """A process msrun started gets SIGTERM when msrun dies, before `init()`. In the scheduler (which runs
    this script too, and whose `init()` serves the cluster until it ends) this is the only tie: msrun starts
    it in its own process group without a signal handler, so a SIGKILL to msrun alone left it running ~30 s,
    until it noticed its workers gone (MS_NODE_TIMEOUT). The ranks are tied again when a run starts
    (`mindgrpo/parallel/watchdog.guard_rank`). Nothing outside msrun."""
    if os.environ.get(ROLE_ENV) in MSRUN_ROLES:
        die_with_parent(os.getppid(), signal.SIGTERM)


def init_comm(train: ParallelLayout, infer: ParallelLayout, ref: Optional[ParallelLayout] = None,
              reshards: Sequence[Tuple[ParallelLayout, ParallelLayout]] = (),
              more: Sequence[ParallelLayout] = ()) -> Comm:
    """Initialise communication (once per process), check the layouts against the world, and
    create every group they use (tensor-, data- and pipeline-parallel, neighbouring stages, the
    resharding exchanges), in one global order (HCCL needs every member of a group to
    create it, and shared groups created in the same order everywhere). reshards: more
    (source, destination) layout pairs, whose layouts' groups and resharding groups are created
    too (tests, benchmarks); more: layouts whose groups are created too (reward models' own)."""
    from mindspore.communication import get_group_size, get_rank, init

    if not communication_started():
        tie_to_msrun()
        init()
    rank, world = get_rank(), get_group_size()
    layouts = [("actor_config.parallel_config", train), ("generate_config.parallel_config", infer)]
    if ref is not None:
        layouts.append(("ref_config.parallel_config", ref))
    layouts += [("reshards", layout) for pair in reshards for layout in pair]
    layouts += [("reward_config.reward_models[].model_parallel", layout) for layout in more]
    wanted = set()
    for where, layout in layouts:
        layout.check_world(world, where)
        wanted |= layout_groups(layout)
    pairs = [(train, infer)] + ([(train, ref)] if ref is not None else []) + list(reshards)
    for src, dst in pairs:  # resharding the policy into the inference and reference layouts
        wanted.update(exchange_groups(src, dst))
    create_groups(rank, wanted, world)
    device = ms.get_context("device_target")
    logger.info("rank %d of %d on %s: train %s, infer %s, ref %s", rank, world, device, train, infer, ref)
    return Comm(rank, world, device, train, infer, ref)


# ---------------------------------------------------------------------------------------
# Collectives as graph cells
# ---------------------------------------------------------------------------------------


def _device() -> str:
    return ms.get_context("device_target")


# Elements per collective call on CPU: mccl's AllReduce segfaults on buffers of ~128 MB (MindSpore
# 2.10, measured); larger tensors go through in pieces of this size (4 MB of fp32: a 216 MB
# AllGather over two ranks took 0.69 s in 4 MB pieces, 0.64 in 2 MB, 0.94 in 16 MB, 1.02 in 64 MB).
CPU_CHUNK = 1 << 20


def _chunk_size() -> int:
    return CPU_CHUNK if _device() == "CPU" else 0


class AllReduce(nn.Cell):
    """Sum over the group; the identity for a group of one. Its gradient is MindSpore's
    (the gradient all-reduced): use CopyToGroup / ReduceFromGroup for Megatron's semantics."""

    def __init__(self, group: Group):
        super().__init__()
        self.single = group.size == 1
        self.chunk = _chunk_size()
        if not self.single:
            self.reduce = ops.AllReduce(ops.ReduceOp.SUM, group.name)

    def construct(self, x):
        if self.single:
            return x
        n = x.size
        if self.chunk == 0 or n <= self.chunk:
            return self.reduce(x)
        flat = x.reshape(-1)
        parts = ()
        for start in range(0, n, self.chunk):
            parts = parts + (self.reduce(flat[start:min(start + self.chunk, n)]),)
        return ops.concat(parts).reshape(x.shape)


class AllGather(nn.Cell):
    """x (n, ...) -> (size * n, ...): the members' pieces in group order. No gradient."""

    def __init__(self, group: Group):
        super().__init__()
        self.size, self.index = group.size, group.index
        self.native = group.size > 1 and (group.world or _device() != "CPU")
        self.chunk = _chunk_size()
        if self.native:
            self.gather = ops.AllGather(group.name)
        elif group.size > 1:
            self.reduce = AllReduce(group)

    def construct(self, x):
        if self.size == 1:
            return x
        if self.native:
            return self._gather(x)
        n = x.shape[0]
        rest = x.shape[1:]
        parts = ()
        if self.index > 0:
            parts = parts + (ops.zeros((self.index * n,) + rest, x.dtype) * -1.0,)
        parts = parts + (x,)
        if self.index < self.size - 1:
            parts = parts + (ops.zeros(((self.size - 1 - self.index) * n,) + rest, x.dtype) * -1.0,)
        return self.reduce(ops.concat(parts, 0))  # -0.0 slots: the sum is x, bit for bit

    def _gather(self, x):
        width = x.size // x.shape[0]
        if self.chunk == 0 or x.size <= self.chunk:
            return self.gather(x)
        flat = x.reshape(x.shape[0], width)
        step = max(1, self.chunk // x.shape[0])
        parts = ()
        for start in range(0, width, step):
            parts = parts + (self.gather(flat[:, start:min(start + step, width)]),)
        return ops.concat(parts, 1).reshape((self.size * x.shape[0],) + x.shape[1:])


class CopyToGroup(nn.Cell):
    """Megatron's f: identity forward, gradient summed over the group backward. Sits where a
    replicated activation enters column-parallel layers."""

    def __init__(self, group: Group):
        super().__init__()
        self.single = group.size == 1
        self.reduce = AllReduce(group)

    def construct(self, x):
        return x

    def bprop(self, x, out, dout):
        return (self.reduce(dout),)


class ReduceFromGroup(nn.Cell):
    """Megatron's g: partial results summed over the group forward, gradient passed through
    unchanged backward (every member already holds the full gradient of the sum)."""

    def __init__(self, group: Group):
        super().__init__()
        self.reduce = AllReduce(group)

    def construct(self, x):
        return self.reduce(x)

    def bprop(self, x, out, dout):
        return (dout,)

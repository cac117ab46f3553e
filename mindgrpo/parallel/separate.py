"""generate_config.placement separate (docs/async.md): under msrun the training group (the first ranks: D data-parallel
replicas of P pipeline stages of T tensor-parallel pieces: actor_config.parallel_config) and the
rollout group (R replicas of T' pieces, each replica T' consecutive ranks: generate_config.parallel_config) meet once
a step, and otherwise work at the same time.

MindSpore's CPU collectives have no Send / Receive, and every member of a group enters a collective at the same
point; so a meeting is an AllReduce over the world (`Comm.host_sum`) to which one side gives its data and the
other zeros (x + 0.0 == x: the data arrives bit for bit; weights are never subnormal, which mccl flushes):

    samples   the rollout ranks' completions of a step (as `data_parallel.completion_rows`, versions included,
              and in a last column each sample's group number: with partial rollouts, its prompt's draw number),
              each replica's in the rows of its share of the groups (`Meeting.share`: contiguous, in prompt order),
              and a row of figures (FIGURES) per rollout replica (its first rank gives them, the others zeros) ->
              every training rank
    weights   the policy's whole parameters after an update, in buckets of rl_config.weight_sync_bucket_mb, the first
              training replica's (each of its ranks its pieces in their places, -0.0 elsewhere: the sum is whole, bit
              for bit) -> every rollout rank's inference copy (each keeps its piece; the other ranks give -0.0,
              the other training replicas keep their own weights, compared with the first's:
              `sync/train_weights_max_diff`);
              with LoRA the adapters only (each training rank of the first replica its pieces, each stage its
              layers'), and at the start, after the warm start and after a resume first a meeting of the base
              weights (both ranks know when: docs/async.md)
    start     after a --resume, training rank 0's restored step and prompt position, and with partial rollouts the
              prompts drawn and the draw numbers of the groups in flight -> every rollout rank
    values    after a samples meeting of conversations (generate_config.tools): what each rollout rank's
              conversations of its share give besides the tokens (the prompts as generated, the reward columns, the
              tool/ and turns/ metrics: `conversations.ReplicaValue`), pickled, lengths first (`comm.host_gather`)
              -> every training rank, in rollout rank order (= prompt order: `conversations.merge_replicas`)

and, among the rollout ranks only (`Meeting.replica_counts`, as each generates a step): with partial rollouts on R > 1
replicas how many groups each replica still needs, so that they draw the step's fresh prompts in one order; with
dynamic sampling after each rollout of a step how many of its groups have a spread of rewards, so that they decide its
further rollouts alike. Each rollout of a step (dynamic sampling: each round) is a samples meeting, and its figures
say how many prompts the next round draws ("more", 0: the step's last), which the training ranks follow; with reward
models or judges (scored on training rank 0: off_policy_steps 0 only) training rank 0 decides instead and gives the
count after each rollout (`Meeting.more_prompts`).

The training ranks' side stands in for the trainer's engine and weight sync (`RemoteRollout`, `SendWeights`), so
the trainer's step is unchanged; each rollout rank runs `grpo/rollout_worker.RolloutWorker`. A replica's model is its
pieces (tensor-parallel layers over the replica's ranks, as a colocated tensor-parallel run's); with D training
replicas each trains its share of a mini-batch, the gradients summed over the replicas of a piece
(`data_parallel.DataParallelGrads`, as a colocated data-parallel run). Rollout replica i generates its share of the
step's prompts, each keyed by its index in the whole batch (a sample's random stream depends on that
index, its sample number and its token number only), so the samples are a one-process run's whichever rank drew them.
Training rank 0 writes the checkpoints of whole replicas (`TrainingGroupCheckpoints`), as one process writes them;
training replicas in pieces write a colocated run's sharded checkpoints (`separate_placement.SeparatePlacement`).
"""

from __future__ import annotations

import logging
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from mindspore import Parameter, Tensor

from mindgrpo.inference.engine import Completion
from mindgrpo.inference.sampling import SamplingParams
from mindgrpo.models.convert import expected_shapes
from mindgrpo.models.lora import adapter_shapes
from mindgrpo.parallel.checkpoint_folders import save_folders
from mindgrpo.parallel.checkpoints import LocalCheckpoints
from mindgrpo.parallel.comm import Comm, Group, host_gather
from mindgrpo.parallel.data_parallel import ROW_FIELDS, ROW_HEAD, completion_rows, row_width, rows_completions, share
from mindgrpo.parallel.layout import ParallelLayout
from mindgrpo.parallel.weight_sync import named_parameters

# a rollout rank's figures of a step, sent after its samples (one float32 row each); "prompt_check" is the sum of its
# share's prompt token ids (mod 2**23): the training rank compares it with its own prompts' (the same data order)
# with partial rollouts (grpo/partial.py) also the prompts drawn, the groups and samples in flight after the step and
# the carried samples that went on in it (0 without) and the turns the conversations in flight had; with dynamic
# sampling decided by the rollout ranks "more": how many prompts the step's next rollout draws (0: this is its last;
# every rollout rank gives the same)
FIGURES = ("new_tokens", "generate_seconds", "wait_seconds", "version", "prompt_check", "useful_fraction",
           "slots_in_use", "kv_bytes", "prefill_seconds", "decode_seconds", "decode_steps", "compiled_graphs",
           "drawn", "carried_groups", "carried_samples", "carried_turns", "continued_samples", "more")
# the rollout group's figure from its ranks' (`group_figures`): tokens, decoding rows, memory and prompts summed; the
# seconds, steps, graphs and version the largest rank's (the group waits for its slowest); the ratio averaged;
# prompt_check kept per rank (`prompt_checks`)
SUMMED = ("new_tokens", "slots_in_use", "kv_bytes", "drawn", "carried_groups", "carried_samples", "carried_turns",
          "continued_samples")
AVERAGED = ("useful_fraction",)
TRAIN_RANK = 0
logger = logging.getLogger(__name__)


def prompt_check(prompts: Sequence[Sequence[int]]) -> float:
    """A sum of the prompts' token ids that float32 carries exactly (below 2**23)."""
    return float(sum(int(np.sum(np.asarray(p, np.int64))) for p in prompts) % (1 << 23))


def check_prompts(figures: Dict[str, float], prompts: Sequence[Sequence[int]], first: int, tp: int) -> None:
    """The rollout group's figures (`group_figures`) name the prompts each replica generated (`prompt_checks`, its
    share of them): those this rank trains on. first: the first rollout rank (the number of training ranks); tp: a
    replica's ranks (the error names its first)."""
    checks = figures["prompt_checks"]
    for i, check in enumerate(checks):
        if check != prompt_check([prompts[k] for k in share(len(prompts), len(checks), i)]):
            raise RuntimeError(f"generate_config.placement separate: rollout rank {first + i * tp} generated other "
                               "prompts than the training rank trains on (their data order differs)")


def group_figures(ranks: Sequence[Dict[str, float]]) -> Dict[str, object]:
    """The rollout group's figures of a step from its ranks' (SUMMED, AVERAGED, the others the largest), with
    `prompt_checks` (each rank's), `wait_seconds_sum` (the group's idle rank-seconds) and, with more than one rank,
    `replicas`: each rank's tokens_per_s and wait_seconds, by `rollout<i>/` (async/rollout<i>/... in metrics.jsonl)."""
    out: Dict[str, object] = {}
    for key in FIGURES:
        values = [r[key] for r in ranks]
        out[key] = sum(values) if key in SUMMED else sum(values) / len(values) if key in AVERAGED else max(values)
    out["prompt_checks"] = [r["prompt_check"] for r in ranks]
    out["wait_seconds_sum"] = sum(r["wait_seconds"] for r in ranks)
    if len(ranks) > 1:
        out["replicas"] = {f"rollout{i}/{k}": v for i, r in enumerate(ranks)
                           for k, v in (("tokens_per_s", r["new_tokens"] / max(r["generate_seconds"], 1e-9)),
                                        ("wait_seconds", r["wait_seconds"]))}
    return out


class Meeting:
    """The world's collectives (every call is made by every rank, in the same order: `RolloutWorker.run` and the
    trainer's step keep it). bucket_bytes: the weights' buckets (rl_config.weight_sync_bucket_bytes)."""

    def __init__(self, comm: Comm, bucket_bytes: int):
        self.trainers = comm.train.world_size  # the training ranks: 0, ..., D - 1
        if self.trainers < 1 or comm.world <= self.trainers:
            raise ValueError(f"generate_config.placement separate runs at least one training rank and at least one "
                             f"rollout rank, got {self.trainers} training ranks in a world of {comm.world}")
        self.comm, self.group = comm, comm.group(range(comm.world))
        self.bucket_bytes = bucket_bytes
        # the rollout ranks D, ..., world - 1: R replicas of T consecutive ranks each (tensor-parallel pieces)
        self.tp = comm.infer.tp
        self.replicas = (comm.world - self.trainers) // self.tp
        rollout = comm.rank - self.trainers  # this rank's place among the rollout ranks (negative: a training rank)
        self.index = rollout // self.tp if rollout >= 0 else rollout  # its replica
        self.piece = rollout % self.tp if rollout >= 0 else -1  # its tensor-parallel piece in the replica
        self.pieces = ParallelLayout(dp=1, tp=self.tp)  # how a replica's ranks split each parameter
        # a training rank's replica and piece in the training layout (D replicas of T_train pieces), and how its
        # replica's ranks split each parameter
        self.train_coords = comm.train.coords(comm.rank) if comm.rank < self.trainers else (-1, -1)
        self.train_pieces = ParallelLayout(dp=1, tp=comm.train.tp)
        # the training group, on its members (D > 1 replicas): the weights' check sums over it
        self.train_group: Optional[Group] = comm.group(range(self.trainers)) \
            if 1 < comm.train.dp and comm.rank < self.trainers else None

    @property
    def gives(self) -> bool:
        """This rank gives what the training side gives (training rank 0; the others give zeros)."""
        return self.comm.rank == TRAIN_RANK

    @property
    def hands_over(self) -> bool:
        """This rank gives its replica's samples, figures and conversations' values: a rollout rank, the first of its
        replica's tensor-parallel pieces (the others hold the same completions and give zeros)."""
        return self.index >= 0 and self.piece == 0

    def tp_group(self) -> Group:
        """A rollout rank's replica: its T tensor-parallel pieces (created at start-up: `comm.init_separate`)."""
        first = self.trainers + self.index * self.tp
        return self.comm.group(range(first, first + self.tp))

    def _layout_piece(self) -> Tuple[ParallelLayout, int]:
        """How this rank's replica splits each parameter (rollout or training layout's tensor parallelism) and its
        piece."""
        return (self.pieces, self.piece) if self.index >= 0 else (self.train_pieces, self.train_coords[1])

    def whole_shape(self, name: str, shape: Sequence[int]) -> Tuple[int, ...]:
        """The whole parameter's shape of this rank's tensor-parallel piece `name` (parallel/layout.py's split
        rules): the weights meeting moves whole parameters."""
        layout, _ = self._layout_piece()
        dim = layout.param_split(name) if layout.tp > 1 else None
        shape = tuple(int(v) for v in shape)
        return shape if dim is None else shape[:dim] + (shape[dim] * layout.tp,) + shape[dim + 1:]

    def own_piece(self, name: str, whole: np.ndarray) -> np.ndarray:
        """This rank's tensor-parallel piece of the whole parameter `name` (itself without tensor parallelism)."""
        layout, piece = self._layout_piece()
        return whole if layout.tp == 1 else np.ascontiguousarray(layout.shard(name, whole, piece))

    def in_place(self, name: str, value: np.ndarray, shape: Tuple[int, ...]) -> np.ndarray:
        """What a training rank of the first replica gives for parameter `name` (its piece `value`, fp32) in the
        weights meeting: the piece in its place of the whole `shape`, -0.0 elsewhere; a parameter the pieces do not
        split, the first piece's ranks give whole and the others -0.0 (x + -0.0 is x: the sum is whole, bit for bit,
        as `ParallelPlacement.whole` makes it)."""
        layout, piece = self.train_pieces, self.train_coords[1]
        dim = layout.param_split(name) if layout.tp > 1 else None
        if dim is None:
            return value if piece == 0 else np.full(shape, -0.0, np.float32)
        out = np.full(shape, -0.0, np.float32)
        n = value.shape[dim]
        out[(slice(None),) * dim + (slice(piece * n, (piece + 1) * n),)] = value
        return out

    def share(self, groups: int, index: Optional[int] = None) -> np.ndarray:
        """The groups (of a step's `groups`, in prompt order) that rollout rank `index` (default this one) generates:
        a contiguous share, the first ranks one more when they do not divide evenly (`data_parallel.share`)."""
        return share(groups, self.replicas, self.index if index is None else index)

    def samples(self, comps: Optional[List[Completion]], rows: int, n: int, width: int,
                figures: Optional[Dict[str, float]] = None, groups: Optional[Sequence[int]] = None,
                first: int = 0) -> Tuple[List[Completion], List[int], List[Dict[str, float]]]:
        """Every rollout rank's `comps` (n a prompt; this rank's from row `first` of the step's `rows`), their groups'
        numbers (default their prompts' indices in the step; float32 carries them exactly below 2**24) and each
        rollout rank's figures, on every rank; the training rank passes None."""
        head = ROW_HEAD + ROW_FIELDS * width
        data = np.zeros((rows + self.replicas, head + 1), np.float32)
        if comps is not None and self.hands_over:
            k = len(comps)
            data[first:first + k, :head] = completion_rows(comps, k, width)
            data[first:first + k, head] = np.repeat(np.arange(first // n, (first + k) // n) if groups is None
                                                    else np.asarray(groups), n)
            data[rows + self.index, :len(FIGURES)] = [figures.get(key, 0.0) for key in FIGURES]
        data = self.comm.host_sum(data, self.group)
        return (rows_completions(data[:rows, :head], n, width), data[:rows:n, head].astype(np.int64).tolist(),
                [dict(zip(FIGURES, map(float, row[:len(FIGURES)]))) for row in data[rows:]])

    def start(self, position: Optional[Sequence[int]], in_flight: Optional[Sequence[int]] = None
              ) -> Tuple[Tuple[int, ...], List[int]]:
        """After a --resume: the training rank's (step, prompt epoch, prompt index, prompts drawn) and, with partial
        rollouts, the draw numbers of its groups in flight, on every rank (the rollout ranks pass None; training ranks
        1 .. D - 1 give zeros), so that the rollout ranks go on from the step, generates those groups again and draws
        from the position restored."""
        if not self.gives:
            position, in_flight = None, None
        head = np.zeros(5, np.float32)
        numbers = [int(k) for k in in_flight or ()]
        if position is not None:
            values = (*position, len(numbers))
            if max(values + tuple(numbers)) >= 1 << 24:
                raise ValueError(f"generate_config.placement separate: a resume position {tuple(position)} or draw "
                                 "number past 2**24 does not pass the meeting exactly")
            head[:] = values
        head = self.comm.host_sum(head, self.group)
        count = int(head[4])
        if count:  # the groups in flight's draw numbers, as many as the head says
            data = np.asarray(numbers, np.float32) if position is not None else np.zeros(count, np.float32)
            numbers = [int(v) for v in self.comm.host_sum(data, self.group)]
        return tuple(int(v) for v in head[:4]), numbers

    def replica_counts(self, count: int) -> List[int]:
        """Every rollout replica's `count`, in replica order, on every rollout rank: with partial rollouts on R
        replicas (grpo/partial.PartialRollouts.step) the groups each still needs this step, with dynamic sampling
        (grpo/rollout_worker.RolloutWorker.rounds) the groups of its share of a rollout with a spread of rewards. An
        AllReduce over the rollout ranks only (a group its members create at start-up: `comm.init_separate`), to which
        each replica's first rank gives its count at its place; the training ranks are not in it (the rollout ranks
        generate ahead of them)."""
        data = np.zeros(self.replicas, np.float32)
        if self.piece == 0:
            data[self.index] = count
        rollout = self.comm.group(range(self.trainers, self.comm.world))
        return [int(v) for v in self.comm.host_sum(data, rollout)]

    def more_prompts(self, count: Optional[int] = None) -> int:
        """After each rollout of a step with rl_config.dynamic_sampling and reward models or judges (off_policy_steps
        0; without them the rollout ranks decide: `GRPOConfig.rollout_ranks_resample`): how many prompts the training
        ranks draw again (0: the step's rollouts are complete), training rank 0's `count` on every rank (the rollout
        ranks pass None; training ranks 1 .. D - 1 decide the same from the same rewards and give zeros)."""
        value = np.zeros(1, np.float32)
        if self.gives:
            value[0] = count
        return int(self.comm.host_sum(value, self.group)[0])

    def values(self, value=None) -> list:
        """Every rollout rank's `value` (any picklable object; None: nothing) on every rank, in rollout rank order; the
        training ranks pass None. The world's `comm.host_gather`, of which the rollout ranks give."""
        if not self.hands_over:
            value = None
        return host_gather(self.comm, value, self.group)[self.trainers:]

    def weights(self, params: Dict[str, Parameter], shapes: Optional[Dict[str, Tuple[int, ...]]] = None
                ) -> Dict[str, float]:
        """params by their path in the model (taken in path order; tensor-parallel pieces of the whole parameters the
        meeting moves; shapes: every parameter that meets by its whole shape, when a rank holds some only, a training
        pipeline stage's; default: params' own): the first training replica's values into every rollout
        rank's, bucket by bucket (each of its ranks gives its pieces in their places: `in_place`; each rollout rank
        keeps its piece: `own_piece`); the others give zeros, and the training ranks of the other replicas keep their
        own weights, which their data-parallel updates made equal to the first's. Returns sync/seconds (the meeting,
        waiting for the other ranks included), sync/bytes and sync/max_bucket_bytes (the whole weights'); with D > 1
        replicas, on the training ranks, sync/train_weights_max_diff: the largest difference of a training rank's
        weights from the first replica's (0.0: the same bits)."""
        give, take = self.index < 0 and self.train_coords[0] == 0, self.index >= 0  # the first training replica gives
        t0 = time.perf_counter()
        if shapes is None:  # every parameter that meets is here (pieces: their whole's)
            shapes = {name: self.whole_shape(name, params[name].shape) for name in params}
        buckets, bucket, size = [], [], 0
        for name in sorted(shapes):
            nbytes = int(np.prod(shapes[name])) * 4
            if bucket and size + nbytes > self.bucket_bytes:
                buckets.append(bucket)
                bucket, size = [], 0
            bucket.append(name)
            size += nbytes
        buckets.append(bucket)
        total, largest, differ = 0, 0, 0.0
        for bucket in buckets:
            sizes = [int(np.prod(shapes[name])) for name in bucket]
            # every other rank gives -0.0 (x + -0.0 is x, -0.0 and +0.0 included: the sum is bit for bit)
            flat = np.full(sum(sizes), -0.0, np.float32)
            if give:
                flat = np.concatenate([self.in_place(name, params[name].asnumpy().astype(np.float32), shapes[name])
                                       .reshape(-1) if name in params else np.full(k, -0.0, np.float32)
                                       for name, k in zip(bucket, sizes)])
            flat = self.comm.host_sum(flat, self.group)
            at = 0
            for name, k in zip(bucket, sizes):
                p = params.get(name)
                if p is None:  # another pipeline stage's parameter
                    pass
                elif take:  # with tensor parallelism its piece of the whole parameter
                    p.set_data(Tensor(self.own_piece(name, flat[at:at + k].reshape(shapes[name])), p.dtype))
                elif not give:  # a training rank of another replica: its own weights against the first replica's
                    own = p.asnumpy().astype(np.float32)
                    theirs = self.own_piece(name, flat[at:at + k].reshape(shapes[name]))
                    differ = max(differ, float(np.max(np.abs(own - theirs))) if k else 0.0)
                at += k
            total += flat.nbytes
            largest = max(largest, flat.nbytes)
        out = {"sync/seconds": time.perf_counter() - t0, "sync/bytes": float(total),
               "sync/max_bucket_bytes": float(largest)}
        if self.train_group is not None:  # every training rank's difference, its largest on each
            table = np.zeros(self.trainers, np.float32)
            table[self.comm.rank] = differ
            out["sync/train_weights_max_diff"] = float(self.comm.host_sum(table, self.train_group).max())
        return out


class RemoteRollout:
    """The training rank's engine: `generate` is the samples meeting (the rollout ranks generated the same prompts
    with the same seeds, each its share); `last_stats` the rollout group's figures (`group_figures`). The versions
    come stamped on the samples."""

    compiled_graphs = 0

    def __init__(self, meeting: Meeting, resamples: bool = False):
        """resamples: the rollout ranks decide dynamic sampling's further rollouts (`GRPOConfig.
        rollout_ranks_resample`), which their figures say; else the trainer decides and tells them."""
        self.meeting, self.resamples = meeting, resamples
        self.last_stats: dict = {}
        self.version = 0  # the trainer's sync sets it; the samples carry the versions that really sampled them

    def cache_bytes(self) -> int:
        return 0  # no KV cache on this rank

    def release(self) -> None:
        """No graphs on this rank."""

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, turns=None) -> List[Completion]:
        """turns: the run's conversations (`engine.Turns`; the rollout ranks run them): only their size is read
        here, the model masks come with the samples and the rest in a value meeting
        (`conversations.RemoteConversations`). `prompts`: this rank's draw, which each rollout rank's prompt check
        names (its share of the draw, before an environment's resets write the prompts generated)."""
        comps, _, figures = self.groups(len(prompts) * params.n, params.n, row_width(params, turns))
        self.check_prompts(figures, prompts)
        return comps

    def check_prompts(self, figures: Dict[str, object], prompts: Sequence[Sequence[int]]) -> None:
        """A samples meeting's figures against the prompts this rank drew (`check_prompts`: the error names the
        rollout replica's first rank, counted after the training ranks)."""
        check_prompts(figures, prompts, self.meeting.trainers, self.meeting.tp)

    def next_round(self, count: int) -> int:
        """rl_config.dynamic_sampling, after each rollout of a step: how many prompts the next one draws (0: the step's
        rollouts are complete). The rollout ranks' decision, made when they generated the step (the last samples
        meeting's figure "more"), which the training ranks follow whatever their own `count` (a reward that scored
        otherwise here, a timeout, must not leave the sides in different meetings); with reward models or judges
        (off_policy_steps 0) this rank's `count`, told to the rollout ranks (`Meeting.more_prompts`)."""
        if not self.resamples:
            self.meeting.more_prompts(count)
            return count
        theirs = int(self.last_stats["more"])
        if theirs != count:
            logger.warning("dynamic sampling: the rollout ranks draw %d prompts again where this rank's rewards say %d "
                           "(the rewards scored otherwise on the two sides); the step follows the rollout ranks",
                           theirs, count)
        return theirs

    def groups(self, rows: int, n: int, width: int) -> Tuple[List[Completion], List[int], Dict[str, object]]:
        """The samples meeting: the rollout group's `rows` samples (n a group), their groups' numbers and its
        figures; last_stats set from them (with train_wait_seconds, this rank's wait in the meeting; tokens_per_s,
        the group's tokens over its slowest rank's seconds)."""
        t0 = time.perf_counter()
        comps, numbers, ranks = self.meeting.samples(None, rows, n, width)
        waited = time.perf_counter() - t0
        figures = group_figures(ranks)
        seconds = max(figures["generate_seconds"], 1e-9)
        self.last_stats = dict(figures, new_tokens=int(figures["new_tokens"]), seconds=seconds,
                               tokens_per_s=figures["new_tokens"] / seconds, train_wait_seconds=waited)
        return comps, numbers, figures


class SendWeights:
    """The training rank's weight sync: the policy's parameters (names: only these, by path; LoRA's adapters, or its
    base weights) into the weights meeting."""

    METRICS = ("sync/seconds", "sync/bytes", "sync/max_bucket_bytes")

    def __init__(self, meeting: Meeting, policy, names: Optional[Sequence[str]] = None):
        self.meeting = meeting
        params = named_parameters(policy)
        stages = meeting.comm.train.pp > 1
        # pipeline stages: every stage's parameters meet (`names`, LoRA's adapters or base, are the whole model's),
        # each stage giving the ones it holds; without stages this rank holds each (a piece of it)
        self.params = params if names is None else {n: params[n] for n in names if not stages or n in params}
        self.shapes = None
        if stages:
            whole = {**expected_shapes(policy.config), **adapter_shapes(policy)}
            self.shapes = {n: tuple(whole[n]) for n in (sorted(whole) if names is None else names)}

    def release(self) -> None:
        """No graphs of its own (the meeting's AllReduce is the comm's)."""

    def __call__(self) -> Dict[str, float]:
        return self.meeting.weights(self.params, self.shapes)


class TrainingGroupCheckpoints:
    """The checkpoints of a training group of D > 1 data-parallel ranks, one process's files (every training rank
    holds the whole model and the same AdamW moments: the config refuses optimizer_shard here): training rank 0 removes
    killed saves' leftovers, writes them and sets later steps aside; on --resume every training rank reads the same
    checkpoint. Barriers over the training group keep the others from looking while rank 0 changes the folder."""

    def __init__(self, local: LocalCheckpoints, comm: Comm, group: Group):
        self.local, self.comm, self.group = local, comm, group
        self.writer = comm.rank == TRAIN_RANK

    @property
    def root(self) -> str:
        return self.local.root

    def clean(self) -> List[str]:
        removed = self.local.clean() if self.writer else []
        self.comm.barrier(self.group)
        return removed

    def find(self, path: Optional[str] = None) -> Optional[str]:
        """As LocalCheckpoints.find, on every training rank (after `clean`, before `set_aside_after`: the folder
        does not change between)."""
        return self.local.find(path)

    def load(self, path: str, groups, model_config: dict) -> dict:
        return self.local.load(path, groups, model_config)

    def set_aside_after(self, step: int, why: str) -> List[str]:
        self.comm.barrier(self.group)  # every training rank has read its checkpoint
        return self.local.set_aside_after(step, why) if self.writer else []

    def save(self, step: int, groups, state: dict, model_config: dict, name: Optional[str] = None,
             extra=None) -> str:
        """Rank 0 writes; every rank returns the checkpoint's folder."""
        if self.writer:
            return self.local.save(step, groups, state, model_config, name, extra)
        return save_folders(self.root, step, name)[0]

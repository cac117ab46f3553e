"""Where the run's models live, and the machinery that goes with it: the placement.

`mindgrpo.grpo.builder.build(cfg, paths, placement)` asks the placement for everything that
depends on how the run is laid out over devices, and runs the same build sequence either way:

                    OneDevice()                        ParallelPlacement(cfg, comm)   (under msrun)
    model(role)     the whole model                    this rank's piece of the role's layout:
                                                       its pipeline stage, its tensor-parallel piece
                                                       (TensorParallelLayers), the weights sliced from a
                                                       full checkpoint or read from per-rank shards
    engine(...)     the RolloutEngine                  a DataParallelEngine: its replica's prompts,
                                                       the completions gathered on every rank
    weight_sync     WeightSync (a copy per bucket)     Reshard (policy layout -> the role's layout)
    same_layout     True                               the role's layout equals the policy's
    shared_sync     SharedWeights: nothing to move (the inference model is the policy), WeightSync's or
                    Reshard's metrics keys at 0
    grad_reducer    None                               DataParallelGrads over the training dp group
    pipeline(role)  None (one stage)                   the role's Pipeline (its stage's hand-offs)
    rewards(set)    the RewardSet                      SharedRewards: rank 0 scores, every rank gets its scores
    reward_model    a reward model whole                its tensor-parallel piece in its own layout (model_parallel
                                                       of the entry, or the policy's tp; every layer: no stages)
    reward_scorer   the scorer itself                  ReplicaScores: each replica of that layout scores its
                                                       share, every rank gets every score
    judge_engine    the judge's engine                 a DataParallelEngine over the world: each rank answers its
                                                       share of the questions with its whole judge
    model_rewards   the reward models, built           the same (SeparatePlacement with D > 1 training ranks:
                                                       SharedModelRewards, rank 0 alone holds and scores them)
    checkpoints     LocalCheckpoints                   ShardedCheckpoints (every rank its pieces)
    whole(params)   each parameter's values            each parameter of the policy's pieces made whole (its
                                                       tensor-parallel pieces summed over the training tp group,
                                                       -0.0 in the others' places: bit for bit; with pipeline
                                                       stages every stage's, summed over the chain of stages)
    load_weights    the weights at a path into a model its piece of them (sliced, or this rank's shard)
    writer          True                               rank 0 (writes what is written once: LoRA's files)

The roles are "policy" (actor_config.parallel_config), "inference" (generate_config's) and
"reference" (ref_config's). Model weights come from the same seed as a one-device run (every rank
draws the full initial tensors and keeps its piece), from a full checkpoint or an HF directory
(sliced here), or from a directory of per-rank shards written by scripts/transform_checkpoint.py
(`DIR/rank_<k>/*.ckpt`). `placement_for` also guards an msrun rank with the collective watchdog
(mindgrpo.parallel.watchdog) before anything is built.
"""

from __future__ import annotations

import glob
import logging
import os
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import mindspore as ms

from mindgrpo.inference.engine import RolloutEngine
from mindgrpo.memory.swap import SwapManager
from mindgrpo.models.checkpoint import find_config, load_state, read_model_state
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.convert import expected_shapes
from mindgrpo.models.lora import adapter_shapes
from mindgrpo.models.lora_targets import full_adapter_shapes
from mindgrpo.models.presets import preset_config
from mindgrpo.models.qwen2 import Qwen2ForCausalLM
from mindgrpo.models.reward_model import RewardModel, load_reward_model
from mindgrpo.parallel.checkpoints import LocalCheckpoints, load_params
from mindgrpo.parallel.comm import CPU_CHUNK, Comm, init_parallel, init_separate, layouts_of
from mindgrpo.parallel.data_parallel import DataParallelEngine, DataParallelGrads
from mindgrpo.parallel.layout import ParallelLayout, reward_model_layout
from mindgrpo.parallel.pipeline import Pipeline, stage_spec
from mindgrpo.parallel.replica_scores import ReplicaScores, replica_of
from mindgrpo.parallel.reshard import Reshard
from mindgrpo.parallel.separate import TRAIN_RANK, Meeting, RemoteRollout, SendWeights, TrainingGroupCheckpoints
from mindgrpo.parallel.sharded_checkpoints import ShardedCheckpoints
from mindgrpo.parallel.shared_rewards import SharedModelRewards, SharedRewards
from mindgrpo.parallel.strategy import training_shapes, write_layout_strategies, write_strategy_file
from mindgrpo.parallel.tp_layers import TensorParallelLayers
from mindgrpo.parallel.watchdog import guard_rank
from mindgrpo.parallel.weight_sync import WeightSync
from mindgrpo.rewards import RewardSet
from mindgrpo.utils import heartbeat

logger = logging.getLogger(__name__)

ROLES = ("policy", "inference", "reference")
Engine = Union[RolloutEngine, DataParallelEngine, RemoteRollout]
Checkpoints = Union[LocalCheckpoints, ShardedCheckpoints, TrainingGroupCheckpoints]
Rewards = Union[RewardSet, SharedRewards]


class SharedWeights:
    """The weight sync of an inference model that is the policy model itself (`mindgrpo.grpo.builder`: one
    copy where the layouts match): there is nothing to move; each call reports the metrics of the sync it
    stands in for, all 0 (its keys: WeightSync.METRICS or Reshard.metric_names(), so that a run whose
    inference model is the policy keeps the columns of metrics.jsonl)."""

    def __init__(self, keys):
        self.keys = tuple(keys)

    def release(self) -> None:
        """No graphs to drop."""

    def __call__(self) -> Dict[str, float]:
        return {k: 0.0 for k in self.keys}


Sync = Union[WeightSync, Reshard, SharedWeights, SendWeights]


def shard_dir(path: str, rank: int) -> Optional[str]:
    """path/rank_<rank> when path is a directory of per-rank shards, else None."""
    candidate = os.path.join(path, f"rank_{rank}")
    return candidate if os.path.isdir(path) and os.path.isdir(candidate) else None


def reward_model_piece(path: str, config: Optional[str], layout: ParallelLayout, group, compute_dtype: str
                       ) -> RewardModel:
    """This rank's tensor-parallel piece of the reward model at `path` over `group`, the tp group of `layout` (every
    layer: a reward model has no pipeline stages): the full checkpoint read, each tensor sliced by SPLIT_RULES."""
    tp = ParallelLayout(dp=1, tp=layout.tp)
    tp.check_divisible(Qwen2Config.load(config or find_config(path)))
    return load_reward_model(path, config, layers=TensorParallelLayers(group),
                             shard=lambda n, a: tp.shard(n, a, group.index), compute_dtype=compute_dtype)


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


class OneDevice:
    """Every model whole, in this process."""

    rank = 0
    rollout_rank = False  # this rank runs the trainer (SeparatePlacement: one rank runs the rollout instead)
    remote_rollout = False  # the trainer's samples come from this process's engine
    writer = True  # the process that writes what is written once
    inference_replicas = 1  # the data-parallel replicas of the inference layout this rank's engine is one of

    @property
    def device(self) -> str:
        return ms.get_context("device_target")

    def check(self, mcfg: Qwen2Config) -> None:
        """Nothing to check: one device holds any model."""

    def model(self, role: str, mcfg: Qwen2Config, path: Optional[str], load: bool, seed: int,
              max_positions: int) -> Qwen2ForCausalLM:
        """The whole model: drawn from `seed`, then the weights at `path` when `load`."""
        lm = Qwen2ForCausalLM(mcfg, seed=seed, max_positions=max_positions)
        if path and load:
            load_state(lm, read_model_state(path, mcfg))
        return lm

    def engine(self, rollout: RolloutEngine) -> Engine:
        return rollout

    def reward_model(self, path: str, config: Optional[str], compute_dtype: str,
                     model_parallel: Optional[int] = None) -> RewardModel:
        return load_reward_model(path, config, compute_dtype=compute_dtype)

    def reward_scorer(self, scorer, model_parallel: Optional[int] = None):
        """The scorer the trainer calls: one device scores every rollout itself."""
        return scorer

    def judge_engine(self, engine: RolloutEngine):
        """What answers a generative judge's questions: one device, its engine."""
        return engine

    def weight_sync(self, src: Qwen2ForCausalLM, dst: Qwen2ForCausalLM, role: str,
                    memory: Optional[SwapManager] = None, bucket_bytes: int = 0,
                    names: Optional[List[str]] = None) -> Sync:
        """names: only these parameters move (LoRA's adapters)."""
        return WeightSync(src, dst, memory, bucket_bytes, names, role)

    def same_layout(self, role: str) -> bool:
        """One device holds every model whole: the role's parameters are the policy's, laid out alike."""
        return True

    def shared_sync(self) -> Sync:
        return SharedWeights(WeightSync.METRICS)

    def rewards(self, rewards: RewardSet) -> Rewards:
        return rewards

    def model_rewards(self, build: Callable[[], object], names: Sequence[str], weights: Sequence[float]):
        """The run's reward models as the trainer scores with them: `build()` (`grpo/reward_models.
        build_model_rewards`: None without any); names and weights: reward_config's
        (the reward models', then the judges')."""
        return build()

    def grad_reducer(self) -> Optional[DataParallelGrads]:
        return None

    def pipeline(self, role: str, dtype) -> Optional[Pipeline]:
        return None

    def checkpoints(self, root: str, keep_last: int, mcfg: Qwen2Config,
                    adapters: Optional[Dict[str, Tuple[int, ...]]] = None) -> Checkpoints:
        return LocalCheckpoints(root, keep_last)

    def barrier(self) -> None:
        """Nothing to wait for."""

    def whole(self, params: Sequence[ms.Parameter], shapes: Optional[Dict[str, Tuple[int, ...]]] = None
              ) -> Iterator[Tuple[str, np.ndarray]]:
        """(name, fp32 values) of each parameter, in the given order (shapes: for pipeline stages only)."""
        for p in params:
            yield p.name, fp32(p)

    def load_weights(self, role: str, lm: Qwen2ForCausalLM, path: str, names: Sequence[str]) -> None:
        """The parameters `names` of the model from the weights at `path` (an HF directory or a .ckpt)."""
        state = read_model_state(path, lm.config)
        load_state(lm, {n: state[n] for n in names})


class ParallelPlacement:
    """This rank's pieces of the training, inference and (with beta > 0) reference layouts of a
    GRPOConfig, over the world `comm` initialised (`init_parallel`)."""

    rollout_rank = remote_rollout = False

    def __init__(self, cfg, comm: Comm):
        self.comm = comm
        train, infer, ref = layouts_of(cfg)
        self.layouts: Dict[str, Optional[ParallelLayout]] = {"policy": train, "inference": infer, "reference": ref}
        self.optimizer_shard = cfg.actor_config.parallel_config.optimizer_shard
        self.inference_replicas = infer.dp  # DataParallelEngine: each replica generates its share of the prompts

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def device(self) -> str:
        return self.comm.device

    def check(self, mcfg: Qwen2Config) -> None:
        """Every layout divides the model (heads, vocabulary, layers); the error names the config section."""
        for role, where in zip(ROLES, ("actor_config", "generate_config", "ref_config")):
            layout = self.layouts[role]
            if layout is not None:
                try:
                    layout.check_divisible(mcfg)
                except ValueError as e:
                    raise ValueError(f"{where}.parallel_config: {e}") from None

    def model(self, role: str, mcfg: Qwen2Config, path: Optional[str], load: bool, seed: int,
              max_positions: int) -> Qwen2ForCausalLM:
        """This rank's piece of the model in the role's layout: its pipeline stage's parameters,
        its tensor-parallel piece of each (every rank draws the whole model from `seed`; `model_piece`), the weights
        at `path` when `load` (a folder of per-rank shards, this rank's, or the full weights sliced)."""
        layout = self.layouts[role]
        return model_piece(mcfg, seed, max_positions, layout, self.comm.tp_group(layout), self.rank,
                           path if load else None, shard_rank=self.rank)

    def load_weights(self, role: str, lm: Qwen2ForCausalLM, path: str, names: Optional[Sequence[str]] = None) -> None:
        """This rank's pieces of the parameters `names` (None: every one of the model) from the weights at `path`:
        a folder of per-rank shards (this rank's), or a full checkpoint or HF directory that every rank reads and
        slices (`load_pieces`)."""
        layout = self.layouts[role]
        load_pieces(lm, path, layout, self.comm.tp_group(layout).index, shard_rank=self.rank, names=names)

    def engine(self, rollout: RolloutEngine) -> Engine:
        return DataParallelEngine(rollout, self.comm, self.comm.infer_dp)

    def reward_model_layout(self, model_parallel: Optional[int]) -> ParallelLayout:
        """A reward model's layout: split over model_parallel ranks (reward_config.reward_models[i].model_parallel),
        or like the policy's tensor parallelism (None); its tensor-parallel groups are its replicas."""
        if model_parallel is None:
            return self.layouts["policy"]
        return reward_model_layout(self.comm.world, model_parallel)

    def reward_model(self, path: str, config: Optional[str], compute_dtype: str,
                     model_parallel: Optional[int] = None) -> RewardModel:
        """This rank's piece of a reward model in its layout (`reward_model_layout`; the policy is on the host while
        it scores)."""
        layout = self.reward_model_layout(model_parallel)
        rm = reward_model_piece(path, config, layout, self.comm.tp_group(layout), compute_dtype)
        heartbeat.beat()
        return rm

    def reward_scorer(self, scorer, model_parallel: Optional[int] = None):
        """Each replica of the reward model's layout scores its share of the rollouts, every rank gets every score
        (`parallel/replica_scores.ReplicaScores`); with one replica, the scorer itself."""
        replica = replica_of(self.reward_model_layout(model_parallel), self.comm.rank)
        logger.info("rank %d: reward model split over %d ranks, replica %d of %d scoring its share of the rollouts",
                    self.rank, len(replica.tp_ranks), replica.index, replica.count)
        return scorer if replica.count == 1 else ReplicaScores(scorer, self.comm, replica)

    def judge_engine(self, engine: RolloutEngine):
        """Every rank holds a generative judge whole and answers its share of the questions; every rank gets every
        answer (a DataParallelEngine over the world: the answers are one process's)."""
        return DataParallelEngine(engine, self.comm, self.comm.group(range(self.comm.world)))

    def weight_sync(self, src: Qwen2ForCausalLM, dst: Qwen2ForCausalLM, role: str,
                    memory: Optional[SwapManager] = None, bucket_bytes: int = 0,
                    names: Optional[List[str]] = None) -> Sync:
        """names: only these parameters move (LoRA's adapters, resharded like the weights by their split rules in
        `parallel/layout.py`): the whole model's names, the same on every rank (`models.lora.adapter_shapes`), of which
        each pipeline stage gives its own."""
        shapes = dict(expected_shapes(src.config), **adapter_shapes(src))
        sync = Reshard(src, dst, self.layouts["policy"], self.layouts[role], self.comm, shapes, memory,
                       bucket_bytes=bucket_bytes, names=names)
        logger.info("rank %d: resharding policy %s -> %s %s receives %.1f MB per sync (minimum %.1f MB)",
                    self.rank, self.layouts["policy"], role, self.layouts[role], sync.received / 2 ** 20,
                    sync.minimum / 2 ** 20)
        return sync

    def same_layout(self, role: str) -> bool:
        """The role's layout equals the policy's: every rank would build the same piece of the same model."""
        return self.layouts[role] == self.layouts["policy"]

    def shared_sync(self) -> Sync:
        return SharedWeights(Reshard.metric_names())

    def rewards(self, rewards: RewardSet) -> Rewards:
        """Rank 0 scores (only its reward pool starts), every rank gets the same scores."""
        return SharedRewards(rewards, self.comm)

    def model_rewards(self, build: Callable[[], object], names: Sequence[str], weights: Sequence[float]):
        """Every rank scores with its tensor-parallel piece of each reward model (a collective of the tp group)."""
        return build()

    def grad_reducer(self) -> Optional[DataParallelGrads]:
        return DataParallelGrads(self.comm, self.comm.train_dp)

    def pipeline(self, role: str, dtype) -> Optional[Pipeline]:
        return Pipeline(self.comm, self.layouts[role], dtype)

    def checkpoints(self, root: str, keep_last: int, mcfg: Qwen2Config,
                    adapters: Optional[Dict[str, Tuple[int, ...]]] = None) -> Checkpoints:
        """Its pieces of the policy, optimizer state and reference, plus (rank 0) the training
        layout's strategy file (mindgrpo.parallel.sharded_checkpoints). adapters: LoRA's full shapes
        (`models.lora.adapter_shapes`), whose checkpoints hold the adapters and their moments in place of the
        weights: the strategy file describes them."""
        shapes, train = training_shapes(mcfg, adapters), self.layouts["policy"]
        return ShardedCheckpoints(self.comm, root, keep_last, lambda path: write_strategy_file(
            path, train, shapes, optimizer_shard=self.optimizer_shard))

    @property
    def writer(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        self.comm.barrier()

    def whole(self, params: Sequence[ms.Parameter], shapes: Optional[Dict[str, Tuple[int, ...]]] = None
              ) -> Iterator[Tuple[str, np.ndarray]]:
        """(name, the whole fp32 values) of each of the policy's parameters, in the given order (the same on every
        rank: each call is a collective). A tensor-parallel piece goes into its place of a buffer of -0.0 that the
        training tp group sums (x + -0.0 is x), in pieces of CPU_CHUNK values. With pipeline stages `shapes` names the
        parameters of the whole model to give (name -> full shape, in their order; `params` are this stage's among
        them): the stage that holds one makes it whole, then the chain of stages sums it with -0.0 from the others."""
        layout = self.layouts["policy"]
        if layout.pp == 1:
            yield from self._tp_whole(params)
            return
        if shapes is None:
            raise ValueError("placement.whole: with pipeline stages the whole model's names and shapes are needed")
        held = {p.name: p for p in params}
        unknown = sorted(set(held) - set(shapes))
        if unknown:
            raise ValueError(f"placement.whole: {unknown[0]} is not among the parameters asked for")
        chain = self.comm.group(layout.pp_group(self.rank))
        for name, shape in shapes.items():
            value = next(self._tp_whole([held[name]]))[1] if name in held else np.full(shape, -0.0, np.float32)
            if value.shape != tuple(shape):
                raise ValueError(f"placement.whole: {name} is {value.shape} whole, the shapes say {tuple(shape)}")
            yield name, self._sum(value, chain)

    def _tp_whole(self, params: Sequence[ms.Parameter]) -> Iterator[Tuple[str, np.ndarray]]:
        """(name, whole fp32 values) of each parameter of this stage, its pieces summed over the tp group."""
        layout = self.layouts["policy"]
        group = self.comm.tp_group(layout)
        for p in params:
            piece = fp32(p)
            if group.size == 1 or layout.param_split(p.name) is None:
                yield p.name, piece
                continue
            flat = np.full((group.size, piece.size), -0.0, np.float32)
            flat[group.index] = piece.reshape(-1)
            flat = self._sum(flat, group)
            yield p.name, layout.merge(p.name, [row.reshape(piece.shape) for row in flat.reshape(group.size, -1)])

    def _sum(self, values: np.ndarray, group) -> np.ndarray:
        """values summed over the group, in pieces of CPU_CHUNK values (a host sum's one buffer each)."""
        flat = values.reshape(-1).copy()
        for start in range(0, flat.size, CPU_CHUNK):
            flat[start:start + CPU_CHUNK] = self.comm.host_sum(flat[start:start + CPU_CHUNK], group)
        return flat.reshape(values.shape)


class SeparatePlacement(OneDevice):
    """generate_config.placement separate (mindgrpo/parallel/separate.py): ranks 0 .. D T P - 1 train
    (actor_config.parallel_config: D data-parallel replicas of P pipeline stages of T tensor-parallel pieces), the
    next R T' ranks generate (generate_config.parallel_config: R replicas of T' pieces); a model is whole, or with T
    (T', P) > 1 this rank's piece (`model`; the stages' hand-offs: `pipeline`). On a training rank the engine and
    the inference weight sync are the meetings with the rollout ranks (`RemoteRollout`, `SendWeights`); the
    reference (beta > 0) is beside the policy, laid out alike. With more than one training rank, rank 0 scores the
    rewards for all of them (`SharedRewards`, and the reward models: `SharedModelRewards`); D > 1 replicas split
    each mini-batch and sum their gradients as a colocated data-parallel run does (`DataParallelGrads`); whole
    replicas' checkpoints are rank 0's one-process files (`TrainingGroupCheckpoints`), replicas in pieces a
    colocated run's shards (`ShardedCheckpoints` over the training group); with one training rank, rewards and
    checkpoints are its own. Each rollout rank builds its inference copy (its piece) and engine
    (`builder.build_rollout`) and runs `grpo/rollout_worker.RolloutWorker` on its replica's share."""

    remote_rollout = True

    def __init__(self, cfg, comm: Comm):
        self.comm = comm
        self.meeting = Meeting(comm, cfg.rl_config.weight_sync_bucket_bytes)
        self.trainers = comm.train.world_size  # D replicas of T tensor-parallel pieces
        self.optimizer_shard = cfg.actor_config.parallel_config.optimizer_shard  # ZeRO-1 over the D replicas
        # the training group, on its members (more than one training rank): rewards, barriers, checkpoints
        self.training = comm.group(range(self.trainers)) if 1 < self.trainers and comm.rank < self.trainers else None

    @property
    def writer(self) -> bool:
        return self.comm.rank == 0

    def rewards(self, rewards: RewardSet) -> Rewards:
        """One training rank: its own; several: rank 0 scores, every training rank gets its scores."""
        return rewards if self.trainers == 1 else SharedRewards(rewards, self.comm, group=self.training)

    def model_rewards(self, build: Callable[[], object], names: Sequence[str], weights: Sequence[float]):
        """Several training ranks: rank 0 alone loads the reward models and judges (whole) and scores the whole batch,
        every training rank gets its scores, metrics and judges' answers (`SharedModelRewards`)."""
        if self.trainers == 1 or not names:
            return build()
        models = build() if self.comm.rank == TRAIN_RANK else None
        return SharedModelRewards(models, self.comm, self.training, names, weights, scorer=TRAIN_RANK)

    def grad_reducer(self) -> Optional[DataParallelGrads]:
        """Several training replicas: each trains its share, the gradients summed over the replicas of its piece."""
        return DataParallelGrads(self.comm, self.comm.train_dp) if self.comm.train.dp > 1 else None

    def checkpoints(self, root: str, keep_last: int, mcfg: Qwen2Config,
                    adapters: Optional[Dict[str, Tuple[int, ...]]] = None) -> Checkpoints:
        """Whole replicas: one process's checkpoints, written by training rank 0 (every training rank holds the
        whole model). Replicas in pieces (actor_config.parallel_config model_parallel or pipeline_stage > 1) or
        moments split over the replicas (optimizer_shard, ZeRO-1): a colocated run's sharded checkpoints over the
        training group (every training rank its pieces, rank 0 the training layout's strategy file:
        `ShardedCheckpoints`), which every training rank reads back on --resume."""
        train, shard = self.comm.train, self.optimizer_shard
        if train.tp > 1 or train.pp > 1 or shard:
            shapes = training_shapes(mcfg, adapters)
            return ShardedCheckpoints(self.comm.within(self.trainers), root, keep_last,
                                      lambda path: write_strategy_file(path, train, shapes, optimizer_shard=shard))
        local = LocalCheckpoints(root, keep_last)
        return local if self.trainers == 1 else TrainingGroupCheckpoints(local, self.comm, self.training)

    def barrier(self) -> None:
        """The training ranks wait for each other."""
        if self.trainers > 1:
            self.comm.barrier(self.training)

    def pipeline(self, role: str, dtype) -> Optional[Pipeline]:
        """Training pipeline stages (actor_config.parallel_config.pipeline_stage > 1): the policy's and the
        reference's hand-offs over the training layout's chains, as a colocated run's."""
        if role == "inference" or self.rollout_rank or self.comm.train.pp == 1:
            return None
        return Pipeline(self.comm, self.comm.train, dtype)

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def rollout_rank(self) -> bool:
        return self.comm.rank >= self.comm.train.world_size

    def check(self, mcfg: Qwen2Config) -> None:
        """The training and rollout replicas' tensor parallelism divides the model (heads, vocabulary); the error names
        the config section."""
        for where, layout in (("actor_config", self.comm.train), ("generate_config", self.comm.infer)):
            try:
                ParallelLayout(dp=1, tp=layout.tp, pp=layout.pp).check_divisible(mcfg)
            except ValueError as e:
                raise ValueError(f"{where}.parallel_config: {e}") from None

    def model(self, role: str, mcfg: Qwen2Config, path: Optional[str], load: bool, seed: int,
              max_positions: int) -> Qwen2ForCausalLM:
        """With tensor parallelism (model_parallel T > 1) or pipeline stages this rank's piece: a rollout rank's
        inference copy its replica's piece (generate_config.parallel_config), a training rank's policy and reference
        its stage's piece of the training layout (actor_config.parallel_config; the reference beside the policy, laid
        out alike): every rank draws the whole model from `seed`, then the weights at `path` sliced (`model_piece`, as
        a colocated run's; the whole weights only: a folder of per-rank shards is a colocated layout's). Otherwise the
        whole model."""
        train, infer = self.comm.train, self.comm.infer
        path = path if load else None
        if role == "inference" and self.rollout_rank and infer.tp > 1:
            return model_piece(mcfg, seed, max_positions, infer, self.meeting.tp_group(), self.rank - train.world_size,
                               path)
        if role != "inference" and not self.rollout_rank and (train.tp > 1 or train.pp > 1):
            return model_piece(mcfg, seed, max_positions, train, self.comm.train_tp, self.rank, path)
        return super().model(role, mcfg, path, load, seed, max_positions)

    def engine(self, rollout: Optional[RolloutEngine]) -> Engine:
        """The training rank: the samples meeting; the rollout rank: its own engine."""
        return rollout if self.rollout_rank else RemoteRollout(self.meeting)

    def weight_sync(self, src: Qwen2ForCausalLM, dst: Optional[Qwen2ForCausalLM], role: str,
                    memory: Optional[SwapManager] = None, bucket_bytes: int = 0,
                    names: Optional[List[str]] = None) -> Sync:
        """The inference copies are on the rollout ranks: the weights meeting (names: only these parameters, LoRA's
        adapters or base); the reference is beside the policy."""
        if role == "inference":
            return SendWeights(self.meeting, src, names)
        return WeightSync(src, dst, memory, bucket_bytes, names, role)

    def same_layout(self, role: str) -> bool:
        """The inference copy is on another rank; the reference is beside the policy."""
        return role != "inference"


Placement = Union[OneDevice, ParallelPlacement, SeparatePlacement]


def placement_for(cfg, use_parallel: bool) -> Placement:
    """One device, or (under msrun) the config's layouts over the world, communication initialised
    and the rank guarded: SIGTERM when msrun dies, the watchdog's bounds (rl_config.collective_timeout_s,
    compile_timeout_s) on every collective, so that no rank hangs or outlives the job."""
    separate = cfg.generate_config.placement == "separate"
    if not use_parallel:
        if separate:
            raise ValueError("generate_config.placement separate runs under msrun (--use_parallel True, msrun "
                             "--worker_num=1 + R: rank 0 trains, R ranks generate); one process is colocated")
        return OneDevice()
    if separate:
        comm = init_separate(cfg)
        guard_rank(comm.rank, cfg.rl_config.collective_timeout_s, cfg.rl_config.compile_timeout_s)
        return SeparatePlacement(cfg, comm)
    comm = init_parallel(cfg)
    guard_rank(comm.rank, cfg.rl_config.collective_timeout_s, cfg.rl_config.compile_timeout_s)
    return ParallelPlacement(cfg, comm)


def load_shard(lm: Qwen2ForCausalLM, folder: str, params: Optional[Sequence[ms.Parameter]] = None) -> None:
    """Load this rank's shard (the last .ckpt of folder in name order, as MindSpore picks) into params (None:
    every parameter of the model), checking every parameter's name and local shape."""
    files = sorted(glob.glob(os.path.join(folder, "*.ckpt")))
    if not files:
        raise FileNotFoundError(f"{folder}: no .ckpt shard")
    params = [p for _, p in lm.parameters_and_names()] if params is None else params
    load_params(files[-1], params, hint=" (a shard of another layout?)")


def fp32(p: ms.Parameter) -> np.ndarray:
    """A parameter's values as an fp32 numpy array (a copy)."""
    return p.astype(ms.float32).asnumpy() if p.dtype != ms.float32 else p.asnumpy().copy()


def save_strategies(cfg, out_dir: str) -> List[str]:
    """Write the training and inference strategy files of cfg's layouts into out_dir/strategy
    (MindSpore's format; see mindgrpo.parallel.strategy) and return their paths. With actor_config.lora_rank > 0
    the training file describes the adapters and their moments (what the run's checkpoints hold)."""
    train_layout, infer_layout, _ = layouts_of(cfg)
    mcfg = preset_config(cfg.actor_config.model, compute_dtype=cfg.actor_config.dtype)
    folder = os.path.join(out_dir, "strategy")
    os.makedirs(folder, exist_ok=True)
    a = cfg.actor_config  # LoRA: the training file describes the adapters and their moments (its checkpoints')
    adapters = full_adapter_shapes(mcfg, a.lora_rank, a.lora_target_modules) if a.lora_rank > 0 else None
    written = write_layout_strategies(folder, mcfg, train_layout, infer_layout,
                                      optimizer_shard=a.parallel_config.optimizer_shard, adapters=adapters)
    return [written["train"], written["infer"]]

"""The separate placement under msrun (generate_config.placement separate): training ranks and rollout ranks, meeting
over the world (parallel/separate.py); a model whole, or this rank's piece (parallel/model_pieces.py).
parallel/placement.py describes what a placement gives the build (grpo/builder.py)."""

from __future__ import annotations

from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import mindspore as ms

from mindgrpo.inference.engine import RolloutEngine
from mindgrpo.memory.swap import SwapManager
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.qwen2 import Qwen2ForCausalLM
from mindgrpo.parallel.checkpoints import LocalCheckpoints
from mindgrpo.parallel.comm import Comm
from mindgrpo.parallel.data_parallel import DataParallelGrads
from mindgrpo.parallel.layout import ParallelLayout
from mindgrpo.parallel.model_pieces import load_pieces, model_piece, whole_parameters
from mindgrpo.parallel.one_device import OneDevice
from mindgrpo.parallel.pipeline import Pipeline
from mindgrpo.parallel.separate import TRAIN_RANK, Meeting, RemoteRollout, SendWeights, TrainingGroupCheckpoints
from mindgrpo.parallel.sharded_checkpoints import ShardedCheckpoints
from mindgrpo.parallel.shared_rewards import SharedModelRewards, SharedRewards
from mindgrpo.parallel.strategy import training_shapes, write_strategy_file
from mindgrpo.parallel.weight_sync import WeightSync
from mindgrpo.rewards import RewardSet


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
        self.resamples = cfg.rollout_ranks_resample()  # dynamic sampling: the rollout ranks decide the rounds
        self.trainers = comm.train.world_size  # D replicas of T tensor-parallel pieces
        self.optimizer_shard = cfg.actor_config.parallel_config.optimizer_shard  # ZeRO-1 over the D replicas
        # the training group, on its members (more than one training rank): rewards, barriers, checkpoints
        self.training = comm.group(range(self.trainers)) if 1 < self.trainers and comm.rank < self.trainers else None

    @property
    def writer(self) -> bool:
        return self.comm.rank == 0

    def rewards(self, rewards: RewardSet) -> Union[RewardSet, SharedRewards]:
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
                    adapters: Optional[Dict[str, Tuple[int, ...]]] = None
                    ) -> Union[LocalCheckpoints, TrainingGroupCheckpoints, ShardedCheckpoints]:
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
        piece = self._piece(role)
        if piece is not None:
            layout, group, layout_rank = piece
            return model_piece(mcfg, seed, max_positions, layout, group, layout_rank, path if load else None)
        return super().model(role, mcfg, path if load else None, load, seed, max_positions)

    def _piece(self, role: str):
        """(layout, its tensor-parallel group, this rank's place in it) where this rank's `role` model is a piece: a
        rollout rank's inference copy in a replica of T' > 1 pieces, a training rank's policy or reference with T or
        P > 1; else None (the model whole)."""
        train, infer = self.comm.train, self.comm.infer
        if role == "inference" and self.rollout_rank and infer.tp > 1:
            return infer, self.meeting.tp_group(), self.rank - train.world_size
        if role != "inference" and not self.rollout_rank and (train.tp > 1 or train.pp > 1):
            return train, self.comm.train_tp, self.rank
        return None

    def load_weights(self, role: str, lm: Qwen2ForCausalLM, path: str, names: Optional[Sequence[str]] = None) -> None:
        """The parameters `names` (None: every one) of this rank's model from the whole weights at `path`: its piece
        of each where `model` built a piece (`load_pieces`, sliced as `model` slices), else whole."""
        piece = self._piece(role)
        if piece is not None:
            load_pieces(lm, path, piece[0], piece[1].index, names=names)
        else:
            super().load_weights(role, lm, path, names)

    def whole(self, params: Sequence[ms.Parameter], shapes: Optional[Dict[str, Tuple[int, ...]]] = None
              ) -> Iterator[Tuple[str, np.ndarray]]:
        """(name, whole fp32 values) of each of the policy's parameters on a training rank (LoRA's checkpoints: its
        base file and PEFT folder): a collective of the training layout's tp group and stages when its replicas are
        in pieces (`model_pieces.whole_parameters`), else this rank's own values."""
        train = self.comm.train
        if train.tp == 1 and train.pp == 1:
            return super().whole(params, shapes)
        return whole_parameters(self.comm, train, self.rank, params, shapes)

    def engine(self, rollout: Optional[RolloutEngine]) -> Union[RolloutEngine, RemoteRollout]:
        """The training rank: the samples meeting; the rollout rank: its own engine."""
        return rollout if self.rollout_rank else RemoteRollout(self.meeting, self.resamples)

    def weight_sync(self, src: Qwen2ForCausalLM, dst: Optional[Qwen2ForCausalLM], role: str,
                    memory: Optional[SwapManager] = None, bucket_bytes: int = 0,
                    names: Optional[List[str]] = None) -> Union[SendWeights, WeightSync]:
        """The inference copies are on the rollout ranks: the weights meeting (names: only these parameters, LoRA's
        adapters or base); the reference is beside the policy."""
        if role == "inference":
            return SendWeights(self.meeting, src, names)
        return WeightSync(src, dst, memory, bucket_bytes, names, role)

    def same_layout(self, role: str) -> bool:
        """The inference copy is on another rank; the reference is beside the policy."""
        return role != "inference"

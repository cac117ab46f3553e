"""The colocated placement under msrun: every rank holds its piece of each of the config's layouts (policy:
actor_config.parallel_config, inference: generate_config's, reference: ref_config's) over the whole world,
`comm.init_parallel` having created their groups (parallel/placement.py describes what a placement gives the
build, grpo/builder.py)."""

from __future__ import annotations

import logging
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import mindspore as ms

from mindgrpo.inference.engine import RolloutEngine
from mindgrpo.memory.swap import SwapManager
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.convert import expected_shapes
from mindgrpo.models.lora import adapter_shapes
from mindgrpo.models.qwen2 import Qwen2ForCausalLM
from mindgrpo.models.reward_model import RewardModel
from mindgrpo.parallel.comm import Comm, layouts_of
from mindgrpo.parallel.data_parallel import DataParallelEngine, DataParallelGrads
from mindgrpo.parallel.layout import ParallelLayout, reward_model_layout
from mindgrpo.parallel.model_pieces import load_pieces, model_piece, reward_model_piece, whole_parameters
from mindgrpo.parallel.pipeline import Pipeline
from mindgrpo.parallel.replica_scores import ReplicaScores, replica_of
from mindgrpo.parallel.reshard import Reshard
from mindgrpo.parallel.sharded_checkpoints import ShardedCheckpoints
from mindgrpo.parallel.shared_rewards import SharedRewards
from mindgrpo.parallel.strategy import training_shapes, write_strategy_file
from mindgrpo.parallel.weight_sync import SharedWeights
from mindgrpo.rewards import RewardSet
from mindgrpo.utils import heartbeat

logger = logging.getLogger(__name__)

ROLES = ("policy", "inference", "reference")


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

    def engine(self, rollout: RolloutEngine) -> DataParallelEngine:
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
                    names: Optional[List[str]] = None) -> Reshard:
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

    def shared_sync(self) -> SharedWeights:
        return SharedWeights(Reshard.metric_names())

    def rewards(self, rewards: RewardSet) -> SharedRewards:
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
                    adapters: Optional[Dict[str, Tuple[int, ...]]] = None) -> ShardedCheckpoints:
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
        """(name, the whole fp32 values) of each of the policy's parameters, in the given order (a collective of the
        policy's layout: `model_pieces.whole_parameters`; shapes: the whole model's, with pipeline stages)."""
        return whole_parameters(self.comm, self.layouts["policy"], self.rank, params, shapes)

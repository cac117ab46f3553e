"""The placement of a one-process run: every model whole, in this process (parallel/placement.py describes what a
placement gives the build, grpo/builder.py)."""

from __future__ import annotations

from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import mindspore as ms

from mindgrpo.inference.engine import RolloutEngine
from mindgrpo.memory.swap import SwapManager
from mindgrpo.models.checkpoint import load_state, read_model_state
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.qwen2 import Qwen2ForCausalLM
from mindgrpo.models.reward_model import RewardModel, load_reward_model
from mindgrpo.parallel.checkpoints import LocalCheckpoints
from mindgrpo.parallel.data_parallel import DataParallelGrads
from mindgrpo.parallel.model_pieces import fp32
from mindgrpo.parallel.pipeline import Pipeline
from mindgrpo.parallel.weight_sync import SharedWeights, WeightSync
from mindgrpo.rewards import RewardSet


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

    def engine(self, rollout: RolloutEngine) -> RolloutEngine:
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
                    names: Optional[List[str]] = None) -> WeightSync:
        """names: only these parameters move (LoRA's adapters)."""
        return WeightSync(src, dst, memory, bucket_bytes, names, role)

    def same_layout(self, role: str) -> bool:
        """One device holds every model whole: the role's parameters are the policy's, laid out alike."""
        return True

    def shared_sync(self) -> SharedWeights:
        return SharedWeights(WeightSync.METRICS)

    def rewards(self, rewards: RewardSet) -> RewardSet:
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
                    adapters: Optional[Dict[str, Tuple[int, ...]]] = None) -> LocalCheckpoints:
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

"""Where the run's models live, and the machinery that goes with it: the placement, and `placement_for`, which
picks it. One module each: `one_device.OneDevice`, `colocated.ParallelPlacement`,
`separate_placement.SeparatePlacement` (generate_config.placement separate: a one-device placement on each of its
ranks, a model whole or in pieces; its class says what it changes); the pieces of a model: `model_pieces.py`.

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
(sliced: `model_pieces.py`), or from a directory of per-rank shards written by scripts/transform_checkpoint.py
(`DIR/rank_<k>/*.ckpt`). `placement_for` also guards an msrun rank with the collective watchdog
(mindgrpo.parallel.watchdog) before anything is built.
"""

from __future__ import annotations

import os
from typing import List, Union

from mindgrpo.inference.engine import RolloutEngine
from mindgrpo.models.lora_targets import full_adapter_shapes
from mindgrpo.models.presets import preset_config
from mindgrpo.parallel.checkpoints import LocalCheckpoints
from mindgrpo.parallel.colocated import ParallelPlacement
from mindgrpo.parallel.comm import init_parallel, init_separate, layouts_of
from mindgrpo.parallel.data_parallel import DataParallelEngine
from mindgrpo.parallel.one_device import OneDevice
from mindgrpo.parallel.reshard import Reshard
from mindgrpo.parallel.separate import RemoteRollout, SendWeights, TrainingGroupCheckpoints
from mindgrpo.parallel.separate_placement import SeparatePlacement
from mindgrpo.parallel.sharded_checkpoints import ShardedCheckpoints
from mindgrpo.parallel.shared_rewards import SharedRewards
from mindgrpo.parallel.strategy import write_layout_strategies
from mindgrpo.parallel.watchdog import guard_rank
from mindgrpo.parallel.weight_sync import SharedWeights, WeightSync
from mindgrpo.rewards import RewardSet

# what a placement gives the build (grpo/builder.py), whichever it is
Engine = Union[RolloutEngine, DataParallelEngine, RemoteRollout]
Checkpoints = Union[LocalCheckpoints, ShardedCheckpoints, TrainingGroupCheckpoints]
Rewards = Union[RewardSet, SharedRewards]
Sync = Union[WeightSync, Reshard, SharedWeights, SendWeights]

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

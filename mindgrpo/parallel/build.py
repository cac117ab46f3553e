"""The distributed build: `mindgrpo.grpo.builder.build` calls `build_parallel` when it is given a Comm.

The parts are those of the one-process build, each model being this rank's piece of its layout:

    policy      training layout (actor_config.parallel_config), TensorParallelLayers, this
                rank's pipeline stage of it (with its `Pipeline`)
    inference   inference layout (generate_config.parallel_config), generating through a
                DataParallelEngine (its replica's share of the prompts, gathered after)
    reference   reference layout (ref_config.parallel_config), only when beta > 0; pipeline
                stages as the policy's
    sync        Reshard policy -> inference after every update; ref_sync policy -> reference
    grad_reducer  DataParallelGrads over the training data-parallel group

Weights come from the same seed as a one-process run (every rank draws the full initial
tensors and keeps its piece), from a full checkpoint (sliced here), or from a directory of
per-rank shards written by scripts/transform_checkpoint.py (`DIR/rank_<k>/*.ckpt`).
"""

from __future__ import annotations

import glob
import logging
import os
from typing import Dict, List, Optional

from mindgrpo.config.grpo import GRPOConfig
from mindgrpo.models.qwen2 import Qwen2Config, Qwen2ForCausalLM
from mindgrpo.parallel.comm import Comm, layouts_of
from mindgrpo.parallel.layout import ParallelLayout
from mindgrpo.utils import heartbeat

logger = logging.getLogger(__name__)


def model_config(cfg: GRPOConfig, path: Optional[str], load: bool) -> Qwen2Config:
    """The model config: beside the weights when they are loaded from a full checkpoint or an HF
    directory, else actor_config.model (a preset name or a file)."""
    from mindgrpo.grpo.builder import resolve_model_config
    from mindgrpo.models.checkpoint import find_config

    dtype = cfg.actor_config.dtype
    if path and load and not shard_dir(path, 0):
        return Qwen2Config.load(find_config(path), compute_dtype=dtype)
    return Qwen2Config.load(resolve_model_config(cfg.actor_config.model), compute_dtype=dtype)


def shard_dir(path: str, rank: int) -> Optional[str]:
    """path/rank_<rank> when path is a directory of per-rank shards, else None."""
    candidate = os.path.join(path, f"rank_{rank}")
    return candidate if os.path.isdir(path) and os.path.isdir(candidate) else None


def load_shard(lm: Qwen2ForCausalLM, folder: str) -> None:
    """Load this rank's shard (the last .ckpt of folder in name order, as MindSpore picks),
    checking every parameter's name and local shape."""
    import mindspore as ms

    files = sorted(glob.glob(os.path.join(folder, "*.ckpt")))
    if not files:
        raise FileNotFoundError(f"{folder}: no .ckpt shard")
    saved = ms.load_checkpoint(files[-1])
    for name, p in lm.parameters_and_names():
        if name not in saved:
            raise KeyError(f"{files[-1]}: missing parameter {name!r}")
        if tuple(saved[name].shape) != tuple(p.shape):
            raise ValueError(f"{files[-1]}: parameter {name!r} has shape {tuple(saved[name].shape)}, this rank's "
                             f"piece is {tuple(p.shape)} (a shard of another layout?)")
        p.set_data(saved[name].astype(p.dtype))


def build_tp_model(cfg: GRPOConfig, mcfg: Qwen2Config, layout: ParallelLayout, comm: Comm, path: Optional[str],
                   load: bool, seed: int) -> Qwen2ForCausalLM:
    """This rank's piece of the model in `layout`: its pipeline stage's parameters, its
    tensor-parallel piece of each."""
    from mindgrpo.models.checkpoint import load_state, read_model_state
    from mindgrpo.parallel.pipeline import stage_spec
    from mindgrpo.parallel.tp_layers import TensorParallelLayers

    group = comm.tp_group(layout)
    gen = cfg.generate_config
    max_pos = min(gen.max_prompt_length + gen.max_tokens + 64, mcfg.max_position_embeddings)
    stage = stage_spec(layout, layout.stage(comm.rank), mcfg.num_hidden_layers)
    lm = Qwen2ForCausalLM(mcfg, seed=seed, max_positions=max_pos, layers=TensorParallelLayers(group), stage=stage)
    if path and load:
        shards = shard_dir(path, comm.rank)
        if shards:
            load_shard(lm, shards)
        else:  # a full checkpoint: every rank reads it and keeps its piece of its stage
            state = read_model_state(path, mcfg)
            mine = dict(lm.parameters_and_names())
            load_state(lm, {n: layout.shard(n, a, group.index) for n, a in state.items() if n in mine})
    heartbeat.beat()  # progress for the collective watchdog: building a big model takes a while
    return lm


def full_shapes(mcfg: Qwen2Config) -> Dict[str, tuple]:
    from mindgrpo.models.convert import expected_shapes

    return expected_shapes(mcfg)


def build_parallel(cfg: GRPOConfig, paths, cache_dir: str, comm: Comm):
    from mindgrpo.grpo.builder import Parts, build_prompts, build_rewards, build_tokenizer, model_source
    from mindgrpo.grpo.prompts import check_vocabulary
    from mindgrpo.inference.engine import RolloutEngine
    from mindgrpo.memory.swap import SwapManager
    from mindgrpo.parallel.data_parallel import DataParallelEngine, DataParallelGrads
    from mindgrpo.parallel.pipeline import Pipeline
    from mindgrpo.parallel.reshard import Reshard
    from mindgrpo.parallel.shared_rewards import SharedRewards

    rl = cfg.rl_config
    train_layout, infer_layout, ref_layout = layouts_of(cfg)
    mcfg = model_config(cfg, paths.sft_path_train, paths.load_sft_checkpoint_train)
    for where, layout in (("actor_config", train_layout), ("generate_config", infer_layout),
                          ("ref_config", ref_layout)):
        if layout is not None:
            try:
                layout.check_divisible(mcfg)
            except ValueError as e:
                raise ValueError(f"{where}.parallel_config: {e}") from None
    tokenizer = build_tokenizer(cfg, paths, cache_dir)
    train, val = build_prompts(cfg, paths, tokenizer, cache_dir)
    if mcfg.vocab_size < tokenizer.vocab_size:
        raise ValueError(f"the model's vocab_size {mcfg.vocab_size} is smaller than the tokenizer's "
                         f"{tokenizer.vocab_size}")
    check_vocabulary(mcfg.vocab_size, model_source(cfg, paths.sft_path_train, paths.load_sft_checkpoint_train),
                     train, val)
    policy = build_tp_model(cfg, mcfg, train_layout, comm, paths.sft_path_train, paths.load_sft_checkpoint_train,
                            rl.seed)
    inference = build_tp_model(cfg, mcfg, infer_layout, comm, paths.sft_path_infer or paths.sft_path_train,
                               paths.load_sft_checkpoint_infer, rl.seed)
    reference = None
    if ref_layout is not None:
        reference = build_tp_model(cfg, mcfg, ref_layout, comm,
                                   paths.ref_path or cfg.ref_config.load_checkpoint or paths.sft_path_train,
                                   paths.load_ref_checkpoint, rl.seed)
        for p in reference.get_parameters():
            p.requires_grad = False
    memory = SwapManager(enabled=rl.swap, device=comm.device)
    rollout = RolloutEngine(inference, pad_token_id=tokenizer.pad_token_id)
    memory.register("policy", policy.get_parameters())
    memory.register("inference", rollout.resident_parameters())
    if reference is not None:
        memory.register("reference", reference.get_parameters())
    engine = DataParallelEngine(rollout, comm, comm.infer_dp)
    memory.register("kv_cache", sizer=engine.cache_bytes)
    shapes = full_shapes(mcfg)
    sync = Reshard(policy, inference, train_layout, infer_layout, comm, shapes, memory)
    if not (paths.sft_path_infer and paths.load_sft_checkpoint_infer):
        sync()  # start the inference copy from the policy's weights
    ref_sync = None
    if reference is not None:
        ref_sync = Reshard(policy, reference, train_layout, ref_layout, comm, shapes)  # the trainer adds ref_
        if not (paths.ref_path or paths.sft_path_train):
            ref_sync()  # random init: the reference starts as the policy
    logger.info("rank %d: policy %s, inference %s, reference %s; resharding receives %.1f MB per sync "
                "(minimum %.1f MB)", comm.rank, train_layout, infer_layout, ref_layout, sync.received / 2**20,
                sync.minimum / 2**20)
    rewards = SharedRewards(build_rewards(cfg), comm)  # rank 0 scores, every rank gets its scores
    return Parts(tokenizer, policy, inference, reference, train, val, rewards, memory, engine, sync,
                 ref_sync, grad_reducer=DataParallelGrads(comm, comm.train_dp),
                 pipeline=Pipeline(comm, train_layout, policy.dtype),
                 ref_pipeline=Pipeline(comm, ref_layout, reference.dtype) if reference is not None else None)


def save_strategies(cfg: GRPOConfig, out_dir: str) -> List[str]:
    """Write the training and inference strategy files of cfg's layouts into out_dir/strategy
    (MindSpore's format; see mindgrpo.parallel.strategy) and return their paths."""
    from mindgrpo.parallel.strategy import write_layout_strategies

    train_layout, infer_layout, _ = layouts_of(cfg)
    mcfg = model_config(cfg, None, False)
    folder = os.path.join(out_dir, "strategy")
    os.makedirs(folder, exist_ok=True)
    written = write_layout_strategies(folder, mcfg, train_layout, infer_layout,
                                      optimizer_shard=cfg.actor_config.parallel_config.optimizer_shard)
    return [written["train"], written["infer"]]


def sharded_checkpoints(cfg: GRPOConfig, comm: Comm, output_dir: str, mcfg: Qwen2Config):
    """The trainer's checkpoint part for this rank: its pieces of the policy, optimizer state and
    reference, plus the training layout's strategy file (mindgrpo.parallel.checkpoint)."""
    from mindgrpo.grpo.checkpointing import checkpoint_root
    from mindgrpo.parallel.checkpoint import ShardedCheckpoints
    from mindgrpo.parallel.strategy import training_shapes, write_strategy_file

    shapes = training_shapes(mcfg)
    return ShardedCheckpoints(comm, checkpoint_root(cfg, output_dir), cfg.rl_config.keep_last_k,
                              lambda path: write_strategy_file(
                                  path, comm.train, shapes, optimizer_shard=cfg.actor_config.parallel_config.optimizer_shard))

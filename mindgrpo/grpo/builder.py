"""Builds a GRPOTrainer from a config: models, tokenizer, data, rewards, engine, sync, memory.

Every part is made by a small function here and passed in; the trainer never reaches for a
global. `build(cfg, paths)` is what `scripts/grpo_one_stage.py` calls.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Optional

from mindgrpo.config.grpo import GRPOConfig
from mindgrpo.grpo.prompts import PromptSource, check_vocabulary

logger = logging.getLogger(__name__)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL_CONFIG_DIR = os.path.join(REPO, "model_configs")


@dataclass(frozen=True)
class Paths:
    """Locations given on the command line (our users' flags); None means: from the config."""

    output_dir: str
    sft_path_train: Optional[str] = None  # policy weights (HF dir or .ckpt)
    sft_path_infer: Optional[str] = None  # inference weights; default: the policy's
    ref_path: Optional[str] = None  # reference weights; default: the policy's
    vocab_path: Optional[str] = None
    merges_file_path: Optional[str] = None
    tokenizer_config: Optional[str] = None
    dataset: Optional[str] = None  # prompt MindRecord
    val_dataset: Optional[str] = None
    load_sft_checkpoint_train: bool = True
    load_sft_checkpoint_infer: bool = True
    load_ref_checkpoint: bool = True


def resolve_model_config(name: str) -> str:
    """A path to a model config file, or a preset name under model_configs/ (tiny, ...)."""
    if os.path.exists(name):
        return name
    for candidate in (os.path.join(MODEL_CONFIG_DIR, name + ".yaml"), os.path.join(MODEL_CONFIG_DIR, name)):
        if os.path.exists(candidate):
            return candidate
    presets = sorted(f[:-5] for f in os.listdir(MODEL_CONFIG_DIR) if f.endswith(".yaml")) \
        if os.path.isdir(MODEL_CONFIG_DIR) else []
    raise FileNotFoundError(f"actor_config.model: {name!r} is neither a file nor a preset; presets: {presets}")


def model_source(cfg: GRPOConfig, path: Optional[str], load: bool) -> str:
    """Where the policy's shape comes from, for messages: the config beside its weights, or actor_config.model."""
    if path and load and not os.path.isdir(os.path.join(path, "rank_0")):
        from mindgrpo.models.checkpoint import find_config

        return f"{find_config(path)} (the config of the weights {path})"
    return f"{resolve_model_config(cfg.actor_config.model)} (actor_config.model)"


def build_tokenizer(cfg: GRPOConfig, paths: Paths, cache_dir: str):
    from mindgrpo.data.tokenizer import QwenTokenizer

    if paths.vocab_path or paths.merges_file_path:
        if not (paths.vocab_path and paths.merges_file_path):
            raise ValueError("--vocab_path and --merges_file_path go together")
        cfg = paths.tokenizer_config
        if cfg is None:
            beside = os.path.join(os.path.dirname(os.path.abspath(paths.vocab_path)), "tokenizer_config.json")
            cfg = beside if os.path.exists(beside) else None
        return QwenTokenizer.from_files(paths.vocab_path, paths.merges_file_path, cfg)
    from mindgrpo.data.synthetic import TinyTokenizerSpec, ensure_tiny_tokenizer

    return ensure_tiny_tokenizer(os.path.join(cache_dir, "tiny_tokenizer"),
                                 TinyTokenizerSpec(task=cfg.synthetic_config.task))


def build_prompts(cfg: GRPOConfig, paths: Paths, tokenizer, cache_dir: str):
    """(train, val) PromptSources: the given MindRecords, or the built-in synthetic task."""
    from mindgrpo.data.mindrecord import load_prompt_dataset

    train_path = paths.dataset or cfg.rl_config.dataset_path
    val_path = paths.val_dataset or cfg.rl_config.val_dataset_path
    if train_path is None:
        import hashlib
        import json as _json
        from dataclasses import asdict

        from mindgrpo.data.synthetic import write_arithmetic_dataset

        syn = cfg.synthetic_config
        key = _json.dumps([asdict(syn), cfg.generate_config.max_prompt_length], sort_keys=True)
        folder = os.path.join(cache_dir, "tiny_data_" + hashlib.sha1(key.encode()).hexdigest()[:10])
        if not os.path.exists(os.path.join(folder, "val.mindrecord")):
            write_arithmetic_dataset(folder, tokenizer, syn.task, template=syn.template,
                                     max_prompt_length=cfg.generate_config.max_prompt_length, overwrite=True)
        train_path = os.path.join(folder, "train.mindrecord")
        val_path = val_path or os.path.join(folder, "val.mindrecord")
    train = PromptSource(load_prompt_dataset(train_path), seed=cfg.rl_config.seed, path=train_path)
    val = PromptSource(load_prompt_dataset(val_path), seed=0, shuffle=False, path=val_path) if val_path else None
    return train, val


def build_model(cfg: GRPOConfig, path: Optional[str], load: bool, seed: int):
    from mindgrpo.models.checkpoint import load_model
    from mindgrpo.models.qwen2 import Qwen2Config, Qwen2ForCausalLM

    actor = cfg.actor_config
    max_pos = cfg.generate_config.max_prompt_length + cfg.generate_config.max_tokens + 64
    if path and load:
        return load_model(path, compute_dtype=actor.dtype)
    mcfg = Qwen2Config.load(resolve_model_config(actor.model), compute_dtype=actor.dtype)
    return Qwen2ForCausalLM(mcfg, seed=seed, max_positions=min(max_pos, mcfg.max_position_embeddings))


def build_rewards(cfg: GRPOConfig):
    from mindgrpo.rewards import RewardSet, load_reward_plugin, reward_parameters

    rc = cfg.reward_config
    if rc.reward_plugin:
        load_reward_plugin(rc.reward_plugin)
    max_len = cfg.generate_config.max_tokens
    params = {}
    for name in rc.verifier_function:
        known = reward_parameters(name)
        if name == "cosine":
            c = rc.cosine
            params[name] = {k: v for k, v in dict(
                cosine_min_len_value_wrong=c.min_value_wrong, cosine_max_len_value_wrong=c.max_value_wrong,
                cosine_min_len_value_correct=c.max_value_correct, cosine_max_len_value_correct=c.min_value_correct,
                cosine_max_len=c.max_len or max_len).items() if k in known}
        elif name == "soft_overlong":
            s = rc.soft_overlong
            params[name] = {k: v for k, v in dict(
                soft_max_cache_length=s.buffer_len, max_completion_length=s.max_len or max_len).items() if k in known}
    return RewardSet(rc.verifier_function, rc.verifier_weight, params, num_workers=rc.num_workers,
                     timeout_s=rc.timeout_s)


@dataclass
class Parts:
    tokenizer: object
    policy: object
    inference: object
    reference: Optional[object]
    train_prompts: PromptSource
    val_prompts: Optional[PromptSource]
    rewards: object
    memory: object
    engine: object
    sync: object
    ref_sync: Optional[object]
    grad_reducer: Optional[object] = None  # data-parallel gradient sum (distributed build only)
    pipeline: Optional[object] = None  # the policy's pipeline stage (mindgrpo.parallel.pipeline.Pipeline)
    ref_pipeline: Optional[object] = None  # the reference model's


def build(cfg: GRPOConfig, paths: Paths, cache_dir: str, comm=None) -> Parts:
    """Single-process parts (the distributed builder in mindgrpo/parallel swaps the models,
    the sync and the gradient reducer for their tensor-parallel versions)."""
    import mindspore as ms

    from mindgrpo.inference.engine import RolloutEngine
    from mindgrpo.memory.swap import SwapManager
    from mindgrpo.parallel.reshard import WeightSync

    if comm is not None:
        from mindgrpo.parallel.build import build_parallel

        return build_parallel(cfg, paths, cache_dir, comm)
    rl = cfg.rl_config
    tokenizer = build_tokenizer(cfg, paths, cache_dir)
    train, val = build_prompts(cfg, paths, tokenizer, cache_dir)
    policy = build_model(cfg, paths.sft_path_train, paths.load_sft_checkpoint_train, seed=rl.seed)
    if policy.config.vocab_size < tokenizer.vocab_size:
        raise ValueError(f"the model's vocab_size {policy.config.vocab_size} is smaller than the tokenizer's "
                         f"{tokenizer.vocab_size}")
    check_vocabulary(policy.config.vocab_size, model_source(cfg, paths.sft_path_train, paths.load_sft_checkpoint_train),
                     train, val)
    inference = build_model(cfg, paths.sft_path_infer or paths.sft_path_train, paths.load_sft_checkpoint_infer,
                            seed=rl.seed)
    reference = None
    if rl.beta > 0:
        reference = build_model(cfg, paths.ref_path or cfg.ref_config.load_checkpoint or paths.sft_path_train,
                                paths.load_ref_checkpoint, seed=rl.seed)
        for p in reference.get_parameters():
            p.requires_grad = False
    memory = SwapManager(enabled=rl.swap, device=ms.get_context("device_target"))  # real moves on Ascend
    engine = RolloutEngine(inference, pad_token_id=tokenizer.pad_token_id)
    memory.register("policy", policy.get_parameters())
    memory.register("inference", engine.resident_parameters())
    if reference is not None:
        memory.register("reference", reference.get_parameters())
    memory.register("kv_cache", sizer=lambda: sum(b.cache.nbytes for b in engine._buckets.values()))
    sync = WeightSync(policy, inference, memory)
    if not (paths.sft_path_infer and paths.load_sft_checkpoint_infer):
        sync()  # start the inference copy from the policy's weights
    ref_sync = WeightSync(policy, reference) if reference is not None else None
    if reference is not None and not (paths.ref_path or paths.sft_path_train):
        ref_sync()  # random init: the reference starts as the policy
    return Parts(tokenizer, policy, inference, reference, train, val, build_rewards(cfg), memory, engine, sync,
                 ref_sync)


def make_trainer(cfg: GRPOConfig, parts: Parts, metrics_log, progress, output_dir: str, rank: int = 0, comm=None):
    from mindgrpo.grpo.trainer import GRPOTrainer

    checkpoints = None  # one process: checkpointing.LocalCheckpoints
    if comm is not None:
        from mindgrpo.parallel.build import sharded_checkpoints

        checkpoints = sharded_checkpoints(cfg, comm, output_dir, parts.policy.config)
    return GRPOTrainer(cfg, policy=parts.policy, inference=parts.inference, reference=parts.reference,
                engine=parts.engine, sync=parts.sync, ref_sync=parts.ref_sync, memory=parts.memory,
                rewards=parts.rewards, tokenizer=parts.tokenizer, train_prompts=parts.train_prompts,
                val_prompts=parts.val_prompts, metrics_log=metrics_log, progress=progress,
                output_dir=output_dir, rank=rank, grad_reducer=parts.grad_reducer, checkpoints=checkpoints,
                pipeline=parts.pipeline, ref_pipeline=parts.ref_pipeline)


def save_strategies(cfg: GRPOConfig, out: str) -> list:
    """Write the strategy files of cfg's training and inference layouts; returns their paths."""
    from mindgrpo.parallel.build import save_strategies as write

    return write(cfg, out)

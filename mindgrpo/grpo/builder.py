"""The composition root: a GRPOTrainer's parts from a config, on one device or under msrun.

    placement = placement_for(cfg, use_parallel)        # mindgrpo.parallel.placement
    parts = build(cfg, paths, placement)                # the build sequence, once for every placement
    trainer = make_trainer(cfg, parts, metrics_log, progress, output_dir)

`build` runs the build sequence: the model config, the tokenizer, the prompts, the vocabulary
checks (the tokenizer's and every prompt token id against the model's), the reward set and its
columns checked against the prompts', the models (policy, inference, reference), the memory
ledger, the reference frozen, the rollout engine, the weight syncs and the initial sync, the
gradient reducer, the pipeline stages and the checkpoint I/O. The start-up checks come before any
model is built. What depends on the devices (each model's piece and how it loads, the engine's
data parallelism, same-layout copy or resharding, who scores the rewards, the gradient sum,
sharded or whole checkpoints) is the placement's; the trainer never reaches for a global.

One copy where the layouts match (`inference_shares_policy`): when the inference model would hold
exactly the policy's parameters in the same layout, the engine generates with the policy model
itself (its fused layer copies remade from the policy's parameters at every call, as always): no
second model, and the weight sync is the placement's `shared_sync`, which moves nothing.
`generate_config.inference_weights: copy` keeps the copy.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, Optional, Tuple

from mindgrpo.config.grpo import GRPOConfig
from mindgrpo.config.loader import ConfigError, check
from mindgrpo.models.convert import expected_shapes
from mindgrpo.models.lora_targets import LoraSpec
from mindgrpo.grpo.prompts import PromptSource, check_vocabulary
from mindgrpo.memory.policy import MemoryPolicy
from mindgrpo.models.presets import resolve_model_config

if TYPE_CHECKING:  # for the types of Parts only: importing these here would load MindSpore with the builder
    from mindgrpo.data.tokenizer import QwenTokenizer
    from mindgrpo.grpo.conversations import Conversations
    from mindgrpo.grpo.lora_checkpoint import LoraCheckpoint
    from mindgrpo.grpo.reward_models import ModelRewards
    from mindgrpo.memory.swap import SwapManager
    from mindgrpo.models.qwen2 import Qwen2ForCausalLM
    from mindgrpo.parallel.data_parallel import DataParallelGrads
    from mindgrpo.parallel.pipeline import Pipeline
    from mindgrpo.parallel.placement import Checkpoints, Engine, Placement, Rewards, Sync
    from mindgrpo.rewards import RewardSet


logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Paths:
    """Locations given on the command line (our users' flags); None means: from the config."""

    output_dir: str
    sft_path_train: Optional[str] = None  # policy weights (HF dir, .ckpt, or a directory of rank shards)
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

    @property
    def cache_dir(self) -> str:
        """What the run makes for itself (the tiny tokenizer and data): <output_dir>/cache."""
        return os.path.join(self.output_dir, "cache")


@dataclass
class Parts:
    """What a GRPOTrainer is made of (`make_trainer`)."""

    tokenizer: QwenTokenizer
    policy: Qwen2ForCausalLM  # this rank's piece of it (all of it on one device)
    inference: Qwen2ForCausalLM  # the policy itself where the layouts match (`inference_shares_policy`)
    reference: Optional[Qwen2ForCausalLM]  # None when beta == 0
    train_prompts: PromptSource
    val_prompts: Optional[PromptSource]
    rewards: Rewards  # the RewardSet, or under msrun rank 0's scores shared
    memory: SwapManager
    engine: Engine
    sync: Sync  # policy -> inference
    ref_sync: Optional[Sync]  # policy -> reference
    checkpoints: Checkpoints
    rank: int = 0
    grad_reducer: Optional[DataParallelGrads] = None  # data-parallel gradient sum (under msrun)
    pipeline: Optional[Pipeline] = None  # the policy's pipeline stage
    ref_pipeline: Optional[Pipeline] = None  # the reference model's
    # reward_config.reward_models (grpo/reward_models.py; a separate placement's training group: SharedModelRewards)
    reward_models: Optional[ModelRewards] = None
    memory_policy: Optional[MemoryPolicy] = None  # rl_config.memory resolved (`mindgrpo/memory/auto.py`)
    base_path: Optional[str] = None  # where the policy's weights came from (LoRA's checkpoints refer to its base)
    conversations: Optional[Conversations] = None  # generate_config.tools (grpo/conversations.py)
    lora: Optional[LoraCheckpoint] = None  # LoRA's part of the checkpoints (grpo/lora_checkpoint.py)
    # LoRA with an inference copy: moves the base weights into it once, when the policy's base changed (the warm
    # start, a resume); the sync moves the adapters only
    base_sync: Optional[Callable[[], Dict[str, float]]] = None


def model_config_file(cfg: GRPOConfig, paths: Paths) -> Tuple[str, str]:
    """The model config file and, for messages, where it comes from: beside the policy's weights
    when they are loaded from a full checkpoint or an HF directory, else actor_config.model (a
    preset name or a file)."""
    from mindgrpo.models.checkpoint import find_config

    path = paths.sft_path_train
    if path and paths.load_sft_checkpoint_train and not os.path.isdir(os.path.join(path, "rank_0")):
        file = find_config(path)
        return file, f"{file} (the config of the weights {path})"
    file = resolve_model_config(cfg.actor_config.model)
    return file, f"{file} (actor_config.model)"


def check_model_limits(cfg: GRPOConfig, mcfg, model_source: str) -> None:
    """generate_config against the model config (`model_source` names its file): the longest sequence fits the
    model's positions, and every stop token is in its vocabulary (ConfigError naming the keys and the file)."""
    gen = cfg.generate_config
    longest = gen.max_prompt_length + gen.max_tokens
    check(longest <= mcfg.max_position_embeddings, "generate_config.max_tokens",
          f"generate_config.max_prompt_length + max_tokens = {gen.max_prompt_length} + {gen.max_tokens} = {longest} "
          f"positions, more than the max_position_embeddings {mcfg.max_position_embeddings} of {model_source}; "
          "lower one of them")
    bad = [t for t in gen.stop_token_ids if not 0 <= t < mcfg.vocab_size]
    check(not bad, "generate_config.stop_token_ids",
          f"holds {bad[0] if bad else None}, outside the vocabulary of {mcfg.vocab_size} tokens of {model_source}")


def check_conversation_limits(cfg: GRPOConfig, mcfg, model_source: str, turn_positions: int) -> None:
    """With conversations a slot holds the prompt, max_tokens and `turn_positions` positions of appended turns
    (max_turns x a turn's tokens): within the model's positions and generate_config.max_num_batched_tokens; and a
    training row the whole trajectory: within the micro-batches' token budgets."""
    if not turn_positions:
        return
    gen = cfg.generate_config
    need = gen.max_prompt_length + gen.max_tokens + turn_positions
    check(need <= mcfg.max_position_embeddings, "generate_config.max_turns",
          f"a conversation needs max_prompt_length + max_tokens + max_turns x {turn_positions // gen.max_turns} "
          f"tokens an appended turn = {need} positions, more than the max_position_embeddings "
          f"{mcfg.max_position_embeddings} of {model_source}; lower max_turns, tool_response_max_tokens or the lengths")
    check(gen.max_num_batched_tokens is None or gen.max_num_batched_tokens >= need,
          "generate_config.max_num_batched_tokens", f"must hold one conversation of {need} positions (max_prompt_length"
          f" + max_tokens + max_turns tool turns), got {gen.max_num_batched_tokens}")
    longest = -(-need // 32) * 32  # a trajectory's row, rounded up as experience.pack does
    actor = cfg.actor_config
    for key, budget in (("actor_config.max_tokens_per_micro_batch", actor.max_tokens_per_micro_batch),
                        ("ref_config.max_tokens_per_micro_batch", cfg.ref_config.max_tokens(actor))):
        check(budget == 0 or budget >= longest, key, f"must hold the longest conversation, max_prompt_length + "
              f"max_tokens + max_turns x {turn_positions // gen.max_turns} tokens an appended turn, rounded up to "
              f"32 = {longest} tokens, got {budget}")


def build_tokenizer(cfg: GRPOConfig, paths: Paths) -> QwenTokenizer:
    from mindgrpo.data.tokenizer import QwenTokenizer
    from mindgrpo.grpo.reward_models import ModelRewards

    if paths.vocab_path or paths.merges_file_path:
        if not (paths.vocab_path and paths.merges_file_path):
            raise ValueError("--vocab_path and --merges_file_path go together")
        config = paths.tokenizer_config
        if config is None:
            beside = os.path.join(os.path.dirname(os.path.abspath(paths.vocab_path)), "tokenizer_config.json")
            config = beside if os.path.exists(beside) else None
        return QwenTokenizer.from_files(paths.vocab_path, paths.merges_file_path, config)
    from mindgrpo.data.synthetic import TinyTokenizerSpec, ensure_tiny_tokenizer

    chat_texts = ()
    if cfg.generate_config.tools and cfg.generate_config.chat_template:  # the tiny tool recipe's conversations
        from mindgrpo.data.templates import ChatTemplateError
        from mindgrpo.grpo.conversations import load_tools, tool_chat_texts

        load_tools(cfg)
        try:
            chat_texts = tool_chat_texts(cfg, chat_template_file(cfg, paths))
        except ChatTemplateError as error:
            raise ConfigError("generate_config.chat_template", str(error)) from None
    return ensure_tiny_tokenizer(os.path.join(paths.cache_dir, "tiny_tokenizer"),
                                 TinyTokenizerSpec(task=cfg.synthetic_config.task, chat_texts=chat_texts))


def tokenizer_config_file(cfg: GRPOConfig, paths: Paths) -> Optional[str]:
    """The tokenizer's tokenizer_config.json (--tokenizer_config, else the one beside --vocab_path, else the tiny
    tokenizer's in the run's cache), or None."""
    if paths.tokenizer_config:
        return paths.tokenizer_config
    if paths.vocab_path:
        beside = os.path.join(os.path.dirname(os.path.abspath(paths.vocab_path)), "tokenizer_config.json")
        return beside if os.path.exists(beside) else None
    return os.path.join(paths.cache_dir, "tiny_tokenizer", "tokenizer_config.json")


def chat_template_file(cfg: GRPOConfig, paths: Paths) -> Optional[str]:
    """The tokenizer_config.json whose chat template writes the conversations: generate_config.chat_template (a
    relative path not found from the working directory is taken from the repository's root, where the recipes
    are), else the tokenizer's own (None: it has none; a file without a chat_template is refused later)."""
    path = cfg.generate_config.chat_template
    if path is None:
        return tokenizer_config_file(cfg, paths)
    if not os.path.isabs(path) and not os.path.exists(path):
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        if os.path.exists(os.path.join(root, path)):
            return os.path.join(root, path)
    check(os.path.isfile(path), "generate_config.chat_template", f"{path} is not a file (a tokenizer_config.json "
          "with a chat_template)")
    return path


def synthetic_template(cfg: GRPOConfig, chat_template: Optional[str]):
    """The synthetic task's prompt template: synthetic_config.template, or with generate_config.tools the chat
    template's one-question prompt with that template's system message and the tools' definitions."""
    syn, gen = cfg.synthetic_config, cfg.generate_config
    if not gen.tools:
        return syn.template
    from mindgrpo.data.templates import ChatTemplateError, chat_prompt_template, get_template
    from mindgrpo.grpo.conversations import load_tools
    from mindgrpo.tools import tool_schema

    load_tools(cfg)

    try:
        return chat_prompt_template(chat_template, get_template(syn.template).system,
                                    [tool_schema(n) for n in gen.tools])
    except (ChatTemplateError, KeyError) as error:
        raise ConfigError("generate_config.chat_template", str(error)) from None


def build_prompts(cfg: GRPOConfig, paths: Paths, tokenizer, template=None):
    """(train, val) PromptSources: the given MindRecords, or the built-in synthetic task (its prompts written with
    `template`, default synthetic_config.template)."""
    from mindgrpo.data.mindrecord import load_prompt_dataset

    train_path = paths.dataset or cfg.rl_config.dataset_path
    val_path = paths.val_dataset or cfg.rl_config.val_dataset_path
    if train_path is None:
        import hashlib
        import json as _json
        from dataclasses import asdict

        from mindgrpo.data.synthetic import write_arithmetic_dataset

        syn = cfg.synthetic_config
        template = template or syn.template
        written = template if isinstance(template, str) else template.parts()
        key = _json.dumps([asdict(syn), cfg.generate_config.max_prompt_length, written], sort_keys=True)
        folder = os.path.join(paths.cache_dir, "tiny_data_" + hashlib.sha1(key.encode()).hexdigest()[:10])
        if not os.path.exists(os.path.join(folder, "val.mindrecord")):
            write_arithmetic_dataset(folder, tokenizer, syn.task, template=template,
                                     max_prompt_length=cfg.generate_config.max_prompt_length, overwrite=True)
        train_path = os.path.join(folder, "train.mindrecord")
        val_path = val_path or os.path.join(folder, "val.mindrecord")
    train = PromptSource(load_prompt_dataset(train_path), seed=cfg.rl_config.seed, path=train_path)
    val = PromptSource(load_prompt_dataset(val_path), seed=0, shuffle=False, path=val_path) if val_path else None
    return train, val


def build_rewards(cfg: GRPOConfig) -> RewardSet:
    from mindgrpo.rewards import RewardSet, load_reward_plugin, reward_parameters

    rc = cfg.reward_config
    if rc.reward_plugin:
        load_reward_plugin(rc.reward_plugin, "reward_config.reward_plugin")
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


def build_engine(cfg: GRPOConfig, inference, pad_token_id: int, memory_policy: Optional[MemoryPolicy] = None,
                 turn_positions: int = 0):
    """The rollout engine of one inference replica, sized by generate_config (and `turn_positions` more per slot
    for conversations' appended turns); layer by layer where the memory policy (default: the config's explicit
    switches) says so."""
    from mindgrpo.inference.engine import RolloutEngine

    gen = cfg.generate_config
    memory_policy = memory_policy or MemoryPolicy.of_config(cfg)
    return RolloutEngine(inference, pad_token_id=pad_token_id, max_num_seqs=gen.max_num_seqs,
                         max_num_batched_tokens=gen.max_num_batched_tokens,
                         max_model_len=gen.max_prompt_length + gen.max_tokens + turn_positions,
                         layerwise=memory_policy.generate_layerwise,
                         decode_layers_per_graph=gen.decode_layers_per_graph,
                         max_prefill_tokens=gen.max_prefill_tokens)


def lora_config(cfg: GRPOConfig) -> Optional[LoraSpec]:
    """actor_config's LoRA settings, or None (lora_rank 0: full fine-tuning)."""
    a = cfg.actor_config
    if a.lora_rank == 0:
        return None
    return LoraSpec(rank=a.lora_rank, alpha=a.lora_alpha, targets=a.lora_target_modules, dropout=a.lora_dropout)


def inference_shares_policy(cfg: GRPOConfig, paths: Paths, placement: Placement) -> bool:
    """`GRPOConfig.inference_shares_policy` for this run: its placement's layouts, and whether --sft_path_infer
    loads weights of its own (a file other than the policy's)."""
    own = bool(paths.sft_path_infer and paths.load_sft_checkpoint_infer) and not (
        paths.sft_path_train and paths.load_sft_checkpoint_train
        and os.path.realpath(paths.sft_path_infer) == os.path.realpath(paths.sft_path_train))
    return cfg.inference_shares_policy(placement.same_layout("inference"), own)


def reward_model_configs(cfg: GRPOConfig) -> list:
    """The model configs of reward_config.reward_models, then of reward_config.judges, in order (for the memory
    plan): each entry's config, else the one beside its weights."""
    from mindgrpo.models.checkpoint import find_config
    from mindgrpo.models.config import Qwen2Config

    out = []
    rc = cfg.reward_config
    entries = [("reward_models", i, e) for i, e in enumerate(rc.reward_models)] + \
        [("judges", i, e) for i, e in enumerate(rc.judges)]
    for key, i, entry in entries:
        try:
            out.append(Qwen2Config.load(entry.config or find_config(entry.path)))
        except (OSError, ValueError) as e:
            raise ValueError(f"reward_config.{key}[{i}].path: {e}") from None
    return out


def build(cfg: GRPOConfig, paths: Paths, placement: Optional[Placement] = None) -> Parts:
    """The trainer's parts, each model being this rank's piece of its layout (`placement`; default:
    one device)."""
    from mindgrpo.grpo.conversations import build_conversations, remote_conversations, replica_conversations
    from mindgrpo.grpo.reward_models import build_model_rewards
    from mindgrpo.memory.auto import choose_for_run
    from mindgrpo.memory.swap import SwapManager
    from mindgrpo.models.config import Qwen2Config
    from mindgrpo.parallel.checkpoints import checkpoint_root
    from mindgrpo.parallel.one_device import OneDevice

    placement = placement or OneDevice()
    rl = cfg.rl_config
    config_file, model_source = model_config_file(cfg, paths)
    mcfg = Qwen2Config.load(config_file, compute_dtype=cfg.actor_config.dtype)
    placement.check(mcfg)
    # the memory savers: rl_config.memory planned against what this placement has, one block in the log
    memory_policy = choose_for_run(cfg, mcfg, placement.device, cfg.actor_config.parallel_config.world_size,
                                   reward_models=reward_model_configs(cfg))
    for line in memory_policy.summary().splitlines():
        logger.info("%s", line)
    tokenizer = build_tokenizer(cfg, paths)
    chat_template = chat_template_file(cfg, paths) if cfg.generate_config.conversations else None
    train, val = build_prompts(cfg, paths, tokenizer,
                               synthetic_template(cfg, chat_template) if cfg.generate_config.tools else None)
    if mcfg.vocab_size < tokenizer.vocab_size:
        raise ValueError(f"the model's vocab_size {mcfg.vocab_size} is smaller than the tokenizer's "
                         f"{tokenizer.vocab_size}")
    check_vocabulary(mcfg.vocab_size, model_source, train, val)
    check_model_limits(cfg, mcfg, model_source)
    check(val is not None or not rl.val_interval or rl.save_best is None, "rl_config.save_best",
          f"needs validation prompts, and rl_config.dataset_path {train.path} comes without any: give "
          "rl_config.val_dataset_path (--val_dataset)")
    rewards = build_rewards(cfg)
    conversations = build_conversations(cfg, tokenizer, chat_template)
    if conversations is not None and placement.remote_rollout:  # the rollout rank runs them (docs/async.md)
        conversations = remote_conversations(conversations, placement.meeting)
    elif conversations is not None and placement.inference_replicas > 1:  # each replica its share's (docs/tools.md)
        conversations = replica_conversations(conversations)
    extra = [] if conversations is None else list(conversations.columns)
    # the columns every reward call gets (grpo/rollouts.Rollouts.columns): a reward needing another fails now
    rewards.check_columns([*train.columns, "completion_length", *extra], "the training prompts")
    if val is not None:
        rewards.check_columns([*val.columns, "completion_length", *extra], "the validation prompts")
    turn_positions = 0 if conversations is None else conversations.extra_positions
    check_conversation_limits(cfg, mcfg, model_source, turn_positions)

    gen = cfg.generate_config  # RoPE positions: the longest prompt and response, some slack, at most the model's
    max_positions = min(gen.max_prompt_length + gen.max_tokens + turn_positions + 64, mcfg.max_position_embeddings)

    def model(role: str, path: Optional[str], load: bool):
        return placement.model(role, mcfg, path, load, rl.seed, max_positions)

    policy = model("policy", paths.sft_path_train, paths.load_sft_checkpoint_train)
    shared = inference_shares_policy(cfg, paths, placement)
    lora = lora_config(cfg)
    if lora is not None:  # adapters on the loaded base; the base stops training (docs/lora.md)
        from mindgrpo.models.lora import add_adapters

        check(not (paths.sft_path_infer and paths.load_sft_checkpoint_infer) or shared, "--sft_path_infer",
              "cannot combine with actor_config.lora_rank > 0: the engine's base weights are the policy's (only "
              "the adapters move)")
        add_adapters(policy, lora, rl.seed)
    if shared:
        inference = policy
        logger.info("inference: the policy model itself (one copy of the weights, no weight sync; "
                    "generate_config.inference_weights=copy keeps a copy)")
    elif placement.remote_rollout:  # generate_config.placement separate: the inference copy is the rollout rank's
        inference = None
    else:
        inference = model("inference", paths.sft_path_infer or paths.sft_path_train, paths.load_sft_checkpoint_infer)
        if lora is not None:
            add_adapters(inference, lora, rl.seed)
    reference = None
    if rl.beta > 0 and lora is None:  # with LoRA the reference is the policy with its adapters off: no copy
        reference = model("reference", paths.ref_path or cfg.ref_config.load_checkpoint or paths.sft_path_train,
                          paths.load_ref_checkpoint)
        for p in reference.get_parameters():
            p.requires_grad = False
    memory = SwapManager(enabled=rl.swap, device=placement.device, shared_inference=shared,  # real moves on Ascend
                         reference_is_policy=lora is not None and rl.beta > 0)
    rollout = build_engine(cfg, inference, tokenizer.pad_token_id, memory_policy, turn_positions) \
        if inference is not None else None
    memory.register("policy", policy.get_parameters())
    held = {id(p) for p in policy.get_parameters()}  # shared: the inference group is the fused copies alone
    if rollout is not None:
        memory.register("inference", [p for p in rollout.resident_parameters() if id(p) not in held])
    if reference is not None:
        memory.register("reference", reference.get_parameters())
    engine = placement.engine(rollout)
    memory.register("kv_cache", sizer=engine.cache_bytes)
    rc = cfg.reward_config  # the reward models, then the judges (grpo/reward_models.build_model_rewards's order)
    reward_models = placement.model_rewards(lambda: build_model_rewards(cfg, tokenizer, memory, placement),
                                            rc.model_names() + rc.judge_names(),
                                            [e.weight for e in (*rc.reward_models, *rc.judges)])
    base_sync = None
    if shared:
        sync = placement.shared_sync()
    else:
        moved = None
        if lora is not None:  # only the adapters move: the base was loaded on both sides
            from mindgrpo.models.lora import adapter_shapes

            moved = list(adapter_shapes(policy))  # the whole model's: a pipeline stage gives its layers'
        sync = placement.weight_sync(policy, inference, "inference", memory, rl.weight_sync_bucket_bytes, names=moved)
        if lora is not None:
            base = sorted(expected_shapes(mcfg))  # the whole model's base weights (every stage's)

            def base_sync() -> Dict[str, float]:  # built when called, its graphs dropped after: a run calls it once
                return placement.weight_sync(policy, inference, "inference", memory, rl.weight_sync_bucket_bytes,
                                             names=base)()
            if placement.remote_rollout:  # separate: the base first, whole (the rollout rank expects it: docs/async.md)
                base_sync()
        if placement.remote_rollout or not (paths.sft_path_infer and paths.load_sft_checkpoint_infer):
            sync()  # start the inference copy from the policy's weights (separate: always, the rollout rank waits)
    ref_sync = None
    if reference is not None:
        ref_sync = placement.weight_sync(policy, reference, "reference",  # the trainer logs it as ref_sync/...
                                         bucket_bytes=rl.weight_sync_bucket_bytes)
        if not (paths.ref_path or paths.sft_path_train):
            ref_sync()  # random init: the reference starts as the policy
    from mindgrpo.grpo.lora_checkpoint import LoraCheckpoint
    from mindgrpo.models.lora import adapter_shapes

    base_path = paths.sft_path_train if paths.sft_path_train and paths.load_sft_checkpoint_train else None
    checkpoints = placement.checkpoints(checkpoint_root(cfg, paths.output_dir), rl.keep_last_k, mcfg,
                                        adapters=adapter_shapes(policy) if lora is not None else None)
    return Parts(tokenizer, policy, inference, reference, train, val, placement.rewards(rewards), memory, engine, sync,
                 ref_sync, checkpoints,
                 rank=placement.rank, grad_reducer=placement.grad_reducer(),
                 pipeline=placement.pipeline("policy", policy.dtype),
                 ref_pipeline=placement.pipeline("reference", reference.dtype) if reference is not None else None,
                 reward_models=reward_models, memory_policy=memory_policy,
                 base_path=base_path, conversations=conversations,
                 lora=LoraCheckpoint(policy, checkpoints.root, base_path, placement) if lora is not None else None,
                 base_sync=base_sync)


def build_rollout(cfg: GRPOConfig, paths: Paths, placement):
    """The rollout rank of generate_config.placement separate: its inference copy, engine and prompts (the training
    rank's, in the same order) as a `grpo/rollout_worker.RolloutWorker`, whose `run` meets the training rank."""
    from mindgrpo.grpo.conversations import build_conversations
    from mindgrpo.grpo.rollout_worker import RolloutWorker
    from mindgrpo.grpo.trainer import stop_ids_of
    from mindgrpo.models.config import Qwen2Config

    rl, gen = cfg.rl_config, cfg.generate_config
    config_file, model_source = model_config_file(cfg, paths)
    mcfg = Qwen2Config.load(config_file, compute_dtype=cfg.actor_config.dtype)
    placement.check(mcfg)
    memory_policy = MemoryPolicy.of_config(cfg)
    tokenizer = build_tokenizer(cfg, paths)
    chat_template = chat_template_file(cfg, paths) if gen.conversations else None
    # val: the held-out prompts it validates on; with tools the synthetic task's prompts show them (as build's)
    train, val = build_prompts(cfg, paths, tokenizer, synthetic_template(cfg, chat_template) if gen.tools else None)
    check_vocabulary(mcfg.vocab_size, model_source, train, val)
    check_model_limits(cfg, mcfg, model_source)
    conversations = build_conversations(cfg, tokenizer, chat_template)  # this rank runs them (its tool workers)
    turn_positions = 0 if conversations is None else conversations.extra_positions
    check_conversation_limits(cfg, mcfg, model_source, turn_positions)
    max_positions = min(gen.max_prompt_length + gen.max_tokens + turn_positions + 64, mcfg.max_position_embeddings)
    inference = placement.model("inference", mcfg, paths.sft_path_infer or paths.sft_path_train,
                                paths.load_sft_checkpoint_infer, rl.seed, max_positions)
    lora, adapters = lora_config(cfg), None
    if lora is not None:  # base and adapters, as the one-process inference copy: each update moves the adapters
        from mindgrpo.models.lora import add_adapters, adapter_shapes

        add_adapters(inference, lora, rl.seed)
        adapters = (sorted(expected_shapes(mcfg)), list(adapter_shapes(inference)))
    engine = build_engine(cfg, inference, tokenizer.pad_token_id, memory_policy, turn_positions)
    # dynamic sampling: this rank decides a step's rounds, scoring them with the run's rule rewards
    rewards = build_rewards(cfg) if cfg.rollout_ranks_resample() else None
    return RolloutWorker(cfg, placement.engine(engine), inference, train, placement.meeting,
                         stop_ids_of(tokenizer, gen), val, conversations=conversations, tokenizer=tokenizer,
                         lora=adapters, rewards=rewards)


def make_trainer(cfg: GRPOConfig, parts: Parts, metrics_log, progress, output_dir: str):
    from mindgrpo.grpo.trainer import GRPOTrainer

    return GRPOTrainer(cfg, policy=parts.policy, inference=parts.inference, reference=parts.reference,
                       engine=parts.engine, sync=parts.sync, ref_sync=parts.ref_sync, memory=parts.memory,
                       rewards=parts.rewards, tokenizer=parts.tokenizer, train_prompts=parts.train_prompts,
                       val_prompts=parts.val_prompts, metrics_log=metrics_log, progress=progress,
                       output_dir=output_dir, rank=parts.rank, grad_reducer=parts.grad_reducer,
                       checkpoints=parts.checkpoints, pipeline=parts.pipeline, ref_pipeline=parts.ref_pipeline,
                       reward_models=parts.reward_models, memory_policy=parts.memory_policy,
                       base_path=parts.base_path, conversations=parts.conversations, lora=parts.lora,
                       base_sync=parts.base_sync)

"""The GRPO config: its sections (`mindgrpo/config/sections.py`, shaped like mindrlhf's
grpo_config) and the rules across them, among them the keys that cannot act in a config
(`INERT_UNLESS`).

    python scripts/grpo_one_stage.py --config CONFIG.yaml rl_config.max_steps=1 actor_config.lr=2e-6
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from mindgrpo.config.loader import check, to_dict
from mindgrpo.config.sections import (
    ActorConfig,
    GenerateConfig,
    RefConfig,
    RewardConfig,
    RLConfig,
    SFTConfig,
    SyntheticConfig,
    GREEDY_LOGIT_GAP,
    MIN_TEMPERATURE,
    MIN_TOP_P,
    VARIANTS,
)


# Every key of the config has one entry here, so none is silently ignored (tests/config/test_grpo_config.py walks
# the dataclass fields and checks it): it acts in every config that passes the checks (ACTS_ALWAYS), or it acts
# only under a condition (INERT_UNLESS: refused otherwise, naming it), or it is a setting of one of rl_config's
# registered variants (refused beside a variant that does not read it: sections.VARIANTS), or it is one of the
# two validation keys of KEPT_WHEN_OFF. A new key is one line in one of them.
ACTS_ALWAYS = (
    "rl_config.seed", "rl_config.max_steps", "rl_config.batch_size", "rl_config.num_generations",
    "rl_config.num_iterations", "rl_config.num_mini_batches", "rl_config.beta", "rl_config.loss_agg_mode",
    "rl_config.adv_estimator", "rl_config.policy_loss", "rl_config.top_entropy_quantile",
    "rl_config.rollout_correction", "rl_config.old_logprobs_from_rollout", "rl_config.off_policy_steps",
    "rl_config.dynamic_sampling",
    "rl_config.overlong_filtering", "rl_config.val_interval", "rl_config.save_interval", "rl_config.keep_last_k",
    "rl_config.log_interval", "rl_config.max_bad_steps", "rl_config.completions_interval", "rl_config.swap",
    "rl_config.release_graphs", "rl_config.memory", "rl_config.device_peak_tflops", "rl_config.dataset_path", "rl_config.output_dir",
    # these three act where the run moves weights (a copy or a reference) or runs under msrun: the launch and the
    # weights' paths decide it, not the config
    "rl_config.weight_sync_bucket_mb", "rl_config.collective_timeout_s", "rl_config.compile_timeout_s",
    "actor_config.model", "actor_config.load_checkpoint", "actor_config.checkpoint_dir", "actor_config.dtype",
    "actor_config.lr", "actor_config.lr_schedule", "actor_config.warmup_steps", "actor_config.adam_beta1",
    "actor_config.adam_beta2", "actor_config.adam_eps", "actor_config.weight_decay", "actor_config.grad_clip",
    "actor_config.micro_batch_size", "actor_config.logprob_chunk_size", "actor_config.recompute",
    "actor_config.layerwise_update", "actor_config.max_tokens_per_micro_batch", "actor_config.packing",
    "actor_config.parallel_config", "actor_config.lora_rank",
    "generate_config.max_prompt_length", "generate_config.max_tokens", "generate_config.temperature",
    "generate_config.top_k", "generate_config.top_p", "generate_config.min_p", "generate_config.stop_token_ids",
    "generate_config.seed", "generate_config.max_num_seqs", "generate_config.max_num_batched_tokens",
    "generate_config.inference_weights", "generate_config.layerwise", "generate_config.max_prefill_tokens",
    "generate_config.parallel_config", "generate_config.tools", "generate_config.environment",
    # acts under msrun (--use_parallel True), which the launch decides; one process refuses "separate"
    "generate_config.placement", "generate_config.partial_rollout",
    "reward_config.verifier_function", "reward_config.verifier_weight", "reward_config.reward_plugin",
    "reward_config.num_workers", "reward_config.reward_models", "reward_config.judges",
    "sft_config.steps",
)

# Keys that act only with validation (rl_config.val_interval > 0) and are still accepted without it: the validation
# data of a recipe (the tiny default's 100 problems), kept when a run turns validation off with val_interval=0
# (rl_config is not reset whole as sft_config={steps: 0} resets the warm start's keys)
KEPT_WHEN_OFF = ("rl_config.val_size", "rl_config.val_dataset_path")

def may_be_on(cfg, saver: Optional[bool]) -> bool:
    """Whether a memory saver (true / false, or null: rl_config.memory decides at build) can be on in this run."""
    return bool(saver) or (saver is None and cfg.rl_config.memory != "speed")


# Keys that cannot take effect in some configs: set to anything but their default there, they are
# an error, since whoever reads the config would believe they act. (dotted key or section, when
# it takes effect, why not)
INERT_UNLESS = (
    ("rl_config.max_staleness", lambda c: c.rl_config.off_policy_steps > 0,
     "has no effect with rl_config.off_policy_steps 0 (every sample comes from the latest weights)"),
    *((f"ref_config.{key}", lambda c: c.rl_config.beta > 0, "has no effect with rl_config.beta = 0 (no reference model)")
      for key in ("max_tokens_per_micro_batch", "layerwise")),
    # with LoRA the reference pass runs the policy with its adapters off: no reference model to load or lay out
    *((f"ref_config.{key}", lambda c: c.rl_config.beta > 0 and c.actor_config.lora_rank == 0,
       "has no effect with rl_config.beta = 0 or actor_config.lora_rank > 0 (no reference model; with LoRA the "
       "reference is the policy with its adapters off)") for key in ("load_checkpoint", "parallel_config")),
    ("rl_config.ref_model_sync_steps", lambda c: c.rl_config.beta > 0 and c.actor_config.lora_rank == 0,
     "has no effect with rl_config.beta = 0 or actor_config.lora_rank > 0 (no reference model; with LoRA the "
     "reference is the policy with its adapters off)"),
    ("rl_config.kl_kind", lambda c: c.rl_config.beta > 0, "has no effect with rl_config.beta = 0 (no KL term)"),
    ("rl_config.max_resample_times", lambda c: c.rl_config.dynamic_sampling,
     "has no effect without rl_config.dynamic_sampling"),
    ("actor_config.packed_attention", lambda c: c.actor_config.packing,
     "applies to packed rows only; it has no effect without actor_config.packing"),
    ("actor_config.shared_prefix", lambda c: c.actor_config.packing,
     "applies to packed rows only; it has no effect without actor_config.packing"),
    ("actor_config.min_lr", lambda c: c.actor_config.lr_schedule != "constant",
     "is the floor of a decaying lr_schedule; it has no effect with lr_schedule 'constant'"),
    ("actor_config.head_rows_per_graph", lambda c: may_be_on(c, c.actor_config.layerwise_update),
     "has no effect without actor_config.layerwise_update (false, or unset with rl_config.memory speed)"),
    ("actor_config.recompute_num_layers", lambda c: may_be_on(c, c.actor_config.layerwise_update),
     "has no effect without actor_config.layerwise_update (false, or unset with rl_config.memory speed)"),
    ("generate_config.decode_layers_per_graph", lambda c: may_be_on(c, c.generate_config.layerwise),
     "has no effect without generate_config.layerwise (false, or unset with rl_config.memory speed)"),
    ("reward_config.timeout_s", lambda c: c.reward_config.num_workers > 0,
     "has no effect with reward_config.num_workers = 0 (rewards run in the trainer's process, without a timeout)"),
    ("reward_config.cosine", lambda c: "cosine" in c.reward_config.verifier_function,
     "has no effect unless reward_config.verifier_function lists cosine"),
    ("reward_config.soft_overlong", lambda c: "soft_overlong" in c.reward_config.verifier_function,
     "has no effect unless reward_config.verifier_function lists soft_overlong"),
    *((f"rl_config.{key}", lambda c: c.rl_config.val_interval > 0,
       "has no effect with rl_config.val_interval = 0 (no validation)")
      for key in ("val_n", "val_temperature", "val_before_train", "save_best")),
    *((f"sft_config.{key}", lambda c: c.sft_config.steps > 0,
       "has no effect with sft_config.steps = 0 (no warm start); to switch off a recipe's warm start, set the "
       "section whole: sft_config={steps: 0}") for key in ("lr", "batch_size", "teacher_carry_error")),
    ("sft_config.teacher_tool_call_rate", lambda c: c.sft_config.steps > 0 and bool(c.generate_config.tools),
     "has no effect without a warm start (sft_config.steps > 0) and generate_config.tools"),
    ("rl_config.memory_budget_gb", lambda c: c.rl_config.memory == "auto",
     "is what rl_config.memory auto plans against; it has no effect with memory speed or low"),
    ("rl_config.restart_on_memory_growth", lambda c: may_be_on(c, c.rl_config.release_graphs),
     "watches the growth that rl_config.release_graphs makes; it has no effect with release_graphs off "
     "(false, or unset with rl_config.memory speed)"),
    *((f"actor_config.{key}", lambda c: c.actor_config.lora_rank > 0,
       "has no effect with actor_config.lora_rank = 0 (no LoRA adapters)")
      for key in ("lora_alpha", "lora_dropout", "lora_target_modules")),
    *((f"generate_config.{key}", lambda c: c.generate_config.conversations,
       "has no effect without generate_config.tools or generate_config.environment (no conversations)")
      for key in ("max_turns", "tool_response_max_tokens", "tool_timeout_s", "tool_num_workers", "chat_template")),
    ("generate_config.tool_plugin", lambda c: bool(c.generate_config.tools),
     "has no effect without generate_config.tools (no tools offered)"),
    *((f"generate_config.{key}", lambda c: c.generate_config.environment is not None,
       "has no effect without generate_config.environment") for key in ("environment_plugin", "environment_settings")),
    ("synthetic_config", lambda c: c.rl_config.dataset_path is None,
     "applies to the built-in synthetic task only, and rl_config.dataset_path (--mind_dataset_dir) names a dataset"),
)


def variant_settings() -> list:
    """The dotted keys that are settings of rl_config's registered variants (sections.VARIANTS)."""
    return sorted({f"rl_config.{setting}" for registry, _ in VARIANTS for name in registry.names()
                   for setting in registry.params(name)})


def greedy_sampling_key(gen: GenerateConfig) -> Optional[tuple]:
    """(key, why) of the first generate_config key that makes sampling (nearly) greedy, or None."""
    if gen.temperature < MIN_TEMPERATURE:
        return "temperature", f"{gen.temperature} is (nearly) greedy (below {MIN_TEMPERATURE})"
    if gen.top_k == 1:
        return "top_k", "1 keeps the top token alone (greedy)"
    if gen.top_p < MIN_TOP_P:
        return "top_p", f"{gen.top_p} keeps the top token alone whenever it holds {gen.top_p} of the probability " \
                        f"(below {MIN_TOP_P})"
    floor = math.exp(-GREEDY_LOGIT_GAP / gen.temperature)
    if gen.min_p > floor:
        return "min_p", f"{gen.min_p} drops every token {GREEDY_LOGIT_GAP} logits below the top one at temperature " \
                        f"{gen.temperature} (min_p must be <= exp(-{GREEDY_LOGIT_GAP} / temperature) = {floor:.3f})"
    return None


def _leaves(d, prefix: str):
    if not isinstance(d, dict):
        yield prefix, d
        return
    for k, v in d.items():
        yield from _leaves(v, f"{prefix}.{k}")


def first_changed_key(cfg, path: str) -> Optional[str]:
    """The first key at or under dotted `path` (a section of `cfg` first) set to other than its default."""
    section, _, rest = path.partition(".")
    node = getattr(cfg, section)
    mine, default = to_dict(node), to_dict(type(node)())
    for part in rest.split(".") if rest else ():
        mine, default = mine[part], default[part]
    defaults = dict(_leaves(default, path))
    for key, value in _leaves(mine, path):
        # a mapping-valued key (generate_config.environment_settings) whose default is none: the key itself
        owner = key if key in defaults else next(k for k in defaults if key.startswith(k + "."))
        if key != owner or value != defaults[key]:
            return owner
    return None


@dataclass(frozen=True)
class GRPOConfig:
    rl_config: RLConfig = field(default_factory=RLConfig)
    actor_config: ActorConfig = field(default_factory=ActorConfig)
    ref_config: RefConfig = field(default_factory=RefConfig)
    generate_config: GenerateConfig = field(default_factory=GenerateConfig)
    reward_config: RewardConfig = field(default_factory=RewardConfig)
    sft_config: SFTConfig = field(default_factory=SFTConfig)
    synthetic_config: SyntheticConfig = field(default_factory=SyntheticConfig)

    def __post_init__(self):
        for path, in_effect, why in INERT_UNLESS:  # first: a key that cannot act is the first thing to say
            key = None if in_effect(self) else first_changed_key(self, path)
            check(key is None, key, why)
        rl, actor = self.rl_config, self.actor_config
        greedy = greedy_sampling_key(self.generate_config)
        check(greedy is None, f"generate_config.{greedy and greedy[0]}",
              f"{greedy and greedy[1]}: with rl_config.num_generations = {rl.num_generations} the samples of a prompt "
              "are all alike, every group's rewards equal and its advantages 0, so nothing is learned; sample (GRPO "
              "runs at temperature about 1)")
        check(rl.rollout_rows % rl.num_mini_batches == 0, "rl_config.num_mini_batches",
              f"must divide batch_size * num_generations = {rl.rollout_rows}, got {rl.num_mini_batches}")
        mini_batch_rows = rl.rollout_rows // rl.num_mini_batches
        dp = actor.parallel_config.data_parallel
        if actor.max_tokens_per_micro_batch == 0:
            check(mini_batch_rows % (dp * actor.micro_batch_size) == 0, "actor_config.micro_batch_size",
                  f"micro_batch_size * actor_config.parallel_config.data_parallel = {actor.micro_batch_size} * {dp} "
                  f"must divide the {mini_batch_rows} rows of a mini-batch")
        else:  # replicas split a mini-batch by tokens
            check(mini_batch_rows >= dp, "actor_config.parallel_config.data_parallel",
                  f"must be at most the {mini_batch_rows} rows of a mini-batch, got {dp}")
        # a budget holds the longest sample: prompt and completion, rounded up as experience.pack does (32)
        longest = -(-(self.generate_config.max_prompt_length + self.generate_config.max_tokens) // 32) * 32
        for key, budget in (("actor_config.max_tokens_per_micro_batch", actor.max_tokens_per_micro_batch),
                            ("ref_config.max_tokens_per_micro_batch", self.ref_config.max_tokens(actor))):
            check(budget == 0 or budget >= longest, key,
                  f"must hold the longest sample, generate_config.max_prompt_length + max_tokens rounded up to 32 = "
                  f"{longest} tokens, got {budget}")
        check(not actor.packing or self.ref_config.max_tokens(actor) > 0, "ref_config.max_tokens_per_micro_batch",
              "must be > 0 (or null) with actor_config.packing: the reference pass packs too")
        check(not (self.ref_config.layerwise and actor.packing and actor.packed_attention == "flash"),
              "ref_config.layerwise", "attends through an additive bias, not flash attention: set it false or "
              "actor_config.packed_attention mask")
        for section in ("ref_config", "generate_config"):
            check(not getattr(self, section).parallel_config.optimizer_shard, f"{section}.parallel_config.optimizer_shard",
                  "only the training layout has an optimizer; set actor_config.parallel_config.optimizer_shard")
        check(self.sft_config.teacher_carry_error == 0.0 or rl.dataset_path is None, "sft_config.teacher_carry_error",
              "applies to the built-in synthetic task only; set it to 0 with rl_config.dataset_path")
        check(self.sft_config.teacher_tool_call_rate == 0.0 or rl.dataset_path is None,
              "sft_config.teacher_tool_call_rate", "applies to the built-in synthetic task only; set it to 0 with "
              "rl_config.dataset_path")
        check(self.sft_config.teacher_tool_call_rate == 0.0 or "calculator" in self.generate_config.tools,
              "sft_config.teacher_tool_call_rate", "the teacher calls the calculator: add it to generate_config.tools")
        overlong = self.reward_config.soft_overlong
        max_len = self.generate_config.max_tokens if overlong.max_len is None else overlong.max_len
        check("soft_overlong" not in self.reward_config.verifier_function or overlong.buffer_len < max_len,
              "reward_config.soft_overlong.buffer_len",
              f"must be < the overlong max_len {max_len}, got {overlong.buffer_len}")
        if self.generate_config.placement == "separate":  # mindgrpo/grpo/separate.py
            self._check_separate()

        if self.generate_config.partial_rollout:  # mindgrpo/grpo/partial.py
            gen = self.generate_config
            check(rl.off_policy_steps >= 1, "rl_config.off_policy_steps",
                  "must be >= 1 with generate_config.partial_rollout: a carried sample's first tokens are older "
                  "than the policy, and its tokens are stamped with their versions")
            # under a separate placement the rollout replicas (generate_config.parallel_config) each keep theirs
            one_device = gen.placement == "separate" or gen.parallel_config.world_size == 1
            check(one_device, "generate_config.parallel_config",
                  "cannot combine with generate_config.partial_rollout yet (one inference device, one answer a "
                  "prompt, one rollout a step)")
            # conversations carry over (grpo/partial_conversations.py), under a separate placement on the rollout
            # ranks too (an environment's: the groups keep the prompts as drawn for the prompt check, and after a
            # resume the games drawn again are reset there: PartialConversations.reset_games)

        for i, entry in enumerate(self.reward_config.reward_models):  # parallel/replica_scores.py
            key, tp = f"reward_config.reward_models[{i}].model_parallel", entry.model_parallel
            if self.generate_config.placement == "separate":  # the training rank (rank 0 of several) scores alone
                check(tp in (None, 1), key, "must be 1 (or null) with generate_config.placement separate: training "
                      f"rank 0 holds the reward model whole and scores for the training group, got {tp}")
            else:
                world = actor.parallel_config.world_size
                check(tp is None or world % tp == 0, key,
                      f"must divide the world of {world} ranks (actor_config.parallel_config), got {tp}")

        gen = self.generate_config
        check(not (gen.tools and gen.environment is not None), "generate_config.environment",
              "cannot combine with generate_config.tools: a run's conversations are one kind (tools or an environment)")
        if gen.conversations:  # conversations (mindgrpo/grpo/conversations.py)
            key = "generate_config.tools" if gen.tools else "generate_config.environment"
            check(not gen.layerwise, "generate_config.layerwise",
                  f"cannot combine with {key}: conversations append their tool turns with the whole "
                  "graphs; set it false")
            for part in ("model_parallel", "pipeline_stage"):  # replicas run their share's (data_parallel)
                value = getattr(gen.parallel_config, part)
                check(value == 1, f"generate_config.parallel_config.{part}",
                      f"must be 1 with {key}: conversations run on whole inference replicas, each its share of the "
                      f"prompts on its own tool workers (set data_parallel to the devices), got {value}")

    def _check_separate(self) -> None:
        """What generate_config.placement separate runs for now (docs/async.md: its limits): a training group of D
        data-parallel replicas of P pipeline stages of T tensor-parallel pieces (actor_config.parallel_config) and a
        rollout group of R replicas of T' pieces (generate_config.parallel_config data_parallel R, model_parallel T',
        no stages; msrun --worker_num D T P + R T')."""
        rl, gen = self.rl_config, self.generate_config
        # partial rollouts run with any training group: the samples meeting gives every training rank every group,
        # so each keeps the same prompts in flight (grpo/partial.DrawnPrompts), rank 0 writes them into a checkpoint
        rollout = gen.parallel_config
        check(rollout.pipeline_stage == 1, "generate_config.parallel_config.pipeline_stage",
              "must be 1 with generate_config.placement separate: generation runs without pipeline stages (set "
              f"data_parallel and model_parallel), got {rollout.pipeline_stage}")
        replicas = rollout.data_parallel
        check(rl.batch_size >= replicas, "rl_config.batch_size",
              f"with generate_config.placement separate: at least one prompt a rollout rank ({replicas}: "
              f"generate_config.parallel_config.data_parallel), got {rl.batch_size}")
        # dynamic sampling: the rollout ranks decide each step's rounds when they generate it (k steps ahead), scoring
        # them with the rule rewards; reward models and judges score on training rank 0 only, which then decides after
        # each round (k = 0: the ranks take turns)
        if rl.dynamic_sampling and rl.off_policy_steps > 0:
            rc = self.reward_config
            for key, models in (("reward_config.reward_models", rc.reward_models), ("reward_config.judges", rc.judges)):
                check(not models, key, "cannot combine with rl_config.dynamic_sampling, generate_config.placement "
                      f"separate and rl_config.off_policy_steps {rl.off_policy_steps}: the rollout ranks decide a "
                      "step's further rollouts when they generate it, ahead, and score them with the rule rewards only "
                      "(the models score on training rank 0); set off_policy_steps 0 or leave them out")

    def rollout_ranks_resample(self) -> bool:
        """generate_config.placement separate: whether the rollout ranks decide dynamic sampling's further rollouts of
        a step themselves (rl_config.dynamic_sampling, scored with the rule rewards: no reward models or judges), as
        the trainer's `collect` would; else (reward models or judges, off_policy_steps 0) training rank 0 decides and
        tells them after each rollout. The one rule for both sides (docs/async.md)."""
        rc = self.reward_config
        return self.rl_config.dynamic_sampling and not rc.reward_models and not rc.judges

    def staleness_bound(self) -> int:
        """rl_config.max_staleness, or its default (sections.RLConfig): the most updates a training sample may be
        stale."""
        rl = self.rl_config
        if rl.max_staleness is not None:
            return rl.max_staleness
        return rl.off_policy_steps + int(self.generate_config.partial_rollout)

    def inference_shares_policy(self, same_layout: bool, own_inference_weights: bool = False) -> bool:
        """Whether the rollout engine generates with the policy model itself (one copy of the weights, no sync):
        generate_config.inference_weights auto, the inference layout the policy's (`same_layout`; always on one
        device), the engine's weights not lagging the policy's (rl_config.off_policy_steps 0) and no weights of
        its own to load (`own_inference_weights`: --sft_path_infer naming another file than the policy's). The one
        rule for the builder and the memory plan."""
        return (self.generate_config.inference_weights == "auto" and same_layout
                and self.rl_config.off_policy_steps == 0 and not own_inference_weights)

    def check_device(self, device_target: str) -> None:
        """Keys that need a kind of device (the run's device_target, e.g. "CPU" or "Ascend")."""
        actor = self.actor_config
        check(not (actor.packing and actor.packed_attention == "flash") or device_target == "Ascend",
              "actor_config.packed_attention",
              f"'flash' needs Ascend (flash_attention_score); this run is on {device_target}: use 'mask'")


__all__ = ["ACTS_ALWAYS", "INERT_UNLESS", "KEPT_WHEN_OFF", "GRPOConfig", "greedy_sampling_key", "variant_settings"]

"""The GRPO config: its sections (`mindgrpo/config/sections.py`, shaped like mindrlhf's
grpo_config) and the rules across them, among them the keys that cannot act in a config
(`INERT_UNLESS`).

    python scripts/grpo_one_stage.py --config CONFIG.yaml rl_config.max_steps=1 actor_config.lr=2e-6
"""

from __future__ import annotations

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
)


# Keys that cannot take effect in some configs: set to anything but their default there, they are
# an error, since whoever reads the config would believe they act. (dotted key or section, when
# it takes effect, why not)
INERT_UNLESS = (
    ("ref_config", lambda c: c.rl_config.beta > 0, "has no effect with rl_config.beta = 0 (no reference model)"),
    ("rl_config.ref_model_sync_steps", lambda c: c.rl_config.beta > 0,
     "has no effect with rl_config.beta = 0 (no reference model)"),
    ("rl_config.max_resample_times", lambda c: c.rl_config.dynamic_sampling,
     "has no effect without rl_config.dynamic_sampling"),
    ("actor_config.packed_attention", lambda c: c.actor_config.packing,
     "applies to packed rows only; it has no effect without actor_config.packing"),
    ("actor_config.min_lr", lambda c: c.actor_config.lr_schedule != "constant",
     "is the floor of a decaying lr_schedule; it has no effect with lr_schedule 'constant'"),
    ("reward_config.cosine", lambda c: "cosine" in c.reward_config.verifier_function,
     "has no effect unless reward_config.verifier_function lists cosine"),
    ("reward_config.soft_overlong", lambda c: "soft_overlong" in c.reward_config.verifier_function,
     "has no effect unless reward_config.verifier_function lists soft_overlong"),
    *((f"rl_config.{key}", lambda c: c.rl_config.val_interval > 0,
       "has no effect with rl_config.val_interval = 0 (no validation)")
      for key in ("val_n", "val_temperature", "val_before_train", "save_best")),
    *((f"actor_config.{key}", lambda c: c.actor_config.lora_rank > 0,
       "has no effect with actor_config.lora_rank = 0 (no LoRA adapters)")
      for key in ("lora_alpha", "lora_dropout", "lora_target_modules")),
    ("synthetic_config", lambda c: c.rl_config.dataset_path is None,
     "applies to the built-in synthetic task only, and rl_config.dataset_path (--mind_dataset_dir) names a dataset"),
)


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
    return next((key for key, value in _leaves(mine, path) if value != defaults[key]), None)


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
        rl, actor = self.rl_config, self.actor_config
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
        check(not self.ref_config.layerwise or self.ref_config.max_tokens(actor) == 0, "ref_config.layerwise",
              "takes right-padded rows of micro_batch_size samples: set it false, or "
              f"ref_config.max_tokens_per_micro_batch to 0 (it is {self.ref_config.max_tokens(actor)})")
        for section in ("ref_config", "generate_config"):
            check(not getattr(self, section).parallel_config.optimizer_shard, f"{section}.parallel_config.optimizer_shard",
                  "only the training layout has an optimizer; set actor_config.parallel_config.optimizer_shard")
        check(self.sft_config.teacher_carry_error == 0.0 or rl.dataset_path is None, "sft_config.teacher_carry_error",
              "applies to the built-in synthetic task only; set it to 0 with rl_config.dataset_path")
        overlong = self.reward_config.soft_overlong
        max_len = self.generate_config.max_tokens if overlong.max_len is None else overlong.max_len
        check("soft_overlong" not in self.reward_config.verifier_function or overlong.buffer_len < max_len,
              "reward_config.soft_overlong.buffer_len",
              f"must be < the overlong max_len {max_len}, got {overlong.buffer_len}")
        if actor.lora_rank > 0:  # the reference and the rollout run the policy's adapters through the whole graphs
            for key, on in (("ref_config.layerwise", self.ref_config.layerwise),
                            ("generate_config.layerwise", self.generate_config.layerwise)):
                check(not on, key, "cannot combine with actor_config.lora_rank > 0 (its layer graph runs the base "
                      "weights only): set it false")
            gen_par = self.generate_config.parallel_config
            check(gen_par.world_size == 1, "generate_config.parallel_config",
                  "with actor_config.lora_rank > 0 the engine runs on one device for now (1 device)")
        for path, in_effect, why in INERT_UNLESS:
            key = None if in_effect(self) else first_changed_key(self, path)
            check(key is None, key, why)

    def check_device(self, device_target: str) -> None:
        """Keys that need a kind of device (the run's device_target, e.g. "CPU" or "Ascend")."""
        actor = self.actor_config
        check(not (actor.packing and actor.packed_attention == "flash") or device_target == "Ascend",
              "actor_config.packed_attention",
              f"'flash' needs Ascend (flash_attention_score); this run is on {device_target}: use 'mask'")


__all__ = ["INERT_UNLESS", "GRPOConfig"]

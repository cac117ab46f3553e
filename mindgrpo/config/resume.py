"""A resumed run's config against the one its checkpoint was written with (state.json's "config"): every key
that differs is listed; those that would break the run's exactness or its data order are refused unless the
user allows them (scripts/grpo_one_stage.py --allow_config_change).

Refused (a dotted key, or a section or prefix covering its keys): what the samples are drawn from and how
(the data, the seeds, the group and batch sizes, sampling), what the loss and the advantages are (the
algorithm, its variants and settings, the rewards), and what the optimiser does (the model, the lr and its
schedule, AdamW). Accepted: where things go and how they are laid out (output and checkpoint folders,
parallel layouts, micro-batches, token budgets, packing, the memory switches, rollout slots, the timeouts,
logging and saving intervals, validation) and max_steps (extending a run; with a cosine lr_schedule the
remaining steps follow the new length), and sft_config (a resumed run skips the warm start).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from mindgrpo.config.loader import to_dict

REFUSED_ON_RESUME = (
    "rl_config.seed", "rl_config.batch_size", "rl_config.num_generations", "rl_config.num_iterations",
    "rl_config.num_mini_batches", "rl_config.beta", "rl_config.kl_kind", "rl_config.clip_low", "rl_config.clip_high",
    "rl_config.dual_clip", "rl_config.loss_agg_mode", "rl_config.advantage_scale", "rl_config.advantage_eps",
    "rl_config.adv_estimator", "rl_config.policy_loss", "rl_config.cispo_epsilon_max", "rl_config.sapo_temperature",
    "rl_config.gmpo_epsilon", "rl_config.top_entropy_quantile", "rl_config.rollout_correction",
    "rl_config.old_logprobs_from_rollout", "rl_config.off_policy_steps", "rl_config.max_staleness",
    "rl_config.ref_model_sync_steps", "rl_config.dynamic_sampling",
    "rl_config.max_resample_times", "rl_config.overlong_filtering", "rl_config.dataset_path",
    "actor_config.model", "actor_config.dtype", "actor_config.lr", "actor_config.lr_schedule",
    "actor_config.warmup_steps", "actor_config.min_lr", "actor_config.adam", "actor_config.weight_decay",
    "actor_config.grad_clip",
    "generate_config.max_prompt_length", "generate_config.max_tokens", "generate_config.temperature",
    "generate_config.top_k", "generate_config.top_p", "generate_config.min_p", "generate_config.stop_token_ids",
    "generate_config.seed", "generate_config.partial_rollout",
    "reward_config.verifier_function", "reward_config.verifier_weight", "reward_config.reward_plugin",
    "reward_config.cosine", "reward_config.soft_overlong", "reward_config.reward_models", "reward_config.judges",
    "synthetic_config",
)


def _leaves(d: Any, prefix: str = ""):
    if isinstance(d, dict):
        for k, v in d.items():
            yield from _leaves(v, f"{prefix}.{k}" if prefix else k)
    else:
        yield prefix, d


def changed_keys(saved: dict, cfg) -> Dict[str, Tuple[Any, Any]]:
    """{dotted key: (the checkpoint's value, this run's)} for every key that differs (a key only one side has:
    None on the other)."""
    old, new = dict(_leaves(saved)), dict(_leaves(to_dict(cfg)))  # to_dict: tuples as lists, as JSON holds them
    return {k: (old.get(k), new.get(k)) for k in [*new, *(k for k in old if k not in new)] if old.get(k) != new.get(k)}


def refused(key: str) -> bool:
    """Whether changing `key` on resume breaks the run's exactness or its data order (REFUSED_ON_RESUME: an entry
    covers the keys it begins, so "actor_config.adam" covers adam_beta1, adam_beta2 and adam_eps)."""
    return any(key == p or key.startswith(p) for p in REFUSED_ON_RESUME)


def resume_changes(saved: Optional[dict], cfg, allow: bool) -> Tuple[List[str], Optional[str]]:
    """(lines to log, an error or None) for resuming with `cfg` from a checkpoint whose state.json holds `saved`
    (None: an older checkpoint without it)."""
    if saved is None:
        return ["--resume: this checkpoint holds no config (written before checkpoints kept it): "
                "the config is not compared"], None
    changes = changed_keys(saved, cfg)
    bad = [k for k in changes if refused(k)]
    lines = [f"--resume: config key '{k}' changed from {old!r} to {new!r}" +
             (" (accepted with --allow_config_change)" if k in bad else " (accepted)")
             for k, (old, new) in changes.items() if allow or k not in bad]
    if bad and not allow:
        shown = ", ".join(f"'{k}' {changes[k][0]!r} -> {changes[k][1]!r}" for k in bad)
        return lines, (f"--resume: the checkpoint was written with another config: {shown}; changing "
                       f"{'this key' if len(bad) == 1 else 'these keys'} breaks the run's exactness or its data order: "
                       "set back, or pass --allow_config_change")
    return lines, None


__all__ = ["REFUSED_ON_RESUME", "changed_keys", "refused", "resume_changes"]

"""Reward functions for GRPO: a registry with TRL's signature `fn(completions, **columns) -> list[float | None]`.

    from mindgrpo.rewards import RewardSet, get_reward, register_reward, load_reward_plugin

Built-ins (mindgrpo/rewards/builtin.py): accuracy, format, format_lenient, cosine, repetition, soft_overlong.
"""

from mindgrpo.rewards import builtin  # noqa: F401  (registers the built-ins)
from mindgrpo.rewards.answer import extract_answer, is_correct, last_boxed, normalize_answer, parse_number
from mindgrpo.rewards.combine import RewardSet, compute_rewards
from mindgrpo.rewards.registry import (
    REWARDS,
    get_reward,
    load_reward_plugin,
    register_reward,
    required_columns,
    reward_parameters,
)

__all__ = [
    "REWARDS",
    "RewardSet",
    "compute_rewards",
    "extract_answer",
    "get_reward",
    "is_correct",
    "last_boxed",
    "load_reward_plugin",
    "normalize_answer",
    "parse_number",
    "register_reward",
    "required_columns",
    "reward_parameters",
]

"""Reward functions for GRPO: a registry with TRL's signature `fn(completions, **columns) -> list[float | None]`.

    from mindgrpo.rewards import RewardSet, get_reward, register_reward, load_reward_plugin

Built-ins (mindgrpo/rewards/builtin.py): accuracy, format, format_lenient, cosine, repetition, soft_overlong.
What a function may return and what happens otherwise: mindgrpo/rewards/scoring.py; the worker pool with its
per-call timeout: mindgrpo/rewards/pool.py (imported by RewardSet when num_workers > 0).
"""

from mindgrpo.rewards import builtin  # noqa: F401  (registers the built-ins)
from mindgrpo.rewards.answer import extract_answer, is_correct, last_boxed, normalize_answer, parse_number
from mindgrpo.rewards.combine import RewardSet, Scores, compute_rewards
from mindgrpo.rewards.registry import (
    REWARDS,
    get_reward,
    load_reward_plugin,
    register_reward,
    required_columns,
    reward_origin,
    reward_parameters,
)
from mindgrpo.rewards.scoring import RewardError

__all__ = [
    "REWARDS",
    "RewardError",
    "RewardSet",
    "Scores",
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
    "reward_origin",
    "reward_parameters",
]

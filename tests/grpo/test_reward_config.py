"""reward_config's sections reach the reward functions with their meaning (mindgrpo/grpo/builder.build_rewards)."""

import math

import pytest

from mindgrpo.config import GRPOConfig, load_config
from mindgrpo.grpo.builder import build_rewards


def open_r1_cosine(correct, length, max_len, min_wrong, max_wrong, min_correct, max_correct):
    """open-r1's cosine_scaled_reward, written out: a wrong answer's ends swap."""
    lo, hi = (min_correct, max_correct) if correct else (max_wrong, min_wrong)
    return lo + 0.5 * (hi - lo) * (1.0 + math.cos(math.pi * min(length, max_len) / max_len))


def test_cosine_config_means_what_open_r1_means():
    values = dict(min_value_wrong=-2.0, max_value_wrong=-1.0, min_value_correct=0.25, max_value_correct=2.0)
    cfg = load_config(GRPOConfig, overrides=["reward_config.verifier_function=[cosine]",
                                             "reward_config.verifier_weight=[1]", "reward_config.cosine.max_len=100"]
                      + [f"reward_config.cosine.{k}={v}" for k, v in values.items()])
    right, wrong = "\\boxed{7}", "\\boxed{8}"
    lengths = [0, 30, 100, 0, 30, 100]
    texts = [right] * 3 + [wrong] * 3
    total, _, _ = build_rewards(cfg)(texts, solution=["7"] * 6, completion_length=lengths)
    expected = [open_r1_cosine(t == right, n, 100, *values.values()) for t, n in zip(texts, lengths)]
    assert list(total) == pytest.approx(expected)
    assert expected[0] == 2.0 and expected[2] == 0.25 and expected[3] == -2.0 and expected[5] == -1.0

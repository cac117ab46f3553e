"""A dense rule reward for the learning test: the share of a completion's characters that are digits."""

from mindgrpo.rewards import register_reward


@register_reward("test_digit_share")
def digit_share(completions, **kwargs):
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]

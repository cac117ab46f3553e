"""A dense rule reward for one-step tests on an untrained model: the completion's length in characters / 32."""

from mindgrpo.rewards import register_reward


@register_reward("test_text_length")
def text_length(completions, **kwargs):
    return [len(c) / 32 for c in completions]

"""A reward plugin for the msrun one-stage test: an untrained tiny model's completions all run to
max_tokens, so length- or correctness-based rewards are equal within every group (advantages 0,
loss 0). The characters of the decoded text differ from sample to sample."""

from mindgrpo.rewards import register_reward


@register_reward("test_text_length")
def text_length(completions, **kwargs):
    return [len(c) / 100.0 for c in completions]

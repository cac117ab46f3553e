"""The reward plugin of tests/parallel/test_separate.py: text_length_reward.py's dense reward, and a validation score
that an untrained micro model moves. Validation scores with the reward named "accuracy" (grpo/trainer.validate),
which gives every answer of an untrained model 0, so two runs' val/accuracy would agree whatever they generated;
here it is a figure of the completion's characters (their code points' sum mod 1000, / 1000), which differs
between answers (an untrained model's greedy answers often have the same length). `test_tool_outcome` reads the
tool calls' outcomes (the `tool_calls` column) in the runs with tools."""

from mindgrpo.rewards import register_reward


@register_reward("test_text_length")
def text_length(completions, **kwargs):
    return [len(c) / 100.0 for c in completions]


@register_reward("test_length_mod3")
def length_mod3(completions, **kwargs):
    """1 when the completion's characters are a multiple of 3: a coarse reward, so that some groups of four samples
    score all the same (dynamic sampling drops them) and others do not."""
    return [float(len(c) % 3 == 0) for c in completions]


@register_reward("accuracy", overwrite=True)
def characters_as_accuracy(completions, **kwargs):
    return [(sum(map(ord, c)) % 1000) / 1000.0 for c in completions]


@register_reward("test_tool_outcome")
def tool_outcome(completions, tool_calls, **kwargs):
    """The tool calls' outcomes (tests/grpo/tool_caller.py's runs): their answers' lengths, errors counted apart."""
    return [sum(len(c["response"] or "") / 100.0 + (c["status"] != "ok") for c in calls) for calls in tool_calls]

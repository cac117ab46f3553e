"""generate_config's conversation keys (docs/tools.md): read from YAML, refused where they cannot act."""

import pytest

from mindgrpo.config import ConfigError, GRPOConfig, load_config

TOOLS_YAML = """generate_config:
  tools: [calculator, python]
  max_turns: 2
  tool_response_max_tokens: 64
  tool_timeout_s: 5.0
  tool_num_workers: 1
  tool_plugin: my_tools.py
  chat_template: other/tokenizer_config.json
"""


def test_tool_keys_from_yaml(tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_text(TOOLS_YAML)
    gen = load_config(GRPOConfig, path).generate_config
    assert (gen.tools, gen.max_turns, gen.tool_response_max_tokens, gen.tool_timeout_s, gen.tool_num_workers,
            gen.tool_plugin, gen.chat_template) == (("calculator", "python"), 2, 64, 5.0, 1, "my_tools.py",
                                                     "other/tokenizer_config.json")


@pytest.mark.parametrize("overrides, key, words", [
    (["generate_config.max_turns=2"], "generate_config.max_turns", "without generate_config.tools"),
    # environments (generate_config.environment) share the conversation keys and have two of their own
    (["generate_config.environment_plugin=my_envs.py"], "generate_config.environment_plugin",
     "without generate_config.environment"),
    (["generate_config.environment_settings={high: 5}"], "generate_config.environment_settings",
     "without generate_config.environment"),
    (["generate_config.tool_plugin=my_tools.py", "generate_config.environment=guess_number"],
     "generate_config.tool_plugin", "without generate_config.tools"),
    (["generate_config.environment=guess_number", "generate_config.tools=[calculator]"],
     "generate_config.environment", "cannot combine with generate_config.tools"),
    (["generate_config.environment=guess_number", "generate_config.layerwise=true"], "generate_config.layerwise",
     "cannot combine with generate_config.environment"),
    # conversations run on whole inference replicas (data_parallel), each its share of the prompts
    (["generate_config.environment=guess_number", "generate_config.parallel_config.model_parallel=2"],
     "generate_config.parallel_config.model_parallel", "must be 1 with generate_config.environment"),
    (["generate_config.tools=[calculator]", "generate_config.layerwise=true"], "generate_config.layerwise",
     "cannot combine with generate_config.tools"),
    (["generate_config.tools=[calculator]", "generate_config.parallel_config.model_parallel=2"],
     "generate_config.parallel_config.model_parallel", "must be 1 with generate_config.tools"),
    (["generate_config.tools=[calculator]", "generate_config.parallel_config.pipeline_stage=2"],
     "generate_config.parallel_config.pipeline_stage", "must be 1 with generate_config.tools"),
    (["generate_config.tools=[calculator]", "generate_config.max_turns=0"], "generate_config.max_turns", ">= 1"),
    (["generate_config.tools=[calculator,calculator]"], "generate_config.tools", "duplicates"),
    (["generate_config.tools=[calculator]", "generate_config.tool_timeout_s=0"], "generate_config.tool_timeout_s",
     "> 0"),
])
def test_tool_keys_refused(overrides, key, words):
    with pytest.raises(ConfigError) as info:
        load_config(GRPOConfig, overrides=overrides)
    assert info.value.key == key and words in info.value.message, str(info.value)


@pytest.mark.parametrize("kind", ["generate_config.tools=[calculator]", "generate_config.environment=guess_number"])
def test_conversations_run_on_data_parallel_inference_replicas(kind):
    """Colocated inference replicas (data_parallel 2) each run their share's conversations: not refused."""
    cfg = load_config(GRPOConfig, overrides=[kind, "generate_config.parallel_config.data_parallel=2",
                                             "actor_config.parallel_config.data_parallel=2"])
    assert cfg.generate_config.conversations and cfg.generate_config.parallel_config.data_parallel == 2


def test_environment_keys_from_yaml_and_the_shared_keys_act_with_an_environment(tmp_path):
    path = tmp_path / "env.yaml"
    path.write_text("generate_config:\n  environment: guess_number\n  environment_plugin: my_envs.py\n"
                    "  environment_settings: {high: 50, seed: 3}\n  max_turns: 3\n  tool_response_max_tokens: 40\n")
    gen = load_config(GRPOConfig, path).generate_config
    assert (gen.environment, gen.environment_plugin, gen.environment_settings, gen.max_turns) == \
        ("guess_number", "my_envs.py", {"high": 50, "seed": 3}, 3)
    # each of 3 turns: 32 tokens of template text (the plan's allowance) + 40, rounded up to 48
    assert gen.conversations and gen.turn_positions() == 3 * 80 and gen.turn_positions(around=8) == 3 * 48
    assert load_config(GRPOConfig).generate_config.turn_positions() == 0


def test_memory_auto_never_turns_layerwise_generate_on_with_tools():
    from mindgrpo.memory.auto import SAVERS, _settable

    name = next(k for k, (key, _) in SAVERS.items() if key == "generate_config.layerwise")
    _, free, inert = _settable(load_config(GRPOConfig))
    assert name in free  # without tools rl_config.memory may turn it on
    _, free, inert = _settable(load_config(GRPOConfig, overrides=["generate_config.tools=[calculator]"]))
    assert name in inert and name not in free

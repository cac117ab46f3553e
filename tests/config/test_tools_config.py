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
    (["generate_config.tools=[calculator]", "generate_config.layerwise=true"], "generate_config.layerwise",
     "cannot combine with generate_config.tools"),
    (["generate_config.tools=[calculator]", "generate_config.parallel_config.data_parallel=2"],
     "generate_config.tools", "one inference device"),
    (["generate_config.tools=[calculator]", "generate_config.max_turns=0"], "generate_config.max_turns", ">= 1"),
    (["generate_config.tools=[calculator,calculator]"], "generate_config.tools", "duplicates"),
    (["generate_config.tools=[calculator]", "generate_config.tool_timeout_s=0"], "generate_config.tool_timeout_s",
     "> 0"),
])
def test_tool_keys_refused(overrides, key, words):
    with pytest.raises(ConfigError) as info:
        load_config(GRPOConfig, overrides=overrides)
    assert info.value.key == key and words in info.value.message, str(info.value)


def test_memory_auto_never_turns_layerwise_generate_on_with_tools():
    from mindgrpo.memory.auto import SAVERS, _settable

    name = next(k for k, (key, _) in SAVERS.items() if key == "generate_config.layerwise")
    _, free, inert = _settable(load_config(GRPOConfig))
    assert name in free  # without tools rl_config.memory may turn it on
    _, free, inert = _settable(load_config(GRPOConfig, overrides=["generate_config.tools=[calculator]"]))
    assert name in inert and name not in free

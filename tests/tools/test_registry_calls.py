"""The tool registry, its JSON schemas in the chat template, and parsing / checking the model's tool calls."""

import json
from pathlib import Path

import pytest

from mindgrpo.data.templates import render_chat
from mindgrpo.tools import (ToolCall, ToolResult, check_call, load_tool_plugin, parse_tool_calls, register_tool,
                            tool_origin, tool_schema, tool_settings, truncate_response)

HOSTILE = str(Path(__file__).with_name("hostile_tools.py"))
QWEN3_CONFIG = Path(__file__).resolve().parents[1] / "data" / "qwen3_template" / "tokenizer_config.json"


def test_builtins_schemas_render_into_the_system_turn():
    schemas = [tool_schema("calculator"), tool_schema("python")]
    assert schemas[0]["function"]["parameters"]["required"] == ["expression"]
    text = render_chat([{"role": "user", "content": "Add 1 and 2"}], schemas, tokenizer_config=str(QWEN3_CONFIG))
    for schema in schemas:
        assert json.dumps(schema, ensure_ascii=False) in text
    listed = text.index("<tools>\n{")
    assert listed < text.index('"calculator"', listed) < text.index("\n</tools>") < text.index("Add 1 and 2")
    assert tool_settings("python") == {"cpu_s": 5, "wall_s": 10.0, "memory_mb": 1024, "output_bytes": 65536}


def test_plugin_names_and_origin():
    names = load_tool_plugin(HOSTILE)
    assert names == ["crasher", "echo", "flood", "raiser", "sleeper"]
    assert load_tool_plugin(HOSTILE) == names
    assert tool_origin("echo") == ("plugin", str(Path(HOSTILE).resolve()))
    assert tool_origin("calculator") == ("module", "mindgrpo.tools.builtin")
    with pytest.raises(FileNotFoundError, match="absent.py"):
        load_tool_plugin("absent.py")


def test_a_bad_schema_is_refused_at_registration():
    with pytest.raises(ValueError, match="type 'object'"):
        register_tool("t1", description="", parameters={"type": "string"})
    with pytest.raises(ValueError, match="no valid JSON schema"):
        register_tool("t2", description="", parameters={"type": "object", "properties": {"a": {"type": 5}}})


def test_parse_calls_of_a_turn():
    turn = ('I will compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+2"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "python", "arguments": "{\\"code\\": \\"print(3)\\"}"}\n</tool_call>'
            '<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>'
            '<tool_call>["calculator"]</tool_call><tool_call>{"name": "x", "arguments": [1]}</tool_call>'
            '<tool_call>{"name": "calculator", "arguments": {"expression": "5"}}')  # unclosed: no call
    calls = parse_tool_calls(turn)
    assert calls[:2] == [ToolCall("calculator", {"expression": "1+2"}), ToolCall("python", {"code": "print(3)"})]
    assert "not valid JSON" in calls[2].error
    assert '{"name": <tool name>' in calls[3].error
    assert calls[4].error == "the arguments must be a JSON object"
    assert len(calls) == 5


def test_check_call_names_the_problem():
    allowed = {"calculator", "python"}
    assert check_call(ToolCall("calculator", {"expression": "1"}), allowed).error is None
    assert "unknown tool 'search'; the tools are calculator, python" in check_call(ToolCall("search"), allowed).error
    assert "unknown tool 'echo'" in check_call(ToolCall("echo", {"n": 1}), allowed).error  # registered, not allowed
    assert "'expression' is a required property" in check_call(ToolCall("calculator", {}), allowed).error
    bad = check_call(ToolCall("calculator", {"expression": 5}), allowed).error
    assert "at expression" in bad and "is not of type 'string'" in bad
    assert "Additional properties" in check_call(ToolCall("calculator", {"expression": "1", "x": 2}), allowed).error
    load_tool_plugin(HOSTILE)
    assert "are settings, not arguments" in check_call(ToolCall("echo", {"n": 1, "scale": 3}), {"echo"}).error


def test_response_and_truncation():
    assert ToolResult("ok", "3").response() == "3"
    assert ToolResult("timeout", "no result within 2 s").response() == "error: no result within 2 s"
    encode = lambda s: s.split(" ")  # noqa: E731 - a word per token
    decode = " ".join
    text = " ".join(f"w{i}" for i in range(50))
    assert truncate_response(text, encode, decode, 50) == text
    cut = truncate_response(text, encode, decode, 20)
    assert len(encode(cut)) <= 20 and cut.startswith("w0 w1") and cut.endswith("[truncated: 50 tokens, the first shown]")

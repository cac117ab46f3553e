"""render_chat: the model's own Jinja chat template against transformers' rendering of the same template.

Qwen2.5: the real tokenizer in ../shared (its tokenizer_config.json) through `apply_chat_template`. Qwen3: a
literal copy of its template (tests/data/qwen3_template, Apache-2.0, see its NOTICE.md) through transformers'
`render_jinja_template`, which `apply_chat_template` calls.
"""

import json
from pathlib import Path

import pytest

from mindgrpo.data.templates import ChatTemplateError, render_chat

QWEN3_CONFIG = Path(__file__).resolve().parent / "qwen3_template" / "tokenizer_config.json"

CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression <exactly> & return the number.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string", "description": "e.g. 12*(3+4)"}},
                   "required": ["expression"]}}}
WEATHER = {"type": "function", "function": {
    "name": "weather", "description": "Température à Zürich",
    "parameters": {"type": "object", "properties": {"day": {"type": "integer"}, "units": {"enum": ["C", "F"]}}}}}


def _call(name, arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


CONVERSATIONS = {
    "one question": ([{"role": "user", "content": "What is 2 + 3?"}], None),
    "system and tools": ([{"role": "system", "content": "Be brief."},
                          {"role": "user", "content": "What is 123 + 456 + 789?"}], [CALCULATOR, WEATHER]),
    "tools, no system": ([{"role": "user", "content": "Add 1 and 2"}], [CALCULATOR]),
    "a tool call and its response": ([
        {"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": "What is 123 + 456 + 789?"},
        {"role": "assistant", "content": "Let me compute it.",
         "tool_calls": [_call("calculator", {"expression": "123 + 456 + 789"})]},
        {"role": "tool", "content": "1368"},
        {"role": "assistant", "content": "The sum is 1368."},
        {"role": "user", "content": "And times 2?"},
    ], [CALCULATOR]),
    "two calls, two responses in a row": ([
        {"role": "user", "content": "Weather on day 3 and 2*21?"},
        {"role": "assistant", "content": "", "tool_calls": [_call("weather", {"day": 3, "units": "C"}),
                                                              _call("calculator", {"expression": "2*21"})]},
        {"role": "tool", "content": "{\"temp\": 21.5}"},
        {"role": "tool", "content": "42"},
    ], [WEATHER, CALCULATOR]),
    "a call without content, then an error": ([
        {"role": "user", "content": "1/0?"},
        {"role": "assistant", "content": None, "tool_calls": [_call("calculator", {"expression": "1/0"})]},
        {"role": "tool", "content": "error: division by zero"},
    ], [CALCULATOR]),
}


@pytest.fixture(scope="module")
def qwen2_5(shared_dir):
    """(transformers' tokenizer, its tokenizer_config.json) of the real Qwen2.5 tokenizer in ../shared."""
    transformers = pytest.importorskip("transformers", reason="transformers (dev dependency) is the reference")
    folder = Path(shared_dir) / "tokenizers" / "qwen2_5"
    if not (folder / "tokenizer_config.json").is_file():
        pytest.skip(f"no Qwen2.5 tokenizer in {folder}")
    return transformers.AutoTokenizer.from_pretrained(str(folder)), folder / "tokenizer_config.json"


@pytest.mark.parametrize("generation_prompt", [True, False])
@pytest.mark.parametrize("case", sorted(CONVERSATIONS))
def test_qwen2_5_equals_apply_chat_template(qwen2_5, case, generation_prompt):
    hf_qwen, config = qwen2_5
    messages, tools = CONVERSATIONS[case]
    expected = hf_qwen.apply_chat_template(messages, tools=tools, tokenize=False,
                                           add_generation_prompt=generation_prompt)
    got = render_chat(messages, tools, tokenizer_config=str(config),
                      add_generation_prompt=generation_prompt)
    assert got == expected
    if tools:
        assert "<tools>" in got and json.dumps(tools[0], ensure_ascii=False) in got


QWEN3_CONVERSATIONS = dict(CONVERSATIONS, **{
    "thinking in the last turn": ([
        {"role": "user", "content": "What is 7 * 6?"},
        {"role": "assistant", "content": "42", "reasoning_content": "7 sixes are 42."},
    ], None),
    "thinking written inline, then a tool": ([
        {"role": "user", "content": "Sum 10, 20, 30"},
        {"role": "assistant", "content": "<think>\nuse the tool\n</think>\n\nCalling.",
         "tool_calls": [_call("calculator", "{\"expression\": \"10+20+30\"}")]},  # arguments as a string
        {"role": "tool", "content": "60"},
        {"role": "assistant", "content": "<think>\nit said 60\n</think>\n\n60"},
    ], [CALCULATOR]),
    "an earlier turn's thought is dropped": ([
        {"role": "user", "content": "a?"},
        {"role": "assistant", "content": "A", "reasoning_content": "first"},
        {"role": "user", "content": "b?"},
    ], None),
})


@pytest.mark.parametrize("enable_thinking", [None, True, False])
@pytest.mark.parametrize("case", sorted(QWEN3_CONVERSATIONS))
def test_qwen3_equals_transformers_rendering(case, enable_thinking):
    transformers = pytest.importorskip("transformers", reason="transformers (dev dependency) is the reference")
    from transformers.utils.chat_template_utils import render_jinja_template

    messages, tools = QWEN3_CONVERSATIONS[case]
    template = json.loads(QWEN3_CONFIG.read_text(encoding="utf-8"))["chat_template"]
    kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    # apply_chat_template drops a message's None values and passes the tokenizer's special tokens; so do we
    clean = [{k: v for k, v in m.items() if v is not None} for m in messages]
    rendered, _ = render_jinja_template([clean], tools=tools, chat_template=template, add_generation_prompt=True,
                                        eos_token="<|im_end|>", pad_token="<|endoftext|>", **kwargs)
    got = render_chat(messages, tools, tokenizer_config=str(QWEN3_CONFIG), **kwargs)
    assert transformers.__version__ and got == rendered[0]
    assert got.endswith("<|im_start|>assistant\n" + ("<think>\n\n</think>\n\n" if enable_thinking is False else ""))


def test_template_errors_and_missing_template_are_one_line(tmp_path):
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": "{{ raise_exception('only user turns') }}"}))
    with pytest.raises(ChatTemplateError, match="tokenizer_config.json: the chat template failed: only user turns"):
        render_chat([{"role": "user", "content": "x"}], tokenizer_config=str(config))
    config.write_text(json.dumps({"eos_token": "</s>"}))
    with pytest.raises(ChatTemplateError, match="no 'chat_template'"):
        render_chat([{"role": "user", "content": "x"}], tokenizer_config=str(config))
    with pytest.raises(ChatTemplateError, match="absent.json"):
        render_chat([{"role": "user", "content": "x"}], tokenizer_config=str(tmp_path / "absent.json"))


def test_the_sandbox_refuses_python_internals(tmp_path):
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": "{{ messages.__class__.__mro__ }}"}))
    with pytest.raises(ChatTemplateError, match="unsafe|access"):
        render_chat([{"role": "user", "content": "x"}], tokenizer_config=str(config))
    config.write_text(json.dumps({"chat_template": "{% set ns = namespace(_x=1) %}{{ eos_token }}",
                                  "eos_token": {"content": "<e>"}}))
    with pytest.raises(ChatTemplateError, match="_x"):
        render_chat([{"role": "user", "content": "x"}], tokenizer_config=str(config))


def test_special_tokens_and_tojson_as_transformers_gives_them(tmp_path):
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": "{{ bos_token }}|{{ eos_token }}|{{ messages[0].content | tojson }}"
                                  "|{{ tools | tojson(indent=1) }}", "bos_token": {"content": "<s>"},
                                  "eos_token": "</s>"}))
    got = render_chat([{"role": "user", "content": "a <b> & é"}], [{"x": 1}], tokenizer_config=str(config))
    assert got == '<s>|</s>|"a <b> & é"|[\n {\n  "x": 1\n }\n]'

"""ToolTurns: a model turn that ends with tool calls gets the tool turn the model's chat template writes for
their answers (the trajectory decodes to render_chat of the conversation), errors included, answers cut to
tool_response_max_tokens; no model needed."""

from pathlib import Path

import pytest

from mindgrpo.data.templates import chat_prompt_template, render_chat
from mindgrpo.inference.tool_turns import ToolTurns
from mindgrpo.tools import ToolPool, tool_schema

QWEN3 = str(Path(__file__).resolve().parents[1] / "data" / "qwen3_template" / "tokenizer_config.json")
TOOLS = [tool_schema("calculator"), tool_schema("python")]
QUESTION = "What is 123 + 456 + 789?"


@pytest.fixture(scope="module")
def pool():
    with ToolPool({"calculator": {}, "python": {"wall_s": 5.0}}, num_workers=2, timeout_s=10.0) as p:
        yield p


def call(expression):
    return '<tool_call>\n{"name": "calculator", "arguments": {"expression": "%s"}}\n</tool_call>' % expression


def test_trajectory_text_is_the_chat_templates_conversation(tokenizer, pool):
    turns = ToolTurns(tokenizer, pool, ["calculator", "python"], QWEN3, max_turns=4, tool_response_max_tokens=200)
    prompt = chat_prompt_template(QWEN3, None, TOOLS)(QUESTION)
    end = tokenizer.decode([tokenizer.stop_token_ids[0]])
    model_turns = ["Let me add.\n" + call("123 + 456 + 789"),
                   call("1368 * 2") + "\n" + '<tool_call>\n{"name": "search", "arguments": {}}\n</tool_call>'
                   + "\n<tool_call>\n{bad json}\n</tool_call>",
                   "The answer is 1368."]
    ids = tokenizer.encode(prompt)
    for request, text in [(7, model_turns[0]), (7, model_turns[1])]:
        turn = tokenizer.encode(text + end)
        assert turns.end_turn(request, 0, turn)
        ready = turns.poll(True)
        assert [r for r, _ in ready] == [request]
        ids += turn + ready[0][1]
    assert not turns.end_turn(7, 0, tokenizer.encode(model_turns[2] + end))  # no tool call: the conversation ends
    messages = [{"role": "user", "content": QUESTION},
                {"role": "assistant", "content": model_turns[0]}, {"role": "tool", "content": "1368"},
                {"role": "assistant", "content": model_turns[1]}, {"role": "tool", "content": "2736"},
                {"role": "tool", "content": "error: unknown tool 'search'; the tools are calculator, python"},
                {"role": "tool", "content": "error: the tool call is not valid JSON (Expecting property name "
                                            "enclosed in double quotes at 2)"}]
    # up to the open assistant turn after the last tool turn (Qwen3's template would write the final assistant
    # turn with an empty thought when re-rendered, which the model did not write)
    assert tokenizer.decode(ids) == render_chat(messages, TOOLS, tokenizer_config=QWEN3, add_generation_prompt=True)
    assert [c["status"] for c in turns.calls[7]] == ["ok", "ok", "error", "error"]
    assert turns.stats(samples=2) == {"tool/calls_mean": 2.0, "tool/errors": 2.0, "tool/timeouts": 0.0,
                                      "tool/seconds": pytest.approx(sum(c["seconds"] for c in turns.calls[7]))}


def test_answers_are_cut_to_the_token_budget_and_the_turns_wait_for_every_call(tokenizer, pool):
    turns = ToolTurns(tokenizer, pool, ["python"], QWEN3, max_turns=2, tool_response_max_tokens=12)
    end = tokenizer.decode([tokenizer.stop_token_ids[0]])
    code = '<tool_call>\n{"name": "python", "arguments": {"code": "import time\\ntime.sleep(%s)\\nprint(\'ab \' * 400)"}}\n</tool_call>'
    assert turns.end_turn(1, 0, tokenizer.encode(code % "0.5" + "\n" + code % "0" + end))
    assert turns.poll(False) == []  # neither has answered yet (a sandbox takes a fraction of a second): it waits
    (request, ids), = turns.poll(True)
    text = tokenizer.decode(ids)
    assert request == 1 and text.count("<tool_response>") == 2 and text.count("[truncated") == 2
    for answer in text.split("<tool_response>\n")[1:]:
        assert len(tokenizer.encode(answer.split("\n</tool_response>")[0])) <= 12
    turns.reset()
    assert not turns.calls


def test_a_turn_that_ends_a_call_it_never_opened_gets_an_error_and_does_not_wait_for_ever(tokenizer, pool):
    import threading

    turns = ToolTurns(tokenizer, pool, ["calculator"], QWEN3, max_turns=2, tool_response_max_tokens=200)
    end = tokenizer.decode([tokenizer.stop_token_ids[0]])
    assert turns.end_turn(3, 0, tokenizer.encode('{"name": "calculator"}\n</tool_call>' + end))
    ready = []
    waiter = threading.Thread(target=lambda: ready.extend(turns.poll(True)), daemon=True)
    waiter.start()
    waiter.join(timeout=60)
    assert not waiter.is_alive(), "poll(True) waits for a call that was never made"
    (request, ids), = ready
    assert request == 3 and "error: no tool call found" in tokenizer.decode(ids)
    assert [c["status"] for c in turns.calls[3]] == ["error"]

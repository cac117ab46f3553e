"""ToolTurns: a model turn that ends with tool calls gets the tool turn the model's chat template writes for
their answers (the trajectory decodes to render_chat of the conversation), errors included, answers cut to
tool_response_max_tokens, and further when the tokenizer makes the turn longer than a run's budget for it; no model
needed."""

import json
from pathlib import Path

import pytest

from mindgrpo.config import GRPOConfig
from mindgrpo.config.loader import from_dict, load_config
from mindgrpo.data.synthetic import TinyTokenizerSpec, ensure_tiny_tokenizer
from mindgrpo.data.templates import chat_prompt_template, render_chat
from mindgrpo.data.tokenizer import QwenTokenizer
from mindgrpo.grpo.conversations import build_conversations, tool_chat_texts
from mindgrpo.inference.tool_turns import ToolTurns
from mindgrpo.tools import ToolPool, tool_schema
from mindgrpo.tools.calls import truncate_response

REPO = Path(__file__).resolve().parents[2]
QWEN3 = str(REPO / "tests" / "data" / "qwen3_template" / "tokenizer_config.json")
TINY_TOOLS = REPO / "model_configs" / "qwen_grpo" / "tiny_tools"
QWEN2_5 = REPO.parent / "shared" / "tokenizers" / "qwen2_5"  # read-only ../shared, absent in some checkouts
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


@pytest.fixture(scope="module")
def tiny_tools(tmp_path_factory):
    """The tiny tool recipe's tokenizer (trained on its conversations, as the builder makes it) and chat template."""
    cfg = load_config(GRPOConfig, str(TINY_TOOLS / "grpo_config.yaml"))
    template = str(TINY_TOOLS / "tokenizer_config.json")
    spec = TinyTokenizerSpec(task=cfg.synthetic_config.task, chat_texts=tool_chat_texts(cfg, template))
    return ensure_tiny_tokenizer(str(tmp_path_factory.mktemp("tiny_tools") / "tokenizer"), spec), template


@pytest.fixture(scope="module")
def qwen2_5():
    if not (QWEN2_5 / "vocab.json").is_file():
        pytest.skip(f"the real Qwen2.5 tokenizer is not at {QWEN2_5} (read-only ../shared is absent)")
    return QwenTokenizer.from_dir(str(QWEN2_5)), str(QWEN2_5 / "tokenizer_config.json")


# (tokenizer, tool_response_max_tokens, what the tool prints): the run's turn budget is the template's text around an
# empty answer + tool_response_max_tokens rounded up to 16, exactly 32 for both; an answer of that many tokens
# renders to 33 (the empty answer let the template's "\n" + "\n" merge into one token)
@pytest.mark.parametrize("tokenizer_of, answer_tokens, printed", [("tiny_tools", 16, "1" * 40),
                                                                  ("qwen2_5", 15, "123456789012345")])
def test_a_tool_turn_fits_its_budget_when_its_answer_splits_the_templates_tokens(request, tokenizer_of, answer_tokens,
                                                                                printed):
    tokenizer, template = request.getfixturevalue(tokenizer_of)
    enc, dec = tokenizer.encode, tokenizer.decode
    cfg = from_dict(GRPOConfig, {"generate_config": {"tools": ["python"], "max_turns": 1,
                                                     "tool_response_max_tokens": answer_tokens}})
    conv = build_conversations(cfg, tokenizer, template)  # the turn budget as a run sizes it
    turns = conv.turns
    cut = truncate_response(printed, enc, dec, answer_tokens)
    assert len(enc(cut)) == answer_tokens and turns.max_turn_tokens == 32
    assert len(enc(turns.tool_turn_text([cut]))) == 33  # the case: cut to its budget, the answer does not fit
    code = "import sys\nsys.stdout.write(%r)" % printed
    model_turn = '<tool_call>\n{"name": "python", "arguments": {"code": %s}}\n</tool_call>' % json.dumps(code)
    conv.start()
    try:
        assert turns.end_turn(0, 0, enc(model_turn + dec([tokenizer.stop_token_ids[0]])))
        (r, ids), = turns.poll(True)
    finally:
        conv.close()
    (read,), = turns.answers[0]  # the answer as the model reads it (one turn, one call)
    assert r == 0 and turns.calls[0][0]["response"] == printed
    assert len(ids) <= 32 and ids == enc(turns.tool_turn_text([read]))
    shown, note = read.split("\n[truncated", 1)
    assert printed.startswith(shown) and len(enc(read)) < answer_tokens  # cut further, with the note
    assert turns.columns(0)["turn_messages"] == [[{"role": "tool", "content": read}]]


def test_answers_of_several_calls_are_cut_until_their_turn_fits(tokenizer, pool):
    """Two long answers against a budget for one: both cut (the longest first, down to the other's length, then
    together) until the turn fits; none cut to nothing while the other keeps its length."""
    turns = ToolTurns(tokenizer, pool, ["python"], QWEN3, max_turns=1, tool_response_max_tokens=40)
    around = len(tokenizer.encode(turns.tool_turn_text(["", ""])))
    turns.max_turn_tokens = around + 40
    answers, ids = turns.fitted_turn(["ab " * 200, "cd " * 30])
    assert len(ids) <= turns.max_turn_tokens and ids == tokenizer.encode(turns.tool_turn_text(answers))
    sizes = [len(tokenizer.encode(a)) for a in answers]
    assert all("[truncated" in a for a in answers) and abs(sizes[0] - sizes[1]) <= 2 and min(sizes) >= 15
    answers, ids = turns.fitted_turn(["1368", "2736"])  # short answers: as they are
    assert answers == ["1368", "2736"]
    turns.max_turn_tokens = around - 1  # not even empty answers fit: the turn as short as it gets (the engine ends
    answers, ids = turns.fitted_turn(["ab " * 200, "cd " * 30])  # the sample and counts it, turns/cut)
    assert answers == ["", ""] and len(ids) == around

"""The tiny tool recipe's pieces without a model: the warm start's teacher conversations (grpo/sft.tool_targets)
are the chat template's conversation token for token, with the tool turn masked; the sampled problem space of
sums too large to enumerate."""

import os

import numpy as np
import pytest

from mindgrpo.config import GRPOConfig
from mindgrpo.config.loader import from_dict
from mindgrpo.data.synthetic import SPACE_LIMIT, ArithmeticTask, arithmetic_rows, ensure_tiny_tokenizer
from mindgrpo.data.templates import chat_prompt_template, render_chat
from mindgrpo.grpo.conversations import build_conversations
from mindgrpo.grpo.sft import expression_of, tool_targets
from mindgrpo.tools import tool_schema

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEMPLATE = os.path.join(REPO, "model_configs", "qwen_grpo", "tiny_tools", "tokenizer_config.json")
TASK = ArithmeticTask(operators=("+",), max_operand=999, num_operands=3, num_train=300, num_val=50)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return ensure_tiny_tokenizer(str(tmp_path_factory.mktemp("tiny") / "tokenizer"))


@pytest.fixture(scope="module")
def turns(tokenizer):
    cfg = from_dict(GRPOConfig, {"generate_config": {"tools": ["calculator"], "tool_num_workers": 1}})
    conv = build_conversations(cfg, tokenizer, TEMPLATE)
    yield conv.turns
    conv.close()


def test_sums_too_many_to_enumerate_are_sampled_distinct_and_split():
    train, val = arithmetic_rows(TASK)
    assert len(train) == 300 and len(val) == 50
    questions = [r.question for r in train + val]
    assert len(set(r.answer for r in train + val)) == 350  # no problem twice, none in both splits
    for row in train[:50]:
        nums = [int(x) for x in expression_of(row.answer).split(" + ")]
        assert len(nums) == 3 and all(0 <= n <= 999 for n in nums) and int(row.solution) == sum(nums)
    assert arithmetic_rows(TASK) == (train, val)  # deterministic in the seed
    assert (TASK.max_operand + 1) ** 3 > SPACE_LIMIT and questions


def test_a_calling_teachers_conversation_is_the_chat_templates(tokenizer, turns):
    train, _ = arithmetic_rows(TASK)
    rows = train[:8]
    targets, masks = tool_targets([r.answer for r in rows], [r.solution for r in rows], tokenizer, turns,
                                  np.random.default_rng(0), call_rate=1.0, carry_error=0.0)
    prompt = chat_prompt_template(TEMPLATE, None, [tool_schema("calculator")])
    for row, ids, mask in zip(rows, targets, masks):
        nums = expression_of(row.answer)
        messages = [{"role": "user", "content": row.question},
                    {"role": "assistant", "content": "", "tool_calls": [
                        {"type": "function", "function": {"name": "calculator", "arguments": {"expression": nums}}}]},
                    {"role": "tool", "content": str(sum(int(x) for x in nums.split(" + ")))},
                    {"role": "assistant", "content": "\\boxed{%s}" % row.solution}]
        whole = render_chat(messages, [tool_schema("calculator")], tokenizer_config=TEMPLATE,
                            add_generation_prompt=False)
        assert tokenizer.decode(tokenizer.encode(prompt(row.question)) + ids) + "\n" == whole
        context = [i for i, own in zip(ids, mask) if not own]
        assert tokenizer.decode(context).startswith("\n<|im_start|>user\n<tool_response>\n")
        assert tokenizer.decode(context).endswith("<|im_start|>assistant\n")
        assert mask[0] and mask[-1] and ids[-1] == tokenizer.stop_token_ids[0]


def test_a_teacher_that_calls_sometimes_answers_at_once_otherwise(tokenizer, turns):
    train, _ = arithmetic_rows(TASK)
    answers, solutions = [r.answer for r in train], [r.solution for r in train]
    targets, masks = tool_targets(answers, solutions, tokenizer, turns, np.random.default_rng(1), call_rate=0.3,
                                  carry_error=0.0)
    called = np.array([not m.all() for m in masks])
    assert 0.2 < called.mean() < 0.4
    for ids, solution in zip(np.array(targets, dtype=object)[~called], np.array(solutions)[~called]):
        assert tokenizer.decode(ids) == "\\boxed{%s}<|im_end|>" % solution
    # a flawed teacher that forgets every carry out of the ones column: its direct answers are often wrong
    targets, masks = tool_targets(answers, solutions, tokenizer, turns, np.random.default_rng(1), call_rate=0.0,
                                  carry_error=1.0)
    wrong = [tokenizer.decode(ids) != "\\boxed{%s}<|im_end|>" % s for ids, s in zip(targets, solutions)]
    assert 0.5 < np.mean(wrong) < 0.95

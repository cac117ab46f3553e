"""The tiny arithmetic task and its tokenizer."""

import json
import operator
import os
import re

import pytest

from mindgrpo.data import synthetic
from mindgrpo.data.synthetic import (
    ArithmeticTask,
    TinyTokenizerSpec,
    arithmetic_rows,
    ensure_tiny_tokenizer,
    train_tiny_tokenizer,
    write_arithmetic_dataset,
)
from mindgrpo.data.templates import TEMPLATES, render_prompt
from mindgrpo.data.tokenizer import QwenTokenizer
from mindgrpo.rewards import get_reward

OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
QUESTION = re.compile(r"\D*?(\d+) ([-+*]) (\d+)[?.]")


def test_rows_are_correct_seeded_and_disjoint():
    task = ArithmeticTask(seed=3, num_train=500, num_val=100)
    train, val = arithmetic_rows(task)
    assert (len(train), len(val)) == (500, 100)
    assert arithmetic_rows(task) == (train, val)
    assert arithmetic_rows(ArithmeticTask(seed=4, num_train=500, num_val=100))[0] != train
    assert not {r.question for r in train} & {r.question for r in val}
    assert len({r.question for r in train}) == 500
    for row in train + val:
        a, op, b = QUESTION.fullmatch(row.question).groups()
        value = OPS[op](int(a), int(b))
        assert row.solution == str(value) and value >= 0
        assert row.answer == f"{a} {op} {b} = {value}"
        if op == "*":
            assert int(a) <= task.max_mul_operand and int(b) <= task.max_mul_operand
        else:
            assert int(a) <= task.max_operand and int(b) <= task.max_operand
    # the reference solutions score full marks with the accuracy reward
    accuracy = get_reward("accuracy")
    assert accuracy([r.answer for r in train], solution=[r.solution for r in train]) == [1.0] * 500


def test_too_many_problems_fail():
    with pytest.raises(ValueError, match="space holds"):
        arithmetic_rows(ArithmeticTask(num_train=10_000, num_val=10_000))


def test_tiny_tokenizer_round_trips_and_keeps_special_tokens(tiny):
    assert tiny.vocab_size == TinyTokenizerSpec().vocab_size
    assert tiny.encode("<|endoftext|><|im_start|><|im_end|>") == [509, 510, 511]
    assert tiny.stop_token_ids == [511, 509] and tiny.pad_token_id == 509
    train, _ = arithmetic_rows(ArithmeticTask(num_train=50, num_val=0))
    texts = [render_prompt(name, r.question) + r.answer + "<|im_end|>" for r in train for name in TEMPLATES.names()]
    texts += ["unseen: \u00fcber \u4e2d\u6587 \U0001f600 \t\r\n tabs", "Z" * 50, ""]
    for text, ids in zip(texts, tiny.encode_batch(texts)):
        assert tiny.decode(ids) == text
        assert all(0 <= i < tiny.vocab_size for i in ids)
    # the corpus words became tokens: a templated R1 prompt is far shorter than its byte count
    prompt = render_prompt("qwen_r1", "What is 23 + 45?")
    assert len(tiny.encode(prompt)) < len(prompt.encode()) / 3


def test_training_is_deterministic():
    spec = TinyTokenizerSpec(vocab_size=400, task=ArithmeticTask(num_train=300, num_val=50))
    a, b = train_tiny_tokenizer(spec), train_tiny_tokenizer(spec)
    assert a.tokenizer_config() == b.tokenizer_config()
    text = render_prompt("qwen_r1", "Compute 12 * 11.")
    assert a.encode(text) == b.encode(text)
    assert [a.id_to_token(i) for i in range(a.vocab_size)] == [b.id_to_token(i) for i in range(b.vocab_size)]


def test_cache_is_reused_and_refreshed(tmp_path, monkeypatch):
    spec = TinyTokenizerSpec(vocab_size=400, task=ArithmeticTask(num_train=300, num_val=50))
    path = tmp_path / "tok"
    first = ensure_tiny_tokenizer(str(path), spec)
    assert sorted(os.listdir(path)) == sorted(
        ["vocab.json", "merges.txt", "tokenizer_config.json", "mindgrpo_tiny_tokenizer.json"]
    )
    assert sorted(os.listdir(tmp_path)) == ["tok"]  # no temporary folder left

    def no_training(_spec):
        raise AssertionError("retrained although the cache is fresh")

    monkeypatch.setattr(synthetic, "train_tiny_tokenizer", no_training)
    again = ensure_tiny_tokenizer(str(path), spec)
    assert again.encode("What is 2 + 2?") == first.encode("What is 2 + 2?")
    assert QwenTokenizer.from_dir(str(path)).vocab_size == 400

    monkeypatch.undo()
    bigger = ensure_tiny_tokenizer(str(path), TinyTokenizerSpec(vocab_size=450, task=spec.task))
    assert bigger.vocab_size == 450
    assert json.loads((path / "mindgrpo_tiny_tokenizer.json").read_text())["vocab_size"] == 450


def test_transformers_reads_the_saved_tiny_tokenizer(tiny, tiny_tokenizer_dir):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))
    text = render_prompt("qwen_r1", "What is 7 * 8?") + "<think> 56 </think> <answer> \\boxed{56} </answer><|im_end|>"
    assert hf.encode(text, add_special_tokens=False) == tiny.encode(text)
    assert len(hf) == tiny.vocab_size


def test_dataset_written_with_the_shared_writer(tiny, tmp_path):
    import mindspore.dataset as ds

    task = ArithmeticTask(num_train=64, num_val=16)
    summaries = write_arithmetic_dataset(str(tmp_path), tiny, task)
    assert {k: s.written for k, s in summaries.items()} == {"train": 64, "val": 16}
    assert summaries["train"].dropped == 0 and summaries["train"].max_length <= 128
    train, _ = arithmetic_rows(task)
    records = list(
        ds.MindDataset(str(tmp_path / "train.mindrecord"), shuffle=False).create_dict_iterator(
            output_numpy=True, num_epochs=1
        )
    )
    assert [str(r["solution"]) for r in records] == [r.solution for r in train]
    first = records[0]
    ids = tiny.encode(render_prompt("qwen_r1", train[0].question))
    assert first["prompt_ids"][: int(first["prompt_length"])].tolist() == ids


CHAIN = re.compile(r"\D*?(\d+) ([-+]) (\d+) ([-+]) (\d+)[?.]")


def test_three_operand_chains_show_every_step():
    import itertools

    task = ArithmeticTask(seed=1, operators=("+", "-"), num_operands=3, max_operand=9, num_train=600, num_val=100)
    train, val = arithmetic_rows(task)
    assert not {r.question for r in train} & {r.question for r in val}
    for row in train + val:
        a, op1, b, op2, c = CHAIN.fullmatch(row.question).groups()
        x = OPS[op1](int(a), int(b))
        y = OPS[op2](x, int(c))
        assert x >= 0 and y >= 0 and row.solution == str(y)
        assert row.answer == f"{a} {op1} {b} = {x}, {x} {op2} {c} = {y}"
    # the space is every chain with non-negative intermediate results, counted independently
    space = sum(1 for a, b, c in itertools.product(range(10), repeat=3)
                for o1, o2 in itertools.product("+-", repeat=2)
                if OPS[o1](a, b) >= 0 and OPS[o2](OPS[o1](a, b), c) >= 0)
    arithmetic_rows(ArithmeticTask(operators=("+", "-"), num_operands=3, max_operand=9, num_train=space, num_val=0))
    with pytest.raises(ValueError, match="space holds"):
        arithmetic_rows(ArithmeticTask(operators=("+", "-"), num_operands=3, max_operand=9, num_train=space,
                                       num_val=1))


@pytest.mark.parametrize("kwargs, match", [({"num_operands": 1}, "num_operands"),
                                           ({"num_operands": 3, "operators": ("*",)}, "only supported"),
                                           ({"operators": ("/",)}, "unknown operator")])
def test_bad_tasks_fail(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ArithmeticTask(**kwargs)


def test_flawed_teacher_forgets_carries_and_carries_on_from_its_mistake():
    import numpy as np

    from mindgrpo.data.synthetic import flawed_solution

    rng = np.random.default_rng(0)
    # worked by hand: 7 + 8 carries (15 -> 5), then 5 + 9 carries too (14 -> 4); 2 - 5 is never touched
    assert flawed_solution("7 + 8 = 15, 15 + 9 = 24", rng, 1.0) == ("7 + 8 = 5, 5 + 9 = 4", "4")
    assert flawed_solution("7 + 8 = 15, 15 + 9 = 24", rng, 0.0) == ("7 + 8 = 15, 15 + 9 = 24", "24")
    assert flawed_solution("12 + 5 = 17, 17 - 9 = 8", rng, 1.0) == ("12 + 5 = 17, 17 - 9 = 8", "8")
    assert flawed_solution("3 + 8 = 11, 11 - 5 = 6", rng, 1.0) == ("3 + 8 = 1, 1 - 5 = -4", "-4")
    # at rate p, about p of the carrying steps are wrong
    wrong = sum(flawed_solution("9 + 9 = 18", rng, 0.6)[1] == "8" for _ in range(2000))
    assert 0.55 < wrong / 2000 < 0.65
    with pytest.raises(ValueError, match="not a worked arithmetic step"):
        flawed_solution("Natalia sold 48 clips", rng, 0.5)

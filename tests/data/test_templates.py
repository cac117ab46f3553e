"""Prompt templates: literal expected text, and parity with the chat_template of the real tokenizer_config.json."""

from pathlib import Path

import pytest

from mindgrpo.data.templates import QWEN_SYSTEM, R1_SYSTEM, TEMPLATES, get_template, render_prompt


def test_qwen_chat_literal():
    expected = (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert render_prompt("qwen_chat", "What is 2 + 3?") == expected


def test_raw_is_the_question():
    assert render_prompt("raw", "  What is 2 + 3?\n") == "  What is 2 + 3?\n"


def test_r1_prompt_asks_for_think_answer_and_boxed():
    text = render_prompt("qwen_r1", "Q?")
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\n")
    for needle in ("<think>", "</think>", "<answer>", "</answer>", "\\boxed{"):
        assert needle in R1_SYSTEM


@pytest.mark.parametrize("name, system", [("qwen_chat", QWEN_SYSTEM), ("qwen_r1", R1_SYSTEM)])
def test_matches_transformers_apply_chat_template(hf_qwen, name, system):
    for question in ["What is 2 + 3?", "Line one\nline two  with  spaces\n", "\u00e9\u00e8 \\frac{1}{2}"]:
        expected = hf_qwen.apply_chat_template(
            [{"role": "system", "content": system}, {"role": "user", "content": question}],
            tokenize=False,
            add_generation_prompt=True,
        )
        assert render_prompt(name, question) == expected


def test_unknown_template_lists_valid_names():
    with pytest.raises(KeyError, match="qwen3_chat, qwen3_chat_no_think, qwen3_r1, qwen_chat, qwen_r1, raw"):
        get_template("qwen")
    assert set(TEMPLATES.names()) == {"qwen_chat", "qwen_r1", "qwen3_chat", "qwen3_chat_no_think", "qwen3_r1", "raw"}


def test_qwen3_literals():
    """Qwen3: no default system turn; thinking on adds nothing after the assistant's turn (the model
    opens <think>), thinking off closes an empty thought."""
    turn = "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    assert render_prompt("qwen3_chat", "What is 2 + 3?") == turn
    assert render_prompt("qwen3_chat_no_think", "What is 2 + 3?") == turn + "<think>\n\n</think>\n\n"
    assert render_prompt("qwen3_r1", "What is 2 + 3?") == f"<|im_start|>system\n{R1_SYSTEM}<|im_end|>\n" + turn


QWEN3_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "tokenizers" / "qwen3"


@pytest.mark.parametrize("name, system, thinking", [("qwen3_chat", None, True), ("qwen3_chat_no_think", None, False),
                                                    ("qwen3_r1", R1_SYSTEM, True)])
def test_qwen3_matches_the_chat_template_of_its_tokenizer_config(name, system, thinking):
    if not (QWEN3_DIR / "tokenizer_config.json").is_file():
        pytest.skip(f"no Qwen3 tokenizer at {QWEN3_DIR} (its tokenizer_config.json holds the reference template)")
    transformers = pytest.importorskip("transformers", reason="transformers (dev dependency) is the reference")
    hf = transformers.AutoTokenizer.from_pretrained(str(QWEN3_DIR))
    for question in ["What is 2 + 3?", "Line one\nline two  with  spaces\n"]:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
        expected = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=thinking)
        assert render_prompt(name, question) == expected

"""QwenTokenizer against transformers' Qwen2Tokenizer loaded from the same real Qwen2.5 files."""

import json

import pytest

from mindgrpo.data.templates import QWEN_SYSTEM, R1_SYSTEM
from mindgrpo.data.tokenizer import AddedTokenSpec, QwenTokenizer, read_merges

TRICKY = [
    "",
    " ",
    "Hello  world\r\n\n  x\t\ty   ",
    "cafe\u0301 vs caf\u00e9, \ufb01 ligature, \uff21\uff11\uff12 full width",  # NFC changes the first
    "I'LL SAY it's, we've, they'd... DON'T",
    "1234567.890 $1,000.00 -7 3/4 1e-5 \u00bd",
    "\u4e2d\u6587\u6d4b\u8bd5\uff0c\u65e5\u672c\u8a9e\u3002 \U0001f600\U0001f44d\U0001f3fd emoji",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "a<|im_end|>b<|endoftext|><|endoftext|>c",
    "<tool_call>{\"x\": 1}</tool_call><|fim_prefix|>def f():<|fim_suffix|>",
    "<|im_start |> <|IM_END|> <|im_end",  # near-misses stay ordinary text
    "\\boxed{\\frac{1}{2}} <think> x </think>\n\n\n<answer>42</answer>",
    "\x00\x07 control \u200b zero width \ufeff bom",
]


def gsm8k_texts(gsm8k_dir):
    texts = []
    for split in ("train", "test"):
        with open(gsm8k_dir / f"{split}.jsonl", encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                texts += [row["question"], row["answer"]]
    return texts


def test_every_gsm8k_question_and_answer_matches_transformers(qwen, hf_qwen, gsm8k_dir):
    texts = gsm8k_texts(gsm8k_dir)
    assert len(texts) == 2 * (7473 + 1319)
    expected = hf_qwen(texts, add_special_tokens=False)["input_ids"]
    got = qwen.encode_batch(texts)
    mismatches = [i for i, (a, b) in enumerate(zip(got, expected)) if a != b]
    assert not mismatches, f"{len(mismatches)} texts differ, first: {texts[mismatches[0]]!r}"
    # the single-text path agrees with the batched one
    assert [qwen.encode(t) for t in texts[:300]] == got[:300]


@pytest.mark.parametrize("text", TRICKY)
def test_tricky_text_matches_transformers(qwen, hf_qwen, text):
    ids = qwen.encode(text)
    assert ids == hf_qwen.encode(text, add_special_tokens=False)
    assert qwen.decode(ids) == hf_qwen.decode(ids)
    assert qwen.decode(ids, skip_special_tokens=True) == hf_qwen.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("system", [QWEN_SYSTEM, R1_SYSTEM])
def test_chat_template_text_matches_transformers(qwen, hf_qwen, gsm8k_dir, system):
    with open(gsm8k_dir / "test.jsonl", encoding="utf-8") as f:
        questions = [json.loads(line)["question"] for line in f][:200]
    rendered = [
        hf_qwen.apply_chat_template(
            [{"role": "system", "content": system}, {"role": "user", "content": q}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for q in questions
    ]
    assert qwen.encode_batch(rendered) == hf_qwen(rendered, add_special_tokens=False)["input_ids"]


def test_special_token_ids(qwen, hf_qwen, qwen_dir):
    assert qwen.encode("<|endoftext|><|im_start|><|im_end|>") == [151643, 151644, 151645]
    assert qwen.vocab_size == len(hf_qwen) == 151665
    assert qwen.eos_token_id == hf_qwen.eos_token_id == 151643
    assert qwen.pad_token_id == hf_qwen.pad_token_id == 151643
    # <|im_end|> ends a chat turn, <|endoftext|> (the base model's eos in generation_config.json) a document
    generation = json.loads((qwen_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] in qwen.stop_token_ids
    assert qwen.stop_token_ids == [151645, 151643]
    # 22 added tokens, of which <tool_call>.. <|file_sep|> are not "special" (kept by skip_special_tokens)
    assert qwen.special_token_ids == list(range(151643, 151657))
    assert qwen.decode(qwen.encode("<tool_call>x<|im_end|>"), skip_special_tokens=True) == "<tool_call>x"


def test_without_config_the_chat_tokens_get_qwen25_ids(qwen_dir, qwen):
    bare = QwenTokenizer.from_files(str(qwen_dir / "vocab.json"), str(qwen_dir / "merges.txt"))
    text = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|endoftext|>"
    assert bare.encode(text) == qwen.encode(text)
    assert bare.vocab_size == 151646
    assert bare.stop_token_ids == [151645, 151643]


def test_save_round_trip_loads_in_both(qwen, hf_qwen, tmp_path):
    transformers = pytest.importorskip("transformers")
    qwen.save(str(tmp_path))
    again = QwenTokenizer.from_dir(str(tmp_path))
    hf_again = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    for text in TRICKY:
        expected = hf_qwen.encode(text, add_special_tokens=False)
        assert again.encode(text) == expected
        assert hf_again.encode(text, add_special_tokens=False) == expected
    assert again.chat_template == qwen.chat_template is not None


def test_read_merges_skips_version_header(tmp_path):
    path = tmp_path / "merges.txt"
    path.write_text("#version: 0.2\n\u0120 t\nh e\n\n", encoding="utf-8")
    assert read_merges(str(path)) == [("\u0120", "t"), ("h", "e")]
    path.write_text("h e\nbroken\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"merges.txt:2"):
        read_merges(str(path))


def test_added_token_ids_must_follow_the_vocabulary():
    vocab = {"a": 0, "b": 1}
    ok = QwenTokenizer(vocab, [], [AddedTokenSpec(2, "<|endoftext|>")])
    assert ok.encode("ab<|endoftext|>") == [0, 1, 2]
    with pytest.raises(ValueError, match="next free id is 2"):
        QwenTokenizer(vocab, [], [AddedTokenSpec(5, "<|endoftext|>")])

"""The work both sides of the GRPO step benchmark do: weights, tokenizer, prompts and the reward."""

from __future__ import annotations

import json
import os
from typing import List

from benchmarks.harness import SHARED
from benchmarks.tiny_models import hf_model

REWARD = "benchmark_letter_share"
TEMPLATE = "qwen_r1"
BETA, LR = 0.04, 1e-6


def letter_share(completions, **_):
    """A cheap reward with TRL's and our signature: the share of ASCII letters among the completion's characters.
    A random model's samples mix word pieces, other scripts and symbols, so a group's rewards differ and its
    advantages are not zero (the share of digits, used before, was zero for nearly every sample of the Qwen
    vocabulary's ~10 digit tokens in 151k: no spread, nothing learned)."""
    return [sum(ch.isascii() and ch.isalpha() for ch in c) / max(len(c), 1) for c in completions]


class Workload:
    """Weights (HF dir and our .ckpt), tokenizer files and the prompt MindRecord of one model config."""

    def __init__(self, name: str, model: dict, folder: str, num_prompts: int, shared: str = SHARED, seed: int = 0):
        self.name, self.model, self.folder = name, model, folder
        self.gsm8k = os.path.join(shared, "data", "gsm8k", "test.jsonl")
        self.qwen_tokenizer = os.path.join(shared, "tokenizers", "qwen2_5")
        os.makedirs(folder, exist_ok=True)
        self.hf_dir, self.ckpt = os.path.join(folder, "hf"), os.path.join(folder, "ms", "model.ckpt")
        self.tokenizer_dir = self._tokenizer()
        self.texts = self._prompts(num_prompts)
        self._weights(seed)
        self.dataset, self.prompt_ids = self._dataset()
        self.params = _num_params(model)

    def _tokenizer(self) -> str:
        """Qwen2.5's when present and the model's vocabulary holds its ids, else our tiny one."""
        from mindgrpo.data.synthetic import ensure_tiny_tokenizer
        from mindgrpo.data.tokenizer import QwenTokenizer

        if os.path.isfile(os.path.join(self.qwen_tokenizer, "vocab.json")):
            if QwenTokenizer.from_dir(self.qwen_tokenizer).vocab_size <= self.model["vocab_size"]:
                return self.qwen_tokenizer

        path = os.path.join(self.folder, "tiny_tokenizer")
        ensure_tiny_tokenizer(path)
        return path

    def _prompts(self, n: int) -> List[str]:
        from mindgrpo.data.templates import render_prompt

        self.data = "GSM8K test" if os.path.isfile(self.gsm8k) else "synthetic"
        if os.path.isfile(self.gsm8k):
            with open(self.gsm8k, encoding="utf-8") as f:
                questions = [json.loads(line)["question"] for _, line in zip(range(n), f)]
        else:
            questions = [f"Question {i}: a farmer has {3 + i} fields of {12 * (i + 1)} rows with {7 + 2 * i} plants "
                         f"each and sells a third of the plants. How many plants are left?" for i in range(n)]
        return [render_prompt(TEMPLATE, q) for q in questions]

    def _weights(self, seed: int) -> None:
        from scripts.convert_weight import hf_to_ms  # the project's converter

        hf_model(self.name, seed=seed, overrides=self.model).save_pretrained(self.hf_dir)
        os.makedirs(os.path.dirname(self.ckpt), exist_ok=True)
        hf_to_ms(self.hf_dir, self.ckpt, None)

    def _dataset(self):
        from mindgrpo.data.mindrecord import PromptRow, write_prompt_dataset
        from mindgrpo.data.tokenizer import QwenTokenizer
        from transformers import AutoTokenizer

        ours = QwenTokenizer.from_dir(self.tokenizer_dir)
        ids = ours.encode_batch(self.texts)
        if AutoTokenizer.from_pretrained(self.tokenizer_dir)(text=self.texts)["input_ids"] != ids:
            raise RuntimeError(f"{self.tokenizer_dir}: transformers and mindgrpo tokenize the prompts differently")
        path = os.path.join(self.folder, "prompts.mindrecord")
        rows = [PromptRow(question=t, answer="", solution="0") for t in self.texts]
        write_prompt_dataset(path, rows, ours, template="raw", max_prompt_length=max(map(len, ids)), overwrite=True)
        return path, ids


def _num_params(model: dict) -> int:
    from mindgrpo.models.config import Qwen2Config

    return Qwen2Config(**model).num_params()

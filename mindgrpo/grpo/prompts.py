"""Prompt batches for the trainer: a seeded, epoch-shuffled walk over a prompt dataset.

The position (epoch, index) is the whole state: saving it in a checkpoint and restoring it
continues the same order, so a resumed run draws exactly the prompts a straight run would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np


@dataclass
class PromptBatch:
    ids: List[List[int]]  # token ids per prompt, unpadded
    columns: Dict[str, list]  # solution, answer, prompt: per prompt


class PromptSource:
    """path: the dataset file, for messages."""

    def __init__(self, data: Dict[str, object], seed: int, shuffle: bool = True, path: str = "the prompt dataset"):
        self.path = path
        self.ids = [row[:n].tolist() for row, n in zip(data["prompt_ids"], data["prompt_length"])]
        self.columns = {k: list(data[k]) for k in ("solution", "answer", "prompt") if k in data}
        if not self.ids:
            raise ValueError(f"{path}: the prompt dataset is empty")
        self.seed, self.shuffle = seed, shuffle
        self.epoch, self.index = 0, 0
        self._order = self._epoch_order(0)

    def __len__(self) -> int:
        return len(self.ids)

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.ids))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.ids))

    def next(self, n: int) -> PromptBatch:
        picks = []
        while len(picks) < n:
            if self.index == len(self.ids):
                self.epoch, self.index = self.epoch + 1, 0
                self._order = self._epoch_order(self.epoch)
            picks.append(int(self._order[self.index]))
            self.index += 1
        return self.take(picks)

    def take(self, rows) -> PromptBatch:
        return PromptBatch([self.ids[i] for i in rows], {k: [v[i] for i in rows] for k, v in self.columns.items()})

    def state(self) -> dict:
        return {"epoch": self.epoch, "index": self.index}

    def out_of_vocabulary(self, vocab_size: int) -> Optional[tuple]:
        """(row, token id) of the first prompt token id outside [0, vocab_size), or None."""
        for row, ids in enumerate(self.ids):
            bad = [t for t in ids if not 0 <= t < vocab_size]
            if bad:
                return row, bad[0]
        return None

    def back(self, n: int) -> None:
        """To the position n prompts earlier (across epochs): the next n draws give the last n drawn again."""
        at = self.epoch * len(self.ids) + self.index - n
        if n < 0 or at < 0:
            raise ValueError(f"{self.path}: cannot go back {n} prompts from epoch {self.epoch}, index {self.index}")
        self.load_state({"epoch": at // len(self.ids), "index": at % len(self.ids)})

    def load_state(self, state: dict) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
        self._order = self._epoch_order(self.epoch)


def check_vocabulary(vocab_size: int, model: str, *sources: Optional[PromptSource]) -> None:
    """ValueError naming the dataset file and `model` (where vocab_size comes from) when a prompt
    holds a token id the model has no embedding for (it would fail much later, inside a gather)."""
    for source in sources:
        found = source.out_of_vocabulary(vocab_size) if source is not None else None
        if found is not None:
            row, token = found
            raise ValueError(f"{source.path}: row {row} holds token id {token}, outside the vocabulary of "
                             f"{vocab_size} tokens of {model}; the dataset was written with another tokenizer "
                             "than the model's")

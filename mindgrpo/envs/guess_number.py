"""The example environment: a guess-the-number game with feedback.

The secret is drawn from the prompt's text and `seed` (so the G samples of a prompt play the same game, and a
run is reproducible). Each model turn's last whole number is its guess: "Higher." / "Lower." come back as the
next user message, a correct guess ends the game with reward 1; a turn without a number is told so and scores
`invalid_reward`.
"""

from __future__ import annotations

import hashlib
import re
from typing import Tuple

from mindgrpo.envs.registry import Environment, register_environment

NUMBER = re.compile(r"-?\d+")
THINK = re.compile(r"<think>.*?</think>", re.S)


@register_environment("guess_number")
class GuessNumber(Environment):
    def __init__(self, *, low: int = 1, high: int = 100, seed: int = 0, invalid_reward: float = 0.0):
        if not low <= high:
            raise ValueError(f"guess_number: low {low} > high {high}")
        self.low, self.high, self.seed, self.invalid_reward = int(low), int(high), int(seed), float(invalid_reward)
        self.secret = None

    def reset(self, prompt: str) -> str:
        digest = hashlib.sha256(f"{self.seed}\0{prompt}".encode()).digest()
        self.secret = self.low + int.from_bytes(digest[:8], "big") % (self.high - self.low + 1)
        return (f"{prompt}\nI am thinking of a whole number from {self.low} to {self.high}. Guess it: answer with "
                "one number; I will say higher or lower.").strip()

    def step(self, model_turn: str) -> Tuple[str, float, bool]:
        numbers = NUMBER.findall(THINK.sub("", model_turn))
        if not numbers:
            return "Answer with one whole number.", self.invalid_reward, False
        guess = int(numbers[-1])
        if guess == self.secret:
            return "Correct!", 1.0, True
        return ("Higher." if guess < self.secret else "Lower."), 0.0, False

"""Environments for the tests (loaded as a plugin file by its path): `counter` answers "obs K" and scores each
turn by its length; `hostile` misbehaves in the way its prompt names."""

import os
import time

from mindgrpo.envs import Environment, register_environment


@register_environment("counter")
class Counter(Environment):
    """Observation "obs K" after the K-th turn; reward len(turn) / 100; done after `done_after` turns (0: never)."""

    def __init__(self, *, done_after: int = 0):
        self.done_after, self.k = done_after, 0

    def reset(self, prompt):
        return f"start {prompt}"

    def step(self, model_turn):
        self.k += 1
        return f"obs {self.k}", len(model_turn) / 100, self.done_after > 0 and self.k >= self.done_after


@register_environment("hostile")
class Hostile(Environment):
    """The prompt names what goes wrong: "sleep", "crash", "raise", "types", "sleep_reset", "crash_reset",
    anything else behaves (reward 1 a turn, never done)."""

    def reset(self, prompt):
        self.mode = prompt.strip()
        if self.mode == "sleep_reset":
            time.sleep(600)
        if self.mode == "crash_reset":
            os._exit(3)
        return f"play {self.mode}"

    def step(self, model_turn):
        if self.mode == "sleep":
            time.sleep(600)
        if self.mode == "crash":
            os._exit(7)
        if self.mode == "raise":
            raise KeyError("missing thing")
        if self.mode == "types":
            return None, "much", "yes"
        return "go on", 1.0, False

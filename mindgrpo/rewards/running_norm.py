"""A running mean and standard deviation (Chan et al.'s parallel update of Welford's sums), to standardise a
reward model's scores before they are weighted (`reward_config.reward_models[].normalize`).

    norm = RunningNorm()
    z = norm(scores)  # (B,): the statistics first take in this batch's finite scores, then standardise it

z = (x - mean) / max(std, eps) with the mean and the population std of every finite score seen so far, this
batch's included; NaN (no score) stays NaN. The statistics are part of a checkpoint (`state()`,
`load_state()`), so a resumed run standardises as the run it continues would have.
"""

from __future__ import annotations

import numpy as np


class RunningNorm:
    def __init__(self, eps: float = 1e-6):
        self.eps = eps
        self.count = 0
        self.mean = 0.0
        self.m2 = 0.0  # sum of squared deviations from the mean

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x, np.float64)
        x = x[np.isfinite(x)]
        if x.size == 0:
            return
        n, mean = x.size, float(x.mean())
        m2 = float(((x - mean) ** 2).sum())
        total = self.count + n
        delta = mean - self.mean
        self.mean += delta * n / total
        self.m2 += m2 + delta * delta * self.count * n / total
        self.count = total

    @property
    def std(self) -> float:
        return float(np.sqrt(self.m2 / self.count)) if self.count else 0.0

    def __call__(self, x: np.ndarray) -> np.ndarray:
        self.update(x)
        x = np.asarray(x, np.float32)
        return ((x - self.mean) / max(self.std, self.eps)).astype(np.float32)

    def state(self) -> dict:
        """The statistics, for a checkpoint's state.json (floats kept exactly: JSON writes repr)."""
        return {"count": self.count, "mean": self.mean, "m2": self.m2}

    def load_state(self, state: dict) -> None:
        self.count, self.mean, self.m2 = int(state["count"]), float(state["mean"]), float(state["m2"])

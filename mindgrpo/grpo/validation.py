"""Validation during training: what it logs, and which validated step is the best so far.

Each validation samples rl_config.val_n completions per held-out prompt (greedy when
val_temperature is 0) and scores them with `accuracy`; a completion is right when it scores 1.
It logs val/accuracy (the mean score), val/pass@k for k = 1, 2, 4, ... val_n (the unbiased
estimator), val/mean@n and val/maj@n (`mindgrpo/eval/metrics.py`). rl_config.save_best names one of
them; `Best` keeps the best value seen after a training step and says when a checkpoint should
replace checkpoints/best.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Sequence

import numpy as np

from mindgrpo.eval.metrics import summarize
from mindgrpo.rewards.answer import answer_key


def val_metrics(accuracy: np.ndarray, texts: Sequence[str], n: int) -> Dict[str, float]:
    """accuracy (P * n,): each completion's `accuracy` score, nan where it was not scored, a prompt's n
    completions adjacent; texts the completions."""
    acc = np.nan_to_num(np.asarray(accuracy, np.float64))
    correct = (acc >= 1.0).reshape(-1, n).astype(np.float64)  # (P, n)
    keys = [answer_key(t) for t in texts]
    out = summarize(correct, [keys[p * n:(p + 1) * n] for p in range(correct.shape[0])], prefix="val/")
    out["val/accuracy"] = float(acc.mean())
    return out


@dataclass
class Best:
    """The best value of `metric` over validations after a training step (higher is better)."""

    metric: str
    value: Optional[float] = None
    step: Optional[int] = None

    def update(self, metrics: Dict[str, float], step: int) -> bool:
        """True when this step's `metric` beats the best so far (it becomes the best)."""
        if step < 1 or self.metric not in metrics:
            return False
        v = float(metrics[self.metric])
        if self.value is not None and not v > self.value:
            return False
        self.value, self.step = v, step
        return True

    def state(self) -> dict:
        return {"metric": self.metric, "value": self.value, "step": self.step}

    def load_state(self, state: dict) -> None:
        """A checkpoint's record; a record of another metric does not count."""
        if state["metric"] == self.metric:
            self.value, self.step = state["value"], state["step"]

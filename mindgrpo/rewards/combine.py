"""Combining reward functions into one scalar per completion.

    rewards = RewardSet(["accuracy", "format"], weights=[1.0, 0.5])
    total, per_function, metrics = rewards(completions, solution=[...], prompt=[...])

total (B,) = sum_i weight_i * r_i, where a None score (the function could not score that completion, or it
raised on it) counts as 0 in the sum. per_function[name] (B,) keeps None as NaN, so the per-function mean in
`metrics` (reward/<name>/mean) is over scored completions only. A function that raises on the batch is called
again per completion to isolate the bad ones; each failure is logged and counted in reward/<name>/errors.
"""

from __future__ import annotations

import logging
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from mindgrpo.rewards.registry import get_reward, required_columns
from mindgrpo.utils.stats import sample_std

logger = logging.getLogger(__name__)


def _score(name: str, fn: Callable, completions: List[str], columns: Mapping[str, Sequence]) -> Tuple[list, int]:
    """Scores of one function and its error count; on a batch failure every completion is retried alone."""
    try:
        scores = list(fn(completions, **columns))
        errors = 0
    except Exception as batch_error:  # noqa: BLE001 - any user reward may fail; isolate instead of crashing
        logger.warning("reward %r failed on the batch (%r); scoring completions one by one", name, batch_error)
        scores, errors = [], 0
        for i, completion in enumerate(completions):
            try:
                (value,) = fn([completion], **{k: [col[i]] for k, col in columns.items()})
            except Exception as error:  # noqa: BLE001
                logger.warning("reward %r failed on completion %d (%r); scored None", name, i, error)
                value, errors = None, errors + 1
            scores.append(value)
    if len(scores) != len(completions):
        raise ValueError(f"reward {name!r} returned {len(scores)} scores for {len(completions)} completions")
    return scores, errors


def compute_rewards(
    reward_fns: Mapping[str, Callable],
    weights: Sequence[float],
    completions: Sequence[str],
    columns: Mapping[str, Sequence],
) -> Tuple[np.ndarray, Dict[str, np.ndarray], Dict[str, float]]:
    """Score `completions` (B,) with every function; returns (total (B,), {name: (B,) with NaN for None}, metrics)."""
    if len(weights) != len(reward_fns):
        raise ValueError(f"{len(weights)} weights for {len(reward_fns)} reward functions")
    completions = list(completions)
    batch = len(completions)
    for key, col in columns.items():
        if len(col) != batch:
            raise ValueError(f"column {key!r} has {len(col)} rows for {batch} completions")
    total = np.zeros(batch, dtype=np.float32)  # (B,)
    per_function: Dict[str, np.ndarray] = {}
    metrics: Dict[str, float] = {}
    for (name, fn), weight in zip(reward_fns.items(), weights):
        scores, errors = _score(name, fn, completions, columns)
        values = np.array([np.nan if s is None else float(s) for s in scores], dtype=np.float32)  # (B,)
        scored = values[~np.isnan(values)]
        total += np.float32(weight) * np.nan_to_num(values, nan=0.0)
        per_function[name] = values
        metrics[f"reward/{name}/mean"] = float(scored.mean()) if scored.size else float("nan")
        metrics[f"reward/{name}/std"] = float(sample_std(scored)) if scored.size else float("nan")
        metrics[f"reward/{name}/none"] = float(batch - scored.size)
        metrics[f"reward/{name}/errors"] = float(errors)
    metrics["reward/total/mean"] = float(total.mean()) if batch else float("nan")
    metrics["reward/total/std"] = float(sample_std(total)) if batch else float("nan")
    return total, per_function, metrics


class RewardSet:
    """Named, weighted reward functions resolved once from the registry.

    names:   registered reward names (no duplicates)
    weights: one per name, default all 1.0
    params:  {name: {parameter: value}} bound through `get_reward`
    """

    def __init__(
        self,
        names: Sequence[str],
        weights: Optional[Sequence[float]] = None,
        params: Optional[Mapping[str, Mapping[str, object]]] = None,
    ):
        names = list(names)
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate reward names in {names}")
        params = dict(params or {})
        stray = sorted(set(params) - set(names))
        if stray:
            raise ValueError(f"parameters given for rewards that are not used: {stray}")
        self.weights = [1.0] * len(names) if weights is None else [float(w) for w in weights]
        if len(self.weights) != len(names):
            raise ValueError(f"{len(self.weights)} weights for {len(names)} reward functions {names}")
        self.fns: Dict[str, Callable] = {n: get_reward(n, **params.get(n, {})) for n in names}
        self.required_columns = sorted({c for fn in self.fns.values() for c in required_columns(fn)})

    @property
    def names(self) -> List[str]:
        return list(self.fns)

    def __call__(self, completions: Sequence[str], **columns):
        """(total (B,), {name: (B,)}, metrics) for `completions` (B,); see compute_rewards."""
        missing = [c for c in self.required_columns if c not in columns]
        if missing:
            raise KeyError(f"reward columns {missing} are missing; got {sorted(columns)}")
        return compute_rewards(self.fns, self.weights, completions, columns)

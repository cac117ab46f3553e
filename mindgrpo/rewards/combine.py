"""Combining reward functions into one scalar per completion.

    rewards = RewardSet(["accuracy", "format"], weights=[1.0, 0.5], num_workers=2, timeout_s=10.0)
    total, per_function, metrics = rewards(completions, solution=[...], prompt=[...])
    rewards.close()  # stops the worker pool (also done at exit)

total (B,) = sum_i weight_i * r_i, where a None score (the function could not score that completion, raised on
it, returned NaN for it or timed out on it) counts as 0 in the sum. per_function[name] (B,) keeps None as NaN,
so the per-function mean in `metrics` (reward/<name>/mean) is over scored completions only.

Scoring: every function is called once on the whole batch. When that call raises, times out or loses its
worker, the function is called on each completion alone (each call with the timeout), so one pathological
completion costs only its own score; those completions are counted in reward/<name>/errors or
reward/<name>/timeouts and logged once per function. With num_workers > 0 the calls run in a worker pool with
a per-call timeout (mindgrpo/rewards/pool.py); with num_workers = 0 they run in this process, without one.
A function that breaks its contract (a wrong number of scores, a score that is not a number: see scoring.py)
raises RewardError, which stops the run.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from mindgrpo.rewards.registry import get_reward, required_columns
from mindgrpo.rewards.scoring import Call, Outcome, RewardError, call_reward
from mindgrpo.utils.stats import sample_std

logger = logging.getLogger(__name__)

Runner = Callable[[List[Call]], List[Outcome]]  # calls -> one outcome per call


@dataclass
class Scores:
    """Every function's scores of a batch of B completions."""

    values: Dict[str, np.ndarray]  # name -> (B,) float32, NaN where the function gave no score
    errors: Dict[str, int]  # name -> completions scored None because the function raised or returned NaN / inf
    timeouts: Dict[str, int]  # name -> completions scored None because the call timed out


def in_process(fns: Mapping[str, Callable], completions: Sequence[str], columns: Mapping[str, Sequence]) -> Runner:
    """A Runner calling the functions here, one call after the other (no timeout)."""

    def run(calls: List[Call]) -> List[Outcome]:
        return [call_reward(c.name, fns[c.name], [completions[i] for i in c.rows],
                            {k: [v[i] for i in c.rows] for k, v in columns.items()}) for c in calls]

    return run


def _what(outcome: Outcome) -> str:
    return "timed out" if outcome.kind == "timeout" else f"raised ({outcome.message})"


def score_batch(run: Runner, names: Sequence[str], batch: int) -> Scores:
    """Scores of `batch` completions by every function: the whole batch first, then one completion at a
    time for the functions whose batch call failed."""
    values = {n: np.full(batch, np.nan, np.float32) for n in names}  # (B,) each
    errors, timeouts = dict.fromkeys(names, 0), dict.fromkeys(names, 0)
    if batch == 0:
        return Scores(values, errors, timeouts)
    nonfinite: Dict[str, List[str]] = defaultdict(list)

    def record(call: Call, outcome: Outcome) -> bool:
        if outcome.kind == "fatal":
            raise RewardError(outcome.message)
        if outcome.kind != "ok":
            return False
        values[call.name][list(call.rows)] = [np.nan if s is None else s for s in outcome.scores]
        for j, shown in outcome.nonfinite:
            errors[call.name] += 1
            nonfinite[call.name].append(f"{shown} for completion {call.rows[j]}")
        return True

    failed: Dict[str, List[Tuple[int, Outcome]]] = defaultdict(list)

    def fail(call: Call, outcome: Outcome) -> None:  # a call on one completion: it scores None
        counts = timeouts if outcome.kind == "timeout" else errors
        counts[call.name] += 1
        failed[call.name].append((call.rows[0], outcome))

    calls = [Call(n, tuple(range(batch))) for n in names]
    retry = []
    for call, outcome in zip(calls, run(calls)):
        if record(call, outcome):
            continue
        if batch == 1:
            fail(call, outcome)
            continue
        logger.warning("reward %r %s on the batch of %d completions; scoring them one at a time",
                       call.name, _what(outcome), batch)
        retry += [Call(call.name, (i,)) for i in range(batch)]
    for call, outcome in zip(retry, run(retry)):
        if not record(call, outcome):
            fail(call, outcome)
    for name, fails in failed.items():
        row, outcome = fails[0]
        logger.warning("reward %r failed on %d of %d completions, scored None (completion %d %s)",
                       name, len(fails), batch, row, _what(outcome))
    for name, shown in nonfinite.items():
        logger.warning("reward %r returned %s; scored None (non-finite scores count as errors)",
                       name, ", ".join(shown[:5]) + (", ..." if len(shown) > 5 else ""))
    return Scores(values, errors, timeouts)


def add_model_scores(total: np.ndarray, per_function: Dict[str, np.ndarray], metrics: Dict[str, float],
                     model_scores: Mapping[str, np.ndarray], weights: Sequence[float]):
    """The reward functions' (total (B,), {name: (B,)}, metrics) of `combine` with reward models' scores
    {name: (B,), NaN where none} added as further weighted terms, as `combine` adds a function's (a None
    counting 0); their metrics reward/<name>/mean, std and none, and reward/total/* again."""
    if len(weights) != len(model_scores):
        raise ValueError(f"{len(weights)} weights for {len(model_scores)} reward models")
    clash = sorted(set(per_function) & set(model_scores))
    if clash:
        raise ValueError(f"reward model names {clash} are also reward functions")
    total, per_function, metrics = np.array(total, np.float32), dict(per_function), dict(metrics)
    for (name, values), weight in zip(model_scores.items(), weights):
        values = np.asarray(values, np.float32)  # (B,)
        scored = values[~np.isnan(values)]
        total += np.float32(weight) * np.nan_to_num(values, nan=0.0)
        per_function[name] = values
        metrics[f"reward/{name}/mean"] = float(scored.mean()) if scored.size else float("nan")
        metrics[f"reward/{name}/std"] = float(sample_std(scored)) if scored.size else float("nan")
        metrics[f"reward/{name}/none"] = float(values.size - scored.size)
    metrics["reward/total/mean"] = float(total.mean()) if total.size else float("nan")
    metrics["reward/total/std"] = float(sample_std(total)) if total.size else float("nan")
    return total, per_function, metrics


def combine(scores: Scores, weights: Sequence[float]) -> Tuple[np.ndarray, Dict[str, np.ndarray], Dict[str, float]]:
    """(total (B,), {name: (B,) with NaN for None}, metrics) of every function's scores, weighted."""
    names = list(scores.values)
    if len(weights) != len(names):
        raise ValueError(f"{len(weights)} weights for {len(names)} reward functions")
    batch = len(next(iter(scores.values.values()))) if names else 0
    total = np.zeros(batch, dtype=np.float32)  # (B,)
    metrics: Dict[str, float] = {}
    for name, weight in zip(names, weights):
        values = scores.values[name]  # (B,)
        scored = values[~np.isnan(values)]
        total += np.float32(weight) * np.nan_to_num(values, nan=0.0)
        metrics[f"reward/{name}/mean"] = float(scored.mean()) if scored.size else float("nan")
        metrics[f"reward/{name}/std"] = float(sample_std(scored)) if scored.size else float("nan")
        metrics[f"reward/{name}/none"] = float(batch - scored.size)
        metrics[f"reward/{name}/errors"] = float(scores.errors[name])
        metrics[f"reward/{name}/timeouts"] = float(scores.timeouts[name])
    metrics["reward/total/mean"] = float(total.mean()) if batch else float("nan")
    metrics["reward/total/std"] = float(sample_std(total)) if batch else float("nan")
    return total, dict(scores.values), metrics


def _check_lengths(completions: Sequence[str], columns: Mapping[str, Sequence]) -> None:
    for key, col in columns.items():
        if len(col) != len(completions):
            raise ValueError(f"column {key!r} has {len(col)} rows for {len(completions)} completions")


def compute_rewards(
    reward_fns: Mapping[str, Callable],
    weights: Sequence[float],
    completions: Sequence[str],
    columns: Mapping[str, Sequence],
) -> Tuple[np.ndarray, Dict[str, np.ndarray], Dict[str, float]]:
    """Score `completions` (B,) with every function in this process; returns (total (B,), {name: (B,) with NaN
    for None}, metrics)."""
    if len(weights) != len(reward_fns):
        raise ValueError(f"{len(weights)} weights for {len(reward_fns)} reward functions")
    completions = list(completions)
    _check_lengths(completions, columns)
    scores = score_batch(in_process(reward_fns, completions, columns), list(reward_fns), len(completions))
    return combine(scores, weights)


class RewardSet:
    """Named, weighted reward functions resolved once from the registry.

    names:       registered reward names (no duplicates)
    weights:     one per name, default all 1.0
    params:      {name: {parameter: value}} bound through `get_reward`
    num_workers: worker processes scoring with a per-call timeout of timeout_s seconds (started at the first
                 call, stopped by close() or at exit); 0 scores in this process, without a timeout
    """

    def __init__(
        self,
        names: Sequence[str],
        weights: Optional[Sequence[float]] = None,
        params: Optional[Mapping[str, Mapping[str, object]]] = None,
        *,
        num_workers: int = 0,
        timeout_s: float = 10.0,
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
        self.params = {n: dict(params.get(n, {})) for n in names}
        self.fns: Dict[str, Callable] = {n: get_reward(n, **self.params[n]) for n in names}
        self.required_columns = sorted({c for fn in self.fns.values() for c in required_columns(fn)})
        self.pool = None
        if num_workers > 0:
            from mindgrpo.rewards.pool import RewardPool

            self.pool = RewardPool(self.params, num_workers, timeout_s)

    @property
    def names(self) -> List[str]:
        return list(self.fns)

    def check_columns(self, available: Iterable[str], where: str) -> None:
        """RewardError naming the first function that needs a column `where` does not provide."""
        available = sorted(set(available))
        for name, fn in self.fns.items():
            missing = [c for c in required_columns(fn) if c not in available]
            if missing:
                raise RewardError(f"reward {name!r} needs the column(s) {missing}, which {where} do not have "
                                  f"(columns: {', '.join(available)})")

    def score(self, completions: Sequence[str], **columns) -> Scores:
        """Every function's scores of `completions` (B,); see score_batch."""
        missing = [c for c in self.required_columns if c not in columns]
        if missing:
            raise KeyError(f"reward columns {missing} are missing; got {sorted(columns)}")
        completions = list(completions)
        _check_lengths(completions, columns)
        if self.pool is None:
            run = in_process(self.fns, completions, columns)
        else:
            def run(calls):
                return self.pool.run(calls, completions, columns)
        return score_batch(run, self.names, len(completions))

    def combine(self, scores: Scores):
        """(total (B,), {name: (B,)}, metrics) of `score`'s result; see combine."""
        return combine(scores, self.weights)

    def __call__(self, completions: Sequence[str], **columns):
        """(total (B,), {name: (B,)}, metrics) for `completions` (B,)."""
        return self.combine(self.score(completions, **columns))

    def start(self) -> None:
        """Start the worker pool, if any, now rather than at the first call (it starts in the background)."""
        if self.pool is not None:
            self.pool.start()

    def close(self) -> None:
        """Stop the worker pool, if any (a closed set starts a new pool at its next call)."""
        if self.pool is not None:
            self.pool.close()

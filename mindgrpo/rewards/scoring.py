"""One call of a reward function and the contract of what it returns.

    outcome = call_reward("accuracy", fn, completions, {"solution": [...]})
    outcome.kind   # "ok" | "raised" | "fatal" | "timeout"

A reward function returns one score per completion: a number, or None ("cannot score this one"). What else
can come back, and what it means:

    an exception                        "raised": the completions of the call score None (after a retry one
                                        at a time, see combine.py), counted in reward/<name>/errors
    NaN or +-inf for a completion       that completion scores None, counted in reward/<name>/errors
    a timeout (worker pool only)        the completions of the call score None, reward/<name>/timeouts
    not a list, tuple or 1-D array      "fatal": a programming error, RewardError stops the run
    a wrong number of scores            "fatal"
    a score that is not a number        "fatal" (a string such as "1", a bool, a list, ...)

Everything here runs both in the trainer's process and in the pool's workers (mindgrpo/rewards/pool.py).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Callable, List, Mapping, Optional, Sequence, Tuple

Score = Optional[float]


class RewardError(ValueError):
    """A reward function broke its contract (or cannot run at all): a programming error that stops the run.
    The message is one line naming the function and what it returned."""


@dataclass(frozen=True)
class Call:
    """Reward `name` on the completions at `rows` (indices into the batch)."""

    name: str
    rows: Tuple[int, ...]


@dataclass(frozen=True)
class Outcome:
    """What one call of a reward function on some completions came to."""

    kind: str  # "ok" | "raised" | "fatal" | "timeout"
    scores: Tuple[Score, ...] = ()  # "ok": one per completion of the call
    nonfinite: Tuple[Tuple[int, str], ...] = ()  # "ok": (index in the call, repr) of NaN / inf, scored None
    message: str = ""  # "raised" / "fatal": what went wrong


def _shown(value, limit: int = 60) -> str:
    """repr(value) on one line, cut at `limit` characters."""
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def check_scores(name: str, returned, n: int) -> Tuple[List[Score], List[Tuple[int, str]]]:
    """(scores, non-finite entries) of what reward `name` returned for n completions; RewardError when it is
    not one number-or-None per completion. NaN / inf entries come back as None and are listed."""
    if not (isinstance(returned, (list, tuple)) or _is_vector(returned)):
        raise RewardError(f"reward {name!r} returned {type(returned).__name__} {_shown(returned)}, "
                          f"not a list of {n} scores")
    values = list(returned)
    if len(values) != n:
        raise RewardError(f"reward {name!r} returned {len(values)} scores for {n} completions")
    scores: List[Score] = []
    nonfinite: List[Tuple[int, str]] = []
    for i, value in enumerate(values):
        if value is None:
            scores.append(None)
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real):  # NumPy's bool_ is not Real
            raise RewardError(f"reward {name!r} returned {type(value).__name__} {_shown(value)} for completion {i}: "
                              "a score must be a number (int or float) or None")
        score = float(value)
        if math.isfinite(score):
            scores.append(score)
        else:
            scores.append(None)
            nonfinite.append((i, repr(score)))
    return scores, nonfinite


def _is_vector(value) -> bool:
    """A one-dimensional array (NumPy, or anything with a 1-D shape and a length)."""
    shape = getattr(value, "shape", None)
    return isinstance(shape, tuple) and len(shape) == 1 and hasattr(value, "__len__")


def call_reward(name: str, fn: Callable, completions: Sequence[str], columns: Mapping[str, Sequence]) -> Outcome:
    """Call reward `name` on completions (B,) with its columns (each (B,)) and check what it returned."""
    try:
        returned = fn(list(completions), **columns)
    except Exception as error:  # noqa: BLE001 - any user reward may fail: the caller isolates the bad completions
        return Outcome("raised", message=f"{type(error).__name__}: {error}")
    try:
        scores, nonfinite = check_scores(name, returned, len(completions))
    except RewardError as error:
        return Outcome("fatal", message=str(error))
    return Outcome("ok", tuple(scores), tuple(nonfinite))

"""Built-in reward functions: accuracy, format, format_lenient, cosine, repetition, soft_overlong, environment.

Lengths (cosine, soft_overlong) are token counts from the `completion_length` column when the caller passes it
(the trainer does: it has the response mask); without it they fall back to whitespace-separated word counts.
"""

from __future__ import annotations

import math
import re
from typing import List, Optional, Sequence

from mindgrpo.rewards.answer import is_correct
from mindgrpo.rewards.registry import register_reward

_TAG = r"</?(?:think|answer)>"
_FREE = rf"(?:(?!{_TAG}).)*"  # text containing no think/answer tag
_FORMAT_STRICT = re.compile(rf"\s*<think>{_FREE}</think>\s*<answer>{_FREE}</answer>\s*", re.DOTALL)
_FORMAT_LENIENT = re.compile(r"<think>.*?</think>.*?<answer>.*?</answer>", re.DOTALL)


def _solution_missing(solution) -> bool:
    return solution is None or str(solution).strip() == ""


def _lengths(completions: Sequence[str], completion_length: Optional[Sequence[int]]) -> List[int]:
    if completion_length is not None:
        return [int(n) for n in completion_length]
    return [len(c.split()) for c in completions]


@register_reward("accuracy")
def accuracy_reward(completions, solution, *, accuracy_rel_tol: float = 1e-4, **kwargs) -> List[Optional[float]]:
    """1.0 when the completion's final answer equals `solution` (see rewards/answer.py), else 0.0;
    None when the row has no reference answer."""
    return [
        None if _solution_missing(sol) else float(is_correct(c, sol, accuracy_rel_tol))
        for c, sol in zip(completions, solution)
    ]


@register_reward("environment")
def environment_reward(completions, env_reward, **kwargs) -> List[float]:
    """The environment's reward of each conversation (generate_config.environment): the sum of the rewards its
    steps gave, the `env_reward` column (0 for a conversation whose environment failed)."""
    return [float(r) for r in env_reward]


@register_reward("format")
def format_reward(completions, **kwargs) -> List[float]:
    """1.0 when the whole completion is `<think>...</think>` then `<answer>...</answer>`, each tag exactly
    once (surrounding whitespace allowed), else 0.0."""
    return [1.0 if _FORMAT_STRICT.fullmatch(c) else 0.0 for c in completions]


@register_reward("format_lenient")
def format_lenient_reward(completions, **kwargs) -> List[float]:
    """1.0 when `<think>...</think>` and later `<answer>...</answer>` appear anywhere, in that order."""
    return [1.0 if _FORMAT_LENIENT.search(c) else 0.0 for c in completions]


def cosine_interpolate(length: int, max_len: int, value_at_zero: float, value_at_max: float) -> float:
    """value_at_zero at length 0 easing to value_at_max at max_len along half a cosine; flat beyond max_len."""
    t = min(length, max_len) / max_len
    return value_at_max + 0.5 * (value_at_zero - value_at_max) * (1.0 + math.cos(math.pi * t))


def _check_cosine(*, cosine_max_len: int, **_) -> None:
    if cosine_max_len <= 0:
        raise ValueError(f"cosine_max_len must be positive, got {cosine_max_len}")


@register_reward("cosine", check=_check_cosine)
def cosine_reward(
    completions,
    solution,
    completion_length=None,
    *,
    cosine_max_len: int,
    cosine_min_len_value_wrong: float = -0.5,
    cosine_max_len_value_wrong: float = 0.0,
    cosine_min_len_value_correct: float = 1.0,
    cosine_max_len_value_correct: float = 0.5,
    accuracy_rel_tol: float = 1e-4,
    **kwargs,
) -> List[Optional[float]]:
    """Length-aware correctness (Yeo et al. 2025, "Demystifying Long Chain-of-Thought Reasoning in LLMs"):
    correct answers earn more when short (1.0 -> 0.5), wrong ones are punished less when long (-0.5 -> 0.0).
    `cosine_max_len` is the max completion length; longer completions score as if exactly that long."""
    _check_cosine(cosine_max_len=cosine_max_len)
    scores: List[Optional[float]] = []
    for c, sol, n in zip(completions, solution, _lengths(completions, completion_length)):
        if _solution_missing(sol):
            scores.append(None)
        elif is_correct(c, sol, accuracy_rel_tol):
            ends = (cosine_min_len_value_correct, cosine_max_len_value_correct)
            scores.append(cosine_interpolate(n, cosine_max_len, *ends))
        else:
            ends = (cosine_min_len_value_wrong, cosine_max_len_value_wrong)
            scores.append(cosine_interpolate(n, cosine_max_len, *ends))
    return scores


def _check_repetition(*, repetition_n_grams: int, repetition_max_penalty: float, **_) -> None:
    if repetition_n_grams < 1:
        raise ValueError(f"repetition_n_grams must be >= 1, got {repetition_n_grams}")
    if repetition_max_penalty > 0:
        raise ValueError(f"repetition_max_penalty must be <= 0, got {repetition_max_penalty}")


@register_reward("repetition", check=_check_repetition)
def repetition_reward(
    completions, *, repetition_n_grams: int = 3, repetition_max_penalty: float = -1.0, **kwargs
) -> List[float]:
    """max_penalty * (1 - distinct n-grams / n-grams) over lower-cased whitespace words; 0.0 for completions
    shorter than one n-gram."""
    _check_repetition(repetition_n_grams=repetition_n_grams, repetition_max_penalty=repetition_max_penalty)
    n = repetition_n_grams
    scores = []
    for c in completions:
        words = c.lower().split()
        if len(words) < n:
            scores.append(0.0)
            continue
        grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
        scores.append((1.0 - len(set(grams)) / len(grams)) * repetition_max_penalty)
    return scores


def _check_soft_overlong(*, max_completion_length: int, soft_max_cache_length: int, **_) -> None:
    if not 0 < soft_max_cache_length <= max_completion_length:
        raise ValueError(
            "need 0 < soft_max_cache_length <= max_completion_length, "
            f"got {soft_max_cache_length} and {max_completion_length}"
        )


@register_reward("soft_overlong", check=_check_soft_overlong)
def soft_overlong_reward(
    completions, completion_length=None, *, max_completion_length: int, soft_max_cache_length: int, **kwargs
) -> List[float]:
    """DAPO's soft overlong punishment (L_max = max_completion_length, L_cache = soft_max_cache_length): 0 up to
    L_max - L_cache, then linear down to -1 at L_max, -1 beyond it."""
    _check_soft_overlong(max_completion_length=max_completion_length, soft_max_cache_length=soft_max_cache_length)
    free = max_completion_length - soft_max_cache_length
    scores = []
    for n in _lengths(completions, completion_length):
        if n <= free:
            scores.append(0.0)
        elif n <= max_completion_length:
            scores.append((free - n) / soft_max_cache_length)
        else:
            scores.append(-1.0)
    return scores

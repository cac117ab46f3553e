"""pass@k, mean@k and maj@k of K scored samples per problem: pure functions of numpy arrays.

Shapes: P problems, K samples each. `correct` (P, K) holds 1 where a sample is right, 0 where it is
not (a reward that could not score a sample counts it wrong).

    pass@k  the chance that at least one of k samples drawn without replacement from the K is right,
            averaged over problems: the unbiased estimator 1 - C(K - c, k) / C(K, k) of Chen et al.
            (2021), c the right samples of a problem, for k <= K. It is exact for the K samples taken,
            not an estimate from k of them, so it does not depend on their order.
    mean@k  the mean of the K samples' correctness (with K = 1 and greedy decoding: accuracy).
    maj@k   the correctness of the answer most samples give (majority vote over the K samples' final
            answers; a sample without an answer does not vote, a tie goes to the answer given first),
            0 when no sample gives one.
"""

from __future__ import annotations

from typing import Dict, Hashable, List, Optional, Sequence

import numpy as np


def ks_up_to(K: int) -> List[int]:
    """The k of pass@k reported for K samples: 1, 2, 4, ... (powers of two below K), then K."""
    if K < 1:
        raise ValueError(f"K must be >= 1, got {K}")
    ks, k = [], 1
    while k < K:
        ks.append(k)
        k *= 2
    return ks + [K]


def pass_at_k(num_samples: np.ndarray, num_correct: np.ndarray, k: int) -> np.ndarray:
    """(P,) unbiased pass@k per problem from its sample count n (P,) and right samples c (P,).

    1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n - c + 1}^{n} (1 - k / i), a product of c factors in
    [0, 1] (no large binomials); 1 when n - c < k (every draw of k holds a right sample)."""
    n = np.asarray(num_samples, np.int64)
    c = np.asarray(num_correct, np.int64)
    if n.shape != c.shape:
        raise ValueError(f"num_samples {n.shape} and num_correct {c.shape} differ in shape")
    if (c < 0).any() or (c > n).any():
        raise ValueError("num_correct must be in [0, num_samples]")
    if k < 1 or (n < k).any():
        raise ValueError(f"k must be in [1, num_samples], got k={k} with num_samples min {int(n.min())}")
    out = np.ones(n.shape, np.float64)
    for idx in np.ndindex(n.shape):
        ni, ci = int(n[idx]), int(c[idx])
        if ni - ci >= k:
            out[idx] = 1.0 - np.prod(1.0 - k / np.arange(ni - ci + 1, ni + 1, dtype=np.float64))
    return out


def mean_at_k(correct: np.ndarray) -> np.ndarray:
    """(P,) the mean correctness of each problem's K samples; correct (P, K)."""
    return np.asarray(correct, np.float64).mean(axis=-1)


def majority_answer(answers: Sequence[Optional[Hashable]]) -> Optional[int]:
    """The index of the first sample that gives the most frequent answer (None answers do not vote;
    a tie goes to the answer given first); None when no sample gives an answer."""
    counts: Dict[Hashable, int] = {}
    first: Dict[Hashable, int] = {}
    for j, a in enumerate(answers):
        if a is None:
            continue
        counts[a] = counts.get(a, 0) + 1
        first.setdefault(a, j)
    if not counts:
        return None
    top = max(counts.values())
    return min(first[a] for a, m in counts.items() if m == top)


def maj_at_k(answers: Sequence[Sequence[Optional[Hashable]]], correct: np.ndarray) -> np.ndarray:
    """(P,) maj@K: the correctness of each problem's majority answer; answers P lists of K answer keys
    (None: no answer), correct (P, K). Samples with the same key are equally right, so the
    majority's first sample stands for it."""
    correct = np.asarray(correct, np.float64)
    if correct.shape[0] != len(answers) or any(len(a) != correct.shape[1] for a in answers):
        raise ValueError(f"answers must be {correct.shape[0]} lists of {correct.shape[1]}, like correct")
    out = np.zeros(len(answers), np.float64)
    for p, row in enumerate(answers):
        j = majority_answer(row)
        if j is not None:
            out[p] = correct[p, j]
    return out


def summarize(correct: np.ndarray, answers: Optional[Sequence[Sequence[Optional[Hashable]]]] = None,
              prefix: str = "") -> Dict[str, float]:
    """The means over problems: `{prefix}pass@k` for k in ks_up_to(K), `{prefix}mean@K` and, given the
    answers, `{prefix}maj@K`; correct (P, K)."""
    correct = np.asarray(correct, np.float64)
    if correct.ndim != 2 or correct.size == 0:
        raise ValueError(f"correct must be (P, K) with P, K >= 1, got shape {correct.shape}")
    P, K = correct.shape
    n = np.full(P, K)
    c = (correct > 0).sum(axis=1)
    out = {f"{prefix}pass@{k}": float(pass_at_k(n, c, k).mean()) for k in ks_up_to(K)}
    out[f"{prefix}mean@{K}"] = float(mean_at_k(correct).mean())
    if answers is not None:
        out[f"{prefix}maj@{K}"] = float(maj_at_k(answers, correct).mean())
    return out

"""pass@k, mean@k, maj@k (mindgrpo/eval/metrics.py) against hand-computed cases and a brute-force
enumeration of every draw of k samples."""

import itertools
from math import comb

import numpy as np
import pytest

from mindgrpo.eval.metrics import ks_up_to, maj_at_k, majority_answer, mean_at_k, pass_at_k, summarize


def test_pass_at_k_hand_cases():
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10; n=4, c=1, k=1: 1/4; n=4, c=3, k=2: no draw of 2 misses
    n = np.array([5, 4, 4, 4])
    c = np.array([2, 1, 3, 0])
    np.testing.assert_allclose(pass_at_k(n, c, 1), [0.4, 0.25, 0.75, 0.0])
    np.testing.assert_allclose(pass_at_k(n[:1], c[:1], 2), [0.7])
    np.testing.assert_allclose(pass_at_k(n[2:3], c[2:3], 2), [1.0])
    np.testing.assert_allclose(pass_at_k(np.array([10]), np.array([3]), 4), [1 - comb(7, 4) / comb(10, 4)])


def brute_force_pass_at_k(correct_row, k):
    """The fraction of the C(n, k) draws of k samples that hold a right one."""
    draws = list(itertools.combinations(range(len(correct_row)), k))
    return sum(any(correct_row[j] for j in d) for d in draws) / len(draws)


def test_pass_at_k_equals_the_enumeration_of_every_draw():
    rng = np.random.default_rng(0)
    for n in range(1, 11):
        for _ in range(3):
            row = rng.random(n) < rng.random()
            for k in range(1, n + 1):
                got = pass_at_k(np.array([n]), np.array([row.sum()]), k)[0]
                assert got == pytest.approx(brute_force_pass_at_k(row, k), abs=1e-12), (n, k, row)


def test_pass_at_k_refuses_k_above_the_samples_and_counts_out_of_range():
    with pytest.raises(ValueError, match="k must be in"):
        pass_at_k(np.array([3]), np.array([1]), 4)
    with pytest.raises(ValueError, match="num_correct"):
        pass_at_k(np.array([3]), np.array([4]), 1)


def test_ks_up_to():
    assert ks_up_to(1) == [1]
    assert ks_up_to(8) == [1, 2, 4, 8]
    assert ks_up_to(6) == [1, 2, 4, 6]


def test_maj_at_k_hand_case():
    answers = [["3", "5", "3", None],  # "3" twice: right
               [None, None, None, None],  # no answer: 0
               ["7", "8", "8", "7"],  # a tie: "7" came first, and it is right
               ["1", "2", "2", "4"]]  # "2" twice, wrong although one sample is right
    correct = np.array([[1, 0, 1, 0], [0, 0, 0, 0], [1, 0, 0, 1], [1, 0, 0, 0]])
    np.testing.assert_array_equal(maj_at_k(answers, correct), [1, 0, 1, 0])
    assert majority_answer(["a", None, "b", "b"]) == 2
    assert majority_answer([None]) is None


def test_summarize_hand_case():
    correct = np.array([[1, 0, 0, 0], [1, 1, 0, 1], [0, 0, 0, 0]])
    answers = [["4", "5", "6", "5"], ["9", "9", "1", "9"], [None, "2", None, None]]
    s = summarize(correct, answers, prefix="val/")
    # pass@1 = mean of c/n = (1/4 + 3/4 + 0) / 3; pass@2 = (1 - C(3,2)/C(4,2) + 1 + 0) / 3 = (0.5 + 1) / 3
    assert s == pytest.approx({"val/pass@1": 1 / 3, "val/pass@2": 0.5, "val/pass@4": 2 / 3,
                               "val/mean@4": 1 / 3, "val/maj@4": 1 / 3})
    np.testing.assert_allclose(mean_at_k(correct), [0.25, 0.75, 0.0])

"""SharedRewards: rank 0 scores, every rank gets rank 0's scores (two ranks as threads, the host sum by hand)."""

import threading

import numpy as np
import pytest

from mindgrpo.parallel.shared_rewards import SharedRewards
from mindgrpo.rewards import RewardSet, compute_rewards, register_reward

CALLS = []  # (thread name, number of completions) of every call of the reward below


@register_reward("test_shared_flaky")
def flaky(completions, solution, **kwargs):
    """1 when the completion equals the solution; raises on "?" (scored None, an error); NaN for "nan"."""
    CALLS.append((threading.current_thread().name, len(completions)))
    if any(c == "?" for c in completions):
        raise ValueError("cannot parse '?'")
    return [float("nan") if c == "nan" else float(c == s) for c, s in zip(completions, solution)]


class TwoRanks:
    """The part of mindgrpo.parallel.comm.Comm that SharedRewards uses, for a world of two threads."""

    def __init__(self):
        self.barrier = threading.Barrier(2)
        self.sent = {}

    def comm(self, rank):
        world = self

        class Comm:
            def __init__(self):
                self.rank, self.world = rank, 2

            def group(self, ranks):
                return tuple(ranks)

            def host_sum(self, values, group):
                assert group == (0, 1)
                world.sent[rank] = np.asarray(values, np.float32)
                world.barrier.wait()
                total = world.sent[0] + world.sent[1]
                world.barrier.wait()
                return total.astype(values.dtype)

        return Comm()


def test_rank_zero_scores_and_both_ranks_get_the_same_result():
    completions = ["1", "2", "?", "nan", "5"]
    columns = {"solution": ["1", "0", "3", "4", "5"], "prompt": ["p"] * 5}
    expected = compute_rewards(RewardSet(["test_shared_flaky", "format"]).fns, [1.0, 0.5], completions, columns)
    world, results = TwoRanks(), {}

    def rank(r):
        rewards = SharedRewards(RewardSet(["test_shared_flaky", "format"], [1.0, 0.5]), world.comm(r))
        results[r] = rewards(completions, **columns)

    CALLS.clear()
    threads = [threading.Thread(target=rank, args=(r,), name=f"rank{r}") for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert {name for name, _ in CALLS} == {"rank0"}  # rank 1 never scores
    assert CALLS == [("rank0", 5)] + [("rank0", 1)] * 5  # the batch raised: one completion at a time
    for r in (0, 1):
        total, per_function, metrics = results[r]
        np.testing.assert_array_equal(total, expected[0])
        np.testing.assert_array_equal(per_function["test_shared_flaky"], [1.0, 0.0, np.nan, np.nan, 1.0])
        assert sorted(per_function) == sorted(expected[1])
        for name in per_function:
            np.testing.assert_array_equal(per_function[name], expected[1][name])
        assert metrics == pytest.approx(expected[2], nan_ok=True)
        assert metrics["reward/test_shared_flaky/errors"] == 2  # the raise and the NaN

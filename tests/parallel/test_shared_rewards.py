"""SharedRewards: rank 0 scores, every rank gets rank 0's scores (two ranks as threads, the host sum by hand);
SharedModelRewards: a separate placement's training rank 0 scores with the reward models for the training group."""

import threading
from types import SimpleNamespace

import numpy as np
import pytest

from mindgrpo.grpo.reward_models import ModelReward, ModelRewards
from mindgrpo.parallel.shared_rewards import SharedModelRewards, SharedRewards
from mindgrpo.rewards import RewardSet, compute_rewards, register_reward
from test_separate_value import ThreadWorld  # this folder, on the path as msrun_util is

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


class LengthScorer:
    """A reward model's scorer (models/reward_model.RewardScorer's call) that scores a sequence by its length, recording
    which thread scored."""

    def __init__(self):
        self.rm, self.calls, self.released = SimpleNamespace(get_parameters=lambda: []), [], 0

    def release(self):
        self.released += 1

    def __call__(self, seqs):
        self.calls.append((threading.current_thread().name, len(seqs)))
        return np.asarray([0.5 * len(s) for s in seqs], np.float32)


class AnsweringModels(ModelRewards):
    """ModelRewards whose call also leaves a judge's answers (grpo/judges.Judge.last_answers), one per completion."""

    def __call__(self, prompt_ids, completion_ids, columns=None):
        out = super().__call__(prompt_ids, completion_ids, columns)
        self.last_answers = {"critic": [f"{len(c)} of 10" for c in completion_ids]}
        return out


def length_models():
    """A normalising reward model scoring completions by their length (an empty one: no score), and a judge's answers."""
    scorer = LengthScorer()
    return AnsweringModels([ModelReward("len", 0.5, "completion", scorer, normalize=True)]), scorer


def test_the_training_groups_rank_zero_scores_with_the_reward_models_for_every_training_rank():
    """A separate placement's training group of two (ranks 0, 1) beside a rollout rank (2, not in the group): rank 0
    alone holds the models and scores the whole batch twice (the running normaliser sees every sample once, as in one
    process), and both get what one process's reward models give, NaN (no score) and metrics included."""
    prompts = [[1, 2], [3], [4, 5, 6]]
    steps = [[[7, 8, 9], [], [1]], [[2, 3], [4, 5, 6, 7], [8]]]
    alone, _ = length_models()  # one process: the same models scoring the same steps
    expected = [alone(prompts, completions) for completions in steps]
    assert np.isnan(expected[0][0]["len"][1]) and expected[1][1]["reward/len/running_std"] > 0
    world, got = ThreadWorld(size=3, trainers=2), {}

    def rank(r):
        models, scorer = length_models() if r == 0 else (None, LengthScorer())
        shared = SharedModelRewards(models, world.rank(r), world.rank(r).train_dp, ("len",), (0.5,))
        assert shared.names == ["len"] and shared.weights == [0.5]
        scored = [(*shared(prompts, completions), shared.last_answers) for completions in steps]
        shared.release()  # rl_config.release_graphs after the phase: the scorer's graphs, where it holds them
        got[r] = (scored, scorer.calls, shared.state(), scorer.released)

    threads = [threading.Thread(target=rank, args=(r,), name=f"rank{r}") for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(got) == [0, 1]
    assert got[0][1] == [("rank0", 2), ("rank0", 3)] and got[1][1] == []  # rank 1 never scores
    assert got[0][3] == 1 and got[1][3] == 0  # rank 0 drops its scoring graphs; rank 1 holds none
    for r in (0, 1):
        for (scores, metrics, answers), (want_scores, want_metrics), completions in zip(got[r][0], expected, steps):
            np.testing.assert_array_equal(scores["len"], want_scores["len"])
            assert metrics == want_metrics
            # the judges' answers (logged with the completions) are rank 0's, on every rank
            assert answers == {"critic": [f"{len(c)} of 10" for c in completions]}
    assert got[0][2] == alone.state()  # rank 0's running statistics (its checkpoint's) are one process's
    assert got[1][2] == {} and alone.state()  # rank 1 keeps none (it writes no checkpoint)
    with pytest.raises(ValueError, match="reward_config's"):  # the scorer's models are the config's
        SharedModelRewards(length_models()[0], world.rank(0), world.rank(0).train_dp, ("rm",), (0.5,))

"""RewardSet / compute_rewards: weighting, None handling, error isolation, columns, plugins."""

import logging

import numpy as np
import pytest

from mindgrpo.rewards import (REWARDS, RewardError, RewardSet, compute_rewards, get_reward, load_reward_plugin,
                              register_reward)


def constant(value):
    def fn(completions, **kwargs):
        return [value(c) if callable(value) else value for c in completions]

    return fn


def test_weighted_sum_and_metrics_by_hand():
    completions = ["a", "bb", "ccc"]
    fns = {"len": constant(len), "half": constant(0.5)}
    total, per_function, metrics = compute_rewards(fns, [2.0, -1.0], completions, {})
    np.testing.assert_allclose(total, [2 * 1 - 0.5, 2 * 2 - 0.5, 2 * 3 - 0.5])
    assert total.shape == (3,) and total.dtype == np.float32
    np.testing.assert_array_equal(per_function["len"], [1, 2, 3])
    assert metrics["reward/len/mean"] == pytest.approx(2.0)
    assert metrics["reward/len/std"] == pytest.approx(1.0)  # sample std (n - 1): sqrt((1 + 0 + 1) / 2)
    assert metrics["reward/total/mean"] == pytest.approx(3.5)
    assert metrics["reward/total/std"] == pytest.approx(2.0)  # totals 1.5, 3.5, 5.5
    assert metrics["reward/len/errors"] == 0 and metrics["reward/half/none"] == 0


def test_none_is_zero_in_the_sum_but_not_in_the_mean():
    scores = {"a": 1.0, "b": None, "c": 3.0}
    total, per_function, metrics = compute_rewards(
        {"maybe": constant(scores.get), "one": constant(1.0)}, [0.5, 1.0], ["a", "b", "c"], {}
    )
    np.testing.assert_allclose(total, [1.5, 1.0, 2.5])
    assert np.isnan(per_function["maybe"][1])
    assert metrics["reward/maybe/mean"] == pytest.approx(2.0)  # (1 + 3) / 2, not / 3
    assert metrics["reward/maybe/none"] == 1 and metrics["reward/maybe/errors"] == 0


def test_a_raising_function_only_loses_the_bad_completion(caplog):
    calls = []

    def fragile(completions, solution, **kwargs):
        calls.append(len(completions))
        return [float(int(c) == int(s)) for c, s in zip(completions, solution)]

    with caplog.at_level(logging.WARNING, logger="mindgrpo.rewards.combine"):
        total, per_function, metrics = compute_rewards(
            {"fragile": fragile, "one": constant(1.0)},
            [1.0, 1.0],
            ["1", "oops", "3", "4"],
            {"solution": ["1", "2", "3", "5"]},
        )
    assert calls == [4, 1, 1, 1, 1]  # the batch, then each completion alone
    np.testing.assert_array_equal(np.isnan(per_function["fragile"]), [False, True, False, False])
    np.testing.assert_allclose(total, [2.0, 1.0, 2.0, 1.0])
    assert metrics["reward/fragile/errors"] == 1 and metrics["reward/fragile/none"] == 1
    assert metrics["reward/fragile/mean"] == pytest.approx(2 / 3)
    assert any("completion 1" in r.getMessage() for r in caplog.records)


def test_wrong_number_of_scores_and_ragged_columns_fail():
    with pytest.raises(ValueError, match="returned 1 scores for 2"):
        compute_rewards({"short": lambda completions, **kw: [1.0]}, [1.0], ["a", "b"], {})
    with pytest.raises(ValueError, match="column 'solution' has 1 rows for 2"):
        compute_rewards({"one": constant(1.0)}, [1.0], ["a", "b"], {"solution": ["x"]})
    with pytest.raises(ValueError, match="2 weights for 1"):
        compute_rewards({"one": constant(1.0)}, [1.0, 2.0], ["a"], {})


def test_reward_set_resolves_names_params_and_columns():
    rewards = RewardSet(
        ["accuracy", "format", "soft_overlong"],
        weights=[1.0, 0.5, 1.0],
        params={"soft_overlong": {"max_completion_length": 10, "soft_max_cache_length": 4}},
    )
    assert rewards.names == ["accuracy", "format", "soft_overlong"]
    assert rewards.required_columns == ["solution"]
    completions = ["<think>a</think><answer>\\boxed{4}</answer>", "\\boxed{5}"]
    total, per_function, _ = rewards(completions, solution=["4", "4"], completion_length=[3, 8], prompt=["p", "q"])
    np.testing.assert_allclose(per_function["soft_overlong"], [0.0, -0.5])
    np.testing.assert_allclose(total, [1.0 + 0.5, -0.5])
    with pytest.raises(KeyError, match=r"\['solution'\] are missing"):
        rewards(completions, prompt=["p", "q"])


def test_reward_set_rejects_bad_configuration():
    with pytest.raises(KeyError, match="valid names: accuracy"):
        RewardSet(["acc"])
    with pytest.raises(ValueError, match="duplicate"):
        RewardSet(["format", "format"])
    with pytest.raises(ValueError, match="1 weights for 2"):
        RewardSet(["format", "accuracy"], weights=[1.0])
    with pytest.raises(ValueError, match="not used"):
        RewardSet(["format"], params={"cosine": {"cosine_max_len": 3}})
    with pytest.raises(TypeError, match="cosine_max_len"):
        RewardSet(["cosine"])


PLUGIN = '''
from mindgrpo.rewards import register_reward


@register_reward("test_plugin_length")
def length_reward(completions, *, scale: float = 1.0, **kwargs):
    return [scale * len(c) for c in completions]
'''


def test_plugin_registers_rewards(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(PLUGIN)
    assert load_reward_plugin(str(path)) == ["test_plugin_length"]
    assert load_reward_plugin(str(path)) == ["test_plugin_length"]  # second load is a no-op
    assert get_reward("test_plugin_length", scale=2.0)(["abc"]) == [6.0]
    total, _, _ = RewardSet(["test_plugin_length"], params={"test_plugin_length": {"scale": 0.5}})(["ab", "abcd"])
    np.testing.assert_allclose(total, [1.0, 2.0])
    with pytest.raises(FileNotFoundError, match="nope.py"):
        load_reward_plugin(str(tmp_path / "nope.py"))


def test_register_twice_fails():
    @register_reward("test_combine_once")
    def once(completions, **kwargs):
        return [0.0] * len(completions)

    assert "test_combine_once" in REWARDS
    with pytest.raises(ValueError, match="already registered"):
        register_reward("test_combine_once")(once)


# ------------------------------------------------------------------------------ what a reward may return


@pytest.mark.parametrize("returned, needle", [
    (lambda cs: "1.0", r"reward 'bad' returned str '1.0', not a list of 2 scores"),
    (lambda cs: ["1" for _ in cs], r"reward 'bad' returned str '1' for completion 0: a score must be a number"),
    (lambda cs: [True for _ in cs], r"reward 'bad' returned bool True for completion 0"),
    (lambda cs: [np.bool_(False) for _ in cs], r"reward 'bad' returned bool_ False for completion 0"),
    (lambda cs: [[1.0] for _ in cs], r"reward 'bad' returned list \[1.0\] for completion 0"),
    (lambda cs: (len(c) for c in cs), r"reward 'bad' returned generator"),
    (lambda cs: [1.0, 2.0, 3.0], r"reward 'bad' returned 3 scores for 2 completions"),
    (lambda cs: np.ones((2, 1)), r"reward 'bad' returned ndarray"),
])
def test_a_contract_violation_is_one_error_naming_the_function(returned, needle):
    def bad(completions, **kwargs):
        return returned(completions)

    with pytest.raises(RewardError, match=needle) as error:
        compute_rewards({"one": constant(1.0), "bad": bad}, [1.0, 1.0], ["a", "bb"], {})
    assert "\n" not in str(error.value)


def test_numbers_of_any_kind_are_scores():
    fns = {"ints": constant(2), "numpy": lambda completions, **kw: np.array([0.5, 1.5], np.float32),
           "tuple": lambda completions, **kw: (np.int64(1), None)}
    _, per_function, metrics = compute_rewards(fns, [1.0, 1.0, 1.0], ["a", "b"], {})
    np.testing.assert_array_equal(per_function["ints"], [2.0, 2.0])
    np.testing.assert_array_equal(per_function["numpy"], [0.5, 1.5])
    np.testing.assert_array_equal(per_function["tuple"], [1.0, np.nan])
    assert metrics["reward/tuple/errors"] == 0 and metrics["reward/tuple/none"] == 1


def test_nan_and_inf_score_none_and_count_as_errors(caplog):
    def ratio(completions, **kwargs):
        return [1.0, float("nan"), float("inf"), 3.0]

    with caplog.at_level(logging.WARNING, logger="mindgrpo.rewards.combine"):
        total, per_function, metrics = compute_rewards({"ratio": ratio}, [1.0], ["a", "bb", "ccc", "dddd"], {})
    np.testing.assert_array_equal(per_function["ratio"], [1.0, np.nan, np.nan, 3.0])
    np.testing.assert_array_equal(total, [1.0, 0.0, 0.0, 3.0])
    assert metrics["reward/ratio/errors"] == 2 and metrics["reward/ratio/none"] == 2
    assert any("reward 'ratio' returned nan for completion 1, inf for completion 2" in r.getMessage()
               for r in caplog.records)


def test_get_reward_does_not_call_the_function():
    calls = []

    @register_reward("test_combine_reduces")
    def relative_length(completions, **kwargs):
        calls.append(len(completions))
        longest = max(len(c) for c in completions)  # fails on zero completions, fine on any real batch
        return [len(c) / longest for c in completions]

    rewards = RewardSet(["test_combine_reduces"])
    assert calls == []
    _, per_function, _ = rewards(["ab", "abcd"])
    np.testing.assert_allclose(per_function["test_combine_reduces"], [0.5, 1.0])
    assert calls == [2]


def test_get_reward_checks_the_signature():
    @register_reward("test_combine_no_kwargs")
    def no_kwargs(completions, solution):
        return [0.0] * len(completions)

    @register_reward("test_combine_no_completions")
    def no_completions(**kwargs):
        return []

    with pytest.raises(TypeError, match=r"reward 'test_combine_no_kwargs' must accept \*\*kwargs"):
        get_reward("test_combine_no_kwargs")
    with pytest.raises(TypeError, match="reward 'test_combine_no_completions' must take the completions"):
        get_reward("test_combine_no_completions")


def test_missing_dataset_columns_are_named_before_any_call():
    rewards = RewardSet(["format", "accuracy"])
    rewards.check_columns(["solution", "prompt", "completion_length"], "the training prompts")
    with pytest.raises(RewardError, match=r"reward 'accuracy' needs the column\(s\) \['solution'\], which the "
                                          r"training prompts do not have \(columns: completion_length, prompt\)"):
        rewards.check_columns(["prompt", "completion_length"], "the training prompts")


def test_a_failed_call_on_one_completion_is_not_repeated():
    calls = []

    def fragile(completions, **kwargs):
        calls.append(len(completions))
        raise ValueError("no")

    _, per_function, metrics = compute_rewards({"fragile": fragile}, [1.0], ["only"], {})
    assert calls == [1] and np.isnan(per_function["fragile"][0]) and metrics["reward/fragile/errors"] == 1


def test_add_model_scores_weights_them_in_by_hand():
    from mindgrpo.rewards.combine import add_model_scores

    total = np.array([1.0, 0.0, 2.0], np.float32)  # the verifiers' weighted sum
    per_fn = {"accuracy": np.array([1.0, 0.0, 1.0], np.float32)}
    rm = np.array([0.5, np.nan, -1.5], np.float32)  # None for the second completion
    out, per, m = add_model_scores(total, per_fn, {"reward/accuracy/mean": 2 / 3}, {"rm": rm}, [2.0])
    np.testing.assert_allclose(out, [1.0 + 1.0, 0.0, 2.0 - 3.0])
    assert set(per) == {"accuracy", "rm"} and np.isnan(per["rm"][1])
    assert m["reward/rm/mean"] == pytest.approx(-0.5) and m["reward/rm/none"] == 1.0
    assert m["reward/rm/std"] == pytest.approx(np.std([0.5, -1.5], ddof=1))
    assert m["reward/total/mean"] == pytest.approx(1 / 3) and m["reward/accuracy/mean"] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="also reward functions"):
        add_model_scores(total, per_fn, {}, {"accuracy": rm}, [1.0])
    with pytest.raises(ValueError, match="1 weights for 2 reward models"):
        add_model_scores(total, per_fn, {}, {"a": rm, "b": rm}, [1.0])

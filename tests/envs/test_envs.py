"""Environments: the registry and its plugins, the example game, and reset / step run in the tool workers with
each conversation's state carried between calls (any worker may take any step), hostile environments counted
as errors or timeouts while the pool goes on."""

from pathlib import Path

import pytest

from mindgrpo.envs import (
    DRIVER,
    environment_settings,
    load_environment_plugin,
    make_environment,
    reset_call,
    reset_result,
    step_call,
    step_result,
)
from mindgrpo.envs.driver import environment_pool
from mindgrpo.tools import check_call, parse_tool_calls

HOSTILE = str(Path(__file__).with_name("hostile_envs.py"))


def test_registry_settings_and_plugins():
    assert load_environment_plugin(HOSTILE) == ["counter", "hostile"]
    assert load_environment_plugin(HOSTILE) == ["counter", "hostile"]  # loaded once
    assert environment_settings("guess_number") == {"low": 1, "high": 100, "seed": 0, "invalid_reward": 0.0}
    with pytest.raises(KeyError, match="unknown environment 'chess'; valid names: .*guess_number"):
        make_environment("chess", {})
    with pytest.raises(ValueError, match=r"no setting\(s\) \['hi'\]; valid: \['high', 'invalid_reward'"):
        reset_call("guess_number", {"hi": 3}, "q")
    # the internal driver tool cannot be run by a model, even when offered
    call, = parse_tool_calls('<tool_call>{"name": "%s", "arguments": {"op": "reset"}}</tool_call>' % DRIVER)
    assert check_call(call, {DRIVER}).error is not None


def test_guess_number_by_bisection():
    env = make_environment("guess_number", {"low": 1, "high": 50, "seed": 4, "invalid_reward": -0.5})
    assert "from 1 to 50" in env.reset("Game one.")
    assert env.step("I have no idea.") == ("Answer with one whole number.", -0.5, False)
    lo, hi, said = 1, 50, []
    for _ in range(7):  # 50 numbers: bisection needs at most 6 guesses
        guess = (lo + hi) // 2
        observation, reward, done = env.step(f"<think>maybe 3</think>My guess is {guess}.")
        said.append((guess, observation))
        if done:
            break
        assert reward == 0.0 and observation in ("Higher.", "Lower.")
        lo, hi = (guess + 1, hi) if observation == "Higher." else (lo, guess - 1)
    assert done and observation == "Correct!" and reward == 1.0
    secret = said[-1][0]
    assert all((g < secret) == (o == "Higher.") for g, o in said[:-1])  # every hint agrees with the secret
    again = make_environment("guess_number", {"low": 1, "high": 50, "seed": 4})
    again.reset("Game one.")
    assert again.step(str(secret))[2]  # the same prompt and seed: the same secret


@pytest.fixture(scope="module")
def pool():
    with environment_pool([HOSTILE], num_workers=2, timeout_s=3.0) as p:
        yield p


def test_state_travels_with_each_step_across_workers(pool):
    first, = pool.run([reset_call("counter", {"done_after": 3}, "abc")])
    observation, state = reset_result(first.text)
    assert first.status == "ok" and observation == "start abc"
    seen = []
    for turn in ["x" * 10, "y" * 25, "z" * 7]:
        (result,) = pool.run([step_call("counter", {"done_after": 3}, state, turn)])
        observation, reward, done, state = step_result(result.text)
        seen.append((observation, reward, done))
    assert seen == [("obs 1", 0.10, False), ("obs 2", 0.25, False), ("obs 3", 0.07, True)]


def test_hostile_environments_are_errors_or_timeouts_and_the_pool_goes_on(pool):
    resets = pool.run([reset_call("hostile", {}, m) for m in ("sleep", "crash", "raise", "types", "fine",
                                                               "sleep_reset", "crash_reset")])
    assert [r.status for r in resets] == ["ok"] * 5 + ["timeout", "error"]
    assert "crashed" in resets[6].text
    states = [reset_result(r.text)[1] for r in resets[:5]]
    steps = pool.run([step_call("hostile", {}, s, "a turn") for s in states])
    assert [r.status for r in steps] == ["timeout", "error", "error", "error", "ok"]
    assert "crashed" in steps[1].text and "KeyError" in steps[2].text
    assert "reward must be a finite number, got 'much'" in steps[3].text
    assert step_result(steps[4].text)[:3] == ("go on", 1.0, False)
    assert pool.replaced >= 4  # two timeouts and two crashes replaced their workers

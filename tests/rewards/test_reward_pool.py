"""The reward worker pool: per-call timeouts, isolation of the bad completion, replaced workers, plugins
loaded in the workers, and no worker left behind (close, Ctrl-C, a killed trainer)."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from mindgrpo.rewards import RewardError, RewardSet, load_reward_plugin, register_reward

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PLUGIN = '''
import os
import time

from mindgrpo.rewards import register_reward


@register_reward("test_pool_length")
def length(completions, **kwargs):
    """len(c), but a completion holding HANG hangs the call (a pathological math check)."""
    if any("HANG" in c for c in completions):
        time.sleep(60)
    return [float(len(c)) for c in completions]


@register_reward("test_pool_pid")
def pid(completions, **kwargs):
    return [float(os.getpid())] * len(completions)


@register_reward("test_pool_crash")
def crash(completions, **kwargs):
    if any("CRASH" in c for c in completions):
        os._exit(3)
    return [1.0] * len(completions)


@register_reward("test_pool_string")
def as_text(completions, **kwargs):
    return ["1" for _ in completions]
'''


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    path = tmp_path_factory.mktemp("pool") / "pool_rewards.py"
    path.write_text(PLUGIN)
    load_reward_plugin(str(path))
    return str(path)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_hung_call_costs_only_the_hung_completion_and_its_worker_is_replaced(plugin):
    rewards = RewardSet(["test_pool_length", "format"], num_workers=2, timeout_s=1.0)
    try:
        rewards.pool.start()
        before = set(rewards.pool.pids())
        total, per_function, metrics = rewards(["a", "HANG", "abc", "<think>x</think><answer>1</answer>"])
        np.testing.assert_array_equal(per_function["test_pool_length"], [1.0, np.nan, 3.0, 34.0])
        np.testing.assert_array_equal(per_function["format"], [0.0, 0.0, 0.0, 1.0])
        np.testing.assert_allclose(total, [1.0, 0.0, 3.0, 35.0])
        assert metrics["reward/test_pool_length/timeouts"] == 1 and metrics["reward/test_pool_length/none"] == 1
        assert metrics["reward/test_pool_length/errors"] == 0 and metrics["reward/format/timeouts"] == 0
        # the batch call and the hung completion's own call timed out: two workers killed, two new ones
        assert rewards.pool.replaced == 2
        gone = before - set(rewards.pool.pids())
        assert gone and not any(alive(pid) for pid in gone)
        assert len(rewards.pool.pids()) == 2 and all(alive(pid) for pid in rewards.pool.pids())
        # training goes on: the next step is scored by the new workers
        _, per_function, metrics = rewards(["xy", "xyz"])
        np.testing.assert_array_equal(per_function["test_pool_length"], [2.0, 3.0])
        assert metrics["reward/test_pool_length/timeouts"] == 0
    finally:
        rewards.close()


def test_rewards_run_in_fresh_worker_processes_that_load_the_plugin(plugin):
    rewards = RewardSet(["test_pool_pid"], num_workers=2, timeout_s=10.0)
    try:
        _, per_function, _ = rewards(["a", "b"])
        pid = int(per_function["test_pool_pid"][0])
        assert pid != os.getpid() and pid in rewards.pool.pids()
        with open(f"/proc/{pid}/cmdline", "rb") as f:  # a new interpreter, not a fork of this one
            assert b"mindgrpo.rewards.worker" in f.read().split(b"\0")
    finally:
        rewards.close()


def test_a_worker_that_dies_costs_only_its_completion(plugin):
    rewards = RewardSet(["test_pool_crash"], num_workers=1, timeout_s=10.0)
    try:
        _, per_function, metrics = rewards(["a", "CRASH", "b"])
        np.testing.assert_array_equal(per_function["test_pool_crash"], [1.0, np.nan, 1.0])
        assert metrics["reward/test_pool_crash/errors"] == 1 and metrics["reward/test_pool_crash/timeouts"] == 0
    finally:
        rewards.close()


def test_a_contract_violation_in_a_worker_stops_the_run(plugin):
    rewards = RewardSet(["test_pool_string"], num_workers=1, timeout_s=10.0)
    try:
        with pytest.raises(RewardError, match=r"reward 'test_pool_string' returned str '1' for completion 0"):
            rewards(["a", "b"])
    finally:
        rewards.close()


def test_close_stops_every_worker(plugin):
    rewards = RewardSet(["test_pool_length"], num_workers=2, timeout_s=10.0)
    rewards(["a"])
    pids = rewards.pool.pids()
    assert len(pids) == 2 and all(alive(p) for p in pids)
    rewards.close()
    assert not any(alive(p) for p in pids)


def test_a_reward_of_the_main_script_is_refused_for_workers():
    def main_reward(completions, **kwargs):
        return [0.0] * len(completions)

    main_reward.__module__ = "__main__"
    register_reward("test_pool_main_script")(main_reward)
    with pytest.raises(RewardError, match="defined in the main script.*num_workers=0"):
        RewardSet(["test_pool_main_script"], num_workers=1)
    RewardSet(["test_pool_main_script"], num_workers=0)  # in this process it is fine


TRAINER = '''
import sys
from mindgrpo.rewards import RewardSet, load_reward_plugin

load_reward_plugin(sys.argv[1])
rewards = RewardSet(["test_pool_length"], num_workers=2, timeout_s=120.0)
rewards(["a"])
print(" ".join(map(str, rewards.pool.pids())), flush=True)
rewards(["HANG"])  # blocks: the trainer is stopped in the middle of a reward call
'''


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_no_worker_outlives_a_stopped_trainer(plugin, tmp_path, sig):
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    proc = subprocess.Popen([sys.executable, str(script), plugin], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=REPO))
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2, proc.stderr.read()
        proc.send_signal(sig)
        assert proc.wait(30) != 0
    finally:
        proc.kill()
        proc.wait()
    end = time.monotonic() + 10  # the workers' SIGKILL is delivered as their parent exits; give it a moment
    while any(alive(pid) for pid in pids) and time.monotonic() < end:
        time.sleep(0.1)
    remaining = [pid for pid in pids if alive(pid)]
    for pid in remaining:
        os.kill(pid, signal.SIGKILL)
    assert not remaining

"""A run killed with SIGKILL three times (once in the middle of a save, twice at random moments
after it made progress) and resumed each time with --resume ends with the weights, optimizer
state and per-step losses of an uninterrupted run, bit for bit."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import mindspore as ms

from mindgrpo.parallel.checkpoint_folders import CRASH_ENV

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "grpo_one_stage.py")
STEPS = 14  # room for both random kills (below) with steps to spare: their delays are bounded in steps
ARGS = [f"actor_config.model={os.path.join(REPO, 'tests', 'grpo', 'micro_qwen2.yaml')}",
        "--reward_plugin", os.path.join(REPO, "tests", "grpo", "digit_reward.py"),
        "reward_config.verifier_function=[test_digit_share]", "reward_config.verifier_weight=[1.0]",
        "rl_config.batch_size=2", "rl_config.num_generations=4", "actor_config.micro_batch_size=4",
        "rl_config.num_mini_batches=2", "generate_config.max_tokens=8", "synthetic_config.template=raw",
        "sft_config={steps: 0}", "rl_config.beta=0.05", "actor_config.lr=1e-2", "rl_config.val_interval=0",
        "rl_config.completions_interval=0", "rl_config.save_interval=1", f"rl_config.max_steps={STEPS}"]

pytestmark = pytest.mark.slow


def start(out, *extra, env=None):
    return subprocess.Popen([sys.executable, SCRIPT, "--output_dir", str(out), *ARGS, *extra], cwd=REPO,
                            env=dict(os.environ, **(env or {})), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)


def finish(proc, timeout=600):
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return proc.returncode, err


def complete_steps(out):
    root = os.path.join(out, "checkpoints")
    return sorted(int(d[5:]) for d in os.listdir(root) if d.startswith("step_")) if os.path.isdir(root) else []


def kill_after_progress(proc, out, steps, delay, timeout=600):
    """SIGKILL `proc` `delay` seconds after it completed `steps` checkpoints beyond those it started with.
    A step of this run takes about 0.2 s on a 2-core CPU, so the kill lands 0-2 steps later, in any phase;
    the kills are bounded in steps (the earlier 0.0-0.8 s delays on 10 steps could let the first resumed run
    reach the last step before its kill, and the second then had nothing left to do)."""
    before = max(complete_steps(out), default=0)
    t0 = time.monotonic()
    while max(complete_steps(out), default=0) < before + steps:
        assert proc.poll() is None, finish(proc)[1][-3000:]
        assert time.monotonic() - t0 < timeout, "no progress"
        time.sleep(0.05)
    time.sleep(delay)
    assert proc.poll() is None, "the run finished before its kill: make STEPS larger"
    proc.send_signal(signal.SIGKILL)
    assert finish(proc)[0] == -signal.SIGKILL


def files(out, step, groups=("policy", "optimizer", "reference")):
    folder = os.path.join(out, "checkpoints", f"step_{step:08d}")
    return {name: {k: v.asnumpy() for k, v in ms.load_checkpoint(os.path.join(folder, f"{name}.ckpt")).items()}
            for name in groups}


def losses(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f)}


def test_killed_three_times_the_run_ends_as_an_uninterrupted_one(tmp_path):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    straight, chaos = tmp_path / "straight", tmp_path / "chaos"
    code, err = finish(start(straight))
    assert code == 0, err[-3000:]

    # 1: killed in the middle of a save, after its policy.ckpt and before the rest
    crash_step = rng.randint(2, 3)
    code, err = finish(start(chaos, env={CRASH_ENV: f"{crash_step}:policy.ckpt"}))
    assert code == -signal.SIGKILL, err[-3000:]
    root = chaos / "checkpoints"
    assert os.path.isdir(root / f".step_{crash_step:08d}.tmp") and complete_steps(chaos)[-1] == crash_step - 1
    # 2, 3: resumed, then killed at a random moment after it saved a new checkpoint
    for _ in range(2):
        kill_after_progress(start(chaos, "--resume"), chaos, steps=rng.randint(1, 2), delay=rng.uniform(0.0, 0.4))
    code, err = finish(start(chaos, "--resume"))
    assert code == 0, err[-3000:]
    assert not [d for d in os.listdir(root) if d.startswith(".step_")], os.listdir(root)  # leftovers removed

    a, b = files(straight, STEPS), files(chaos, STEPS)
    for name in a:
        assert sorted(a[name]) == sorted(b[name])
        for k in a[name]:
            np.testing.assert_array_equal(a[name][k], b[name][k], err_msg=f"{name} {k} (random seed {seed})")
    assert losses(chaos) == losses(straight), f"random seed {seed}"
    assert sorted(losses(straight)) == list(range(1, STEPS + 1))


LORA = ["actor_config.lora_rank=4", "actor_config.lora_alpha=8"]


def test_a_killed_lora_run_ends_as_an_uninterrupted_one(tmp_path):
    """LoRA (docs/lora.md): killed in the middle of a save (after lora.ckpt) and once at a random moment, resumed
    each time: the adapters, their moments, the PEFT adapter folder and the losses of an uninterrupted run."""
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    straight, chaos = tmp_path / "straight", tmp_path / "chaos"
    code, err = finish(start(straight, *LORA))
    assert code == 0, err[-3000:]
    crash_step = rng.randint(2, 3)
    code, err = finish(start(chaos, *LORA, env={CRASH_ENV: f"{crash_step}:lora.ckpt"}))
    assert code == -signal.SIGKILL, err[-3000:]
    kill_after_progress(start(chaos, *LORA, "--resume"), chaos, steps=rng.randint(1, 2), delay=rng.uniform(0.0, 0.4))
    code, err = finish(start(chaos, *LORA, "--resume"))
    assert code == 0, err[-3000:]
    a, b = files(straight, STEPS, ("lora", "optimizer")), files(chaos, STEPS, ("lora", "optimizer"))
    for name in a:
        assert sorted(a[name]) == sorted(b[name])
        for k in a[name]:
            np.testing.assert_array_equal(a[name][k], b[name][k], err_msg=f"{name} {k} (random seed {seed})")
    peft = [os.path.join(out, "checkpoints", f"step_{STEPS:08d}", "adapter", "adapter_model.safetensors")
            for out in (straight, chaos)]
    with open(peft[0], "rb") as f, open(peft[1], "rb") as g:
        assert f.read() == g.read()
    assert losses(chaos) == losses(straight), f"random seed {seed}"

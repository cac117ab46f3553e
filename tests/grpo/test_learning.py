"""The built-in default learns.

test_reward_rises: scripts/grpo_one_stage.py with the shipped tiny config (tiny Qwen2, synthetic
task, built-in tokenizer), no warm start, few steps, and a dense rule reward from a plugin (the
share of digit characters), so that an untrained model gets a signal in every group. If the loop's
pieces did not fit (advantages, log-probs, the update, the weight sync into the inference copy),
the reward would not move.

test_the_tiny_default_learns_to_carry: the shipped recipe itself, unchanged (flawed-teacher warm
start, then 20 GRPO steps with the accuracy reward, the 2-layer model): held-out greedy accuracy must
rise by 0.25 (seeds 1, 2 and 3 rose by 0.40 to 0.47 when measured on machine C, 2026-11-27; README). About
2 minutes alone on a 2-core machine, more in CI beside the other tests: the subprocess timeout only guards
against a hang. The recipe of 2026-11-26 (1,000 warm-start steps of 32 solutions) gave seed 1 only
0.27 -> 0.52 once the log-probs head moved to the softmax kernel (0.40 before): the trajectory, not
the arithmetic, had changed.
The outcome depends on the whole trajectory, which any change of rounding moves: with the
embedding's gradient summed in another order (tried 2026-11-24 on the 4-layer model of the time,
correct to 1e-6, then reverted) seed 1 rose only 0.28 -> 0.47 by step 20 and stalled at 0.45 through step 100, while seeds 2 and 3
rose by 0.60 and 0.55; this test is what caught it.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from parallel.msrun_util import free_port, msrun_path, python_path

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_reward_rises(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, os.path.join(REPO, "scripts", "grpo_one_stage.py"), "--output_dir", str(out),
           "--reward_plugin", os.path.join(REPO, "tests", "grpo", "digit_reward.py"),
           "reward_config.verifier_function=[test_digit_share]", "reward_config.verifier_weight=[1.0]",
           "sft_config={steps: 0}", "rl_config.max_steps=16", "rl_config.batch_size=4", "rl_config.num_generations=8",
           "generate_config.max_tokens=12", "rl_config.val_interval=0", "rl_config.save_interval=0",
           "actor_config.lr=3e-3", "actor_config.micro_batch_size=32"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rewards = [json.loads(line)["reward_mean"] for line in open(out / "metrics.jsonl") if '"reward_mean"' in line]
    assert len(rewards) == 16
    first, last = np.mean(rewards[:4]), np.mean(rewards[-4:])
    assert last > first + 0.1, rewards


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """The shipped recipe, unchanged but for keeping three checkpoints (rl_config.keep_last_k: no effect on
    training), so that its step-0 checkpoint (the warm-started policy) is there for the runs that start from it."""
    out = tmp_path_factory.mktemp("learning") / "run"
    cmd = [sys.executable, os.path.join(REPO, "scripts", "grpo_one_stage.py"), "--output_dir", str(out),
           "rl_config.keep_last_k=3"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=3600)
    assert r.returncode == 0, r.stderr[-3000:]
    return out, r


def warm_started(default_run) -> str:
    """The default run's warm-started policy (its checkpoint of step 0), as a run's --sft_path_train."""
    path = default_run[0] / "checkpoints" / "step_00000000" / "policy.ckpt"
    assert path.is_file(), sorted(os.listdir(default_run[0] / "checkpoints"))
    return str(path)


@pytest.mark.slow
def test_the_tiny_default_learns_to_carry(default_run):
    out, r = default_run
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    val = {m["step"]: m["val/accuracy"] for m in rows if "val/accuracy" in m}
    assert sorted(val) == [0, 20]
    assert val[20] >= val[0] + 0.25, val
    assert "final: val_accuracy start=" in r.stdout
    # the warm start's weights were saved as step 0 (a crash in the first steps resumes from them)
    assert sorted(d for d in os.listdir(out / "checkpoints") if d.startswith("step_")) == \
        ["step_00000000", "step_00000010", "step_00000020"]


@pytest.mark.slow
def test_the_tiny_default_learns_with_lora(default_run, tmp_path):
    """The shipped recipe with LoRA (docs/lora.md), rank 8 on all seven projections, lr 1e-3 (ten times the full
    fine-tuning's), from the shipped recipe's warm start (the default run's step-0 checkpoint: with LoRA too the warm
    start trains the base, the adapters after it; one warm start for both tests), 10 GRPO steps that train the
    adapters alone (a learning test shortened, as the issue allows). Held-out greedy accuracy must rise by 0.3 (seed 1
    rose 0.26 -> 0.69 at step 10 and 20 with its own warm start, 2026-11-28, and 0.26 -> 0.32, 0.69, 0.72, 0.69 at
    steps 5-20 on 2026-11-29; the full fine-tuning recipe rises 0.39-0.47 in 20)."""
    out = tmp_path / "run"
    cmd = [sys.executable, os.path.join(REPO, "scripts", "grpo_one_stage.py"), "--output_dir", str(out),
           "--sft_path_train", warm_started(default_run), "sft_config={steps: 0}",
           "actor_config.lora_rank=8", "actor_config.lr=1e-3", "rl_config.max_steps=10", "rl_config.val_interval=10"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=3600)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    val = {m["step"]: m["val/accuracy"] for m in rows if "val/accuracy" in m}
    assert sorted(val) == [0, 10]
    assert val[10] >= val[0] + 0.3, val
    last = out / "checkpoints" / "step_00000010"
    assert (last / "adapter" / "adapter_model.safetensors").is_file() and not (last / "policy.ckpt").exists()


@pytest.mark.slow
@pytest.mark.msrun
def test_the_tiny_default_learns_one_step_off_policy_on_a_separate_rollout_rank(default_run, tmp_path):
    """The shipped recipe learns asynchronously (issue 46, docs/async.md): scripts/run_grpo.sh with 2 workers,
    `generate_config.placement=separate rl_config.off_policy_steps=1` and nothing else changed: the 20 GRPO steps
    run their rollouts one update behind on the rollout rank, validation on the rollout rank's weights. They start
    from the recipe's warm start (the default run's step-0 checkpoint: one warm start for the learning tests; the
    warm start under this placement is checked in tests/parallel/test_separate.py). Held-out greedy accuracy, read
    from the training rank's metrics.jsonl, must rise by 0.3 between step 0 and step 20, as the one-process recipe
    does. No rl_config key is set for the asynchronous schedule (no rollout_correction): one update of staleness at
    lr 1e-4 did not hold the recipe back (seed 1 rose 0.26 -> 0.74 with its own warm start when measured,
    2026-11-29; the one-process recipe rises 0.40-0.47)."""
    msrun_path()
    out = tmp_path / "run"
    cmd = ["bash", os.path.join(REPO, "scripts", "run_grpo.sh"), "--worker_num", "2", "--local_worker_num", "2",
           "--master_port", str(free_port()), "--log_dir", str(tmp_path / "log"), "--timeout", "3000", "--",
           "--output_dir", str(out), "--sft_path_train", warm_started(default_run), "sft_config={steps: 0}",
           "generate_config.placement=separate", "rl_config.off_policy_steps=1"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=3600,
                       env=dict(os.environ, PATH=python_path()))
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    val = {m["step"]: m["val/accuracy"] for m in rows if "val/accuracy" in m}
    print("held-out accuracy by step:", val)
    assert sorted(val) == [0, 20]
    # validation ran on the rollout rank's weights: at step 20 those of update 19, one behind
    assert [m["val/policy_version"] for m in rows if "val/policy_version" in m] == [0.0, 19.0]
    assert max(m["staleness/max"] for m in rows if "staleness/max" in m) == 1.0
    assert val[20] >= val[0] + 0.3, val


@pytest.mark.slow
def test_the_tiny_default_learns_from_a_reward_model_alone(default_run, tmp_path):
    """The shipped recipe's GRPO stage with the reward model of `tiny_reward_model.py` as the only reward
    (docs/reward_models.md, issue 48): the accuracy rule stays in verifier_function with weight 0, so it is logged
    (reward/accuracy/mean) but adds nothing; the policy learns from the reward model's score of prompt + completion
    alone. The reward model starts from the recipe's warm-started policy (the default run's step-0 checkpoint,
    converted to HF) and is trained by this test in torch on the training problems only: that policy's own samples of
    them (scripts/generate.py, temperature 1, labelled by the arithmetic's truth), mixed with a student's worked
    solutions that slip either way. GRPO starts from the same warm start, with two changes to the recipe:
    - rl_config.advantage_scale=batch (TRL's scale_rewards="batch"): a reward model's scores differ within every
      group, so dividing by the group's std blows its noise between equally wrong answers up to full-size advantages
      (held-out 0.26 -> 0.42 -> 0.43 at steps 0, 10, 20 with the group std on an earlier warm start, the policy
      drifting to "9 + 1 = 11");
    - rl_config.beta=1.0, a KL penalty to the warm start: without it the policy games the reward model after about
      ten steps. That model cannot check the ones digit of a carrying addition ("6 + 5 = 10" scored as high as
      "6 + 5 = 11"); its agreement with the rule on the policy's own samples fell from 0.93 (steps 1-10) to 0.60-0.76
      (steps 11-20) while its mean score rose, and held-out accuracy at steps 0, 5, 10, 15, 20 went
      .36 .53 .80 .72 .68 / .36 .54 .76 .60 .56 / .36 .53 .62 .47 .37 on three draws (seeds of the reward model's
      samples and training / of GRPO: 0/1, the test's, 1/2, 2/3). With beta 1.0 the KL stays near 0.01, the
      agreement 0.94-0.99 through step 20, and the same draws (the same reward models) went
      .36 .53 .82 .79 .75 / .36 .54 .82 .79 .80 / .36 .53 .81 .80 .75 (+0.39, +0.44, +0.39; 2026-11-29), and two
      more draws, 3/4 and 4/5, +0.39 and +0.36. beta 0.1 acted too little (0.70 at step 20 on 0/1), beta 3.0 too
      much (0.44 on 2/3); a squared loss, more slips, off-by-one carries in the student's data or 900 training steps
      left beta 0's trajectory where it was (docs/reward_models.md).
    Held-out greedy accuracy, measured by the rule on the 100 validation problems neither model saw, must rise by 0.3
    between step 0 and step 20 (0.36 -> 0.82 -> 0.75 in the run of 2026-11-29 at load 3-5: 165 s after the default
    run, 84 s of conversion, samples and reward model, 80 s of GRPO; 358 s with the default run)."""
    from mindgrpo.data.synthetic import ArithmeticTask, arithmetic_rows
    from mindgrpo.data.tokenizer import QwenTokenizer
    from tiny_reward_model import policy_samples, train_tiny_reward_model

    policy = warm_started(default_run)
    tokenizer_dir = str(default_run[0] / "checkpoints" / "tokenizer")  # the run's
    tokenizer = QwenTokenizer.from_dir(tokenizer_dir)
    task = ArithmeticTask(operators=("+",), max_operand=9, num_operands=3, num_train=800, num_val=100)  # the recipe's
    train, val = arithmetic_rows(task)
    hf_policy = tmp_path / "policy_hf"
    r = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "convert_weight.py"), "--reverse",
                        "--mindspore_ckpt_path", policy, "--torch_ckpt_dir", str(hf_policy)],
                       capture_output=True, text=True, cwd=REPO, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    on_policy = policy_samples(policy, tokenizer_dir, tokenizer, train, n=4, seed=0)
    held_out_samples = policy_samples(policy, tokenizer_dir, tokenizer, val, n=4, seed=10_000)  # to check the RM only
    rm, held_out = train_tiny_reward_model(str(tmp_path), tokenizer, task, on_policy=on_policy,
                                           held_out_policy=held_out_samples, init_from=str(hf_policy), steps=300)
    print("reward model's held-out accuracy:", held_out)
    # the fixture made a reward model that tells right from wrong on unseen problems: the policy's own answers, and
    # the student's (off by one in a quarter of the chains: 0.76-0.80 on three draws, 2026-11-29)
    assert held_out["policy"] >= 0.85 and held_out["student"] >= 0.7, held_out
    out = tmp_path / "run"
    cmd = [sys.executable, os.path.join(REPO, "scripts", "grpo_one_stage.py"), "--output_dir", str(out),
           "--sft_path_train", policy, "sft_config={steps: 0}", "reward_config.verifier_weight=[0.0]",
           f"reward_config.reward_models=[{{path: {rm}, name: rm}}]", "rl_config.advantage_scale=batch",
           "rl_config.beta=1.0", "rl_config.val_interval=10", "rl_config.save_interval=0"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=3600)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    val_accuracy = {m["step"]: m["val/accuracy"] for m in rows if "val/accuracy" in m}
    print("held-out accuracy by step:", val_accuracy)
    assert sorted(val_accuracy) == [0, 10, 20]
    steps = [m for m in rows if "reward/rm/mean" in m]
    assert len(steps) == 20 and all(m["reward_mean"] == pytest.approx(m["reward/rm/mean"], rel=1e-5, abs=1e-5) for m in steps)
    assert val_accuracy[20] >= val_accuracy[0] + 0.3, val_accuracy

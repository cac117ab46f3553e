"""scripts/grpo_one_stage.py end to end on a micro model: metrics, exact resume, a reward plugin, config errors."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import mindspore as ms

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "grpo_one_stage.py")
MICRO = [f"actor_config.model={os.path.join(REPO, 'tests', 'grpo', 'micro_qwen2.yaml')}",
         "rl_config.batch_size=2", "rl_config.num_generations=4", "actor_config.micro_batch_size=4",
         "rl_config.num_mini_batches=2", "generate_config.max_tokens=8", "rl_config.val_size=4",
         "rl_config.completions_interval=1", "sft_config.steps=2", "sft_config.batch_size=4",
         "synthetic_config.template=raw", "rl_config.beta=0.05", "actor_config.lr=1e-3"]


def run(out, *extra, check=True, env=None):
    # sft_config={steps: 0} switches the warm start off: MICRO's warm-start keys go with it (they could not act)
    micro = [a for a in MICRO if not a.startswith("sft_config.")] if "sft_config={steps: 0}" in extra else MICRO
    r = subprocess.run([sys.executable, SCRIPT, "--output_dir", str(out), *micro, *extra],
                       capture_output=True, text=True, cwd=REPO, timeout=1800,  # a hang guard; minutes on a busy machine
                       env=None if env is None else {**os.environ, **env})
    if check:
        assert r.returncode == 0, r.stderr[-3000:]
    return r


def metrics(out):
    return [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]


def weights(ckpt):
    return {k: v.asnumpy() for k, v in ms.load_checkpoint(ckpt).items()}


def last_checkpoint(out, name="policy"):
    root = os.path.join(out, "checkpoints")
    return os.path.join(root, sorted(d for d in os.listdir(root) if d.startswith("step_"))[-1], f"{name}.ckpt")


PLUGIN = ("from mindgrpo.rewards import register_reward\n\n"
          "@register_reward('always_half')\n"
          "def always_half(completions, **_):\n"
          "    return [0.5 for _ in completions]\n")


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    """A user's reward plugin file, given with --reward_plugin to every run that trains (the runs share
    their compile-heavy start, so the flag is checked on the straight run rather than on a run of its own).
    A constant reward moves no advantage: the accuracy alone trains."""
    path = tmp_path_factory.mktemp("plugin") / "my_rewards.py"
    path.write_text(PLUGIN)
    return ["--reward_plugin", str(path), "reward_config.verifier_function=[accuracy, always_half]",
            "reward_config.verifier_weight=[1, 2]"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory, plugin):
    out = tmp_path_factory.mktemp("straight")
    run(out, *plugin, "rl_config.max_steps=4", "rl_config.val_interval=2", "rl_config.save_interval=2",
        "rl_config.log_interval=3", "--save_data_file", str(out / "data" / "experience.mindrecord"))
    return out


@pytest.mark.slow
def test_metrics_and_outputs(straight):
    rows = metrics(straight)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    for r in rows[1:]:
        for key in ("loss", "reward_mean", "reward_std", "grad_norm", "kl", "entropy", "lr",
                    "response_length/mean", "time/rollout", "time/update", "time/sync", "memory/peak_bytes",
                    "memory/host_resident_bytes", "memory/host_peak_bytes"):
            assert key in r, key
        # the host process (MindSpore alone is hundreds of MB); its peak so far is at least what it holds now
        assert 1e8 < r["memory/host_resident_bytes"] <= r["memory/host_peak_bytes"]
        assert 0 <= r["time/compile"] <= r["time/step"] and r["compile/graphs"] >= 0
    # the first step compiles the step's graphs (rollout, scoring, update); the start-up's (warm start) are not its.
    # Every later step has the same shapes (prompts under one length bucket, 8 new tokens): a graph compiled again
    # there is a recompile (a value that changes each step reaching a graph as a constant, a Cell made per step)
    assert rows[1]["compile/graphs"] >= 4 and rows[1]["time/compile"] > 0
    assert [r["compile/graphs"] for r in rows[2:]] == [0, 0, 0]
    assert "val/accuracy" in rows[0] and "val/accuracy" in rows[2] and "val/accuracy" in rows[4]
    assert {"val/pass@1", "val/mean@1", "val/maj@1"} <= set(rows[2])  # greedy validation: pass@1 is the accuracy
    assert rows[2]["val/pass@1"] == rows[2]["val/accuracy"]
    for r in rows[1:]:  # perf/* from the step's logged lengths and times: 2 prompts x G=4 on one device
        tokens = (r["prompt_length/mean"] + r["response_length/mean"]) * 8
        step_s = r["time/step"] - r.get("time/validate", 0.0)
        assert r["perf/e2e_tokens_per_s_per_device"] == pytest.approx(tokens / step_s)
        for phase, name in (("rollout", "rollout"), ("ref", "reference"), ("update", "update")):
            assert r[f"perf/{name}_tokens_per_s_per_device"] == pytest.approx(tokens / r[f"time/{phase}"])
        assert 0 < r["perf/mfu"] < 1
    assert os.path.getsize(os.path.join(straight, "completions.jsonl")) > 0
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(os.path.join(straight, "tensorboard")))
    assert open(os.path.join(straight, "training.png"), "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert sorted(os.listdir(os.path.join(straight, "checkpoints"))) == ["step_00000002", "step_00000004", "tokenizer"]
    # rl_config.log_interval=3: a progress line at step 3 and at the last step; metrics.jsonl has every step
    # (the trainer's lines: a step of over a minute on a loaded machine also gets the progress ticker's lines)
    log = "\n".join(line for line in open(os.path.join(straight, "logs", "rank_0.log")).read().splitlines()
                    if "mindgrpo.grpo.trainer: step " in line)
    assert [s for s in range(1, 5) if f"step {s}/4 |" in log] == [3, 4]
    assert "e2e tok/s/device" in log.split("step 3/4 |")[1].splitlines()[0]
    host = float(log.split("step 3/4 |")[1].splitlines()[0].split("| host ")[1].split(" GB")[0])
    assert host == pytest.approx(rows[3]["memory/host_resident_bytes"] / 1e9, abs=0.006)  # shown to the hundredth


@pytest.mark.slow
def test_resume_from_an_older_step_sets_the_newer_aside_and_resume_continues_exactly(straight, plugin, tmp_path):
    out = tmp_path / "resumed"
    shutil.copytree(straight, out)
    ckpts = out / "checkpoints"
    r = run(out, *plugin, "--resume_from", str(ckpts / "step_00000002"), "rl_config.max_steps=3", "rl_config.val_interval=2",
            "rl_config.save_interval=2")
    aside = [d for d in os.listdir(ckpts) if d.startswith("abandoned_step_00000004.")]
    assert len(aside) == 1 and "set aside" in r.stderr and "abandoned_step_00000004." in r.stderr
    assert sorted(d for d in os.listdir(ckpts) if d.startswith("step_")) == ["step_00000002", "step_00000003"]
    r = run(out, *plugin, "--resume", "rl_config.max_steps=4", "rl_config.val_interval=2", "rl_config.save_interval=2",
            env={"MINDGRPO_PROGRESS_INTERVAL_S": "0.5"})  # the line of the step in flight, every half second
    assert f"the newest complete checkpoint is {ckpts / 'step_00000003'}" in r.stderr  # the new line, not step 4
    # the resumed run did step 4 alone: the lines of the step in flight name it (x/4 | phase ... for ...)
    running = [line.split("step ", 1)[1].split(" |")[0] for line in r.stderr.splitlines() if " for " in line
               and "| phase " in line]
    assert running and set(running) == {"4/4"}, running
    assert sorted(os.listdir(ckpts)) == aside + ["step_00000003", "step_00000004", "tokenizer"]  # kept aside, never counted
    a, b = weights(last_checkpoint(straight)), weights(last_checkpoint(out))
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    oa, ob = weights(last_checkpoint(straight, "optimizer")), weights(last_checkpoint(out, "optimizer"))
    assert all(np.array_equal(oa[k], ob[k]) for k in oa)
    assert [r["step"] for r in metrics(out)] == [0, 1, 2, 3, 4]
    sa = {r["step"]: r for r in metrics(straight)}
    for r in metrics(out):
        assert r.get("loss") == sa[r["step"]].get("loss")


@pytest.mark.slow
def test_completions_and_saved_experience_carry_the_metrics_step(straight):
    """completions.jsonl and --save_data_file's files say the step of metrics.jsonl (1 to 4, the last one
    included; rl_config.completions_interval=1)."""
    rows = [json.loads(line) for line in open(os.path.join(straight, "completions.jsonl"))]
    assert sorted({r["step"] for r in rows}) == [1, 2, 3, 4]
    assert sorted(os.listdir(straight / "data")) == [f"experience_step{s:06d}.mindrecord{x}" for s in range(1, 5)
                                                     for x in ("", ".db")]


@pytest.mark.slow
def test_the_runs_tokenizer_is_written_beside_its_checkpoints(straight):
    """checkpoints/tokenizer holds the run's tokenizer (here the tiny one the run made in its cache), where
    generate.py and evaluate.py look for it by default."""
    from mindgrpo.data.tokenizer import QwenTokenizer, default_tokenizer_dir

    policy = last_checkpoint(straight)
    assert default_tokenizer_dir(policy) == os.path.join(straight, "checkpoints", "tokenizer")
    ours = QwenTokenizer.from_dir(os.path.join(straight, "checkpoints", "tokenizer"))
    made = QwenTokenizer.from_dir(os.path.join(straight, "cache", "tiny_tokenizer"))
    text = "What is 3 + 8 + 5? <think>3 + 8 = 11</think>"
    assert ours.vocab_size == made.vocab_size and ours.encode(text) == made.encode(text)
    assert ours.stop_token_ids == made.stop_token_ids


# what differs between two runs of the same work: wall-clock figures
TIMING = ("time/", "perf/", "seconds", "tokens_per_s", "throughput/")


@pytest.mark.slow
def test_an_inference_copy_gives_the_steps_of_the_shared_policy(tmp_path):
    """On one device the run generates with the policy model itself (generate_config.inference_weights auto: one
    copy of the weights, no sync). Forced to keep an inference copy synced after every update, the same run (a
    dense reward, so that both steps update the policy and the second rollout reads the update) logs the same
    validation and steps, in the same columns."""
    dense = [f"reward_config.reward_plugin={os.path.join(REPO, 'tests', 'grpo', 'text_length_reward.py')}",
             "reward_config.verifier_function=[test_text_length]", "reward_config.verifier_weight=[1.0]"]
    rows = {}
    for weights in ("auto", "copy"):
        run(tmp_path / weights, *dense, "sft_config={steps: 0}", "rl_config.max_steps=2", "rl_config.val_interval=2",
            "rl_config.beta=0", "rl_config.num_mini_batches=1",  # fewer graphs: no reference, no old log-probs
            f"generate_config.inference_weights={weights}")
        rows[weights] = metrics(tmp_path / weights)
    assert [r["step"] for r in rows["auto"]] == [r["step"] for r in rows["copy"]] == [0, 1, 2]
    for a, b in zip(rows["auto"], rows["copy"]):
        assert a.keys() == b.keys()
        same = [k for k in a if not any(s in k for s in TIMING) and not k.startswith(("sync/", "memory/"))]
        assert {k: a[k] for k in same} == {k: b[k] for k in same}, a["step"]
    for a, b in zip(rows["auto"][1:], rows["copy"][1:]):
        assert a["grad_norm"] > 0 and a["reward_std"] > 0  # each step updated the policy
        assert a["sync/bytes"] == 0 < b["sync/bytes"]
        # swap on: one copy of the weights resident at a time either way, so the same rollout and update phases;
        # the sync phase has no bucket to take in
        for phase in ("rollout", "update"):
            assert a[f"memory/peak_bytes/{phase}"] == b[f"memory/peak_bytes/{phase}"], phase
        assert a["memory/peak_bytes/sync"] < b["memory/peak_bytes/sync"]


@pytest.mark.parametrize("extra, needle", [
    (["actor_config.load_checkpoint=/nonexistent/model.ckpt"],
     "config key 'actor_config.load_checkpoint': /nonexistent/model.ckpt does not exist"),
    (["generate_config.temperature=inf"], "config key 'generate_config.temperature': must be a finite number"),
])
def test_start_up_errors_are_one_line(tmp_path, extra, needle):
    r = run(tmp_path / "bad", *extra, check=False)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert not (tmp_path / "bad").exists()


def test_prompt_token_ids_outside_the_model_vocabulary_are_refused_naming_both_files(tmp_path):
    from mindgrpo.data.mindrecord import PROMPT_SCHEMA, write_mindrecord

    data = str(tmp_path / "wide.mindrecord")
    rows = [{"prompt_ids": np.array([5, 7, 600 if i == 2 else 9, 0], np.int32), "prompt_length": np.int32(3),
             "prompt": "q", "solution": "1", "answer": "1"} for i in range(4)]
    write_mindrecord(data, PROMPT_SCHEMA, [rows])
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    micro = os.path.join(REPO, "tests", "grpo", "micro_qwen2.yaml")
    r = subprocess.run([sys.executable, SCRIPT, "--config", str(empty), "--output_dir", str(tmp_path / "out"),
                        "--mind_dataset_dir", data, f"actor_config.model={micro}"],
                       capture_output=True, text=True, cwd=REPO, timeout=600)
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.strip().splitlines() if "error" in ln]
    assert len(lines) == 1, r.stderr
    assert lines[0].endswith(f"error: {data}: row 2 holds token id 600, outside the vocabulary of 512 tokens of "
                             f"{micro} (actor_config.model); the dataset was written with another tokenizer than "
                             "the model's")


@pytest.mark.parametrize("override, needle", [
    ("rl_config.max_stepz=3", "rl_config.max_stepz"),
    ("actor_config.lr=fast", "actor_config.lr"),
    ("rl_config.loss_agg_mode=nope", "rl_config.loss_agg_mode"),
])
def test_bad_config_is_one_line_error(tmp_path, override, needle):
    r = run(tmp_path / "bad", override, check=False)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow
def test_reward_plugin_flag(straight):
    rows = [r for r in metrics(straight) if "reward_mean" in r]
    assert len(rows) == 4
    for row in rows:
        assert row["reward/always_half/mean"] == 0.5
        assert abs(row["reward_mean"] - (row["reward/accuracy/mean"] + 1.0)) < 1e-6


def test_a_reward_needing_a_missing_column_stops_the_run_in_one_line(tmp_path):
    plugin = tmp_path / "rewards.py"
    plugin.write_text("from mindgrpo.rewards import register_reward\n\n"
                      "@register_reward('by_difficulty')\n"
                      "def by_difficulty(completions, difficulty, **_):\n"
                      "    return [float(d) for d in difficulty]\n")
    r = run(tmp_path / "out", "--reward_plugin", str(plugin), "rl_config.max_steps=1", "sft_config={steps: 0}",
            "reward_config.verifier_function=[accuracy, by_difficulty]", "reward_config.verifier_weight=[1, 1]",
            check=False)
    assert r.returncode == 2
    errors = [line for line in r.stderr.splitlines() if "error" in line.lower()]
    assert errors == ["grpo_one_stage: error: reward 'by_difficulty' needs the column(s) ['difficulty'], which the "
                      "training prompts do not have (columns: answer, completion_length, prompt, solution)"], \
        r.stderr[-3000:]


def test_a_reward_plugin_with_a_syntax_error_stops_the_run_in_one_line(tmp_path):
    plugin = tmp_path / "rewards.py"
    plugin.write_text("from mindgrpo.rewards import register_reward\n\n"
                      "@register_reward('broken')\n"
                      "def broken(completions, **_):\n"
                      "    return [1.0 for c in completions\n")
    r = run(tmp_path / "out", "--reward_plugin", str(plugin), "rl_config.max_steps=1", "sft_config={steps: 0}",
            check=False)
    assert r.returncode == 2
    errors = [line for line in r.stderr.splitlines() if "error" in line.lower()]
    assert errors == [f"grpo_one_stage: error: {plugin}:5: SyntaxError: '[' was never closed "
                      "(reward_config.reward_plugin)"], r.stderr[-3000:]
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_evaluate_on_the_runs_checkpoint(straight, tmp_path):
    """scripts/evaluate.py on the short run's last policy.ckpt, its tokenizer and held-out problems."""
    cache = os.path.join(straight, "cache")
    val = [os.path.join(cache, d, "val.mindrecord") for d in os.listdir(cache) if d.startswith("tiny_data_")]
    assert len(val) == 1
    r = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "evaluate.py"), "--model", last_checkpoint(straight),
                        "--tokenizer_dir", os.path.join(cache, "tiny_tokenizer"), "--data", val[0], "--n", "4",
                        "--temperature", "1.0", "--max_tokens", "8", "--limit", "4", "--num_workers", "1",
                        "--output", str(tmp_path)], capture_output=True, text=True, cwd=REPO, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 16 and summary["problems"] == 4
    assert summary["metrics"]["mean@4"] == pytest.approx(np.mean([s["correct"] for s in samples]))
    assert summary["metrics"]["pass@1"] == pytest.approx(summary["metrics"]["mean@4"])
    assert summary["metrics"]["pass@4"] == pytest.approx(
        np.mean([any(s["correct"] for s in samples[4 * p:4 * p + 4]) for p in range(4)]))
    assert "pass@4" in r.stdout and "ETA" in r.stderr


@pytest.mark.slow  # one GRPO step from the command line (a warm start, one rollout, one update)
def test_one_grpo_step_of_a_tiny_qwen3(tmp_path):
    """model_type qwen3 (QK-norm, no q/k/v bias, head_dim 12 != 32 / 4) through the whole recipe: the
    update (no warm start) has a gradient (a dense reward: the digits' share) that reaches the QK-norm
    weights, and the checkpoint describes a Qwen3."""
    out = tmp_path / "qwen3"
    micro3 = f"actor_config.model={os.path.join(REPO, 'tests', 'grpo', 'micro_qwen3.yaml')}"
    no_warm_start = [a for a in MICRO[1:] if not a.startswith("sft_config.")] + ["sft_config={steps: 0}"]
    r = subprocess.run([sys.executable, SCRIPT, "--output_dir", str(out), micro3, *no_warm_start,
                        "rl_config.max_steps=1", "rl_config.save_interval=1", "rl_config.val_interval=0",
                        "--reward_plugin", os.path.join(REPO, "tests", "grpo", "digit_reward.py"),
                        "reward_config.verifier_function=[test_digit_share]", "reward_config.verifier_weight=[1]"],
                       capture_output=True, text=True, cwd=REPO, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = metrics(out)
    assert [row["step"] for row in rows][-1] == 1 and np.isfinite(rows[-1]["loss"]) and rows[-1]["grad_norm"] > 0
    w = weights(last_checkpoint(out))
    assert not any(k.endswith(".bias") for k in w) and w["model.layers.0.attention.wq.weight"].shape == (48, 32)
    for k in ("q_norm", "k_norm"):
        assert not np.array_equal(w[f"model.layers.1.attention.{k}.weight"], np.ones(12, np.float32))
    saved = json.load(open(os.path.join(os.path.dirname(last_checkpoint(out)), "config.json")))
    assert (saved["model_type"], saved["head_dim"]) == ("qwen3", 12)

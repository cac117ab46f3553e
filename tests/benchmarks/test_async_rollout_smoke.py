"""benchmarks/async_rollout.py at its smallest (a one-layer micro model, 2 prompts x 2 samples of at most 16 tokens,
2 steps of which 1 warms up): both msrun jobs ran every step asked, and the JSON's figures are those the runs logged
in their own metrics.jsonl (kept with --runs_dir) after the warm-up."""

import json
import os
import subprocess
import sys

import pytest

from grpo.fakes import one_layer_micro  # tests/ is on the path (pyproject.toml)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def logged(folder, side):
    with open(os.path.join(folder, side, "metrics.jsonl")) as f:
        return {r["step"]: r for r in map(json.loads, f) if "time/step" in r}


@pytest.mark.slow  # two msrun jobs of two ranks, each compiling a micro model's graphs
def test_async_rollout_benchmark_runs_both_sides(tmp_path):
    out, runs = tmp_path / "ar.json", tmp_path / "runs"
    r = subprocess.run([sys.executable, "-m", "benchmarks.async_rollout", "--steps", "2", "--warmup", "1",
                        "--batch_size", "2", "--group", "2", "--micro_batch_size", "2", "--max_tokens", "16",
                        "--model", one_layer_micro(tmp_path), "--runs_dir", str(runs), "--output", str(out)],
                       capture_output=True, text=True, cwd=REPO, timeout=900,
                       env=dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert r.returncode == 0, r.stderr[-3000:] + r.stdout[-3000:]
    res = json.loads(out.read_text())
    sync, asyn = logged(runs, "sync"), logged(runs, "async")
    assert sorted(sync) == sorted(asyn) == [1, 2]  # every step asked, on both sides
    s, a = res["sides"]["sync"], res["sides"]["async"]
    assert s["timed_steps"] == a["timed_steps"] == [2]
    # the figures are step 2's, as each run logged it
    assert res["sync_step_s"] == s["step_s"] == sync[2]["time/step"]
    assert res["async_step_s"] == a["step_s"] == asyn[2]["time/step"]
    assert res["idle_s"]["sync"]["train"] == sync[2]["time/rollout"] > 0
    assert res["idle_s"]["async"]["rollout"] == asyn[2]["async/wait_seconds"]
    # the training rank idles waiting for the samples and in the weights' meeting: at least the former
    assert res["idle_s"]["async"]["train"] >= asyn[2]["async/train_wait_seconds"]
    # one step off: step 2 trains samples of the first weights (version 0), one update stale
    assert res["staleness_mean"] == asyn[2]["staleness/mean"] == 1.0 and "staleness/mean" not in sync[2]
    assert "partial/carried_groups" in asyn[2] and "partial/carried_groups" not in sync[2]  # a partial run
    assert a["rollout_generate_s"] > 0 and "async/generate_seconds" in asyn[2]  # a separate one
    assert res["matmul_gflops"]["peak"] > 0 and res["command"].startswith("python -m benchmarks.async_rollout")
    assert "| async (separate" in (tmp_path / "ar.md").read_text()

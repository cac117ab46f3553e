"""The tiny tool recipe learns (model_configs/qwen_grpo/tiny_tools): the shipped recipe unchanged, its warm start
on a teacher that calls the calculator in 40% of its conversations, then GRPO with the accuracy reward; held-out
greedy accuracy (with the calculator at hand) must rise by 0.3 and the policy must call the tool more often."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = os.path.join(REPO, "model_configs", "qwen_grpo", "tiny_tools", "grpo_config.yaml")


@pytest.mark.slow
def test_the_tiny_tool_recipe_learns_to_call_the_calculator(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, os.path.join(REPO, "scripts", "grpo_one_stage.py"), "--config", RECIPE,
           "--output_dir", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=5400)  # a hang guard
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    val = {m["step"]: m for m in rows if "val/accuracy" in m}
    first, last = val[min(val)], val[max(val)]
    assert last["val/accuracy"] >= first["val/accuracy"] + 0.3, {s: m["val/accuracy"] for s, m in val.items()}
    assert last["val/tool/calls_mean"] > first["val/tool/calls_mean"]
    calls = [m["tool/calls_mean"] for m in rows if "tool/calls_mean" in m]
    assert sum(calls[-5:]) > sum(calls[:5]), calls
    assert "final: val_accuracy start=" in r.stdout

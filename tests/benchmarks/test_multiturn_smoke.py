"""benchmarks/rollout.py --workloads multiturn on a few short conversations: both sides run, the re-prefill side
generates exactly the cache side's model tokens, and the results have the layout the README row reads."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_multiturn_benchmark_runs_both_sides(tmp_path):
    out = tmp_path / "mt.json"
    r = subprocess.run([sys.executable, "-m", "benchmarks.rollout", "--workloads", "multiturn", "--prompts", "2",
                        "--group", "4", "--max_tokens", "48", "--slots", "8", "--tool_workers", "2",
                        "--latency_ms", "20", "--output", str(out)],
                       capture_output=True, text=True, cwd=REPO, timeout=900,
                       env=dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())["configs"]["micro"]
    assert res["tool_calls"] > 0 and res["ratio"] > 0
    cache, reprefill = res["runs"]["cache"][0], res["runs"]["reprefill"][0]
    assert cache["model_tokens"] == reprefill["model_tokens"] == res["model_tokens"]
    # the warm-up compiled every shape the re-prefill side meets (its calls are fixed by the conversations); the cache
    # side's appends depend on the decode step at which each tool answers, which the machine's load moves, so a timed
    # run may meet a shape its warm-up did not (seen once in a fresh-clone CI, 2026-11-30): reported, not asserted
    assert reprefill["rounds"] >= 2 and reprefill["compiled_graphs"] == 0
    assert isinstance(cache["compiled_graphs"], int)
    assert "| micro |" in (tmp_path / "mt.md").read_text()

"""benchmarks.grpo_step end to end on a micro model: one measured step per side, output structure only."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # an end-to-end run of a benchmark script

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_grpo_step_writes_json_markdown_and_png(tmp_path):
    out = tmp_path / "grpo_step.json"
    r = subprocess.run([sys.executable, "-m", "benchmarks.grpo_step", "--configs", "micro",
                        "--steps", "1", "--new_tokens", "8", "--shared", str(tmp_path / "absent"),
                        "--output", str(out)],
                       capture_output=True, text=True, cwd=REPO, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    c = res["configs"]["micro"]
    for side in ("mindgrpo", "trl"):
        for key in ("step", "generation", "reference", "old_logprobs", "update", "sync", "other"):
            assert c[f"{side}_{key}_s"] >= 0.0, (side, key)
        assert c[f"{side}_tokens_per_s"] > 0 and c[f"{side}_update_gflops_per_s"] > 0
        assert len(c[f"{side}_steps"]) == 2  # warm-up + 1
    assert c["trl_torch_threads"] == os.cpu_count()  # every core (a MindSpore parent leaves OMP_NUM_THREADS=1 to children)
    assert c["speedup"] == c["trl_step_s"] / c["mindgrpo_step_s"]
    assert c["generated_tokens"] == 4 * 4 * 8 and c["prompts"] == "synthetic"
    assert c["mindspore_matmul_gflops"]["peak"] > 0 and c["torch_matmul_gflops"]["peak"] > 0
    assert c["mindgrpo_update_pct_of_mindspore_peak"] > 0 and c["trl_update_pct_of_torch_peak"] > 0
    md = (tmp_path / "grpo_step.md").read_text()
    assert "| micro |" in md and "| update |" in md and res["command"] in md
    assert (tmp_path / "grpo_step.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

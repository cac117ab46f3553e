"""benchmarks.grpo_step end to end on a micro model: one measured step per side; the reported figures are the
measured step's (not the warm-up's), both sides did the same work, and the files show what the JSON holds."""

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
        steps = c[f"{side}_steps"]
        assert len(steps) == 2  # warm-up + 1
        # the figures are the measured step's, not the warm-up's (which compiles): with one step, that step's own
        assert c[f"{side}_step_s"] == steps[1]["step"] and c[f"{side}_first_step_s"] == steps[0]["step"]
        assert c[f"{side}_update_s"] == steps[1]["update"]
    assert c["trl_torch_threads"] == os.cpu_count()  # every core (a MindSpore parent leaves OMP_NUM_THREADS=1 to children)
    # the same work on both sides: 4 synthetic prompts x G=4 x 8 forced tokens (each side raises on another count)
    assert c["generated_tokens"] == 4 * 4 * 8 and c["prompts"] == "synthetic"
    assert set(c["mindspore_matmul_gflops"]) == set(c["torch_matmul_gflops"])  # the same shapes timed on each side
    md = (tmp_path / "grpo_step.md").read_text()
    assert "| micro |" in md and "| update |" in md and res["command"] in md
    assert f"{c['speedup']:.2f}x" in md  # the table shows the figure the JSON holds
    assert (tmp_path / "grpo_step.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

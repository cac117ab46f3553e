"""benchmarks/rollout.py on a few short samples: the three sides run in their own processes and the
results have the layout the README and the issue quote."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEYS = {"engine_tokens_per_s", "static_tokens_per_s", "transformers_tokens_per_s", "useful_fraction",
        "static_useful_fraction", "peak_rss_gb"}


@pytest.mark.slow
def test_rollout_benchmark_writes_every_side_and_workload(tmp_path):
    out = tmp_path / "rollout.json"
    r = subprocess.run([sys.executable, "-m", "benchmarks.rollout", "--configs", "tiny-small-vocab", "--prompts", "2",
                        "--group", "4", "--max_tokens", "8", "--slots", "8", "--output", str(out)],
                       capture_output=True, text=True, cwd=REPO, timeout=900,
                       env=dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    per = res["configs"]["tiny-small-vocab"]
    assert set(per) == {"longtail", "forced"}
    for kind, summary in per.items():
        assert set(summary) == KEYS, kind
        assert all(summary[k] > 0 for k in KEYS), kind
    # forced: every sample runs the whole length on every side; the static batch (2 prompts x 4) fills
    # its 8-row bucket, so none of its rows is padding
    forced = res["details"]["tiny-small-vocab"]["forced"]
    assert all(forced[side]["runs"][0]["tokens"] == 2 * 4 * 8 for side in ("engine", "static", "transformers"))
    assert per["forced"]["static_useful_fraction"] == 1.0
    assert "| tiny-small-vocab | longtail |" in (tmp_path / "rollout.md").read_text()

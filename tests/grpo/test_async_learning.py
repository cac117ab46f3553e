"""The shipped recipe learns asynchronously (issue 46, docs/async.md): scripts/run_grpo.sh with 2 workers,
`generate_config.placement=separate rl_config.off_policy_steps=1` and nothing else changed (flawed-teacher warm start
on the training rank, 20 GRPO steps whose rollouts run one update behind on the rollout rank, validation on the
rollout rank's weights). Held-out greedy accuracy, read from the training rank's metrics.jsonl, must rise by 0.3
between step 0 and step 20, as the one-process recipe does (tests/grpo/test_learning.py). No rl_config key is set
for the asynchronous schedule (no rollout_correction): one update of staleness at lr 1e-4 did not hold the recipe
back (seed 1 rose 0.26 -> 0.74 when measured, 2026-11-29; the one-process recipe rises 0.40-0.47). 540 s at load 4-5
(the warm start's 500 steps on rank 0 most of it: 5.5 minutes; the 20 GRPO steps 2 minutes)."""

import json
import os
import subprocess

import pytest

from parallel.msrun_util import REPO, free_port, msrun_path, python_path


@pytest.mark.slow
@pytest.mark.msrun
def test_the_tiny_default_learns_one_step_off_policy_on_a_separate_rollout_rank(tmp_path):
    msrun_path()
    out = tmp_path / "run"
    cmd = ["bash", os.path.join(REPO, "scripts", "run_grpo.sh"), "--worker_num", "2", "--local_worker_num", "2",
           "--master_port", str(free_port()), "--log_dir", str(tmp_path / "log"), "--timeout", "3000", "--",
           "--output_dir", str(out), "generate_config.placement=separate", "rl_config.off_policy_steps=1"]
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

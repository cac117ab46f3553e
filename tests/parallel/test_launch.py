"""Launch paths: --only_save_strategy, and scripts/run_grpo.sh reporting a failing rank's error."""

import os
import subprocess
import sys

import pytest
from mindspore.parallel import build_searched_strategy

from msrun_util import REPO, free_port, msrun_path, python_path


def test_only_save_strategy_writes_both_layouts(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "grpo_one_stage.py"), "--only_save_strategy",
                           "True", "--output_dir", str(tmp_path), "actor_config.parallel_config.model_parallel=2",
                           "generate_config.parallel_config.data_parallel=2"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    paths = proc.stdout.split()
    assert [os.path.basename(p) for p in paths] == ["train_strategy.ckpt", "infer_strategy.ckpt"]
    train, infer = (build_searched_strategy(p) for p in paths)
    wq = "model.layers.0.attention.wq.weight"
    assert list(train[wq].dev_matrix[0].dim) == [1, 2] and list(train[wq].tensor_map[0].dim) == [0, -1]
    assert list(infer[wq].dev_matrix[0].dim) == [2, 1]
    assert "adam_m." + wq in train and "adam_m." + wq not in infer


@pytest.mark.msrun
@pytest.mark.slow
def test_run_grpo_sh_exits_nonzero_with_the_failing_rank_error(tmp_path):
    msrun_path()
    proc = subprocess.run(["bash", os.path.join(REPO, "scripts", "run_grpo.sh"), "--worker_num", "2",
                           "--master_port", str(free_port()), "--log_dir", str(tmp_path / "log"), "--timeout", "240",
                           "--", "--output_dir", str(tmp_path / "out"),
                           "actor_config.parallel_config.model_parallel=3"],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env=dict(os.environ, PATH=python_path()))
    assert proc.returncode != 0
    assert "run_grpo.sh: rank 0 failed" in proc.stderr or "run_grpo.sh: rank 1 failed" in proc.stderr
    assert ("actor_config.parallel_config: data_parallel*model_parallel*pipeline_stage = 3, but the world size is 2"
            in proc.stderr)

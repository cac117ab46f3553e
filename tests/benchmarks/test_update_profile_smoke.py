"""benchmarks.update_profile on a micro model: the profile is read and every part accounted for."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks.update_profile import op_kind

pytestmark = pytest.mark.slow  # an end-to-end run of a benchmark script

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_op_kinds():

    assert op_kind("MatMul", [(4, 8), (8, 512)], 512) == "matmul"
    assert op_kind("BatchMatMul", [(2, 4, 8)], 512) == "matmul"
    assert op_kind("AssignAdd", [(512, 8), (512, 8)], 512) == "accumulation"
    assert op_kind("LogSoftmax", [(256, 512)], 512) == "vocabulary"
    assert op_kind("Mul", [(4, 224, 64), (4, 224, 64)], 512) == "other"


def test_update_profile_accounts_for_the_update(tmp_path):
    out = tmp_path / "update_profile.json"
    r = subprocess.run([sys.executable, "-m", "benchmarks.update_profile", "--config", "micro",
                        "--prompts", "2", "--group", "2", "--new_tokens", "8", "--micro_batch", "2", "--steps", "1",
                        "--output", str(out)], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())["result"]
    ops = res["profiled_ops_s"]
    assert set(ops) == {"matmul", "vocabulary", "accumulation", "other"}
    assert ops["matmul"] > 0 and ops["vocabulary"] > 0 and ops["accumulation"] > 0 and ops["other"] > 0
    assert res["micro_batches"] == 2 and res["scored"] == [4, 32]
    for r in res["rounds"]:  # each round's parts add up to its update
        assert abs(r["graphs"] + r["adamw"] + r["host"] - r["update"]) < 1e-9
        assert r["peak"]["peak"] == max(v for k, v in r["peak"].items() if k != "peak")
    # rates only: the profiled matmuls and the timed update run in different rounds, so on a loaded machine
    # either can be the slower (the fresh-clone CI of 595bf31 timed the matmuls alone at 5.3 GFLOP/s, the
    # whole update at 7.7): no order between them is asserted
    assert res["matmul_only_gflops_per_s"] > 0 and res["update_gflops_per_s"] > 0
    assert "| update (as the trainer runs it) |" in (tmp_path / "update_profile.md").read_text()

"""benchmarks.decode_bound on a small head: every measure is taken and the floors follow from them."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # an end-to-end run of a benchmark script

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_decode_bound_measures_and_derives_the_floors(tmp_path):
    out = tmp_path / "decode_bound.json"
    r = subprocess.run([sys.executable, "-m", "benchmarks.decode_bound", "--vocab", "2048",
                        "--hidden", "64", "--batch", "4", "--rounds", "2", "--calls", "2", "--output", str(out)],
                       capture_output=True, text=True, cwd=REPO, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    m, rounds = res["medians"], res["rounds"]
    assert len(rounds) == 2
    for key in ("read_1_core_gbps", "read_2_cores_gbps", "mindspore_head_ms", "torch_head_ms", "mindspore_peak_gflops"):
        assert all(r[key] > 0 for r in rounds), key
        assert m[key] == pytest.approx((rounds[0][key] + rounds[1][key]) / 2), key
    nbytes, flops = 2048 * 64 * 4, 2 * 4 * 2048 * 64
    assert abs(m["read_floor_ms"] - nbytes / m["read_2_cores_gbps"] / 1e6) < 1e-9
    assert abs(m["matmul_floor_ms"] - flops / m["mindspore_peak_gflops"] / 1e6) < 1e-9
    assert abs(m["mindspore_head_gflops"] - flops / m["mindspore_head_ms"] / 1e6) < 1e-9
    assert "| read, 2 cores at once |" in (tmp_path / "decode_bound.md").read_text()

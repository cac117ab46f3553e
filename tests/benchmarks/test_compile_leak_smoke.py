"""benchmarks/compile_leak.py: the cycles of fresh models and parts run and are reported, and no model
outlives its part (tests/grpo/test_graph_lifetime.py says why); the slope is a least-squares one."""

import json

import pytest

from benchmarks import compile_leak


def test_slope_is_the_least_squares_change_per_step():
    assert compile_leak.slope([5.0, 7.0, 9.0, 11.0]) == pytest.approx(2.0)
    assert compile_leak.slope([1.0, 3.0, 2.0]) == pytest.approx(0.5)  # by hand: x = 0, 1, 2; sum(dx * dy) / sum(dx^2)


@pytest.mark.slow
def test_cycles_write_every_part(tmp_path):
    out = tmp_path / "compile_leak.json"
    assert compile_leak.main(["--cycles", "3", "--tiny_steps", "0", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    for kind in ("score", "update", "recompile"):
        r = res["cycles"][kind]
        assert len(r["rss_mb"]) == 3 and all(v > 100 for v in r["rss_mb"])  # MindSpore alone is hundreds of MB
        assert len(r["objects"]) == 3
        assert r["models_alive"] == (None if kind == "recompile" else 0)
    assert "| update |" in (tmp_path / "compile_leak.md").read_text()

"""scripts/check_device.py (mindgrpo/parallel/device_check.py): every check passes in one process and on two msrun
workers; a broken weight sync fails the reshard check, named, with a non-zero exit."""

import os

import pytest

from mindgrpo.parallel import reshard
from mindgrpo.parallel.device_check import CHECKS
from msrun_util import REPO, run_msrun
from scripts import check_device


def lines(text):
    return [ln for ln in text.splitlines() if ln.startswith(("pass ", "FAIL "))]


@pytest.mark.slow
def test_every_check_passes_in_one_process(capsys):
    assert check_device.main([]) == 0
    out = lines(capsys.readouterr().out)
    assert [ln.split()[:2] for ln in out] == [["pass", name] for name in CHECKS]


def test_a_broken_sync_fails_the_reshard_check_naming_it(monkeypatch, capsys):
    """The sync's buckets skipped: the destination keeps its own (other) weights, not the numpy plan's bits."""
    monkeypatch.setattr(reshard._Bucket, "__call__", lambda self, src: None)
    assert check_device.main(["--checks", "reshard,swap"]) == 1
    out = lines(capsys.readouterr().out)
    assert out[0].startswith("FAIL  reshard") and "not the numpy plan's bits: lm_head.weight" in out[0], out
    assert out[1].startswith("pass  swap"), out


@pytest.mark.msrun
@pytest.mark.slow
def test_every_check_passes_on_two_msrun_workers(tmp_path):
    run_msrun(os.path.join(REPO, "scripts", "check_device.py"), 2, str(tmp_path / "log"), timeout=900)
    with open(os.path.join(str(tmp_path / "log"), "worker_0.log")) as f:
        out = lines(f.read())
    assert [ln.split()[:2] for ln in out] == [["pass", name] for name in CHECKS], out
    assert "over 2 ranks exact" in out[2] and "ParallelLayout(dp=1, tp=2, pp=1) -> ParallelLayout(dp=2" in out[3], out

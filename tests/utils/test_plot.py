"""plot_training: a PNG from a fake metrics.jsonl; no crash without matplotlib or data."""

import json
import logging
import math
import os
import sys

import pytest

from mindgrpo.utils.plot import plot_training, read_series

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _fake_metrics(path, steps=40):
    with open(path, "w") as f:
        for step in range(1, steps + 1):
            acc = 0.2 + 0.5 * (1 - math.exp(-step / 12))
            row = {
                "step": step,
                "reward_mean": acc + 0.3 * min(step / 10, 1.0),
                "reward/accuracy/mean": acc,
                "reward/format/mean": min(step / 10, 1.0),
                "train/accuracy": acc,
                "response_length/mean": 180 - 1.5 * step,
                "response_length/max": 256 if step < 15 else 220,
                "loss": None if step == 7 else 0.1,
            }
            if step % 10 == 0:
                row["val/accuracy"] = acc - 0.05
            f.write(json.dumps(row) + "\n")
        f.write('{"step": 41, "reward_me')  # a torn last line


def test_read_series(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        '{"step": 2, "a": 2.0, "b": null, "flag": true, "s": "x"}\n'
        "\n"
        '{"step": 1, "a": 1.0, "b": 5}\n'
        '{"step": 2, "a": 20.0}\n'  # a duplicated step: the last line wins
        "[1, 2]\n"
        '{"step": 3, "a": 3.0\n'
    )
    assert read_series(str(path)) == {"a": ([1, 2], [1.0, 20.0]), "b": ([1], [5.0])}


def test_plot_training(tmp_path):
    pytest.importorskip("matplotlib")
    metrics = tmp_path / "run" / "metrics.jsonl"
    metrics.parent.mkdir()
    _fake_metrics(metrics)
    series = read_series(str(metrics))
    assert series["val/accuracy"][0] == [10, 20, 30, 40] and len(series["loss"][0]) == 39

    out = tmp_path / "plots" / "training.png"
    assert plot_training(str(metrics), str(out)) == str(out)
    with open(out, "rb") as f:
        assert f.read(8) == PNG_SIGNATURE
    assert os.path.getsize(out) > 10_000
    assert os.listdir(out.parent) == ["training.png"]  # no temporary file left


def test_plot_training_without_data(tmp_path):
    pytest.importorskip("matplotlib")
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1, "loss": 0.5}\n')
    out = tmp_path / "training.png"
    assert plot_training(str(metrics), str(out)) == str(out)  # three empty panels, still a PNG
    assert out.read_bytes()[:8] == PNG_SIGNATURE


def test_plot_never_raises(tmp_path, caplog):
    out = tmp_path / "training.png"
    with caplog.at_level(logging.WARNING, logger="mindgrpo.utils.plot"):
        assert plot_training(str(tmp_path / "missing.jsonl"), str(out)) is None
    assert "could not plot" in caplog.text
    assert os.listdir(tmp_path) == []


def test_plot_without_matplotlib(tmp_path, monkeypatch, caplog):
    metrics = tmp_path / "metrics.jsonl"
    _fake_metrics(metrics)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import now raises ImportError
    with caplog.at_level(logging.WARNING, logger="mindgrpo.utils.plot"):
        assert plot_training(str(metrics), str(tmp_path / "training.png")) is None
    assert "matplotlib is not installed" in caplog.text
    assert not (tmp_path / "training.png").exists()

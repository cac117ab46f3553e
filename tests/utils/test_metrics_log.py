"""MetricsLogger (JSONL, TensorBoard, console) and per-rank setup_logging."""

import json
import logging
import math
import os

import numpy as np
import pytest

from mindgrpo.utils.metrics_log import MetricsLogger, setup_logging, to_json_value


def _lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def _jsonl(path):
    return [json.loads(line) for line in _lines(path)]


def test_to_json_value():
    import mindspore as ms

    assert to_json_value(np.float32(0.5)) == 0.5 and type(to_json_value(np.float32(0.5))) is float
    assert to_json_value(np.int64(3)) == 3 and type(to_json_value(np.int64(3))) is int
    assert to_json_value(np.bool_(True)) is True
    assert to_json_value(float("nan")) is None and to_json_value(-math.inf) is None
    assert to_json_value(np.array(2.5)) == 2.5
    assert to_json_value(np.array([1.0, np.nan])) == [1.0, None]
    assert to_json_value({"a": (1, np.float64(np.inf))}) == {"a": [1, None]}
    assert to_json_value(ms.Tensor(1.5, ms.float32)) == 1.5
    assert to_json_value("text") == "text" and to_json_value(None) is None


def test_log_writes_sorted_flushed_lines(tmp_path):
    logger = MetricsLogger(str(tmp_path), tensorboard=False, console=False)
    logger.log(1, {"reward_mean": 0.5, "loss": np.float32(0.25), "kl": float("nan"), "time/step": 2, "note": "ok"})
    # flushed while the logger is still open: a crash now keeps the line
    assert _lines(tmp_path / "metrics.jsonl") == [
        '{"step": 1, "kl": null, "loss": 0.25, "note": "ok", "reward_mean": 0.5, "time/step": 2}'
    ]
    logger.log(np.int64(2), {"step": 99, "loss": np.inf})  # the argument is the step
    logger.close()
    assert _jsonl(tmp_path / "metrics.jsonl")[1] == {"step": 2, "loss": None}
    assert not (tmp_path / "tensorboard").exists()


def test_log_to_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsLogger(str(tmp_path), console=False) as logger:
        for step in (1, 2, 3):
            logger.log(step, {"loss": 1.0 / step, "kl": float("nan"), "ok": True, "note": "x", "rows": [1, 2]})
        logger.log_text(3, "completions", "**prompt** 1+1= → 2")
        acc = EventAccumulator(str(tmp_path / "tensorboard"))
        acc.Reload()  # readable before close: each step is flushed
    assert sorted(acc.Tags()["scalars"]) == ["kl", "loss", "ok"]  # strings and lists are not scalars
    loss = acc.Scalars("loss")
    assert [e.step for e in loss] == [1, 2, 3]
    assert [e.value for e in loss] == pytest.approx([1.0, 0.5, 1 / 3], rel=1e-6)
    assert all(math.isnan(e.value) for e in acc.Scalars("kl"))
    assert [e.value for e in acc.Scalars("ok")] == [1.0, 1.0, 1.0]
    (text,) = acc.Tensors("completions")
    assert text.step == 3 and text.tensor_proto.string_val == ["**prompt** 1+1= → 2".encode()]


def test_console_line(tmp_path, caplog):
    logger = MetricsLogger(str(tmp_path), tensorboard=False)
    metrics = {"loss": 0.123456, "reward_mean": 0.5, "val/accuracy": float("nan"), "grad_norm": 3, "time/step": 2.25,
               "pg_loss": 0.1}
    with caplog.at_level(logging.INFO, logger="mindgrpo.utils.metrics_log"):
        logger.log(7, metrics)
    logger.close()
    assert caplog.messages == [
        "step 7 | loss 0.1235 | reward_mean 0.5 | val/accuracy nan | grad_norm 3 | time/step 2.25"]
    assert logger.console_line(1, {}) == "step 1"


def test_other_ranks_write_no_files(tmp_path, caplog):
    logger = MetricsLogger(str(tmp_path / "out"), rank=1)
    with caplog.at_level(logging.INFO, logger="mindgrpo.utils.metrics_log"):
        logger.log(1, {"loss": 1.0})
    logger.log_completions(1, [{"completion": "x"}])
    assert logger.truncate_after(1) == 0
    logger.close()
    assert caplog.messages == ["step 1 | loss 1"]
    assert not (tmp_path / "out").exists()


def test_log_completions(tmp_path):
    with MetricsLogger(str(tmp_path), tensorboard=False, console=False) as logger:
        logger.log_completions(3, [{"prompt": "1+1=", "completion": "2 ✓", "reward": np.float32(1.0)},
                                   {"prompt": "2+2=", "completion": "5", "reward": float("nan"), "step": 0}])
    lines = _lines(tmp_path / "completions.jsonl")
    assert lines[0] == '{"step": 3, "prompt": "1+1=", "completion": "2 ✓", "reward": 1.0}'
    assert json.loads(lines[1]) == {"step": 3, "prompt": "2+2=", "completion": "5", "reward": None}


def test_truncate_after_resume(tmp_path):
    with MetricsLogger(str(tmp_path), tensorboard=False, console=False) as first:
        for step in range(1, 6):
            first.log(step, {"loss": float(step)})
            first.log_completions(step, [{"completion": f"c{step}"}])
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "loss"')  # a crash mid-line

    with MetricsLogger(str(tmp_path), tensorboard=False, console=False) as resumed:
        assert resumed.truncate_after(4) == 3  # steps 4 and 5, and the torn line
        for step in (4, 5):
            resumed.log(step, {"loss": 10.0 * step})
            resumed.log_completions(step, [{"completion": f"new{step}"}])
    assert [(r["step"], r["loss"]) for r in _jsonl(tmp_path / "metrics.jsonl")] == [
        (1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0), (5, 50.0)]
    assert [r["completion"] for r in _jsonl(tmp_path / "completions.jsonl")] == ["c1", "c2", "c3", "new4", "new5"]
    assert not [name for name in os.listdir(tmp_path) if ".tmp." in name]


def test_truncate_after_in_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsLogger(str(tmp_path), console=False) as first:
        for step in range(1, 6):
            first.log(step, {"loss": float(step)})
    with MetricsLogger(str(tmp_path), console=False) as resumed:
        resumed.truncate_after(4)
        resumed.log(4, {"loss": 40.0})
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]


def test_torn_last_line_is_not_glued(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "lo')
    with MetricsLogger(str(tmp_path), tensorboard=False, console=False) as logger:
        logger.log(3, {"loss": 3.0})
    assert _lines(tmp_path / "metrics.jsonl")[1:] == ['{"step": 2, "lo', '{"step": 3, "loss": 3.0}']


@pytest.fixture
def restore_root_logger():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in root.handlers[:]:
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)


def test_setup_logging_per_rank(tmp_path, capsys, restore_root_logger):
    path = setup_logging(str(tmp_path), rank=3)
    path = setup_logging(str(tmp_path), rank=3)  # again: replaces its handlers, no duplicate lines
    assert path == str(tmp_path / "logs" / "rank_3.log")
    logging.getLogger("mindgrpo.test").info("hello from %s", "rank three")
    logging.getLogger("mindgrpo.test").debug("not shown")
    for handler in logging.getLogger().handlers:
        handler.flush()
    (line,) = _lines(path)
    assert line.endswith(" [rank 3] INFO mindgrpo.test: hello from rank three")
    assert line[:4].isdigit()  # starts with the time
    assert "[rank 3] INFO mindgrpo.test: hello from rank three" in capsys.readouterr().err

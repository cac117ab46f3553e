"""Training logs: per-rank Python logging, and one metrics logger for console, JSONL and TensorBoard.

    log_file = setup_logging(output_dir, rank)        # console + <output_dir>/logs/rank_<k>.log
    metrics = MetricsLogger(output_dir, rank)
    metrics.truncate_after(resume_step)               # when resuming: drop steps >= resume_step
    metrics.log(step, {"loss": 0.3, "reward_mean": 0.5, "time/step": 2.1})
    metrics.log_completions(step, [{"prompt": ..., "completion": ..., "reward": 1.0}])
    metrics.close()

Files (rank 0 only; the other ranks only log to the console and their own log file):

    <output_dir>/metrics.jsonl       one object per step: {"step": 3, <metrics, keys sorted>}
    <output_dir>/completions.jsonl   one object per completion: {"step": 3, <row>}
    <output_dir>/tensorboard/        every numeric metric, tagged with its name

Every line is flushed as it is written, so a crash keeps everything logged before it.
NaN and infinities are written as null (JSON has no NaN); TensorBoard gets them as they are.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import os
import sys
from typing import Any, Iterable, List, Mapping, Optional, Sequence

from mindgrpo.utils.tensorboard import SummaryWriter

logger = logging.getLogger(__name__)

# The metrics shown on the console line, in this order, when present.
CONSOLE_KEYS = (
    "loss",
    "reward_mean",
    "accuracy",
    "train/accuracy",
    "val/accuracy",
    "grad_norm",
    "kl",
    "lr",
    "time/step",
)

LOG_FORMAT = "%(asctime)s [rank %(rank)d] %(levelname)s %(name)s: %(message)s"


# ---------------------------------------------------------------------------------------
# Python logging, one file per rank
# ---------------------------------------------------------------------------------------


class _RankFilter(logging.Filter):
    """Stamps every record with the rank, for LOG_FORMAT."""

    def __init__(self, rank: int):
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        return True


def setup_logging(output_dir: str, rank: int = 0, level: int = logging.INFO) -> str:
    """Log every rank to the console and to <output_dir>/logs/rank_<rank>.log; returns that path.

    Configures the root logger. Calling it again replaces the handlers it added before
    (not anyone else's), so it is safe to call once per run in the same process.
    """
    log_dir = os.path.join(output_dir, "logs")
    os.makedirs(log_dir, exist_ok=True)
    path = os.path.join(log_dir, f"rank_{rank}.log")

    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "_mindgrpo_setup", False)]:
        root.removeHandler(handler)
        handler.close()

    formatter = logging.Formatter(LOG_FORMAT)
    for handler in (logging.StreamHandler(sys.stderr), logging.FileHandler(path, encoding="utf-8")):
        handler.setFormatter(formatter)
        handler.addFilter(_RankFilter(rank))
        handler._mindgrpo_setup = True
        root.addHandler(handler)
    root.setLevel(level)
    return path


# ---------------------------------------------------------------------------------------
# Values -> JSON
# ---------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """`value` as Python scalars/lists/dicts; numpy and MindSpore scalars become int/float/bool, NaN stays."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if callable(getattr(value, "item", None)) and getattr(value, "size", None) == 1:
        return _plain(value.item())  # numpy bool, 0-d arrays and tensors; a host sync for a device tensor
    if callable(getattr(value, "tolist", None)):
        return _plain(value.tolist())
    return str(value)


def _json_safe(value: Any) -> Any:
    """A copy of a `_plain` value with NaN and infinities replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def to_json_value(value: Any) -> Any:
    """A JSON-safe copy of `value`: numpy/MindSpore scalars as Python numbers, NaN/inf as None."""
    return _json_safe(_plain(value))


def _dump_line(obj: Mapping[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False, allow_nan=False)


def _read_jsonl(path: str) -> List[str]:
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def _step_of(line: str) -> Optional[int]:
    """The step of one JSONL line, or None if the line is torn or has no step."""
    try:
        step = json.loads(line).get("step")
    except (ValueError, AttributeError):
        return None
    return step if isinstance(step, int) else None


def _keep_before(path: str, step: int) -> int:
    """Rewrite `path` (atomically) without lines of step >= `step` or torn lines; returns lines dropped."""
    if not os.path.exists(path):
        return 0
    lines = _read_jsonl(path)
    kept = []
    for line in lines:
        line_step = _step_of(line)
        if line_step is not None and line_step < step:
            kept.append(line)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in kept))
    os.replace(tmp, path)
    return len(lines) - len(kept)


# ---------------------------------------------------------------------------------------
# The metrics logger
# ---------------------------------------------------------------------------------------


class _JsonlFile:
    """An append-only JSONL file, opened on first write and flushed after every line."""

    def __init__(self, path: str):
        self.path = path
        self._file = None

    def write(self, obj: Mapping[str, Any]) -> None:
        if self._file is None:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")
            if self._file.tell() > 0 and not _ends_with_newline(self.path):
                self._file.write("\n")  # a crash tore the last line: do not glue the next one to it
        self._file.write(_dump_line(obj) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _ends_with_newline(path: str) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


class MetricsLogger:
    """Logs a step's metrics to the console (every rank) and to JSONL and TensorBoard (rank 0)."""

    def __init__(
        self,
        output_dir: str,
        rank: int = 0,
        tensorboard: bool = True,
        console: bool = True,
        console_keys: Sequence[str] = CONSOLE_KEYS,
    ):
        self.output_dir = output_dir
        self.rank = rank
        self.console = console
        self.console_keys = tuple(console_keys)
        self.writes_files = rank == 0
        self.metrics_path = os.path.join(output_dir, "metrics.jsonl")
        self.completions_path = os.path.join(output_dir, "completions.jsonl")
        self.tensorboard_dir = os.path.join(output_dir, "tensorboard")
        self._metrics = _JsonlFile(self.metrics_path)
        self._completions = _JsonlFile(self.completions_path)
        self._tb = SummaryWriter(self.tensorboard_dir) if tensorboard and self.writes_files else None

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """One step's metrics: a metrics.jsonl line, TensorBoard scalars, a console line."""
        step = int(step)
        plain = {str(k): _plain(v) for k, v in metrics.items() if k != "step"}
        values = _json_safe(plain)
        if self.writes_files:
            self._metrics.write({"step": step, **dict(sorted(values.items()))})
            if self._tb is not None:
                scalars = {k: float(v) for k, v in plain.items() if isinstance(v, (bool, int, float))}
                self._tb.add_scalars(scalars, step)
                self._tb.flush()
        if self.console:
            logger.info(self.console_line(step, values))

    def console_line(self, step: int, metrics: Mapping[str, Any]) -> str:
        """`step 3 | loss 0.3 | reward_mean 0.5 | time/step 2.1`: the console keys present in `metrics`."""
        parts = [f"step {step}"]
        for key in self.console_keys:
            if key in metrics:
                parts.append(f"{key} {_format_value(metrics[key])}")
        return " | ".join(parts)

    def log_completions(self, step: int, rows: Iterable[Mapping[str, Any]]) -> None:
        """Append each row (prompt, completion, rewards, ...) to completions.jsonl, tagged with `step`."""
        if not self.writes_files:
            return
        for row in rows:
            values = {str(k): to_json_value(v) for k, v in row.items() if k != "step"}
            self._completions.write({"step": int(step), **values})

    def log_text(self, step: int, tag: str, text: str) -> None:
        """Text (e.g. a sample completion) in TensorBoard's Text tab."""
        if self._tb is not None:
            self._tb.add_text(tag, text, int(step))
            self._tb.flush()

    def truncate_after(self, step: int) -> int:
        """Before resuming at `step`: drop logged lines with step >= `step`; returns metrics lines dropped.

        Also drops torn lines (a crash mid-write) from both JSONL files, and tells TensorBoard
        that the run restarted at `step`, so it hides the old run's points from `step` on.
        """
        if not self.writes_files:
            return 0
        self._metrics.close()
        self._completions.close()
        dropped = _keep_before(self.metrics_path, step)
        _keep_before(self.completions_path, step)
        if self._tb is not None:
            self._tb.add_session_start(int(step))
            self._tb.flush()
        return dropped

    def close(self) -> None:
        self._metrics.close()
        self._completions.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _format_value(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "nan" if value is None else str(value)
    if isinstance(value, int):
        return str(value)
    return f"{value:.4g}"

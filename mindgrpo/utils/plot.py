"""A PNG of a run's training curves, drawn from its metrics.jsonl.

    plot_training("out/metrics.jsonl", "out/training.png")

Three panels against step:
    reward             reward_mean, and reward/<name>/mean for each reward function
    accuracy           val/accuracy (points: validation runs every few steps), train/accuracy
    response length   response_length/mean, response_length/max

Missing metrics leave their panel empty. Nulls (NaN when logged) are skipped. If a step
appears twice (a resumed run that did not truncate), its last line wins.

matplotlib is optional: without it, or on any plotting error, this logs a warning and
returns None, so a plot never stops training. The PNG is written to a temporary file and
renamed, so a reader never sees half an image.
"""

from __future__ import annotations

import json
import logging
import os
import re
from typing import Dict, List, Optional, Tuple

logger = logging.getLogger(__name__)

_REWARD_FN = re.compile(r"^reward/(.+)/mean$")

Series = Tuple[List[int], List[float]]


def read_series(metrics_jsonl_path: str) -> Dict[str, Series]:
    """{metric: (steps, values)} of every numeric metric, sorted by step; torn lines skipped."""
    by_step: Dict[int, dict] = {}
    with open(metrics_jsonl_path, encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int):
                by_step[row["step"]] = row
    series: Dict[str, Series] = {}
    for step in sorted(by_step):
        for key, value in by_step[step].items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                steps, values = series.setdefault(key, ([], []))
                steps.append(step)
                values.append(float(value))
    return series


def _panels(series: Dict[str, Series]) -> List[Tuple[str, List[Tuple[str, dict]]]]:
    """[(y label, [(metric, plot style)])] for the three panels."""
    reward = [("reward_mean", dict(linewidth=2.0, color="black"))]
    for key in sorted(series):
        match = _REWARD_FN.match(key)
        if match:
            reward.append((key, dict(linewidth=1.0, label=f"reward/{match.group(1)}")))
    accuracy = [
        ("train/accuracy", dict(linewidth=1.0)),
        ("val/accuracy", dict(marker="o", linewidth=1.0, markersize=4)),
    ]
    length = [
        ("response_length/mean", dict(linewidth=1.5)),
        ("response_length/max", dict(linewidth=1.0, linestyle="--")),
    ]
    return [("reward", reward), ("accuracy", accuracy), ("response length (tokens)", length)]


def plot_training(metrics_jsonl_path: str, out_png: str, title: Optional[str] = None) -> Optional[str]:
    """Draw the training curves of `metrics_jsonl_path` into `out_png`; returns its path, or None."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        logger.warning("matplotlib is not installed; not plotting %s", out_png)
        return None
    tmp = None
    try:
        series = read_series(metrics_jsonl_path)
        # Figure + the Agg canvas, not pyplot: no global backend switch, no figure registry to leak.
        fig = Figure(figsize=(7.0, 8.5), dpi=100, layout="constrained")
        FigureCanvasAgg(fig)
        panels = _panels(series)
        axes = fig.subplots(len(panels), 1, sharex=True)
        for ax, (name, lines) in zip(axes, panels):
            drawn = 0
            for key, style in lines:
                if key in series:
                    steps, values = series[key]
                    ax.plot(steps, values, **{"label": key, **style})
                    drawn += 1
            ax.set_ylabel(name)
            ax.grid(True, alpha=0.3)
            if drawn:
                ax.legend(fontsize="small", loc="best")
            else:
                ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="gray")
        axes[-1].set_xlabel("step")
        fig.suptitle(title or os.path.basename(os.path.dirname(os.path.abspath(metrics_jsonl_path))))

        os.makedirs(os.path.dirname(os.path.abspath(out_png)), exist_ok=True)
        tmp = f"{out_png}.tmp.{os.getpid()}"
        fig.savefig(tmp, format="png")
        os.replace(tmp, out_png)
        return out_png
    except Exception:  # noqa: BLE001 - a plot must never stop training
        logger.warning("could not plot %s into %s", metrics_jsonl_path, out_png, exc_info=True)
        if tmp is not None and os.path.exists(tmp):
            os.remove(tmp)
        return None

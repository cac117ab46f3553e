"""Where an msrun worker's time goes: one line per check with its wall and CPU seconds, the graphs it
compiled and the seconds those compiles took, so that a slow job can be read from its worker logs:

    grep '^\\[clock' LOG_DIR/worker_0.log

Counting wraps MindSpore's Cell compile (`_cell_graph_executor.compile`, which reports whether it
compiled a new graph or found the phase compiled); `ms.jit` functions are not counted. The wrapper is
installed once per process (several.py runs several workers in one).
"""

import resource
import time

from mindspore.graph.api import _cell_graph_executor

_TOTALS = {"graphs": 0, "compile_wall": 0.0, "compile_cpu": 0.0}


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _install():
    compile_cell = _cell_graph_executor.compile
    if getattr(compile_cell, "counted", False):
        return

    def counted(obj, *args, **kwargs):
        wall, cpu = time.perf_counter(), _cpu()
        phase, new = compile_cell(obj, *args, **kwargs)
        if new:
            _TOTALS["graphs"] += 1
            _TOTALS["compile_wall"] += time.perf_counter() - wall
            _TOTALS["compile_cpu"] += _cpu() - cpu
        return phase, new

    counted.counted = True
    _cell_graph_executor.compile = counted


def graphs_compiled() -> int:
    """Graphs this process has compiled so far (counted once a Clock has been made)."""
    return _TOTALS["graphs"]


class Clock:
    """`clock.mark(name)` prints what the process spent since the previous mark (or since the clock
    was made): wall and CPU seconds, graphs compiled and their compile seconds."""

    def __init__(self, worker: str):
        _install()
        self.worker = worker
        self.start = time.perf_counter()
        self.last = self._now()

    def _now(self):
        return time.perf_counter(), _cpu(), dict(_TOTALS)

    def mark(self, what: str) -> None:
        now = self._now()
        (w0, c0, t0), (w1, c1, t1) = self.last, now
        self.last = now
        print(f"[clock {self.worker}] {what}: wall {w1 - w0:.1f}s cpu {c1 - c0:.1f}s | "
              f"{t1['graphs'] - t0['graphs']} graphs compiled in {t1['compile_wall'] - t0['compile_wall']:.1f}s "
              f"(cpu {t1['compile_cpu'] - t0['compile_cpu']:.1f}s) | at {w1 - self.start:.1f}s", flush=True)

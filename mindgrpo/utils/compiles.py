"""The graphs this process has compiled and the time it spent compiling them.

    compiles.install()                  # once, before the graphs are built (idempotent)
    before = compiles.totals()          # Totals(graphs=0, seconds=0.0, cpu_seconds=0.0)
    ...                                 # graph calls: a Cell's first call (per input shapes) compiles
    spent = compiles.totals() - before  # what those calls compiled

On MindSpore a graph's first call compiles it, and compiling is most of a short run's time (the tiny
default's first step compiles 11 graphs in ~14 s, its later steps take ~1.3 s; DEVELOPERS.md, "Keeping the suite
fast"). The trainer reports each step's share (`time/compile`, `compile/graphs`: utils/progress.py), so a slow
first step, or a step that compiles again (new shapes, `rl_config.release_graphs`), says so.

Counting wraps MindSpore 2.10's Cell compile (`_cell_graph_executor.compile`, which returns whether it made a new
graph or found the phase compiled), a private name: where it is missing, `install()` returns False and the totals
stay 0. One process, one count: ranks run as threads (the tests) add to the same totals.
"""

from __future__ import annotations

import resource
import threading
import time
from typing import NamedTuple


class Totals(NamedTuple):
    graphs: int = 0  # new graphs compiled
    seconds: float = 0.0  # wall seconds in those compiles
    cpu_seconds: float = 0.0  # this process's CPU seconds in them (every thread's)

    def __sub__(self, other: "Totals") -> "Totals":
        return Totals(self.graphs - other.graphs, self.seconds - other.seconds, self.cpu_seconds - other.cpu_seconds)


_totals = Totals()
_lock = threading.Lock()


def process_cpu_seconds() -> float:
    """This process's CPU seconds so far, every thread's, user and system."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def install() -> bool:
    """Count from now on; True when counting (already installed, or installed now)."""
    try:
        from mindspore.graph.api import _cell_graph_executor as executor
    except ImportError:
        return False
    compile_cell = getattr(executor, "compile", None)
    if compile_cell is None:
        return False
    if getattr(compile_cell, "counts_compiles", False):
        return True

    def counted(obj, *args, **kwargs):
        global _totals
        wall, cpu = time.perf_counter(), process_cpu_seconds()
        out = compile_cell(obj, *args, **kwargs)
        if isinstance(out, tuple) and len(out) == 2 and out[1] is True:  # (phase, a new graph)
            spent = Totals(1, time.perf_counter() - wall, process_cpu_seconds() - cpu)
            with _lock:
                _totals = Totals(*(a + b for a, b in zip(_totals, spent)))
        return out

    counted.counts_compiles = True
    executor.compile = counted
    return True


def totals() -> Totals:
    """What this process has compiled since `install()`."""
    return _totals

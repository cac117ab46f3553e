"""Where an msrun worker's time goes: one line per check with its wall and CPU seconds, the graphs it
compiled and the seconds those compiles took, so that a slow job can be read from its worker logs:

    grep '^\\[clock' LOG_DIR/worker_0.log

The graphs are counted by the library's own count (`mindgrpo/utils/compiles.py`: MindSpore's Cell compile,
wrapped once per process; several.py runs several workers in one); `ms.jit` functions are not counted.
"""

import time

from mindgrpo.utils import compiles


def graphs_compiled() -> int:
    """Graphs this process has compiled so far (counted once a Clock has been made)."""
    return compiles.totals().graphs


class Clock:
    """`clock.mark(name)` prints what the process spent since the previous mark (or since the clock
    was made): wall and CPU seconds, graphs compiled and their compile seconds."""

    def __init__(self, worker: str):
        compiles.install()
        self.worker = worker
        self.start = time.perf_counter()
        self.last = self._now()

    def _now(self):
        return time.perf_counter(), compiles.process_cpu_seconds(), compiles.totals()

    def mark(self, what: str) -> None:
        now = self._now()
        (w0, c0, t0), (w1, c1, t1) = self.last, now
        self.last = now
        print(f"[clock {self.worker}] {what}: wall {w1 - w0:.1f}s cpu {c1 - c0:.1f}s | "
              f"{t1.graphs - t0.graphs} graphs compiled in {t1.seconds - t0.seconds:.1f}s "
              f"(cpu {t1.cpu_seconds - t0.cpu_seconds:.1f}s) | at {w1 - self.start:.1f}s", flush=True)

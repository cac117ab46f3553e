"""This process's last sign of progress and the phase it is in, read by the collective watchdog
(mindgrpo/parallel/watchdog.py).

    with heartbeat.phase("update"):      # the trainer's phases (utils/progress.Progress.phase enters them)
        for micro_batch in ...:
            graph(...)                   # may wait on another rank inside a collective
            heartbeat.beat()             # it came back: progress

Loops of blocking calls beat once per iteration (the decode loop, the pipeline schedules, host sums);
entering and leaving a phase beat too. A phase's first run compiles its graphs, which can take much
longer than any later call: `status()` says whether the innermost phase has ever finished, so that the
watchdog can allow for it. Outside every phase the process is in "start-up" (building, loading, the
warm start), which counts as a first run.

One process, one heartbeat: the state is module-level, written by the main thread and read by the
watchdog's thread (single assignments, atomic under the GIL). Time is read through one clock
(`time.monotonic`; tests install a manual one with `use_clock`, so the watchdog can be checked without sleeps).
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Dict, Iterator, List, Optional, Tuple

_clock: Callable[[], float] = time.monotonic
_last = _clock()  # the last beat
_tokens = 0  # tokens generated in this process so far (the decode loop counts them as it beats)
_active: List[str] = []  # phases running now, innermost last
_finished: set = set()  # phases that have run to the end at least once
_runs: Dict[str, int] = {}  # phase -> times entered
_stall: Optional[Tuple[str, int]] = None  # tests: (phase, run) that hangs this process (stall_at)
_stalled = False


def beat(tokens: int = 0) -> None:
    """Something that may wait on other ranks has just come back (having generated `tokens` tokens)."""
    global _last, _tokens
    _last = _clock()
    _tokens += int(tokens)


def tokens() -> int:
    """Tokens generated in this process so far: the in-step progress line's count (utils/progress.Ticker)."""
    return _tokens


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """The block runs as phase `name` (the innermost phase is the one a watchdog names)."""
    _runs[name] = _runs.get(name, 0) + 1
    if _stall == (name, _runs[name]):
        hang()
    _active.append(name)
    beat()
    try:
        yield
    finally:
        _active.pop()
        _finished.add(name)
        beat()


def status() -> Optional[Tuple[str, float, bool]]:
    """(phase, seconds since the last beat, whether this is the phase's first run), or None while a test
    stall holds this process (see stall_at)."""
    if _stalled:
        return None
    name = _active[-1] if _active else "start-up"
    return name, _clock() - _last, name not in _finished


def use_clock(clock: Callable[[], float]) -> None:
    """The clock beats and `status` read (seconds, never going back); `time.monotonic` unless a test sets
    another. Beats at once, so that idle time counts from now on the new clock."""
    global _clock
    _clock = clock
    beat()


def reset() -> None:
    """A new run in this process: its phases' first runs compile again."""
    _active.clear()
    _finished.clear()
    _runs.clear()
    beat()


def stall_at(name: str, run: int) -> None:
    """Tests only: the `run`-th entry into phase `name` hangs this process (see hang)."""
    global _stall
    _stall = (name, int(run))


def hang() -> None:
    """Tests only: hang this process for good, as a rank stuck outside any collective would; its own
    watchdog ignores it, so the other ranks' watchdogs must act."""
    global _stalled
    _stalled = True
    while True:
        time.sleep(3600)

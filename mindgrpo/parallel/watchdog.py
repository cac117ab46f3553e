"""A rank that makes no progress ends its job instead of hanging it.

On CPU (and, as HCCL's execution timeout is 30 minutes, on Ascend too) a collective whose peers never
arrive blocks its rank inside a graph call forever, and the whole msrun job with it. The collectives run
inside compiled graphs, so the bound has to come from the host: a thread that reads this process's
heartbeat (mindgrpo/utils/heartbeat.py: the trainer's phase and the last time a blocking call came back)
and, after `timeout_s` without progress, logs

    rank K: no progress in phase P for T s (a collective is waiting on another rank?)

and exits the process with EXIT_CODE (os._exit: the main thread is stuck, nothing else would run), so that
msrun ends the other ranks. A phase's first run compiles its graphs (minutes for a 32B model): until the
phase has finished once, the bound is `compile_timeout_s`.

    watchdog = Watchdog(rank, timeout_s=cfg.rl_config.collective_timeout_s,
                        compile_timeout_s=cfg.rl_config.compile_timeout_s).start()

`guard_rank` starts it for an msrun rank and also ties the rank to msrun (the rank gets SIGTERM when msrun
dies), so that no rank outlives a launcher that was killed. Tests make a rank stall with the environment
variable MINDGRPO_TEST_STALL="<rank>:<phase>:<run>": on the run-th entry into the phase (heartbeat.stall_at),
or at once for the phase "start-up" (before the initial weight sync, the first collective of a run).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from typing import Callable, Optional

from mindgrpo.utils import heartbeat
from mindgrpo.utils.process import die_with_parent

logger = logging.getLogger(__name__)

EXIT_CODE = 75  # EX_TEMPFAIL: the run can be resumed from its last checkpoint
STALL_ENV = "MINDGRPO_TEST_STALL"


class Watchdog:
    """Ends this process when the heartbeat stays still for too long; see the module docstring."""

    def __init__(self, rank: int, timeout_s: float, compile_timeout_s: float,
                 exit: Callable[[int], None] = os._exit, poll_s: Optional[float] = None):
        if not 0 < timeout_s <= compile_timeout_s:
            raise ValueError(f"need 0 < timeout_s <= compile_timeout_s, got {timeout_s} and {compile_timeout_s}")
        self.rank, self.timeout_s, self.compile_timeout_s = rank, float(timeout_s), float(compile_timeout_s)
        self.exit = exit
        self.poll_s = min(5.0, self.timeout_s / 10) if poll_s is None else poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="mindgrpo-watchdog", daemon=True)

    def start(self) -> "Watchdog":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            if self.check():
                return

    def check(self) -> bool:
        """One look at the heartbeat (its clock: `heartbeat.use_clock`): fires and returns True when it has been
        still for longer than the bound of its phase."""
        seen = heartbeat.status()
        if seen is None:  # a test stall: this rank is the one the others wait for
            return False
        phase, idle, first_run = seen
        if idle > (self.compile_timeout_s if first_run else self.timeout_s):
            self._fire(phase, idle)
            return True
        return False

    def _fire(self, phase: str, idle: float) -> None:
        message = (f"rank {self.rank}: no progress in phase {phase} for {idle:.0f} s "
                   "(a collective is waiting on another rank?)")
        where = f"rank {self.rank} is stuck at {main_thread_location()}"
        logger.error("%s; %s", message, where)
        print(f"watchdog: {message}\nwatchdog: {where}", file=sys.stderr, flush=True)
        for handler in logging.getLogger().handlers:  # the rank's log file, before the hard exit
            handler.flush()
        self.exit(EXIT_CODE)


_GUARD: Optional[Watchdog] = None  # one per process, like the heartbeat it reads


def main_thread_location() -> str:
    """`mindgrpo/<module>.py:<line> (<function>)` of the innermost mindgrpo frame the main thread is in."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if path.startswith(os.path.join(package, "mindgrpo") + os.sep):
            return f"{os.path.relpath(path, package)}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return "an unknown place (outside mindgrpo)"


def guard_rank(rank: int, timeout_s: float, compile_timeout_s: float) -> None:
    """For an msrun rank at the start of a run: SIGTERM when msrun (the parent) dies, and the process's
    Watchdog with these bounds (none when timeout_s is 0). A later run in the same process replaces the
    watchdog and starts a new heartbeat (its phases' first runs compile again). Reads the test stall variable."""
    global _GUARD
    die_with_parent(os.getppid(), signal.SIGTERM)
    if _GUARD is not None:
        _GUARD.stop()
        _GUARD = None
    heartbeat.reset()
    if timeout_s > 0:
        _GUARD = Watchdog(rank, timeout_s, compile_timeout_s).start()
    stall = os.environ.get(STALL_ENV)
    if stall:
        who, phase, run = stall.split(":")
        if int(who) == rank and phase == "start-up":
            heartbeat.hang()
        if int(who) == rank:
            heartbeat.stall_at(phase, int(run))

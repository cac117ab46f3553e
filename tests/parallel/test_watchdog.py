"""The collective watchdog in one process: what counts as progress, the first-run (compile) bound, the message.
The bounds are checked on a manual clock (heartbeat.use_clock, Watchdog.check), without sleeps; one test runs
the watchdog's thread on the real clock. Under msrun with a stalled rank: tests/parallel/test_launch.py."""

import logging
import threading
import time

import pytest

from mindgrpo.parallel.watchdog import EXIT_CODE, Watchdog
from mindgrpo.utils import heartbeat
from mindgrpo.utils.progress import Progress


class Exit:
    """Records the watchdog's exit instead of ending the test process."""

    def __init__(self):
        self.codes, self.event = [], threading.Event()

    def __call__(self, code):
        self.codes.append(code)
        self.event.set()


class Clock:
    """Seconds that move only when the test says so."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds


@pytest.fixture
def exit_():
    heartbeat.reset()
    yield Exit()
    heartbeat.use_clock(time.monotonic)
    heartbeat.reset()


@pytest.fixture
def clock():
    c = Clock()
    heartbeat.use_clock(c)
    return c


def watch(exit_, timeout_s, compile_timeout_s):
    return Watchdog(rank=3, timeout_s=timeout_s, compile_timeout_s=compile_timeout_s, exit=exit_, poll_s=0.02).start()


def test_no_progress_ends_the_process_naming_phase_rank_and_place(exit_, caplog, capfd):
    with heartbeat.phase("update"):
        pass  # the phase has run once: its graphs are compiled
    with caplog.at_level(logging.ERROR, logger="mindgrpo.parallel.watchdog"):
        dog = watch(exit_, timeout_s=0.3, compile_timeout_s=60)
        with heartbeat.phase("update"):
            assert exit_.event.wait(30)  # a call that never comes back
        dog.stop()
    assert exit_.codes == [EXIT_CODE]
    err = capfd.readouterr().err
    assert "watchdog: rank 3: no progress in phase update for 0 s (a collective is waiting on another rank?)" in err
    assert "watchdog: rank 3 is stuck at an unknown place (outside mindgrpo)" in err  # this test's wait
    assert any("no progress in phase update" in r.getMessage() for r in caplog.records)


def test_a_phase_first_run_gets_the_compile_bound(exit_, clock):
    dog = Watchdog(rank=3, timeout_s=0.2, compile_timeout_s=1.5, exit=exit_)  # not started: checked by hand
    with heartbeat.phase("rollout"):  # never finished: compiling
        clock.advance(1.4)  # seven times timeout_s, within the compile bound
        assert not dog.check() and exit_.codes == []
        clock.advance(0.2)
        assert dog.check()
    assert exit_.codes == [EXIT_CODE]
    # once the phase has finished, its next run gets the plain bound
    with heartbeat.phase("rollout"):
        clock.advance(0.3)
        assert dog.check()
    assert exit_.codes == [EXIT_CODE, EXIT_CODE]


def test_beats_are_progress(exit_, clock):
    dog = Watchdog(rank=3, timeout_s=1.0, compile_timeout_s=1.0, exit=exit_)
    progress = Progress(total_steps=1)
    with progress.phase("sync"):
        for _ in range(30):  # 27 s in all, nine tenths of the bound between beats
            clock.advance(0.9)
            assert not dog.check()
            heartbeat.beat()
        assert heartbeat.status()[0] == "sync"  # Progress phases are the heartbeat's phases
        assert exit_.codes == []
        clock.advance(1.1)  # then no beat for longer than the bound
        assert dog.check()
    assert exit_.codes == [EXIT_CODE]


def test_outside_any_phase_is_start_up(exit_):
    name, idle, first_run = heartbeat.status()
    assert (name, first_run) == ("start-up", True) and idle < 5


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError, match="timeout_s <= compile_timeout_s"):
        Watchdog(rank=0, timeout_s=10, compile_timeout_s=5)

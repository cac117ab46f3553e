"""The collective watchdog in one process: what counts as progress, the first-run (compile) bound, the message.
Under msrun with a stalled rank: tests/parallel/test_launch.py."""

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


@pytest.fixture
def exit_():
    heartbeat.reset()
    yield Exit()
    heartbeat.reset()


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


def test_a_phase_first_run_gets_the_compile_bound(exit_):
    dog = watch(exit_, timeout_s=0.2, compile_timeout_s=1.5)
    with heartbeat.phase("rollout"):  # never finished: compiling
        assert not exit_.event.wait(0.8)  # four times timeout_s, still quiet
        assert exit_.event.wait(30)
    dog.stop()
    assert exit_.codes == [EXIT_CODE]


def test_beats_are_progress(exit_):
    dog = watch(exit_, timeout_s=1.0, compile_timeout_s=1.0)
    progress = Progress(total_steps=1)
    with progress.phase("sync"):
        for _ in range(60):  # three times the bound in all, a beat every 0.05 s
            time.sleep(0.05)
            heartbeat.beat()
        assert heartbeat.status()[0] == "sync"  # Progress phases are the heartbeat's phases
    dog.stop()
    assert exit_.codes == []


def test_outside_any_phase_is_start_up(exit_):
    name, idle, first_run = heartbeat.status()
    assert (name, first_run) == ("start-up", True) and idle < 5


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError, match="timeout_s <= compile_timeout_s"):
        Watchdog(rank=0, timeout_s=10, compile_timeout_s=5)

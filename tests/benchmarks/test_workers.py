"""benchmarks.workers: a side that fails or dies is reported, and the other sides are stopped
instead of being waited for (the GRPO step benchmark hung when TRL's side failed to import)."""

import os
import signal
import subprocess
import sys
import time

import pytest

from benchmarks.workers import SideFailed, Workers


def _echo(conn):
    """Says "ready", then answers each message with twice its value until "stop"."""
    conn.send("ready")
    while (msg := conn.recv()) != "stop":
        conn.send(2 * msg)


def _fails(conn):
    raise ImportError("no module named 'trl' (as the benchmark's TRL side once failed)")


def _killed(conn):
    os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer ends a side


def _stopped_after_failure(failing):
    """The benchmark's pattern: one side built and waiting, then the other fails. Returns the
    error and whether the waiting side still runs after the block."""
    waiting = None
    try:
        with pytest.raises(SideFailed) as err:
            with Workers() as sides:
                waiting = sides.start(_echo)
                assert waiting.recv() == "ready"
                sides.start(failing).recv()
        return str(err.value), waiting.proc.is_alive()
    finally:
        if waiting is not None and waiting.proc.is_alive():  # never leave it behind, even when the test fails
            waiting.proc.kill()
            waiting.proc.join()


def test_a_side_that_raises_is_reported_and_the_other_stopped():
    message, still_running = _stopped_after_failure(_fails)
    assert "_fails failed" in message and "no module named 'trl'" in message  # the side's traceback
    assert not still_running


def test_a_side_that_is_killed_is_reported_and_the_other_stopped():
    message, still_running = _stopped_after_failure(_killed)
    assert "_killed died with exit code -9" in message and "SIGKILL" in message
    assert not still_running


def test_sides_answer_and_end_with_their_peak_memory():
    with Workers() as sides:
        side = sides.start(_echo)
        assert side.recv() == "ready"
        assert [side.ask(k) for k in (1, 2, 3)] == [2, 4, 6]
        peak_gb = side.ask("stop")
    assert isinstance(peak_gb, float) and peak_gb > 0
    assert side.proc.exitcode == 0


SIDE_OF_A_KILLED_PARENT = """
import os, sys, time

def idle(conn):
    conn.send(os.getpid())
    time.sleep(600)

if __name__ == "__main__":
    from benchmarks.workers import Workers
    with Workers() as sides:
        print(sides.start(idle).recv(), flush=True)
        time.sleep(600)
"""


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan's zombie may wait long for its reaper)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sides end with their parent on Linux only")
def test_a_side_ends_when_its_parent_is_killed(tmp_path):
    """Killing a benchmark (SIGKILL: no handler runs) must not leave its sides running."""
    script = tmp_path / "parent.py"
    script.write_text(SIDE_OF_A_KILLED_PARENT)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=repo,
                              env={**os.environ, "PYTHONPATH": repo})
    side = None
    try:
        side = int(parent.stdout.readline())
        assert _running(side)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 30
        while _running(side) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(side)
    finally:
        parent.kill()
        if side is not None and _running(side):
            os.kill(side, signal.SIGKILL)

"""Benchmark sides in their own processes, driven over pipes; when one side fails, the others stop.

    with Workers() as sides:
        ours = sides.start(ours_worker, work, ...)   # spawned: no thread pool, allocator or memory pool shared
        ours.recv()                                  # its first message ("ready")
        trl = sides.start(trl_worker, work, ...)
        ... ours.ask("step") ... trl.recv() ...
        ours.ask("stop")                             # a side's last message: its peak RSS (GB)
    # leaving the block stops every side still running (SIGTERM, then SIGKILL), on an error at once

A target is `target(conn, *args)`: it talks to the parent over `conn`; when it returns, the parent
gets its peak RSS. An exception in a side comes back as a RuntimeError carrying the side's traceback;
a side that ends without a word (the kernel's OOM killer sends SIGKILL) as a RuntimeError with its
exit code. While waiting on a side, the parent checks every second that the side is still alive; a
side ends with its parent, however the parent ends (SIGKILL included), so none is left behind.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import traceback
from typing import Callable, List

from benchmarks.harness import peak_rss_gb
from mindgrpo.utils.process import die_with_parent

POLL_S = 1.0  # how often a waiting parent checks that the side it waits on is alive
STOP_GRACE_S = 10.0  # SIGTERM, then this long, then SIGKILL


class SideFailed(RuntimeError):
    """A side raised or died; the message names it and carries its traceback or exit code."""


class Worker:
    """One side: `target(conn, *args)` in a spawned process (never forked from a process running
    MindSpore's threads)."""

    def __init__(self, target: Callable, *args):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.name = target.__name__
        self.proc = ctx.Process(target=_serve, args=(child, os.getpid(), target, *args), name=self.name)
        self.proc.start()
        child.close()  # the child's end lives in the child only: its death closes the pipe

    def send(self, msg) -> None:
        try:
            self.conn.send(msg)
        except (BrokenPipeError, ConnectionResetError):
            self._died()

    def recv(self):
        while not self.conn.poll(POLL_S):
            if not self.proc.is_alive() and not self.conn.poll(0):
                self._died()
        try:
            msg = self.conn.recv()
        except (EOFError, ConnectionResetError):
            self._died()
        if isinstance(msg, tuple) and msg and msg[0] == "error":
            self.proc.join(STOP_GRACE_S)
            raise SideFailed(f"{self.name} failed:\n{msg[1]}")
        return msg

    def ask(self, msg):
        self.send(msg)
        return self.recv()

    def join(self, timeout: float = None) -> None:
        self.proc.join(timeout)

    def stop(self) -> None:
        """End the process if it still runs: SIGTERM, then SIGKILL after STOP_GRACE_S."""
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(STOP_GRACE_S)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()

    def _died(self):
        self.proc.join(STOP_GRACE_S)
        code = self.proc.exitcode
        why = " (SIGKILL: out of memory? see dmesg)" if code == -9 else ""
        raise SideFailed(f"{self.name} died with exit code {code}{why}")


class Workers:
    """The sides of one measurement: `start` them inside the `with` block; leaving it stops every
    side still running (on an error at once, else after STOP_GRACE_S for it to finish)."""

    def __init__(self):
        self.started: List[Worker] = []

    def start(self, target: Callable, *args) -> Worker:
        w = Worker(target, *args)
        self.started.append(w)
        return w

    def __enter__(self) -> "Workers":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        for w in self.started:
            if exc_type is None:
                w.join(STOP_GRACE_S)
            w.stop()


def _serve(conn, parent: int, target: Callable, *args) -> None:
    die_with_parent(parent, signal.SIGKILL)
    try:
        target(conn, *args)
        conn.send(peak_rss_gb())
    except BaseException:  # noqa: BLE001 - reported to the parent
        conn.send(("error", traceback.format_exc()))

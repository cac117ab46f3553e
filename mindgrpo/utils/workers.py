"""A worker process the trainer talks to over two pipes in frames (utils/frames.py): reward and tool workers.

    w = WorkerProcess("mindgrpo.tools.worker", env={"TMPDIR": folder})  # our pipes now, no process yet
    start_at(pool.workers, k, w, setup)  # listed as workers[k] first (a close() that interrupts the start still
                                         # reaps it), then `python -m MODULE TASKS_FD RESULTS_FD PARENT_PID` and
                                         # the set-up frame
    w.stop(grace_s)              # pipes closed, the process waited for or killed (one never spawned: fds only)

Workers are fresh interpreters, never forks of the trainer (a fork would copy MindSpore's threads' locks in
whatever state they were). The SIGTERM handler of a run closes its pools between any two bytecodes, a start
included: a worker listed before spawn() is reaped by that close(); one caught inside Popen itself dies with
its parent (each worker module arms the parent-death signal first, utils/process.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import List, Mapping, Optional

from mindgrpo.utils.frames import close_and_reap, send_frame

START_TIMEOUT_S = 120.0  # a worker's start-up (an interpreter, NumPy, the plugins) on a loaded machine


class WorkerProcess:
    def __init__(self, module: str, env: Optional[Mapping[str, str]] = None, stdout=subprocess.DEVNULL):
        self.module, self.env, self.stdout = module, dict(env or {}), stdout
        self.child_tasks, self.tasks = os.pipe()
        self.results, self.child_results = os.pipe()
        self.proc: Optional[subprocess.Popen] = None
        self.ready = False
        self.deadline = time.monotonic() + START_TIMEOUT_S

    def spawn(self, setup) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(os.path.abspath(p) for p in sys.path if p), **self.env}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", self.module, str(self.child_tasks), str(self.child_results), str(os.getpid())],
            pass_fds=(self.child_tasks, self.child_results), stdin=subprocess.DEVNULL, stdout=self.stdout, env=env)
        _close_all((self.child_tasks, self.child_results))
        self.child_tasks = self.child_results = -1
        self.deadline = time.monotonic() + START_TIMEOUT_S
        try:
            send_frame(self.tasks, setup)  # small: fits the pipe's buffer while the worker starts
        except OSError:  # it died at once: the pool reads its end of file and reports it
            pass

    def stop(self, grace_s: float = 0.0) -> None:
        """Close the pipes (the worker exits at end of file); SIGKILL it if it is still there after grace_s."""
        if self.proc is None:
            _close_all((self.child_tasks, self.child_results, self.tasks, self.results))
        else:
            close_and_reap(self.proc, (self.tasks, self.results), grace_s)


def _close_all(fds) -> None:
    for fd in fds:
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass


def start_at(workers: List[WorkerProcess], k: int, worker: WorkerProcess, setup) -> None:
    """`worker` as workers[k] (appended when k is len(workers)), listed before its process starts; then started."""
    if k == len(workers):
        workers.append(worker)
    else:
        workers[k] = worker
    worker.spawn(setup)

"""Reward functions in worker processes, every call bounded by a timeout.

    pool = RewardPool({"accuracy": {}, "cosine": {"cosine_max_len": 512}}, num_workers=2, timeout_s=10.0)
    outcomes = pool.run([Call("accuracy", rows), ...], completions, columns)  # one Outcome per Call
    pool.close()

The workers are fresh interpreters (`python -m mindgrpo.rewards.worker`), never forks of the trainer: a fork
would copy MindSpore's threads' locks in whatever state they were. Each worker loads its reward functions once,
by name (the plugin file or module that registered each, see registry.reward_origin). The pool starts its
workers once, at its first call; a call that outlives `timeout_s` comes back as Outcome("timeout"), and its
worker is killed (SIGKILL) and replaced by a new one that starts while the others go on. A worker that dies
during a call (a crash in C code, os._exit) gives Outcome("raised") and is replaced too.

The pool stops its workers at close(), at interpreter exit (atexit, which a Ctrl-C in the trainer reaches), and
a worker dies with its parent process on Linux (mindgrpo/rewards/worker.py), so none is left behind.
"""

from __future__ import annotations

import atexit
import logging
import select
import time
from collections import deque
from typing import List, Mapping, Optional, Sequence

from mindgrpo.rewards.registry import reward_origin
from mindgrpo.rewards.scoring import Call, Outcome, RewardError
from mindgrpo.utils.frames import recv_frame, send_frame
from mindgrpo.utils.workers import START_TIMEOUT_S, WorkerProcess, start_at

logger = logging.getLogger(__name__)


class _Worker(WorkerProcess):
    """A reward worker; its reward functions' prints go to our stderr."""

    def __init__(self):
        super().__init__("mindgrpo.rewards.worker", stdout=2)
        self.call: Optional[int] = None  # index of the call it is running


class RewardPool:
    """num_workers processes scoring `rewards` ({name: parameters}); see the module docstring."""

    def __init__(self, rewards: Mapping[str, Mapping[str, object]], num_workers: int, timeout_s: float):
        if num_workers < 1:
            raise ValueError(f"a reward pool needs at least one worker, got {num_workers}")
        if not timeout_s > 0:
            raise ValueError(f"the reward timeout must be > 0, got {timeout_s}")
        self.setup = {}
        for name, params in rewards.items():
            origin = reward_origin(name)
            if origin == ("module", "__main__"):
                raise RewardError(f"reward {name!r} is defined in the main script, which reward workers cannot "
                                  "import: register it in a plugin file (reward_config.reward_plugin) or score in "
                                  "the trainer's process (reward_config.num_workers=0)")
            self.setup[name] = (origin, dict(params))
        self.num_workers, self.timeout_s = num_workers, float(timeout_s)
        self.workers: List[_Worker] = []
        self.replaced = 0  # workers killed after a timeout or lost to a crash

    def start(self) -> None:
        """Start the workers (once; `run` calls it)."""
        if not self.workers:
            atexit.register(self.close)
            for _ in range(self.num_workers):
                start_at(self.workers, len(self.workers), _Worker(), self.setup)

    def pids(self) -> List[int]:
        return [w.proc.pid for w in self.workers]

    def close(self) -> None:
        """Stop every worker (a second close is a no-op)."""
        workers, self.workers = self.workers, []
        for w in workers:
            w.stop(grace_s=2.0 if w.call is None else 0.0)
        atexit.unregister(self.close)

    def __enter__(self) -> "RewardPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _replace(self, worker: _Worker) -> None:
        logger.info("reward worker %d stopped (a call timed out or it died); starting another", worker.proc.pid)
        worker.stop()
        start_at(self.workers, self.workers.index(worker), _Worker(), self.setup)
        self.replaced += 1

    def run(self, calls: Sequence[Call], completions: Sequence[str],
            columns: Mapping[str, Sequence]) -> List[Outcome]:
        """One Outcome per call, in order; the calls run in parallel on the workers."""
        self.start()
        queue = deque(range(len(calls)))
        out: List[Optional[Outcome]] = [None] * len(calls)
        while queue or any(w.call is not None for w in self.workers):
            for w in self.workers:
                if queue and w.ready and w.call is None:
                    self._send(w, queue.popleft(), calls, completions, columns, queue)
            waiting = [w for w in self.workers if w.call is not None or (queue and not w.ready)]
            if not waiting:
                continue  # a send failed and its call is queued again: send it to another worker
            timeout = max(0.0, min(w.deadline for w in waiting) - time.monotonic())
            readable, _, _ = select.select([w.results for w in waiting], [], [], timeout)
            for w in [w for w in waiting if w.results in readable]:
                self._receive(w, out, calls)
            now = time.monotonic()
            for w in [w for w in waiting if w.results not in readable and w.deadline <= now]:
                if w.call is None:
                    raise RewardError(f"a reward worker did not start within {START_TIMEOUT_S:.0f} s "
                                      f"(rewards {sorted(self.setup)})")
                out[w.call] = Outcome("timeout", message=f"no result within {self.timeout_s:g} s")
                self._replace(w)
        return out

    def _send(self, w: _Worker, k: int, calls, completions, columns, queue) -> None:
        call = calls[k]
        task = (call.name, [completions[i] for i in call.rows], {c: [v[i] for i in call.rows]
                                                                 for c, v in columns.items()})
        try:
            send_frame(w.tasks, task)
        except OSError:  # the worker died while idle
            queue.appendleft(k)
            self._replace(w)
            return
        w.call, w.deadline = k, time.monotonic() + self.timeout_s

    def _receive(self, w: _Worker, out: List[Optional[Outcome]], calls) -> None:
        message = recv_frame(w.results)
        if message is None:  # the worker died
            code = w.proc.wait()
            if w.call is None:
                raise RewardError(f"a reward worker exited during start-up (exit code {code}; its error is "
                                  "in the log above)")
            out[w.call] = Outcome("raised", message=f"the reward worker died (exit code {code})")
            self._replace(w)
        elif isinstance(message, Outcome):
            out[w.call], w.call = message, None
        elif message[0] == "ready":
            w.ready = True
        else:  # ("setup_error", text)
            raise RewardError(f"a reward worker could not load the rewards {sorted(self.setup)}: {message[1]}")


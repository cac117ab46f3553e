"""Tool calls in worker processes, each bounded by a timeout, submitted and collected while decoding goes on.

    pool = ToolPool({"calculator": {}, "python": {"wall_s": 5.0}}, num_workers=2, timeout_s=10.0)
    pool.submit(key, call)              # a checked ToolCall (calls.check_call); a malformed one answers at once
    for key, result in pool.poll(0.0):  # the calls that have finished, in any order; poll(None) waits for one
        ...
    pool.run([call, ...])               # or all at once: one ToolResult per call, in order
    pool.close()

The workers are fresh interpreters (`python -m mindgrpo.tools.worker`), started at the first call. A call that
outlives `timeout_s` comes back as ToolResult("timeout") and its worker is killed (SIGKILL) and replaced; a
worker that dies during a call (a crash in C code, os._exit) gives ToolResult("error") and is replaced too.
Each worker keeps its temporary files in a directory of its own (the python tool's sandboxes make theirs in it),
removed when the worker is replaced and at close(); these directories are in one folder of the pool's
(`mindgrpo-tools-*`, a utils/scratch.ScratchFolder), which goes at close() and also when the process ends without
closing the pool (os._exit, a signal): its keeper removes it. The pool closes at interpreter exit (atexit), and a
worker dies with its parent process on Linux.
"""

from __future__ import annotations

import atexit
import logging
import select
import shutil
import tempfile
import time
from collections import deque
from typing import Dict, Hashable, List, Mapping, Optional, Sequence, Tuple

from mindgrpo.tools.calls import ToolCall, ToolResult
from mindgrpo.tools.registry import check_settings, tool_origin
from mindgrpo.utils.frames import recv_frame, send_frame
from mindgrpo.utils.scratch import ScratchFolder
from mindgrpo.utils.workers import START_TIMEOUT_S, WorkerProcess, start_at

logger = logging.getLogger(__name__)


class ToolPoolError(RuntimeError):
    """The pool cannot run tools at all (a worker cannot load them): stops the run, unlike any call's failure."""


class _Worker(WorkerProcess):
    """A tool worker: its process, and a scratch folder of its own (its TMPDIR) removed when it stops."""

    def __init__(self, root: str):
        self.tmp = tempfile.mkdtemp(prefix="worker-", dir=root)
        super().__init__("mindgrpo.tools.worker", env={"TMPDIR": self.tmp})
        self.key: Optional[Hashable] = None  # the call it runs
        self.started = 0.0

    @property
    def busy(self) -> bool:
        return self.key is not None

    def stop(self, grace_s: float = 0.0) -> None:
        super().stop(grace_s)
        shutil.rmtree(self.tmp, ignore_errors=True)


class ToolPool:
    """num_workers processes running `tools` ({name: settings}); see the module docstring."""

    def __init__(self, tools: Mapping[str, Mapping[str, object]], num_workers: int, timeout_s: float,
                 max_chars: int = 1 << 16):
        if num_workers < 1:
            raise ValueError(f"a tool pool needs at least one worker, got {num_workers}")
        if not timeout_s > 0:
            raise ValueError(f"the tool timeout must be > 0, got {timeout_s}")
        spec = {}
        for name, settings in tools.items():
            origin = tool_origin(name)
            if origin == ("module", "__main__"):
                raise ToolPoolError(f"tool {name!r} is defined in the main script, which tool workers cannot import: "
                                    "register it in a plugin file")
            check_settings(name, settings)
            spec[name] = (origin, dict(settings))
        self.setup = (spec, int(max_chars))
        self.num_workers, self.timeout_s = num_workers, float(timeout_s)
        self.workers: List[_Worker] = []
        self.scratch: Optional[ScratchFolder] = None  # the pool's folder, while started
        self.queue: deque = deque()  # (key, call) waiting for a worker
        self.done: List[Tuple[Hashable, ToolResult]] = []  # finished, not yet polled
        self.replaced = 0

    @property
    def root(self) -> Optional[str]:
        """The pool's folder (the workers' folders are in it), None until started and after close()."""
        return None if self.scratch is None else self.scratch.path

    def start(self) -> None:
        if not self.workers:
            atexit.register(self.close)
            self.scratch = ScratchFolder("mindgrpo-tools-")
            for _ in range(self.num_workers):
                start_at(self.workers, len(self.workers), _Worker(self.root), self.setup)

    def close(self) -> None:
        workers, self.workers = self.workers, []
        for w in workers:
            w.stop(grace_s=2.0 if not w.busy else 0.0)
        if self.scratch is not None:
            self.scratch.close()
            self.scratch = None
        atexit.unregister(self.close)

    def __enter__(self) -> "ToolPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def pending(self) -> int:
        """Calls submitted and not yet polled."""
        return len(self.queue) + sum(w.busy for w in self.workers) + len(self.done)

    def submit(self, key: Hashable, call: ToolCall) -> None:
        """Run `call` (checked by calls.check_call); its result comes back from poll() under `key`."""
        if call.error is not None:
            self.done.append((key, ToolResult("error", call.error)))
            return
        self.start()
        self.queue.append((key, call))
        self._dispatch()

    def poll(self, timeout_s: Optional[float] = 0.0) -> List[Tuple[Hashable, ToolResult]]:
        """The results finished so far; waits up to timeout_s (None: until at least one) when none has."""
        end = None if timeout_s is None else time.monotonic() + timeout_s
        while not self.done and (self.queue or any(w.busy for w in self.workers)):
            self._dispatch()
            waiting = [w for w in self.workers if w.busy or not w.ready]
            now = time.monotonic()
            wait = min(w.deadline for w in waiting) - now
            if end is not None:
                wait = min(wait, end - now)
            readable, _, _ = select.select([w.results for w in waiting], [], [], max(0.0, wait))
            for w in [w for w in waiting if w.results in readable]:
                self._receive(w)
            now = time.monotonic()
            for w in [w for w in waiting if w.results not in readable and w.deadline <= now and w in self.workers]:
                if not w.busy:
                    raise ToolPoolError(f"a tool worker did not start within {START_TIMEOUT_S:.0f} s")
                self.done.append((w.key, ToolResult("timeout", f"no result within {self.timeout_s:g} s",
                                                    now - w.started)))
                self._replace(w)
            if end is not None and time.monotonic() >= end:
                break
        done, self.done = self.done, []
        return done

    def run(self, calls: Sequence[ToolCall]) -> List[ToolResult]:
        """One result per call, in order (the calls run in parallel on the workers)."""
        for k, call in enumerate(calls):
            self.submit(("run", k), call)
        out: Dict[Hashable, ToolResult] = {}
        while len(out) < len(calls):
            out.update(self.poll(None))
        return [out[("run", k)] for k in range(len(calls))]

    def _dispatch(self) -> None:
        for w in self.workers:
            if self.queue and w.ready and not w.busy:
                key, call = self.queue.popleft()
                try:
                    send_frame(w.tasks, (key, call.name, call.arguments))
                except OSError:  # it died while idle: the call goes to another
                    self.queue.appendleft((key, call))
                    self._replace(w)
                    continue
                w.key, w.started = key, time.monotonic()
                w.deadline = w.started + self.timeout_s

    def _receive(self, w: _Worker) -> None:
        message = recv_frame(w.results)
        if message is None:
            code = w.proc.wait()
            if not w.busy:
                raise ToolPoolError(f"a tool worker exited during start-up (exit code {code})")
            self.done.append((w.key, ToolResult("error", f"the tool crashed (its process ended with code {code})",
                                                time.monotonic() - w.started)))
            self._replace(w)
        elif message[0] == "ready":
            w.ready = True
        elif message[0] == "setup_error":
            raise ToolPoolError(f"a tool worker could not load the tools {sorted(self.setup[0])}: {message[1]}")
        else:
            key, result = message
            self.done.append((key, result))
            w.key = None

    def _replace(self, w: _Worker) -> None:
        logger.info("tool worker %d stopped (a call timed out or it died); starting another", w.proc.pid)
        w.stop()
        start_at(self.workers, self.workers.index(w), _Worker(self.root), self.setup)
        self.replaced += 1

"""A fresh process when the resident memory grows (rl_config.restart_on_memory_growth).

With rl_config.release_graphs every step compiles its graphs again, and MindSpore 2.10 keeps a few MB of live
C++ allocations for every compile (measured: jemalloc's `stats.allocated` and glibc's in-use bytes grow by the
resident memory's 4.6 MB a compile, Python's objects flat; nothing MindSpore offers gives them back:
DEVELOPERS.md). So the trainer watches its own resident memory at the end of each step, against what this
process held at the end of its `BASELINE_STEP`-th step, and once it is `growth` above that it saves a
checkpoint and the recipe (`grpo/run.py`) carries on in a fresh process: the same command with `--resume`
(`os.execv`: the same pid, so a supervisor or msrun-less shell sees one run), which loads that checkpoint and
appends to the same metrics.jsonl and TensorBoard folder. No step is lost or run twice: a resumed run is the
uninterrupted one (tests/grpo/test_chaos.py).

    watch = MemoryWatch(0.03)
    if watch.due():            # at the end of a step
        raise Restart(step, watch.reason)
    ...
    exec_fresh(restart_argv(sys.executable, sys.argv))   # scripts/grpo_one_stage.py, after run() closed its files

One process only (under msrun every rank would have to restart together: not done, the watch stays off).
"""

from __future__ import annotations

import os
from typing import List, Optional

from mindgrpo.utils.host_memory import status_bytes

BASELINE_STEP = 2  # a process's first step compiles and makes its buffers; its second is the level to hold
RESTARTS_ENV = "MINDGRPO_RESTARTS"  # how many fresh processes this run has had (for the log and the soak benchmark)


class Restart(Exception):
    """Raised out of `GRPOTrainer.fit` after the checkpoint of `step` is saved: continue in a fresh process."""

    def __init__(self, step: int, reason: str):
        super().__init__(f"step {step}: {reason}")
        self.step, self.reason = step, reason


class MemoryWatch:
    """This process's resident memory at the end of each step against its own at the end of its BASELINE_STEP-th
    step; `due()` once it is more than `growth` (a fraction) above. A process always runs past its baseline step,
    so a fresh process that starts higher than the last one cannot restart in a loop."""

    def __init__(self, growth: float, read=lambda: status_bytes("VmRSS")):
        self.growth, self.read = growth, read
        self.steps = 0
        self.baseline: Optional[int] = None
        self.reason = ""

    def due(self) -> bool:
        self.steps += 1
        rss = self.read()
        if self.steps <= BASELINE_STEP:
            self.baseline = rss
            return False
        if rss <= (1 + self.growth) * self.baseline:
            return False
        self.reason = (f"resident memory {rss / 1e9:.2f} GB is {rss / self.baseline - 1:.1%} above this process's "
                       f"{self.baseline / 1e9:.2f} GB at its step {BASELINE_STEP} (rl_config.restart_on_memory_growth "
                       f"{self.growth:g}; MindSpore keeps some memory of every graph compiled again under "
                       "rl_config.release_graphs)")
        return True


def restart_argv(executable: str, argv: List[str]) -> List[str]:
    """The command line of the fresh process: the same interpreter, script and flags, with `--resume` (the newest
    complete checkpoint, the one just saved) instead of any `--resume_from PATH`."""
    out, skip = [executable], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--resume_from":
            skip = True
            continue
        if a.startswith("--resume_from=") or a == "--resume":
            continue
        out.append(a)
    return out + ["--resume"]


def exec_fresh(argv: List[str], why: str = "") -> None:
    """Become the fresh process (`os.execv`, the same pid): the log files flushed and closed first."""
    import logging
    import sys

    logging.getLogger("mindgrpo").warning("%scontinuing in a fresh process: %s", f"{why}: " if why else "",
                                          " ".join(argv[1:]))
    os.environ[RESTARTS_ENV] = str(restarts() + 1)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)


def restarts() -> int:
    """Fresh processes this run has had so far (0 in the first)."""
    return int(os.environ.get(RESTARTS_ENV, "0"))

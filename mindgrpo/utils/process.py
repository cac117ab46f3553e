"""Tying a process's life to its parent's: a reward worker to its trainer, an msrun rank to msrun.

    die_with_parent(parent_pid, signal.SIGTERM)

Linux delivers `sig` to this process when the thread that started it exits (PR_SET_PDEATHSIG), however
the parent ends, SIGKILL included; elsewhere this is a no-op.
"""

from __future__ import annotations

import os
import sys


def die_with_parent(parent: int, sig: int) -> None:
    """Have `sig` sent to this process when `parent` exits; exit now if it already has."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(sig), 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)

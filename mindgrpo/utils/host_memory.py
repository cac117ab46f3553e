"""The host process's memory, as Linux's /proc/PID/status gives it: resident now (VmRSS) and its peak
(VmHWM), in bytes. Each training step logs both (`step_metrics`): the device ledger of
`mindgrpo/memory/swap.py` does not see the host, and a run whose resident memory climbs step after
step (MindSpore keeps some memory of every graph it compiles: `rl_config.release_graphs` compiles the
step's graphs again each step, benchmarks/results/HISTORY.md) shows it here long before the machine runs out.

    status_bytes("VmRSS")         # bytes, from the kB (1024 bytes) /proc gives; pid= another's
    step_metrics()                # {"memory/host_resident_bytes": ..., "memory/host_peak_bytes": ...}

Without /proc (not Linux) there is nothing to read: `step_metrics` returns {}.
"""

from __future__ import annotations

import os
from typing import Dict


def status_bytes(key: str, pid: str = "self") -> int:
    """A field of /proc/PID/status (VmRSS, VmHWM, ...) in bytes: /proc gives kB of 1024 bytes. This
    process's by default."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(f"/proc/{pid}/status has no {key}")


def step_metrics() -> Dict[str, float]:
    """This process's resident memory now and its peak so far, in bytes (empty without /proc)."""
    if not os.path.exists("/proc/self/status"):
        return {}
    return {"memory/host_resident_bytes": float(status_bytes("VmRSS")),
            "memory/host_peak_bytes": float(status_bytes("VmHWM"))}

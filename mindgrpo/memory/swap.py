"""Host-memory swap: each phase keeps only its own weights on the device.

Groups of parameters are registered by name (policy, optimizer, reference, inference,
reward_model, ...); a phase names the groups it needs. Entering a phase offloads the groups it does
not need and loads the ones it does. The manager keeps a ledger of device-resident bytes per group,
checks that no two of the exclusive groups (policy, reference, inference, reward_model) are resident
at once, and records the peak.

When the inference model is the policy model itself (one copy of the weights where the layouts
match: `mindgrpo/grpo/builder.py`), the "inference" group holds only what generating adds to the
policy's parameters (the engine's fused copies of the layer weights), and generating needs the
policy resident: `SHARED_PHASES`, and only policy and reference exclude each other.

On Ascend the moves are `Parameter._offload()` / `_load()`. On CPU those calls do nothing
(host and device are the same memory), so only the ledger moves; the ledger is then the
figure that `scripts/plan_memory.py` predicts. With swap disabled every group stays resident
and the ledger shows the sum of the models.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Sequence, Tuple

import numpy as np

logger = logging.getLogger(__name__)

EXCLUSIVE = ("policy", "reference", "inference", "reward_model")

# phase -> groups on the device during it
PHASES: Dict[str, Tuple[str, ...]] = {
    "rollout": ("inference", "kv_cache"),
    "reference": ("reference",),
    "reward_model": ("reward_model",),  # the outcome reward models (`mindgrpo/grpo/reward_models.py`)
    "old_logprobs": ("policy",),
    "update": ("policy", "grads", "optimizer"),
    "sync": ("policy",),  # the inference side arrives bucket by bucket: see `transient`
    "validate": ("inference", "kv_cache"),
}
# the inference model being the policy: generating reads the policy's own weights (not its moments)
SHARED_PHASES: Dict[str, Tuple[str, ...]] = {**PHASES, "rollout": ("policy", "inference", "kv_cache"),
                                             "validate": ("policy", "inference", "kv_cache")}


def nbytes(params) -> int:
    return sum(int(np.prod(p.shape)) * p.itemsize for p in params)


@dataclass
class Group:
    name: str
    params: list = field(default_factory=list)  # mindspore Parameters (empty: bytes only)
    bytes: int = 0
    resident: bool = True
    sizer: Optional[Callable[[], int]] = None  # for groups whose size changes (KV cache)

    def size(self) -> int:
        return self.sizer() if self.sizer else self.bytes


class SwapManager:
    """shared_inference: the inference model is the policy itself (`SHARED_PHASES`). reference_is_policy: the
    reference is the policy with its LoRA adapters off (no reference group; the reference phase needs the policy)."""

    def __init__(self, enabled: bool = True, device: str = "CPU", shared_inference: bool = False,
                 reference_is_policy: bool = False):
        self.enabled = enabled
        self.phases = SHARED_PHASES if shared_inference else PHASES
        if reference_is_policy:
            self.phases = {**self.phases, "reference": ("policy",)}
        self.exclusive = tuple(n for n in EXCLUSIVE if not (shared_inference and n == "inference"))
        self.real_moves = device == "Ascend"
        self.groups: Dict[str, Group] = {}
        self.peak = 0
        self.phase_peaks: Dict[str, int] = {}
        self.current: Optional[str] = None
        self._step = {"swap_bytes": 0, "swap_seconds": 0.0}
        self._transient = 0

    # ------------------------------------------------------------- registration
    def register(self, name: str, params: Sequence = (), extra_bytes: int = 0,
                 sizer: Optional[Callable[[], int]] = None) -> None:
        """A new group starts on the device; with swap on it goes to host at once and comes back
        in the first phase that needs it."""
        params = list(params)
        group = Group(name, params, nbytes(params) + extra_bytes, True, sizer)
        self.groups[name] = group
        if self.enabled:
            self._move(group, False)
        self._check_and_record()

    # ------------------------------------------------------------- ledger
    def resident_bytes(self) -> int:
        return sum(g.size() for g in self.groups.values() if g.resident) + self._transient

    def _check_and_record(self) -> None:
        if self.enabled:
            both = [n for n in self.exclusive if n in self.groups and self.groups[n].resident]
            if len(both) > 1:
                raise RuntimeError(f"swap invariant broken in phase {self.current!r}: {both} resident together")
        now = self.resident_bytes()
        self.peak = max(self.peak, now)
        if self.current:
            self.phase_peaks[self.current] = max(self.phase_peaks.get(self.current, 0), now)

    def _move(self, group: Group, to_device: bool) -> None:
        if group.resident == to_device:
            return
        t0 = time.perf_counter()
        if self.real_moves:
            for p in group.params:
                p._load() if to_device else p._offload()  # noqa: SLF001 - MindSpore's swap API
        group.resident = to_device
        self._step["swap_bytes"] += group.size()
        self._step["swap_seconds"] += time.perf_counter() - t0

    # ------------------------------------------------------------- phases
    @contextmanager
    def phase(self, name: str):
        """Run a block with the phase's groups resident (and, with swap on, the rest on host)."""
        if name not in self.phases:
            raise KeyError(f"unknown memory phase {name!r}; valid: {', '.join(self.phases)}")
        need = self.phases[name]
        self.current = name
        if self.enabled:
            for g in self.groups.values():  # offload first, so the invariant holds in between
                if g.name not in need:
                    self._move(g, False)
            for g in self.groups.values():
                if g.name in need:
                    self._move(g, True)
        self._check_and_record()
        try:
            yield
            self._check_and_record()  # sizes may have grown inside (KV cache)
        finally:
            self.current = None

    @contextmanager
    def transient(self, n_bytes: int):
        """Extra device bytes for the duration of a block (one resharding bucket)."""
        self._transient += n_bytes
        self._check_and_record()
        try:
            yield
        finally:
            self._transient -= n_bytes

    def step_metrics(self) -> Dict[str, float]:
        """Swap bytes/seconds since the last call, and the peaks so far."""
        out = {"memory/swap_bytes": float(self._step["swap_bytes"]),
               "memory/swap_seconds": self._step["swap_seconds"],
               "memory/peak_bytes": float(self.peak)}
        out.update({f"memory/peak_bytes/{k}": float(v) for k, v in self.phase_peaks.items()})
        self._step = {"swap_bytes": 0, "swap_seconds": 0.0}
        return out

    def largest_phase_bytes(self) -> int:
        return max(self.phase_peaks.values()) if self.phase_peaks else 0

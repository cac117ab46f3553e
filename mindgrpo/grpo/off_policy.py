"""Off-policy steps (rl_config.off_policy_steps, docs/async.md): the inference weights k updates behind the
policy's, and how stale each sample is when it trains.

A policy version is the number of updates done (steps, counting a step without an update). With k off-policy
steps the weight sync after update s gives the engine version s - k, so the rollout of step s + 1 samples with
the weights of update s - k while update s + 1 trains on it: in one process the schedule gains no time, but it is
the semantics a separate placement (rollout on its own devices, up to k steps ahead) reproduces, and it is testable
against a replay. Every token records its version (`Completion.versions`); a sample's staleness at update s + 1 is
s minus the oldest version among its tokens.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from mindspore import Parameter, Tensor


class LaggedSync:
    """The weight sync `sync` (policy -> inference copy) run `lag` updates late.

    It keeps host copies of the policy's trainable parameters (this rank's pieces; LoRA: the adapters) of the
    last lag + 1 versions. To give the engine version v it loads v's copy into the policy, runs `sync`, and
    loads the latest copy back (the policy is then bit for bit what the update left). lag + 1 host copies of
    the trained parameters: the cost of the schedule in one process."""

    def __init__(self, sync: Callable[[], Dict[str, float]], policy, lag: int, version: int = 0):
        if lag < 1:
            raise ValueError(f"a lagged sync needs lag >= 1, got {lag}")
        self.sync, self.lag = sync, lag
        self.params: List[Parameter] = [p for p in policy.get_parameters() if p.requires_grad]
        self.copies: deque = deque()  # (version, host arrays), oldest first
        self.restart(version)

    def restart(self, version: int) -> None:
        """The policy as it is now is `version` and the engine's (at the start, after a resume: the lag restarts,
        no older version being at hand)."""
        self.copies.clear()
        self.copies.append((version, self._snapshot()))

    def _snapshot(self) -> List[np.ndarray]:
        return [p.asnumpy().copy() for p in self.params]  # a copy: asnumpy may share the host buffer

    def _load(self, arrays: Sequence[np.ndarray]) -> None:
        for p, a in zip(self.params, arrays):
            p.set_data(Tensor(a))

    def __call__(self, version: int) -> Tuple[Dict[str, float], int]:
        """After update `version`: the engine gets max(version - lag, the oldest kept). Returns the sync's metrics
        and the version synced."""
        self.copies.append((version, self._snapshot()))
        target = version - self.lag
        while len(self.copies) > 1 and self.copies[1][0] <= target:
            self.copies.popleft()
        synced, arrays = self.copies[0]
        self._load(arrays)
        try:
            metrics = self.sync()
        finally:
            self._load(self.copies[-1][1])
        return metrics, synced


def sample_versions(versions: Sequence[Optional[np.ndarray]]) -> Optional[np.ndarray]:
    """(B,) the oldest version among each sample's tokens (a sample without tokens: its array is empty and counts
    as the newest, never stale), or None when an engine stamped none."""
    if any(v is None for v in versions):
        return None
    big = np.iinfo(np.int64).max
    return np.array([int(np.min(v)) if len(v) else big for v in versions], np.int64)


def staleness(oldest: np.ndarray, current: int, bound: int) -> Tuple[np.ndarray, Dict[str, float]]:
    """oldest (B,): each sample's oldest token version; current: the policy's version before the update (updates
    done); bound: rl_config.max_staleness (GRPOConfig.staleness_bound). Returns keep (B,) bool, False for a sample
    more than `bound` updates stale (dropped from the loss), and staleness/mean, staleness/max (updates, over the
    samples) and staleness/dropped (samples)."""
    lag = np.maximum(current - np.minimum(oldest, current), 0)  # (B,); an empty sample: 0
    keep = lag <= bound
    return keep, {"staleness/mean": float(lag.mean()), "staleness/max": float(lag.max()),
                  "staleness/dropped": float((~keep).sum())}

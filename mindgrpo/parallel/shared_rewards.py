"""Rewards of a multi-rank stage: one rank scores, every rank gets the same scores.

Every rank holds the step's completions, so each could score them itself, but not identically: a reward call
that times out or loses its worker on one rank only would give the ranks different rewards, hence different
advantages, and tensor- or data-parallel pieces of the update computed from different losses. So rank 0 alone
scores (only it starts a reward worker pool) and the scores travel in one host sum over the world, where the
other ranks add zeros (x + 0.0 == x).

    rewards = SharedRewards(build_rewards(cfg), comm)
    total, per_function, metrics = rewards(completions, **columns)   # the same on every rank

A reward function that breaks its contract raises RewardError on rank 0, which exits; msrun then ends the
other ranks, waiting in the host sum (and the watchdog would, after rl_config.collective_timeout_s).
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import numpy as np

from mindgrpo.parallel.comm import Comm, Group
from mindgrpo.rewards.combine import Scores


class SharedRewards:
    """A reward set (mindgrpo.rewards.RewardSet) scored on `scorer` only and shared with every rank of `group` (default
    the world; a separate placement's training group: mindgrpo/parallel/separate.py)."""

    def __init__(self, rewards, comm: Comm, scorer: int = 0, group: Optional[Group] = None):
        self.rewards, self.comm, self.scorer = rewards, comm, scorer
        self.group = comm.group(range(comm.world)) if group is None else group

    @property
    def names(self):
        return self.rewards.names

    def check_columns(self, available: Iterable[str], where: str) -> None:
        self.rewards.check_columns(available, where)

    def start(self) -> None:
        if self.comm.rank == self.scorer:
            self.rewards.start()

    def close(self) -> None:
        self.rewards.close()

    def __call__(self, completions: Sequence[str], **columns):
        """(total (B,), {name: (B,)}, metrics), the same on every rank: see RewardSet.__call__."""
        names, batch = self.rewards.names, len(completions)
        # (F, B) scores with NaN -> 0, (F, B) 1 where scored, (F,) errors, (F,) timeouts
        packed = np.zeros(len(names) * (2 * batch + 2), np.float32)
        if self.comm.rank == self.scorer:
            scores = self.rewards.score(completions, **columns)
            values = np.stack([scores.values[n] for n in names]) if names else np.zeros((0, batch), np.float32)
            scored = ~np.isnan(values)
            packed = np.concatenate([np.where(scored, values, 0.0).ravel(), scored.ravel(),
                                     [scores.errors[n] for n in names], [scores.timeouts[n] for n in names]])
        packed = self.comm.host_sum(packed.astype(np.float32), self.group)
        f = len(names)
        values = packed[:f * batch].reshape(f, batch)
        scored = packed[f * batch:2 * f * batch].reshape(f, batch) > 0
        errors, timeouts = packed[2 * f * batch:2 * f * batch + f], packed[2 * f * batch + f:]
        shared = Scores({n: np.where(scored[i], values[i], np.nan).astype(np.float32) for i, n in enumerate(names)},
                        {n: int(errors[i]) for i, n in enumerate(names)},
                        {n: int(timeouts[i]) for i, n in enumerate(names)})
        return self.rewards.combine(shared)

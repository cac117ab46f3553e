"""Rewards of a multi-rank stage: one rank scores, every rank gets the same scores.

Every rank holds the step's completions, so each could score them itself, but not identically: a reward call
that times out or loses its worker on one rank only would give the ranks different rewards, hence different
advantages, and tensor- or data-parallel pieces of the update computed from different losses. So rank 0 alone
scores (only it starts a reward worker pool) and the scores travel in one host sum over the world, where the
other ranks add zeros (x + 0.0 == x).

    rewards = SharedRewards(build_rewards(cfg), comm)
    total, per_function, metrics = rewards(completions, **columns)   # the same on every rank

The reward models and generative judges of a separate placement's training group (D > 1 ranks) likewise: rank 0
alone loads them and scores the whole batch (`SharedModelRewards`), its scores, metrics and judges' answers pickled to
the others.

A reward function that breaks its contract raises RewardError on rank 0, which exits; msrun then ends the
other ranks, waiting in the host sum (and the watchdog would, after rl_config.collective_timeout_s).
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import numpy as np

from mindgrpo.parallel.comm import Comm, Group, host_gather
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


class SharedModelRewards:
    """A run's reward models (`grpo/reward_models.ModelRewards`), held and scored on `scorer` only, its scores and
    metrics shared with every rank of `group` (a separate placement's training group of D > 1 ranks): one scoring of
    the whole batch as in one process, so the running normalisers' statistics (and the checkpoint `scorer` writes)
    are one process's, and every training rank trains on the same scores. `models` is None on the other ranks, which
    know the models' names and weights (reward_config) only. The scores travel pickled (`comm.host_gather`), NaN (no
    score) included."""

    def __init__(self, models, comm: Comm, group: Group, names: Sequence[str], weights: Sequence[float],
                 scorer: int = 0):
        self.comm, self.group, self.scorer = comm, group, scorer
        self.models = models if comm.rank == scorer else None
        if comm.rank == scorer and (models is None or list(models.names) != list(names)):
            held = None if models is None else models.names
            raise ValueError(f"reward models: rank {scorer} scores, its models {held} are not the reward_config's "
                             f"{list(names)}")
        self.names, self.weights = list(names), list(weights)
        self.last_answers: dict = {}  # {judge name: its answers}: the scorer's, after each call

    def parameters(self) -> list:
        return self.models.parameters() if self.models is not None else []

    def state(self) -> dict:
        """The running normalisers' statistics: the scorer's (the only one that writes a checkpoint)."""
        return self.models.state() if self.models is not None else {}

    def load_state(self, state) -> list:
        return self.models.load_state(state) if self.models is not None else []

    def cache_bytes(self) -> int:
        return self.models.cache_bytes() if self.models is not None else 0

    def release(self) -> None:
        """With rl_config.release_graphs: the scorer's scoring graphs dropped (`ModelRewards.release`)."""
        if self.models is not None:
            self.models.release()

    def __call__(self, prompt_ids, completion_ids, columns=None):
        """({name: scores (B,)}, metrics): `scorer`'s, on every rank of the group; its judges' answers in
        `last_answers`."""
        mine = None
        if self.models is not None:
            scores, metrics = self.models(prompt_ids, completion_ids, columns)
            mine = (scores, metrics, self.models.last_answers)
        given = [v for v in host_gather(self.comm, mine, self.group) if v is not None]
        if len(given) != 1:
            raise RuntimeError(f"reward models: {len(given)} ranks of the group scored, not one (rank {self.scorer})")
        scores, metrics, self.last_answers = given[0]
        return scores, metrics

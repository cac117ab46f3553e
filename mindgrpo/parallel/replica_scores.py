"""A reward model in a layout of its own under msrun: split over T ranks (tensor parallelism,
`reward_config.reward_models[i].model_parallel`, the policy's by default), the world's W / T groups of T ranks each
a data-parallel replica of it that scores its share of the rollouts; every rank gets every score.

    scorer = ReplicaScores(RewardScorer(piece, ...), comm, replica)    # replica_of(layout, rank); layout:
                                                                       # layout.reward_model_layout(W, T)
    scores = scorer(sequences)                                         # (B,) fp32, the same on every rank

A replica's share is dealt by tokens (`data_parallel.share_by_tokens`: the replicas' totals differ by at most the
longest sequence), so each replica scores about W / T of the batch's tokens instead of all of them. The scores travel
in one host sum over the world, where each replica's first rank gives its share's scores in their rows and every
other rank zeros (x + 0.0 == x: a score arrives bit for bit). A row's score is its replica's forward of that row, as
one device's up to the rounding of the micro-batches it shares (other rows beside it, another padded length).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence, Tuple

import numpy as np

from mindgrpo.parallel.comm import Comm
from mindgrpo.parallel.data_parallel import share_by_tokens
from mindgrpo.parallel.layout import ParallelLayout


@dataclass(frozen=True)
class Replica:
    """Where a rank sits in a reward model's layout: its tensor-parallel group (world ranks), the index of that group
    among the layout's (its replica) and their number."""

    tp_ranks: Tuple[int, ...]
    index: int
    count: int

    @property
    def first(self) -> int:
        """The replica's rank that gives its scores in the host sum."""
        return self.tp_ranks[0]


def replica_of(layout: ParallelLayout, rank: int) -> Replica:
    """The replica `rank` belongs to: `layout`'s tensor-parallel groups, numbered in order (a reward model has no
    pipeline stages: with a pipelined policy layout every stage's tp groups are replicas of their own)."""
    world = layout.world_size
    groups = sorted({tuple(layout.tp_group(r)) for r in range(world)})
    mine = tuple(layout.tp_group(rank))
    return Replica(mine, groups.index(mine), len(groups))


class ReplicaScores:
    """A scorer (`models/reward_model.RewardScorer`: sequences -> (B,) scores) whose replica scores its share of each
    call, the scores of all shared with every rank of the world. `rm` and `release` are the scorer's."""

    def __init__(self, scorer, comm: Comm, replica: Replica):
        self.scorer, self.comm, self.replica = scorer, comm, replica
        self.world = comm.group(range(comm.world))

    @property
    def rm(self):
        return self.scorer.rm

    def release(self) -> None:
        self.scorer.release()

    def share(self, sequences: Sequence[Sequence[int]]) -> np.ndarray:
        """The rows this rank's replica scores."""
        tokens = np.array([len(s) for s in sequences], np.int64)
        return share_by_tokens(tokens, self.replica.count, self.replica.index)

    def __call__(self, sequences: Sequence[Sequence[int]]) -> np.ndarray:
        """(B,) fp32 scores of every sequence, the same on every rank (each rank calls it with the same sequences)."""
        mine: List[int] = self.share(sequences).tolist()
        out = np.zeros(len(sequences), np.float32)
        if mine:  # every rank of the replica scores (its tensor-parallel collectives), the first one gives
            scores = np.asarray(self.scorer([sequences[i] for i in mine]), np.float32)
            if self.comm.rank == self.replica.first:
                out[mine] = scores
        return self.comm.host_sum(out, self.world)

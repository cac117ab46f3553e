"""Reductions written for MindSpore's CPU kernels, shared by the optimizer, the parallel layers, the
log-probs head and the sampler; the squares of many tensors in one graph (`utils/spans.py`)."""

from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

from mindgrpo.utils.spans import spans


def row_sum(x):
    """x (N, V) -> the sum of each row (N,), as a matmul against ones: blocked accumulation, where a plain
    reduction over 152k terms is off by ~3e-6."""
    return ops.matmul(x, ops.ones((x.shape[-1], 1), x.dtype)).reshape(-1)


def squared_sum(x):
    """sum(x * x) as a 0-d tensor, the last axis first: MindSpore's CPU reduces over every element
    about 10x slower than along rows (139 against 15 ms for a (152k, 256) gradient; `benchmarks/adamw.py`)."""
    sq = x * x
    return sq.sum(-1).sum() if sq.ndim > 1 else sq.sum()


class _SquaresSpan(nn.Cell):
    def __init__(self, take):
        super().__init__(auto_prefix=False)
        self.take, self.n = tuple(take), len(take)

    def construct(self, sq, xs):
        for i in range(self.n):
            if self.take[i]:
                sq = sq + squared_sum(xs[i])
        return sq


class SquaredSums(nn.Cell):
    """construct(xs) -> the sum of squared_sum(x) over the tensors xs that `take` marks (all when None),
    added one after another in order, from a float32 zero; in spans (`utils/spans.py`)."""

    def __init__(self, n: int, take=None):
        super().__init__(auto_prefix=False)
        take = (True,) * n if take is None else tuple(bool(t) for t in take)
        self.bounds = spans(n)
        self.span = nn.CellList([_SquaresSpan(take[a:b]) for a, b in self.bounds])

    def construct(self, xs):
        sq = ops.zeros((), ms.float32)
        for k in range(len(self.bounds)):
            a, b = self.bounds[k]
            sq = self.span[k](sq, xs[a:b])
        return sq

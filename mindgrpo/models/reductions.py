"""Reductions written for MindSpore's CPU kernels, shared by the optimizer, the parallel layers, the
log-probs head and the sampler."""

from __future__ import annotations

from mindspore import ops


def row_sum(x):
    """x (N, V) -> the sum of each row (N,), as a matmul against ones: blocked accumulation, where a plain
    reduction over 152k terms is off by ~3e-6."""
    return ops.matmul(x, ops.ones((x.shape[-1], 1), x.dtype)).reshape(-1)


def squared_sum(x):
    """sum(x * x) as a 0-d tensor, the last axis first: MindSpore's CPU reduces over every element
    about 10x slower than along rows (139 against 15 ms for a (152k, 256) gradient; `benchmarks/adamw.py`)."""
    sq = x * x
    return sq.sum(-1).sum() if sq.ndim > 1 else sq.sum()

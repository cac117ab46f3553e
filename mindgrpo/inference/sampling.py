"""Sampling parameters and the in-graph sampler.

Sampling runs inside the compiled decode graph. The only randomness that comes from the host
is one uniform number per row and step (B floats), drawn from a seeded numpy generator, so a
run is reproducible bit for bit and no (B, V) noise is built on the host. A token is drawn by
inverting the cumulative distribution of the filtered probabilities.

Filters apply in this order: temperature, top-k, top-p, min-p.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import mindspore as ms
from mindspore import nn, ops


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 1.0  # 0 means greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    min_p: float = 0.0  # 0: off
    n: int = 1  # samples per prompt; rows of one prompt are adjacent in the output
    stop_token_ids: Tuple[int, ...] = ()
    ignore_stop: bool = False  # force max_tokens new tokens (benchmarks)
    seed: int = 0

    def __post_init__(self):
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p < 1.0:
            raise ValueError(f"min_p must be in [0, 1), got {self.min_p}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def graph_key(self):
        """The fields that shape the compiled sampler (the rest are host-side)."""
        return (self.temperature, self.top_k, self.top_p, self.min_p)


class Sampler(nn.Cell):
    """logits (B, V) fp32, u (B,) in [0, 1) -> token ids (B,) int32. Static config."""

    def __init__(self, params: SamplingParams, vocab_size: int):
        super().__init__()
        self.greedy = params.greedy
        self.temperature = params.temperature if not params.greedy else 1.0
        self.top_k = min(params.top_k, vocab_size)
        self.top_p = params.top_p
        self.min_p = params.min_p
        self.sort_needed = self.top_k == 0 and self.top_p < 1.0

    def construct(self, logits, u):
        if self.greedy:
            return ops.argmax(logits, -1).astype(ms.int32)
        if self.temperature != 1.0:
            logits = logits / self.temperature
        idx = None
        if self.top_k > 0:
            logits, idx = ops.topk(logits, self.top_k)  # (B, K), sorted descending
        elif self.sort_needed:
            logits, idx = ops.sort(logits, -1, descending=True)
        weights = ops.exp(logits - logits.max(axis=-1, keepdims=True))  # unnormalised probs
        if self.top_p < 1.0:  # keep a token while the mass strictly before it is < top_p
            total = weights.sum(-1, keepdims=True)
            before = ops.cumsum(weights, -1) - weights
            weights = ops.where(before < self.top_p * total, weights, ops.zeros_like(weights))
        if self.min_p > 0.0:  # the max weight is exactly 1 after the shift above
            weights = ops.where(weights >= self.min_p, weights, ops.zeros_like(weights))
        cdf = ops.cumsum(weights, -1)
        threshold = u.reshape(-1, 1) * cdf[:, -1:]
        pick = (cdf <= threshold).astype(ms.int32).sum(-1)
        pick = ops.minimum(pick, weights.shape[-1] - 1)
        if idx is not None:
            pick = ops.gather_elements(idx, 1, pick.reshape(-1, 1)).reshape(-1)
        return pick.astype(ms.int32)

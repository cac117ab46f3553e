"""Sampling parameters and the in-graph sampler.

Sampling runs inside the compiled decode graph. The only randomness that comes from the host
is one uniform number per row and step (B floats), each sample's own stream
(`mindgrpo/inference/streams.py`), so a run is reproducible bit for bit and no (B, V) noise is
built on the host. A token is drawn by
inverting the cumulative distribution of the filtered probabilities, in two levels: sums of
blocks of about sqrt(V) tokens pick the block, a cumulative sum inside it picks the token. With
no top-k and no top-p the whole vocabulary takes one softmax and one block sum: no (B, V)
cumulative sum (~10 ms at V=152k, B=16 on CPU) and no (B, V) comparison, and the cumulative
sums are short enough to stay exact to fp32 rounding (one over 152k terms drifts by more than
a token's probability).

Filters apply in this order: temperature, top-k, top-p, min-p. With the token the sampler returns
its log-probs under the filtered distribution and under softmax(logits / T) (the rollout log-probs
the trainer keeps next to the training graph's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Tuple

import mindspore as ms
from mindspore import nn, ops

from mindgrpo.models.reductions import row_sum


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
        """The fields compiled into the sampler; the temperature is an input (0: greedy), so greedy
        validation and sampled rollouts share their graphs."""
        return (self.top_k, self.top_p, self.min_p)


def identical_greedy_samples(n: int, greedy_flag: str) -> str:
    """What generate.py and evaluate.py say to n > 1 samples of a prompt asked greedy by `greedy_flag`
    (`--greedy`, `--temperature 0`): n copies of one sample."""
    return (f"--n {n} with {greedy_flag} draws {n} identical greedy samples; use --n 1, or sample with "
            "--temperature > 0")


def block_size(n: int) -> int:
    """The divisor of n nearest to sqrt(n): blocks for the two-level draw (1 when n is prime,
    which is then one level)."""
    divisors = [k for k in range(1, int(math.isqrt(n)) + 1) if n % k == 0]
    divisors += [n // k for k in divisors]
    return min(divisors, key=lambda k: (abs(k - math.sqrt(n)), k))


class Sampler(nn.Cell):
    """logits (B, V) fp32, u (B,) in [0, 1), temperature (B,) fp32 (0: greedy) -> token ids (B,)
    int32, and two log-probs (B,) fp32 of each drawn token:
        sampled  under the distribution it was drawn from: softmax(logits / T) after top-k, top-p
                 and min-p, renormalised (0 for greedy: a point mass)
        scaled   under softmax(logits / T) (T = 1 for greedy), what the training graph scores
    top-k, top-p and min-p are compiled in; the temperature is per row."""

    def __init__(self, params: SamplingParams, vocab_size: int):
        super().__init__()
        self.top_k = min(params.top_k, vocab_size)
        self.top_p = params.top_p
        self.min_p = params.min_p
        self.sort_needed = self.top_k == 0 and self.top_p < 1.0
        self.whole_vocab = self.top_k == 0 and not self.sort_needed
        n = vocab_size if self.whole_vocab else (self.top_k or vocab_size)
        self.block = block_size(n)

    def construct(self, logits, u, temperature):
        greedy = temperature <= 0.0  # (B,)
        best = ops.argmax(logits, -1).astype(ms.int32)
        logits = logits / ops.where(greedy, 1.0, temperature).reshape(-1, 1)
        # one fused softmax kernel: 2.1 to 2.7 ms a draw on (16, 152k) here, against 5.4 to 6.3 for
        # exp(logits - max) in separate ops (a probe, removed: git show 997488e:benchmarks/sampler.py); no ops.log_softmax (see models/qwen2.LogProbs)
        probs = ops.softmax(logits, -1)  # (B, V)
        if self.whole_vocab:  # `draw` needs no normalisation, but the probabilities are at hand
            weights = probs
            if self.min_p > 0.0:
                keep = probs >= self.min_p * probs.max(axis=-1, keepdims=True)
                weights = ops.where(keep, probs, ops.zeros_like(probs))
            # the draw's outputs by index, each used: an output of it left unused in construct draws MindSpore's
            # "Some side effect nodes were eliminated by mistake" warning at every compile (DEVELOPERS.md)
            out = self.draw(weights, u)
            tok, sampled = ops.where(greedy, best, out[0]), out[1]
            mass = out[2] if self.min_p == 0.0 else row_sum(probs)  # the draw summed p itself
        else:
            if self.top_k > 0:
                top, idx = ops.topk(logits, self.top_k)  # (B, K), sorted descending
            else:
                top, idx = ops.sort(logits, -1, descending=True)
            weights = ops.exp(top - top[:, :1])  # unnormalised probs; the max weight is exactly 1
            if self.top_p < 1.0:  # keep a token while the mass strictly before it is < top_p
                total = weights.sum(-1, keepdims=True)
                before = ops.cumsum(weights, -1) - weights
                weights = ops.where(before < self.top_p * total, weights, ops.zeros_like(weights))
            if self.min_p > 0.0:
                weights = ops.where(weights >= self.min_p, weights, ops.zeros_like(weights))
            out = self.draw(weights, u)  # its total unused here: the outputs by index (above)
            tok, sampled = ops.where(greedy, best, _pick(idx, out[0]).astype(ms.int32)), out[1]
            mass = row_sum(probs)
        # log p of the token, no (B, V) log; a drawn token has weight > 0, so p > 0 in practice. The kernel's
        # probabilities sum to 1 + ~1.5e-5 at V = 152k (its normaliser), so log p is divided by their sum
        scaled = ops.log(_pick(probs, tok)) - ops.log(mass)
        return tok, ops.where(greedy, ops.zeros_like(sampled), sampled), scaled

    def draw(self, weights, u):
        """weights (B, N) >= 0, not all zero per row -> the index i whose cumulative weight interval
        [c_i - w_i, c_i) holds u * total (B,) int32, log(w_i / total) (B,) and total (B,). A threshold that
        rounds to the end of a block or of the row takes its last nonzero token (`c < last`), never
        a zero-weight one."""
        b, n = weights.shape
        nb, blk = n // self.block, self.block
        rows = weights.reshape(b * nb, blk)
        sums = rows.sum(-1).reshape(b, nb)  # (B, nb) block sums
        ends = ops.cumsum(sums, -1)
        total = ends[:, -1:]
        threshold = u.reshape(b, 1) * total
        j = ops.logical_and(ends <= threshold, ends < total).astype(ms.int32).sum(-1)  # (B,) the block
        start = ops.gather_elements(ends - sums, 1, j.reshape(b, 1))  # (B, 1) mass before the block
        inner = start + ops.cumsum(ops.gather(rows, ops.arange(b, dtype=ms.int32) * nb + j, 0), -1)  # (B, blk)
        i = ops.logical_and(inner <= threshold, inner < inner[:, -1:]).astype(ms.int32).sum(-1)
        pick = j * blk + i
        total = total.reshape(-1)
        return pick, ops.log(_pick(weights, pick)) - ops.log(total), total


def _pick(x, index):
    """x (B, N), index (B,) -> x[b, index[b]] (B,)."""
    return ops.gather_elements(x, 1, index.reshape(-1, 1).astype(ms.int32)).reshape(-1)

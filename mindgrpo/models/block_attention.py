"""Attention over packed rows a block of queries at a time, forward only (the reward scorer's graphs:
`models/reward_model.py`): no (B, heads, S, S) tensor and no (B, 1, S, S) mask is ever made.

For each block of C queries [a, a + C) the graph takes the keys [0, a + C) only (causal: the later ones are masked
anyway), so a block's scores are (B, heads, C, a + C); their mask is built from the segments of the block's queries
and of those keys (0 where the key is at or before the query and in the same sequence, NEG_INF elsewhere, as
`models/scoring.segment_bias`), then softmax, then the values. The blocks are a static loop in the graph; MindSpore's
CPU runtime reuses one block's buffers for the next, so a graph keeps about one block's worth
(docs/reward_models.md, "Scoring memory"). Queries are scaled by 1/sqrt(d) before the product (one buffer fewer).

    query_block(rows, heads, length)   the block's query count C for a row shape (a multiple of 32, or the length)
    BlockAttention                     q (B, nh, S, d), k / v (B, nkv, S, d), segments (B, S) -> (B, S, nh * d)

Masked keys weigh exp(NEG_INF - max) = 0 exactly, so the result is the whole-row attention's up to the order of the
softmax's and the product's sums (fp32 rounding). MindSpore 2.10 has no fused attention on the CPU
(`ops.flash_attention_score` and `ops.prompt_flash_attention` refuse it: "Unsupported op ... on CPU"), hence this.
On the CPU in fp32 with our kernels switched on (`mindgrpo/kernels/attention.py`, MINDGRPO_CPU_KERNELS) one kernel
computes the same attention instead of the blocks: it reads only the keys of each query's own sequence, and builds
no mask (docs/cpu_kernels.md); equal to the blocks to fp32 rounding.
Shapes use the vocabulary of `mindgrpo/__init__.py`.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

from mindgrpo.kernels.attention import segment_attention

# A block's scores hold at most this many fp32 elements (32 MB): rows x heads x C x (keys <= S)
BLOCK_ELEMENTS = 1 << 23
NEG_INF = -1e9  # the additive mask value of every attention here (models/qwen2 imports it)


def query_block(rows: int, heads: int, length: int, budget: int = BLOCK_ELEMENTS) -> int:
    """The queries a block takes at rows x length tokens and `heads` query heads: as many as keep a block's scores
    (rows, heads, C, length) within `budget` elements, a multiple of 32 (at least 32), at most the length."""
    c = budget // max(1, rows * heads * length) // 32 * 32
    return int(min(length, max(32, c)))


class BlockAttention(nn.Cell):
    """Grouped-query attention of packed rows in blocks of queries (module docstring). nh / nkv: the query and kv
    heads this rank holds (query heads h*g .. h*g+g-1 share kv head h, as `models/qwen2.Attention`); scale: 1/sqrt(d);
    dtype: the compute dtype (fp32 on a CPU with our kernels switched on: the kernel, else the blocks)."""

    def __init__(self, nh: int, nkv: int, scale: float, budget: int = BLOCK_ELEMENTS, dtype=ms.float32):
        super().__init__()
        self.nh, self.nkv, self.g, self.scale, self.budget = nh, nkv, nh // nkv, scale, budget
        self.kernel = segment_attention(dtype)  # None: the blocks below
        self.qk = ops.BatchMatMul(transpose_b=True)
        self.pv = ops.BatchMatMul()

    def construct(self, q, k, v, segments):
        """q (B, nh, S, d), k / v (B, nkv, S, d), segments (B, S) int32 (1, 2, ... a row's sequences, 0 its
        padding) -> (B, S, nh * d)."""
        b, _, s, d = q.shape
        q = q * self.scale
        if self.kernel is not None:
            return self.kernel(q, k, v, segments).transpose(0, 2, 1, 3).reshape(b, s, self.nh * d)
        c = query_block(b, self.nh, s, self.budget)
        index = ops.arange(s).astype(ms.int32)  # (S,) key and query positions along the row
        outs = ()
        for a in range(0, s, c):
            n = c if a + c <= s else s - a  # queries in this block
            end = a + n  # keys [0, end): the later ones follow every query of the block
            qb = q if n == s else ops.slice(q, (0, 0, a, 0), (b, self.nh, n, d))
            kb = k if end == s else ops.slice(k, (0, 0, 0, 0), (b, self.nkv, end, d))
            vb = v if end == s else ops.slice(v, (0, 0, 0, 0), (b, self.nkv, end, d))
            seg_k = segments if end == s else ops.slice(segments, (0, 0), (b, end))  # (B, T)
            seg_q = segments if n == s else ops.slice(segments, (0, a), (b, n))  # (B, C)
            key_at = index if end == s else ops.slice(index, (0,), (end,))
            query_at = index if n == s else ops.slice(index, (a,), (n,))
            after = (query_at.reshape(n, 1) < key_at.reshape(1, end)).reshape(1, n, end)  # the key follows the query
            query = ops.broadcast_to(seg_q.reshape(b, n, 1), (b, n, end))
            elsewhere = ops.logical_or(query != seg_k.reshape(b, 1, end), after)  # (B, C, T) bool
            bias = (elsewhere.astype(ms.float32) * NEG_INF).reshape(b, 1, 1, n, end)
            scores = self.qk(qb.reshape(b, self.nkv, self.g * n, d), kb)  # heads of a kv group side by side
            scores = scores.reshape(b, self.nkv, self.g, n, end).astype(ms.float32)
            scores = scores + ops.broadcast_to(bias, scores.shape)
            probs = ops.softmax(scores, -1).astype(v.dtype).reshape(b, self.nkv, self.g * n, end)
            outs = outs + (self.pv(probs, vb).reshape(b, self.nh, n, d),)
        out = outs[0] if len(outs) == 1 else ops.concat(outs, 2)  # (B, nh, S, d)
        return out.transpose(0, 2, 1, 3).reshape(b, s, self.nh * d)

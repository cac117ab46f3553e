"""numpy's attention over packed rows with the masks spelled out, in float64: the independent reference of the
reward scorer's attention (tests/models/test_reward_model.py: the blocks; tests/kernels/test_attention_kernel.py: the
CPU kernel)."""

import numpy as np


def whole_row_attention(q, k, v, segments, scale):
    """numpy: q (B, nh, S, d), k / v (B, nkv, S, d), segments (B, S) -> (B, S, nh * d): each query attends to the
    keys at or before it in its own segment (padding, segment 0, to the padding), in float64."""
    b, nh, s, d = q.shape
    g = nh // k.shape[1]
    k, v = np.repeat(k, g, axis=1).astype(np.float64), np.repeat(v, g, axis=1).astype(np.float64)
    scores = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k) * scale
    keep = (segments[:, :, None] == segments[:, None, :]) & np.tril(np.ones((s, s), bool))[None]
    scores = np.where(keep[:, None], scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhqk,bhkd->bqhd", p, v).reshape(b, s, nh * d)

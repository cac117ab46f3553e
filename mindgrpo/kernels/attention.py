"""Causal attention over packed rows, forward only, for MindSpore's CPU backend: `attention.cc`'s kernel as an
`ops.Custom` "aot" op. `segment_attention()` gives it where `matmul.matmul` would give our matmul (CPU, fp32,
MINDGRPO_CPU_KERNELS on, the library loaded), else None: `models/block_attention.BlockAttention` then keeps its
MindSpore ops.

    op(q (B, nh, S, d) scaled, k (B, nkv, S, d), v (B, nkv, S, d), segments (B, S) int32) -> (B, nh, S, d)

A query attends to the keys at or before it with its own segment id (a run of equal ids along the row), as
BlockAttention's masks say; the kernel touches only those keys (the work of each sequence's own square, not the
row's). No backward: the scorer only runs forward."""

from __future__ import annotations

from typing import Optional

import mindspore as ms
from mindspore import ops

from mindgrpo.kernels.matmul import library, switched_on


def _same(q, k, v, segments):
    return q


def segment_attention(dtype=ms.float32) -> Optional[ops.Custom]:
    """The kernel's op for this compute dtype, or None (switched off, not CPU, not fp32, no library)."""
    if dtype != ms.float32 or not switched_on():
        return None
    path = library()
    if path is None:
        return None
    return ops.Custom(f"{path}:SegmentAttention", out_shape=_same, out_dtype=_same, func_type="aot")

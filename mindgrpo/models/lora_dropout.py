"""LoRA dropout (PEFT's `lora_dropout`) as a stateless counter-based hash in the graph.

PEFT computes y = x W^T (+ b) + s (dropout_p(x) A^T) B^T with one `nn.Dropout` per adapted projection: inverted
dropout (kept inputs times 1 / (1 - p)) on the adapter's input only, a mask of its own for each projection. Here
the mask of every element is a hash of integers, so there is no random state to save or restore, and any graph
that runs the same forward (the layerwise update's backward, recompute, a pipeline stage's backward, a resumed
run) makes the same mask from the same numbers. All arithmetic is on 32-bit words, + and * modulo 2^32, >> a
logical shift (in the graph: int32 with wrap-around, the shifts masked), and

    mix(h)  = lowbias32:  h ^= h >> 16; h *= 0x7FEB352D; h ^= h >> 15; h *= 0x846CA68B; h ^= h >> 16
    key     = mix(mix(mix(mix(seed) + step) + micro_batch) + replica)        (host: `update_key`)
    L       = key + 7 * layer * 0x9E3779B9                                   (the layer's key: `layer_key`)
    P       = mix(L + k * 0x9E3779B9),  k = 0 .. 6: q, k, v, o, gate, up, down (`projection_key`)
    r_t     = mix(P ^ t),  t = b * S + s: the token's flat index in the micro-batch's rows
    c_j     = mix((j + offset) * 0x85EBCA6B),  j: the input feature (offset: a row-parallel piece's first column)
    h       = r_t + c_j;  h ^= h >> 16;  h *= 0x7FEB352D;  h ^= h >> 15;  h *= 0x846CA68B
    keep    = (h >> 8) >= ceil(p * 2^24)       (a 24-bit uniform against the threshold: 1 - p of them kept)

step is the optimizer step the update is for (`PolicyUpdater.optimizer_steps`, restored on resume), micro_batch
its index in the update, replica the data-parallel replica's index. Packed rows are keyed by the position in the
packed row, so packing (or another micro-batch plan) changes which elements drop.
"""

from __future__ import annotations

import math

import numpy as np
import mindspore as ms
from mindspore import ops

__all__ = ["PROJECTIONS", "threshold", "keep_scale", "update_key", "layer_key", "projection_key", "dropout_mask",
           "layer_key_offset", "host_layer_key"]

PROJECTIONS = 7  # q, k, v, o, gate, up, down: k in the hash
_GOLDEN, _COLUMN = 0x9E3779B9, 0x85EBCA6B
_M1, _M2 = 0x7FEB352D, 0x846CA68B


def _i32(v: int) -> int:
    """A 32-bit word as the int32 with its bits (the graph's integers)."""
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


def threshold(p: float) -> int:
    """The 24-bit threshold: an element is kept when its uniform (h >> 8) is at least this."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"lora_dropout must be in [0, 1), got {p}")
    return int(math.ceil(p * (1 << 24)))


def keep_scale(p: float) -> float:
    """1 / (1 - p): what a kept input is multiplied by (inverted dropout)."""
    return 1.0 / (1.0 - p)


def _mix_host(h: int) -> int:
    h &= 0xFFFFFFFF
    h ^= h >> 16
    h = (h * _M1) & 0xFFFFFFFF
    h ^= h >> 15
    h = (h * _M2) & 0xFFFFFFFF
    return h ^ (h >> 16)


def update_key(seed: int, step: int, micro_batch: int, replica: int = 0) -> np.int32:
    """The key of one micro-batch of one update (module docstring), as the graph's int32."""
    h = _mix_host(seed)
    for v in (step, micro_batch, replica):
        h = _mix_host(h + v)
    return np.int32(_i32(h))


def layer_key_offset(layer: int) -> int:
    """7 * layer * 0x9E3779B9 as an int32: L = key + this."""
    return _i32(PROJECTIONS * layer * _GOLDEN)


def layer_key(key, layer: int):
    """L of decoder layer `layer` (module docstring) in a graph: key an int32 scalar tensor."""
    return key + layer_key_offset(layer)


def host_layer_key(key: int, layer: int) -> np.int32:
    """`layer_key` on the host (the layerwise update gives it to its layer graph as an input)."""
    return np.int32(_i32(int(key) + layer_key_offset(layer)))


def _shr(h, n: int):
    """Logical right shift of int32 words by n."""
    return ops.bitwise_and(ops.bitwise_right_shift(h, n), (1 << (32 - n)) - 1)


def _mix(h):
    h = ops.bitwise_xor(h, _shr(h, 16))
    h = h * _i32(_M1)
    h = ops.bitwise_xor(h, _shr(h, 15))
    h = h * _i32(_M2)
    return ops.bitwise_xor(h, _shr(h, 16))


def projection_key(layer_key_tensor, k: int):
    """P of projection k of the layer whose key is given (an int32 scalar tensor), or None without one."""
    if layer_key_tensor is None:
        return None
    return _mix(layer_key_tensor + _i32(k * _GOLDEN))


def dropout_mask(key, n: int, width: int, offset: int, thresh: int, scale: float, dtype):
    """key: a projection's P (int32 scalar tensor) -> (n, width) mask in `dtype`: scale where kept, 0 where dropped,
    for the tokens 0 .. n-1 of the micro-batch's flat rows and the input features offset .. offset + width - 1."""
    t = ops.arange(n).astype(ms.int32)
    rows = _mix(ops.bitwise_xor(ops.broadcast_to(key.reshape(1), (n,)), t)).reshape(n, 1)  # (n, 1)
    cols = _mix((ops.arange(width).astype(ms.int32) + offset) * _i32(_COLUMN)).reshape(1, width)  # (1, width)
    h = ops.broadcast_to(rows, (n, width)) + cols
    h = ops.bitwise_xor(h, _shr(h, 16))
    h = h * _i32(_M1)
    h = ops.bitwise_xor(h, _shr(h, 15))
    h = h * _i32(_M2)
    keep = _shr(h, 8) >= thresh
    return keep.astype(dtype) * scale

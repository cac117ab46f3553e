"""Tensor-parallel layers (Megatron), written with explicit collectives, and their factory.

`TensorParallelLayers(group)` has the methods of `mindgrpo.models.qwen2.DenseLayers`; passed to
`Qwen2ForCausalLM(..., layers=...)` it makes one rank's piece of the model. Parameter names do
not change: `model.layers.0.attention.wq.weight` holds this rank's rows. The split is the one of
`mindgrpo.parallel.layout.SPLIT_RULES` (rank k of a group of tp holds the k-th of tp equal,
contiguous pieces), so a strategy file of the layout describes these parameters exactly.

    column   Linear on rows [k*out/tp, (k+1)*out/tp) of W; output (..., out/tp), no collective; a LoRA
             adapter's B by the same rows, its A whole (its gradient summed over the group: f)
    row      Linear on columns [k*in/tp, ...) of W; partial outputs summed over the group (g); a LoRA
             adapter's A by the same columns, its B whole (x A^T summed over the group before B: g)
    enter    identity forward, gradient summed over the group (f), once before column layers
    embedding        rows [k*V/tp, ...) of the table; other ranks' ids give 0, summed over (g)
    logprobs         log p(label) and entropy from the vocabulary-split logits (N, V/tp): a
                     max, one sum of (N, 3) and no (N, V) gather
    gather_vocab     (N, V/tp) -> (N, V), for sampling
    grad_sq_norm     the whole gradient's squared norm (pieces summed over the group), for clipping
A replicated activation's gradient is whole on every rank (f sums it), so the norms' weights
get the same gradient everywhere and need no reduction. Qwen3's QK-norm weights are the exception:
replicated, but applied to each rank's own heads, so their weight itself passes through f
(`mindgrpo.models.qwen2.HeadNorm`) and every rank gets the gradient summed over the heads of all.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from mindgrpo.models.fused_head import HeadLogProbs
from mindgrpo.models.qwen2 import Embedding, Linear
from mindgrpo.models.reductions import SquaredSums
from mindgrpo.parallel.comm import AllGather, AllReduce, CopyToGroup, Group, ReduceFromGroup
from mindgrpo.parallel.layout import ParallelLayout


def _piece(full: np.ndarray, dim: int, tp: int, index: int) -> np.ndarray:
    n = full.shape[dim] // tp
    return np.take(full, np.arange(index * n, (index + 1) * n), axis=dim)


class ColumnParallelLinear(Linear):
    """y_k = x W_k^T (+ b_k): W_k (out/tp, in) and b_k are this rank's rows, x whole (it entered through f).

    LoRA (y_k + s (x A^T) B_k^T): B_k (out/tp, r) this rank's rows of B, A (r, in) whole on every rank. Each rank's
    rows give A only part of its gradient, so A passes through f (`lora_in`), which sums it over the group, as
    Qwen3's QK-norm weights do; x's gradient through A^T is then partial per rank like the base matmul's, and the
    f x came through sums both."""

    def __init__(self, weight: np.ndarray, bias: Optional[np.ndarray], compute_dtype, group: Group):
        super().__init__(weight, bias, compute_dtype)
        self.tp, self.index = group.size, group.index
        self.enter_a = CopyToGroup(group)

    def lora_in(self, a):
        return self.enter_a(a)

    def full_shape(self):
        out_rows, in_f = super().full_shape()
        return out_rows * self.tp, in_f

    def adapter_piece(self, a, b):
        return a, _piece(b, 0, self.tp, self.index)


class RowParallelLinear(Linear):
    """y = g(x_k W_k^T) + b: x_k (..., in/tp) is this rank's slice of the features, W_k (out, in/tp).
    `Linear.construct` does the matmul; `finish` the sum over the group and the bias.

    LoRA (+ s g(x_k A_k^T) B^T): A_k (r, in/tp) this rank's columns of A, B (out, r) whole. The (N, r) partial
    products are summed over the group before B (`lora_mid`): so B's gradient is whole on every rank (summing
    after B would leave it partial) and A_k's gradient is its piece's. LoRA dropout masks x_k with the whole
    input's mask at this piece's columns (`lora_offset`), so the pieces drop what one device drops."""

    def __init__(self, weight: np.ndarray, bias: Optional[np.ndarray], compute_dtype, group: Group):
        super().__init__(weight, None, compute_dtype)
        self.reduce = ReduceFromGroup(group)
        self.reduce_lora = ReduceFromGroup(group)
        self.tp, self.index = group.size, group.index
        self.lora_offset = self.index * int(self.weight.shape[1])  # LoRA dropout: the whole input's mask here
        self.has_row_bias = bias is not None
        if self.has_row_bias:
            self.bias = Parameter(Tensor(np.ascontiguousarray(bias, np.float32)), name="bias")

    def lora_mid(self, h):  # (N, r) partial -> summed over the group
        return self.reduce_lora(h)

    def full_shape(self):
        out_f, in_cols = super().full_shape()
        return out_f, in_cols * self.tp

    def adapter_piece(self, a, b):
        return _piece(a, 1, self.tp, self.index), b

    def finish(self, y):  # (N, out) partial -> (N, out): summed over the group, then the bias
        y = self.reduce(y)
        if self.has_row_bias:
            y = y + self.bias.astype(y.dtype)
        return y


class VocabParallelEmbedding(Embedding):
    """ids (...) -> (..., H) from this rank's rows [start, start + V/tp) of the table."""

    def __init__(self, weight: np.ndarray, start: int, group: Group):
        super().__init__(weight)
        self.start, self.rows = start, weight.shape[0]
        self.reduce = ReduceFromGroup(group)

    def construct(self, ids):
        local = ids - self.start
        mine = ops.logical_and(local >= 0, local < self.rows)
        x = ops.gather(self.embedding_weight, ops.where(mine, local, ops.zeros_like(local)), 0)
        x = ops.where(mine.expand_dims(-1), x, ops.zeros_like(x))
        return self.reduce(x)


class VocabParallelLogProbs(nn.Cell):
    """logits (N, V/tp) fp32 (this rank's vocabulary slice), labels (N,) -> log p(label) (N,),
    entropy (N,) or zeros.

        m     = max over the whole vocabulary (the tp local maxima gathered; no gradient: the
                result does not depend on the shift)
        Z     = sum_r sum_i exp(l_i - m),  target = l_label - m  (only its owner has it)
        H     = log Z - sum_r sum_i p_i (l_i - m)
    The three sums travel in one (N, 3) reduction with an identity backward (g): every rank
    computes the same loss from them, so each rank's own terms get the whole gradient."""

    def __init__(self, group: Group, vocab_start: int, vocab_rows: int):
        super().__init__()
        self.start, self.rows = vocab_start, vocab_rows
        self.gather = AllGather(group)
        self.reduce = ReduceFromGroup(group)
        self.tp = group.size

    def construct(self, logits, labels, with_entropy: bool):
        n = logits.shape[0]
        local_max = logits.max(axis=-1, keepdims=True)  # (N, 1)
        m = self.gather(local_max.reshape(1, n)).max(axis=0).reshape(n, 1)  # (tp, N) -> (N, 1)
        m = ops.stop_gradient(m)
        shifted = logits - ops.broadcast_to(m, logits.shape)  # explicit broadcast: see models/fused_head.py
        e = ops.exp(shifted)
        local = labels.astype(ms.int32) - self.start
        mine = ops.logical_and(local >= 0, local < self.rows)
        picked = ops.gather_elements(shifted, 1, ops.where(mine, local, ops.zeros_like(local)).reshape(-1, 1))
        target = ops.where(mine, picked.reshape(-1), ops.zeros_like(picked.reshape(-1)))
        if with_entropy:
            es = ops.stop_gradient((e * shifted).sum(-1))
        else:
            es = ops.zeros_like(target)
        sums = self.reduce(ops.stack((e.sum(-1), target, es), axis=1))  # (N, 3)
        log_z = ops.log(sums[:, 0])
        logp = sums[:, 1] - log_z
        if with_entropy:
            ent = log_z - sums[:, 2] / sums[:, 0]
        else:
            ent = ops.zeros_like(logp)
        return logp, ent


class GroupMax(nn.Cell):
    """x (N, 1) -> the elementwise max over the group (N, 1). No gradient."""

    def __init__(self, group: Group):
        super().__init__()
        self.gather = AllGather(group)

    def construct(self, x):
        n = x.shape[0]
        return self.gather(x.reshape(1, n)).max(axis=0).reshape(n, 1)  # (tp, N) -> (N, 1)


class GatherVocab(nn.Cell):
    """logits (N, V/tp) -> (N, V): the ranks' slices side by side."""

    def __init__(self, group: Group):
        super().__init__()
        self.gather = AllGather(group)
        self.tp = group.size

    def construct(self, logits):
        n, v = logits.shape
        full = self.gather(logits)  # (tp * N, V/tp)
        return full.reshape(self.tp, n, v).transpose(1, 0, 2).reshape(n, self.tp * v)


class GradSqNorm(nn.Cell):
    """Gradients (this rank's pieces) -> squared norm of the whole model's gradient: the split
    parameters' squares summed over the group, the replicated ones (norms) counted once."""

    def __init__(self, split, group: Group):
        super().__init__()
        split = tuple(bool(s) for s in split)
        self.pieces = SquaredSums(len(split), split)
        self.whole = SquaredSums(len(split), tuple(not s for s in split))
        self.reduce = AllReduce(group)

    def construct(self, grads):
        return self.reduce(self.pieces(grads)) + self.whole(grads)


class TensorParallelLayers:
    """The layer factory of one rank of a tensor-parallel group (see the module docstring)."""

    def __init__(self, group: Group):
        self.group = group
        self.tp, self.index = group.size, group.index

    def column(self, weight, bias, compute_dtype) -> nn.Cell:
        return ColumnParallelLinear(_piece(weight, 0, self.tp, self.index),
                                    None if bias is None else _piece(bias, 0, self.tp, self.index), compute_dtype,
                                    self.group)

    def row(self, weight, bias, compute_dtype) -> nn.Cell:
        return RowParallelLinear(_piece(weight, 1, self.tp, self.index), bias, compute_dtype, self.group)

    def enter(self) -> nn.Cell:
        return CopyToGroup(self.group)

    def embedding(self, weight) -> nn.Cell:
        piece = _piece(weight, 0, self.tp, self.index)
        return VocabParallelEmbedding(piece, self.index * piece.shape[0], self.group)

    def logprobs(self, vocab_size: int) -> nn.Cell:
        rows = vocab_size // self.tp
        return VocabParallelLogProbs(self.group, self.index * rows, rows)

    def head_logprobs(self, vocab_size: int, chunk: int, with_entropy: bool) -> nn.Cell:
        rows = vocab_size // self.tp
        return HeadLogProbs(chunk, with_entropy, self.index * rows, GroupMax(self.group), AllReduce(self.group))

    def gather_vocab(self) -> nn.Cell:
        return GatherVocab(self.group)

    def grad_sq_norm(self, names) -> nn.Cell:
        return GradSqNorm(tuple(ParallelLayout.param_split(n) is not None for n in names), self.group)

"""The vocabulary projection and log-softmax of the training graph, fused, in row chunks, with a
hand-written backward.

    HeadLogProbs(chunk)(h (N, H), w (V, H), labels (N,)) -> logp (N,), entropy (N,), lse (N,)

Autodiff of `log_softmax(h @ w.T)[label]` makes about a dozen (N, V) tensors (logits, shifted,
exp, log-probs, their gradients) and keeps several from the forward to the backward pass. Here the
forward pass makes the logits of `chunk` rows at a time and keeps only three numbers per row; the
backward pass recomputes each chunk's logits (one extra matmul) and turns them straight into the
gradients:

    p      = exp(logits - lse)                            (chunk, V)
    dlogit = g * (onehot(label) - p)                      d logp / d logits, times the incoming g
    dh     = dlogit @ w,   dw += dlogit.T @ h

so a chunk needs ~3 (chunk, V) tensors, and chunk k waits for chunk k-1 (`ops.depend`). With forward
and backward, the head alone (152k vocabulary, 128-row chunks) still grows by ~0.2 GB per chunk on
MindSpore 2.10's CPU runtime (0.98 GB at one chunk, 1.57 at four; autodiff 0.94 and 2.02): not yet
found where. Figures for a whole GRPO step: a probe, removed (`git show 997488e:benchmarks/fused_head.py`). On Ascend, untested.
The entropy output is for logging: it gets no gradient (the GRPO loss does not use it).

Under tensor parallelism w is this rank's vocabulary slice [vocab_start, vocab_start + V/tp):
`max_over` and `sum_over` combine the per-row maxima and sums over the group (identity on one
device), lse is global, and dh is this rank's partial sum (the column-parallel entry `f` sums it).
(`ops.zeros_like` inside a cell with a custom bprop fails to compile in MindSpore 2.10: `ops.zeros`.)

Broadcasts against (chunk, V) tensors are written out with `ops.broadcast_to`: on MindSpore 2.10's CPU
runtime an implicit (C, V) - (C, 1) keeps a chunk-sized buffer alive per call (the head alone, 128-row
chunks, forward: 1.02 GB for one chunk and 1.90 GB for four; with broadcast_to 0.83 GB for both).
"""

from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

from mindgrpo.kernels.matmul import rows_matmul


class HeadLogProbs(nn.Cell):
    def __init__(self, chunk: int, with_entropy: bool, vocab_start: int = 0, max_over=None, sum_over=None):
        super().__init__()
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        self.chunk, self.with_entropy, self.start = chunk, with_entropy, vocab_start
        self.max_over = max_over if max_over is not None else nn.Identity()  # (N, 1) -> group max
        self.sum_over = sum_over if sum_over is not None else nn.Identity()  # (N, 3) -> group sum
        # ours on CPU for fp32 chunks of many rows (mindgrpo/kernels), else MindSpore's MatMul
        self.project = rows_matmul(transpose_b=True)  # h (C, H) x w (V, H) -> (C, V), no `.T` copy
        self.back_h = rows_matmul()  # dlogit (C, V) x w (V, H) -> (C, H)
        self.back_w = rows_matmul(transpose_a=True)  # dlogit (C, V)^T x h (C, H) -> (V, H)

    def _local(self, labels, rows):
        """labels (C,) -> their index in this rank's slice (0 where not ours), and which are ours."""
        local = labels.astype(ms.int32) - self.start
        mine = ops.logical_and(local >= 0, local < rows)
        return ops.where(mine, local, ops.zeros(local.shape, local.dtype)), mine

    def _rows(self, h, w, labels):
        """One chunk: h (C, H) -> logp (C,), entropy (C,), lse (C,)."""
        logits = self.project(h, w).astype(ms.float32)  # (C, V)
        m = self.max_over(logits.max(axis=-1, keepdims=True))  # (C, 1)
        shifted = logits - ops.broadcast_to(m, logits.shape)  # explicit: see the module docstring
        e = ops.exp(shifted)
        index, mine = self._local(labels, w.shape[0])
        picked = ops.gather_elements(shifted, 1, index.reshape(-1, 1)).reshape(-1)
        target = ops.where(mine, picked, ops.zeros(picked.shape, picked.dtype))
        if self.with_entropy:
            es = (e * shifted).sum(-1)
        else:
            es = ops.zeros(target.shape, target.dtype)
        sums = self.sum_over(ops.stack((e.sum(-1), target, es), axis=1))  # (C, 3)
        log_z = ops.log(sums[:, 0])
        ent = log_z - sums[:, 2] / sums[:, 0] if self.with_entropy else ops.zeros(log_z.shape, log_z.dtype)
        return sums[:, 1] - log_z, ent, m.reshape(-1) + log_z

    def construct(self, h, w, labels):
        n = h.shape[0]
        logp, ent, lse = (), (), ()
        done = ops.zeros((), ms.float32)
        for start in range(0, n, self.chunk):
            stop = min(start + self.chunk, n)
            # chunk k waits for chunk k-1: independent branches would otherwise run side by side, every
            # chunk's (chunk, V) buffers alive at once
            a, b, c = self._rows(ops.depend(h[start:stop], done), w, labels[start:stop])
            logp, ent, lse = logp + (a,), ent + (b,), lse + (c,)
            done = c
        return ops.concat(logp), ops.concat(ent), ops.concat(lse)

    def bprop(self, h, w, labels, out, dout):
        n, rows = h.shape[0], w.shape[0]
        lse, g = out[2], dout[0]  # the entropy and lse outputs carry no gradient
        dh, dw = (), ops.zeros(w.shape, ms.float32)
        for start in range(0, n, self.chunk):
            stop = start + self.chunk if start + self.chunk < n else n  # (no `min` in a bprop)
            hc = h[start:stop]
            logits = self.project(ops.depend(hc, dw), w).astype(ms.float32)  # (C, V), recomputed after chunk k-1
            gc = g[start:stop].reshape(-1, 1)
            p = ops.exp(logits - ops.broadcast_to(lse[start:stop].reshape(-1, 1), logits.shape))
            dlogit = -ops.broadcast_to(gc, logits.shape) * p
            index, mine = self._local(labels[start:stop], rows)
            hit = ops.stack((ops.arange(stop - start, dtype=ms.int32), index), axis=1)  # (C, 2)
            gc = gc.reshape(-1)
            dlogit = ops.tensor_scatter_add(dlogit, hit, ops.where(mine, gc, ops.zeros(gc.shape, gc.dtype)))
            dlogit = dlogit.astype(h.dtype)
            dh = dh + (self.back_h(dlogit, w),)
            dw = dw + self.back_w(dlogit, hc).astype(ms.float32)
        return ops.concat(dh).astype(h.dtype), dw.astype(w.dtype), ops.zeros(labels.shape, labels.dtype)

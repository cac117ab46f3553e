"""Pipeline parallelism: a rank's place in the chain of stages, the hand-offs between neighbours,
and the two schedules the actor runs its micro-batches through.

Stage s of a layout holds decoder layers `ParallelLayout.stage_layers(s, L)` (the first stage also
the embedding, the last the final norm and the lm_head). Rank (s, dp, tp) passes its output
hidden states (B, S, H) to rank (s+1, dp, tp) and gets their gradient back; every tensor-parallel
rank of a stage holds the whole activation (the row-parallel layers sum it), so each passes it
to its own counterpart.

    scoring (forward only)   per micro-batch: receive, run the stage, send; the last stage
                             computes the log-probs, which every stage then gets (`from_last`)
    training (GPipe)         the forwards of all micro-batches, then their backwards in the same
                             order; a stage before the last keeps only its input per micro-batch
                             and recomputes its forward inside the backward graph (activation
                             recomputation), the last stage runs forward and backward in one graph

Every rank issues the hand-offs it takes part in in one global order (micro-batch, then stage;
backwards after forwards), so the blocking exchanges always meet. With one stage both schedules
are the plain micro-batch loop.

A hand-off is a sum over the two ranks' group where the receiver contributes -0.0: x + (-0.0)
is x bit for bit. MindSpore 2.10's CPU collectives have no Send/Receive; the sum works on every
backend (on Ascend HCCL's Send/Receive would halve the bytes).
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np
import mindspore as ms
from mindspore import nn, ops

from mindgrpo.grpo.optim import squared_sum
from mindgrpo.models.qwen2 import StageSpec
from mindgrpo.parallel.comm import AllReduce, Comm, Group
from mindgrpo.parallel.layout import ParallelLayout


def stage_spec(layout: ParallelLayout, stage: int, num_layers: int) -> StageSpec:
    """The part of the model a pipeline stage of `layout` holds."""
    ids = layout.stage_layers(stage, num_layers)
    return StageSpec(ids.start, ids.stop, stage == 0, stage == layout.pp - 1)


class _Give(nn.Cell):
    """The sender's side of a hand-off: x (any shape) -> x, summed with the receiver's -0.0."""

    def __init__(self, group: Group):
        super().__init__()
        self.sum = AllReduce(group)

    def construct(self, x):
        return self.sum(x)


class _Take(nn.Cell):
    """The receiver's side: shape (a constant) -> the sender's tensor of that shape."""

    def __init__(self, group: Group, dtype):
        super().__init__()
        self.sum = AllReduce(group)
        self.dtype = dtype

    def construct(self, shape):
        return self.sum(ops.zeros(shape, self.dtype) * -1.0)


class ChainSqNorm(nn.Cell):
    """Gradient buffers of this stage -> the squared norm of the whole model's gradient: the
    stage's own (its tensor-parallel pieces summed by `inner`, or a local sum) summed over the
    stages."""

    def __init__(self, inner: Optional[nn.Cell], n: int, chain: Group):
        super().__init__()
        self.inner, self.n = inner, n
        self.has_inner = inner is not None
        self.sum = AllReduce(chain)

    def construct(self, grads):
        if self.has_inner:
            sq = self.inner(grads)
        else:
            sq = ops.zeros((), ms.float32)
            for i in range(self.n):
                sq = sq + squared_sum(grads[i])
        return self.sum(sq)


class Pipeline:
    """This rank's stage of a layout and its hand-offs; `Pipeline()` is the one-stage case.

    comm, layout: the process world and the (training or reference) layout; dtype: the
    compute dtype of the hidden states that travel."""

    def __init__(self, comm: Optional[Comm] = None, layout: Optional[ParallelLayout] = None, dtype=ms.float32):
        layout = layout or ParallelLayout()
        rank = comm.rank if comm is not None else 0
        self.stages = layout.pp
        self.stage = layout.stage(rank) if self.stages > 1 else 0
        self.first, self.last = self.stage == 0, self.stage == self.stages - 1
        self.chain: Optional[Group] = None
        if self.stages > 1:
            chain = layout.pp_group(rank)
            self.chain = comm.group(chain)
            if not self.first:
                pair = comm.group((chain[self.stage - 1], rank))
                self._take_prev, self._give_prev = _Take(pair, dtype), _Give(pair)
            if not self.last:
                pair = comm.group((rank, chain[self.stage + 1]))
                self._take_next, self._give_next = _Take(pair, dtype), _Give(pair)
        self.comm = comm

    # ------------------------------------------------------------------ hand-offs

    def send_next(self, x) -> None:
        self._give_next(x)

    def recv_prev(self, shape: Tuple[int, ...]):
        return self._take_prev(tuple(shape))

    def send_prev(self, dx) -> None:
        self._give_prev(dx)

    def recv_next(self, shape: Tuple[int, ...]):
        return self._take_next(tuple(shape))

    def from_last(self, values: np.ndarray) -> np.ndarray:
        """A host array computed on the last stage, on every stage (float32 on the wire)."""
        if self.stages == 1:
            return values
        values = np.asarray(values)
        mine = values if self.last else np.zeros_like(values)
        return self.comm.host_sum(mine, self.chain)

    def sq_norm(self, inner: Optional[nn.Cell], n: int) -> Optional[nn.Cell]:
        """The gradient-norm cell for AdamW: `inner` (tensor-parallel pieces, or None) summed over
        the stages; with one stage, inner itself."""
        return inner if self.stages == 1 else ChainSqNorm(inner, n, self.chain)

    # ------------------------------------------------------------------ schedules

    def forward(self, n: int, first_inputs: Callable[[int], Any], hidden_shape: Callable[[int], Sequence[int]],
                stage: Callable[[Any], Any], last: Callable[[int, Any], Any]) -> List[Any]:
        """Forward only, micro-batch by micro-batch. first_inputs(m): the first stage's inputs of
        micro-batch m (token ids); hidden_shape(m): the (B, S, H) that travels; stage(x): a stage
        before the last; last(m, x): the last stage's result. Returns the results (last stage),
        else an empty list."""
        out = []
        for m in range(n):
            x = first_inputs(m) if self.first else self.recv_prev(hidden_shape(m))
            if self.last:
                out.append(last(m, x))
            else:
                self.send_next(stage(x))
        return out

    def train(self, n: int, first_inputs: Callable[[int], Any], hidden_shape: Callable[[int], Sequence[int]],
              stage: Callable[[Any], Any], stage_backward: Callable[[Any, Any], Any],
              last_step: Callable[[int, Any], Tuple[Any, Any]]) -> List[Any]:
        """GPipe: every micro-batch forward, then every micro-batch backward. stage(x) -> output;
        stage_backward(x, d_out) -> d_x (accumulating the stage's gradients); last_step(m, x) ->
        (result, d_x) (forward, loss and backward at once). Returns the last stage's results."""
        kept = []
        for m in range(n):
            x = first_inputs(m) if self.first else self.recv_prev(hidden_shape(m))
            kept.append(x)
            if not self.last:
                self.send_next(stage(x))
        out = []
        for m in range(n):
            if self.last:
                result, dx = last_step(m, kept[m])
                out.append(result)
            else:
                dx = stage_backward(kept[m], self.recv_next(hidden_shape(m)))
            if not self.first:
                self.send_prev(dx)
            kept[m] = None
        return out

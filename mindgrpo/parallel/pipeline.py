"""Pipeline parallelism: a rank's place in the chain of stages, the hand-offs between neighbours,
and the two schedules the actor runs its micro-batches through.

Stage s of a layout holds decoder layers `ParallelLayout.stage_layers(s, L)` (the first stage also
the embedding, the last the final norm and the lm_head). Rank (s, dp, tp) passes its output
hidden states (B, S, H) to rank (s+1, dp, tp) and gets their gradient back; every tensor-parallel
rank of a stage holds the whole activation (the row-parallel layers sum it), so each passes it
to its own counterpart.

    scoring (forward only)   per micro-batch: receive, run the stage, send; the last stage
                             computes the log-probs, which every stage then gets (`from_last`)
    training (1F1B)          stage s runs the forwards of stages - s - 1 micro-batches, then one
                             forward and one backward at a time, then the last backwards; it
                             keeps only the inputs of the micro-batches in flight (at most
                             stages - s) and recomputes its forward inside the backward graph
                             (activation recomputation); the last stage runs forward and backward
                             in one graph. In the steady state a stage passes an activation on
                             and takes a gradient back in one exchange

The two ranks of a link issue their exchanges in the same order (Megatron's 1F1B order), so the
blocking exchanges always meet. With one stage both schedules are the plain micro-batch loop.

A hand-off is a sum over the two ranks' group where the receiver contributes -0.0: x + (-0.0)
is x bit for bit. MindSpore 2.10's CPU collectives have no Send/Receive; the sum works on every
backend (on Ascend HCCL's Send/Receive would halve the bytes).
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np
import mindspore as ms
from mindspore import nn, ops

from mindgrpo.models.qwen2 import StageSpec
from mindgrpo.models.reductions import SquaredSums
from mindgrpo.parallel.comm import AllReduce, Comm, Group
from mindgrpo.parallel.layout import ParallelLayout
from mindgrpo.utils import heartbeat


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


class _Swap(nn.Cell):
    """Both sides of a hand-off each way at once (1F1B's steady state): the earlier stage gives an
    activation and takes a gradient, the later the reverse. One sum of [activation | gradient],
    each side filling in its own part. construct(mine, theirs_shape, mine_first) -> theirs."""

    def __init__(self, group: Group, dtype):
        super().__init__()
        self.sum = AllReduce(group)
        self.dtype = dtype

    def construct(self, mine, theirs_shape, mine_first):
        size = 1
        for d in theirs_shape:
            size = size * d
        blank = ops.zeros((size,), self.dtype) * -1.0
        flat = mine.reshape(-1)
        if mine_first:
            return self.sum(ops.concat((flat, blank)))[flat.shape[0]:].reshape(theirs_shape)
        return self.sum(ops.concat((blank, flat)))[:size].reshape(theirs_shape)


class ChainSqNorm(nn.Cell):
    """Gradient buffers of this stage -> the squared norm of the whole model's gradient: the
    stage's own (its tensor-parallel pieces summed by `inner`, or a local sum) summed over the
    stages."""

    def __init__(self, inner: Optional[nn.Cell], n: int, chain: Group):
        super().__init__()
        self.inner = inner if inner is not None else SquaredSums(n)
        self.sum = AllReduce(chain)

    def construct(self, grads):
        return self.sum(self.inner(grads))


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
                self._take_prev, self._give_prev, self._swap_prev = _Take(pair, dtype), _Give(pair), _Swap(pair, dtype)
            if not self.last:
                pair = comm.group((rank, chain[self.stage + 1]))
                self._take_next, self._give_next, self._swap_next = _Take(pair, dtype), _Give(pair), _Swap(pair, dtype)
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

    def send_next_recv_next(self, y, shape: Tuple[int, ...]):
        """Give the next stage an activation and take a gradient of that shape from it."""
        return self._swap_next(y, tuple(shape), True)

    def send_prev_recv_prev(self, dx, shape: Tuple[int, ...]):
        """Give the previous stage a gradient and take an activation of that shape from it."""
        return self._swap_prev(dx, tuple(shape), False)

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
                stage: Callable[[int, Any], Any], last: Callable[[int, Any], Any]) -> List[Any]:
        """Forward only, micro-batch by micro-batch. first_inputs(m): the first stage's inputs of
        micro-batch m (token ids); hidden_shape(m): the (B, S, H) that travels; stage(m, x): a stage
        before the last; last(m, x): the last stage's result. Returns the results (last stage),
        else an empty list."""
        out = []
        for m in range(n):
            x = first_inputs(m) if self.first else self.recv_prev(hidden_shape(m))
            if self.last:
                out.append(last(m, x))
            else:
                self.send_next(stage(m, x))
            heartbeat.beat()  # a micro-batch (and its collectives) came back
        return out

    def train(self, n: int, first_inputs: Callable[[int], Any], hidden_shape: Callable[[int], Sequence[int]],
              stage: Callable[[int, Any], Any], stage_backward: Callable[[int, Any, Any], Any],
              last_step: Callable[[int, Any], Tuple[Any, Any]]) -> List[Any]:
        """1F1B (PipeDream-flush, as Megatron): stage s runs the forwards of the first
        min(stages - s - 1, n) micro-batches, then alternates one forward and one backward, then
        the remaining backwards; so it keeps at most stages - s inputs at a time. stage(m, x) ->
        output; stage_backward(m, x, d_out) -> d_x (accumulating the stage's gradients);
        last_step(m, x) -> (result, d_x) (forward, loss and backward at once). Returns the last
        stage's results, in micro-batch order."""
        warm = min(self.stages - self.stage - 1, n)
        steady = n - warm
        kept, out = {}, []

        def take_input(m):
            return first_inputs(m) if self.first else self.recv_prev(hidden_shape(m))

        for f in range(warm):  # only stages before the last warm up
            kept[f] = take_input(f)
            self.send_next(stage(f, kept[f]))
        x = take_input(warm) if steady else None
        for i in range(steady):
            f, b = warm + i, i  # this step's forward and backward micro-batches
            kept[f] = x
            if self.last:  # warm == 0, so f == b: forward and backward in one graph
                result, dx = last_step(f, kept.pop(f))
                out.append(result)
            else:
                dy = self.send_next_recv_next(stage(f, x), hidden_shape(b))
                dx = stage_backward(b, kept.pop(b), dy)
            more = i + 1 < steady
            if self.first:
                x = first_inputs(f + 1) if more else None
            elif more:
                x = self.send_prev_recv_prev(dx, hidden_shape(f + 1))
            else:
                self.send_prev(dx)
            heartbeat.beat()  # a micro-batch (and its collectives) came back
        for b in range(steady, n):
            dx = stage_backward(b, kept.pop(b), self.recv_next(hidden_shape(b)))
            if not self.first:
                self.send_prev(dx)
            heartbeat.beat()
        return out

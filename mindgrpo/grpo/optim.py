"""AdamW with gradient accumulation and global-norm clipping, as MindSpore graphs; LR schedules.

The update is torch.optim.AdamW's (decoupled weight decay, bias-corrected moments); biases and
norm weights get no weight decay. The host passes the step's learning rate and bias
corrections as tensors, so the schedule is plain Python (`lr_at`) and nothing recompiles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from mindgrpo.models.reductions import SquaredSums
from mindgrpo.parallel.comm import AllGather, Group
from mindgrpo.utils.registry import Registry
from mindgrpo.utils.shrink import shrink, zeros_again
from mindgrpo.utils.spans import spans

LR_SCHEDULES = Registry("lr schedule")


@LR_SCHEDULES.register("constant")
def _constant(progress: float) -> float:
    return 1.0


@LR_SCHEDULES.register("cosine")
def _cosine(progress: float) -> float:
    return 0.5 * (1.0 + math.cos(math.pi * min(max(progress, 0.0), 1.0)))


@LR_SCHEDULES.register("linear")
def _linear(progress: float) -> float:
    return 1.0 - min(max(progress, 0.0), 1.0)


def lr_at(step: int, base_lr: float, total_steps: int, warmup_steps: int = 0,
          schedule: str = "constant", min_lr: float = 0.0) -> float:
    """LR for optimizer step `step` (0-based): linear warmup to base_lr, then the schedule's
    decay from base_lr to min_lr over the remaining steps."""
    if step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    decay = LR_SCHEDULES.get(schedule)
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return min_lr + (base_lr - min_lr) * decay(progress)


def no_decay(name: str) -> bool:
    """Biases and norm weights are not decayed."""
    return name.endswith(".bias") or "norm" in name.rsplit(".", 2)[-2]


class GradBuffer(nn.Cell):
    """fp32 accumulators, one per trainable parameter.

    They are zero between optimizer steps (the step, or `ZeroGrads` when it is skipped, zeroes them), so
    `release()` can shrink each to one element between updates (the memory of a copy of the weights
    handed back: the rollout and the reference do without it, as PyTorch's `zero_grad(set_to_none=True)`
    does) and `restore()` make them zeros of their full shapes again, exactly as they were; the same
    Parameters throughout, so the graphs that take them keep them."""

    def __init__(self, params: Sequence[Parameter], prefix: str = "accum", released: bool = False):
        super().__init__()
        self.shapes = [tuple(p.shape) for p in params]
        self.bufs = ms.ParameterTuple(
            Parameter(Tensor(np.zeros((1,) * len(p.shape) if released else p.shape, np.float32)),
                      name=f"{prefix}.{p.name}", requires_grad=False)
            for p in params)
        self.released = released  # released: made shrunk (the first `restore()` makes them)

    def nbytes(self) -> int:
        return sum(int(np.prod(shape)) * 4 for shape in self.shapes)

    def release(self) -> None:
        """Shrink every accumulator to one element; call it only between optimizer steps (all zero)."""
        shrink(self.bufs)
        self.released = True

    def restore(self) -> None:
        """Zeros of the full shapes again after a `release()`; nothing otherwise."""
        if self.released:
            zeros_again(self.bufs, self.shapes)
            self.released = False


class _AccumulateSpan(nn.Cell):
    def __init__(self, n: int):
        super().__init__(auto_prefix=False)
        self.n = n

    def construct(self, bufs, grads):
        out = ()
        for i in range(self.n):
            out = out + (ops.assign_add(bufs[i], grads[i].astype(ms.float32)),)
        return out


class AccumulateGrads(nn.Cell):
    """bufs += grads, in one graph."""

    def __init__(self, buffer: GradBuffer):
        super().__init__()
        self.bufs = buffer.bufs
        self.bounds = spans(len(buffer.bufs))
        self.span = nn.CellList([_AccumulateSpan(b - a) for a, b in self.bounds])

    def construct(self, grads):
        out = ()
        for k in range(len(self.bounds)):
            a, b = self.bounds[k]
            out = out + self.span[k](self.bufs[a:b], grads[a:b])
        return out


class GradNorm(nn.Cell):
    """construct() -> the global norm of the accumulated gradients (sq_norm: see AdamW)."""

    def __init__(self, buffer: GradBuffer, sq_norm: Optional[nn.Cell] = None):
        super().__init__()
        self.bufs, self.sq_norm = buffer.bufs, sq_norm
        self.local = SquaredSums(len(buffer.bufs))

    def construct(self):
        if self.sq_norm is None:
            sq = self.local(self.bufs)
        else:
            sq = self.sq_norm(self.bufs)
        return ops.sqrt(sq)


class _ZeroSpan(nn.Cell):
    def __init__(self, n: int):
        super().__init__(auto_prefix=False)
        self.n = n

    def construct(self, bufs):
        out = ()
        for i in range(self.n):
            out = out + (ops.assign(bufs[i], ops.zeros_like(bufs[i])),)
        return out


class ZeroGrads(nn.Cell):
    """construct(): zero the accumulated gradients (a skipped step's, which are not finite)."""

    def __init__(self, buffer: GradBuffer):
        super().__init__()
        self.bufs = buffer.bufs
        self.bounds = spans(len(buffer.bufs))
        self.span = nn.CellList([_ZeroSpan(b - a) for a, b in self.bounds])

    def construct(self):
        out = ()
        for k in range(len(self.bounds)):
            a, b = self.bounds[k]
            out = out + self.span[k](self.bufs[a:b])
        return out


@dataclass(frozen=True)
class AdamWSettings:
    """AdamW's hyperparameters as the updater takes them (actor_config's adam_beta1, adam_beta2, adam_eps,
    weight_decay, grad_clip and parallel_config.optimizer_shard: `of_actor`)."""

    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip: float = 1.0  # the gradient's global norm is clipped to it; 0: no clipping
    shard: bool = False  # ZeRO-1: the replicas of the gradient reducer's data-parallel group split the moments

    @classmethod
    def of_actor(cls, actor) -> "AdamWSettings":
        """An ActorConfig's settings."""
        return cls(actor.adam_beta1, actor.adam_beta2, actor.adam_eps, actor.weight_decay, actor.grad_clip or 0.0,
                   actor.parallel_config.optimizer_shard)


class AdamW(nn.Cell):
    """One optimizer step from the accumulated gradients (then zeroes them).

    construct(lr, bias_correction1, bias_correction2, max_norm, norm) -> pre-clip global grad
    norm. max_norm <= 0 disables clipping. norm: the gradient's norm from `grad_norm()` (the host
    checks it first and skips the step when it is not finite: `zero_grads()` then discards the
    gradients), or None to compute it in the same graph (given, not defaulted: `train_graph`'s note
    on construct signatures). sq_norm: a cell (buffers,) -> the squared norm
    of the whole gradient when the buffers hold pieces of it (tensor parallelism); None: their own sum.

    shard, sharded (ZeRO-1): the data-parallel group whose members hold the same parameters and the
    same summed gradients, and which parameters to split (`ParallelLayout.opt_shard_parts`; their dim
    0 must divide by the group's size). Member k keeps the moments of only the k-th of `size` equal
    pieces of dim 0 of those parameters (MindSpore's optimizer-parallel layout), updates that piece,
    and the pieces are gathered back into the whole parameter. The fused kernel below updates
    weights in place, so a member keeps an fp32 copy of its piece (`adam_piece.<name>`, rewritten
    every step, not saved). The arithmetic per element is unchanged, so the weights are
    bit-identical to the unsharded update, while moments and piece take 3/size of the memory of
    the two whole moments.

    The update is MindSpore's fused AdamWeightDecay kernel, with the bias corrections folded into
    its step size and epsilon: lr * m_hat / (sqrt(v_hat) + eps) = lr' * m / (sqrt(v) + eps') with
    lr' = lr * sqrt(bc2) / bc1 and eps' = eps * sqrt(bc2), and the decoupled decay lr * wd * p
    written as lr' * (wd * lr / lr') * p. One step of a (152k, 256) parameter takes about half the
    time and a tenth of the transient memory of the same update written as tensor arithmetic,
    which keeps a buffer per intermediate on the CPU (`python -m benchmarks.adamw`)."""

    def __init__(self, params: Sequence[Parameter], buffer: GradBuffer, beta1=0.9, beta2=0.999,
                 eps=1e-8, weight_decay=0.0, sq_norm: Optional[nn.Cell] = None, shard: Optional[Group] = None,
                 sharded: Optional[Sequence[bool]] = None):
        super().__init__()
        self.grad_norm = GradNorm(buffer, sq_norm)
        self.zero_grads = ZeroGrads(buffer)
        self.params = ms.ParameterTuple(params)
        self.bufs = buffer.bufs
        parts = 1 if shard is None else shard.size
        self.sharded = tuple(parts > 1 and bool(s) for s in (sharded or [True] * len(params)))
        for p, s in zip(params, self.sharded):
            if s and (len(p.shape) == 0 or p.shape[0] % parts):
                raise ValueError(f"parameter {p.name!r} of shape {list(p.shape)}: dim 0 cannot be split into {parts}")
        self.rows = tuple(p.shape[0] // parts if s else 0 for p, s in zip(params, self.sharded))
        self.start = tuple(0 if shard is None else shard.index * r for r in self.rows)
        shapes = [(r,) + tuple(p.shape[1:]) if s else p.shape for p, s, r in zip(params, self.sharded, self.rows)]
        self.m = ms.ParameterTuple(Parameter(Tensor(np.zeros(s, np.float32)), name=f"adam_m.{p.name}",
                                             requires_grad=False) for p, s in zip(params, shapes))
        self.v = ms.ParameterTuple(Parameter(Tensor(np.zeros(s, np.float32)), name=f"adam_v.{p.name}",
                                             requires_grad=False) for p, s in zip(params, shapes))
        split = [i for i, s in enumerate(self.sharded) if s]
        self.piece = ms.ParameterTuple(Parameter(Tensor(np.zeros(shapes[i], np.float32)),
                                                 name=f"adam_piece.{params[i].name}", requires_grad=False)
                                       for i in split)
        self.piece_of = tuple(split.index(i) if s else -1 for i, s in enumerate(self.sharded))
        for p in params:
            if p.dtype != ms.float32:
                raise ValueError(f"parameter {p.name!r} is {p.dtype}: AdamW updates fp32 master weights")
        self.adam = ops.AdamWeightDecay()
        if shard is not None:
            self.gather = AllGather(shard)
        self.decay = [0.0 if no_decay(p.name) else float(weight_decay) for p in params]
        self.beta1, self.beta2, self.eps = float(beta1), float(beta2), float(eps)
        self.n = len(params)
        self.bounds = spans(self.n)
        gather = self.gather if shard is not None else None
        self.span = nn.CellList([
            _AdamSpan(tuple(self.decay[a:b]), self.sharded[a:b], self.rows[a:b], self.start[a:b], self.piece_of[a:b],
                      self.beta1, self.beta2, self.adam, gather) for a, b in self.bounds])

    def state_parameters(self) -> List[Parameter]:
        """What a checkpoint holds: the moments."""
        return list(self.m) + list(self.v)

    def resident_parameters(self) -> List[Parameter]:
        """What the optimizer keeps on the device: the moments and, under ZeRO-1, the pieces."""
        return self.state_parameters() + list(self.piece)

    def construct(self, lr, bias_correction1, bias_correction2, max_norm, norm):
        if norm is None:
            norm = self.grad_norm()
        coef = ops.where(max_norm > 0, ops.minimum(max_norm / (norm + 1e-6), 1.0), 1.0)
        root = ops.sqrt(bias_correction2)
        step = lr * root / bias_correction1  # lr' and eps' of the class docstring
        eps = self.eps * root
        out = ()
        for k in range(len(self.bounds)):
            a, b = self.bounds[k]
            out = out + (self.span[k](self.params[a:b], self.m[a:b], self.v[a:b], self.bufs[a:b], self.piece,
                                      lr, step, eps, coef),)
        return ops.depend(norm, out)


class _AdamSpan(nn.Cell):
    """AdamW.construct's step for a span of its parameters (in spans: `utils/spans.py`): params, m, v, bufs of
    the span, every ZeRO-1 piece; the per-parameter constants of the span."""

    def __init__(self, decay, sharded, rows, start, piece_of, beta1, beta2, adam, gather):
        super().__init__(auto_prefix=False)
        self.decay, self.sharded, self.rows, self.start, self.piece_of = decay, sharded, rows, start, piece_of
        self.beta1, self.beta2, self.n = beta1, beta2, len(decay)
        self.adam, self.gather = adam, gather

    def construct(self, params, m, v, bufs, pieces, lr, step, eps, coef):
        out = ()
        for i in range(self.n):
            g = bufs[i] * coef
            decay = lr * self.decay[i] / step
            if self.sharded[i]:  # this member's rows of dim 0, updated in its piece, then gathered
                piece = pieces[self.piece_of[i]]
                rows = slice(self.start[i], self.start[i] + self.rows[i])
                loaded = ops.assign(piece, params[i][rows])
                done = self.adam(piece, m[i], v[i], step, self.beta1, self.beta2, eps, decay,
                                 ops.depend(g[rows], loaded))
                done = ops.assign(params[i], self.gather(ops.depend(piece, done)))  # members in order
            else:
                done = self.adam(params[i], m[i], v[i], step, self.beta1, self.beta2, eps, decay, g)
            out = out + (ops.depend(ops.assign(bufs[i], ops.zeros_like(bufs[i])), done),)
        return ops.depend(ops.zeros((1,), ms.float32), out)


def adam_scalars(step: int, beta1: float, beta2: float):
    """Bias corrections for optimizer step `step` (1-based), as tensors for AdamW.construct."""
    return (Tensor(np.float32(1 - beta1 ** step)), Tensor(np.float32(1 - beta2 ** step)))

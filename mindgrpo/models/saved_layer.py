"""A decoder layer's forward that keeps what its backward reads, and that backward without running the
layer again: the layerwise update's per-layer graphs (`mindgrpo/grpo/layerwise.py`).

Differentiating the whole layer from its input (`LayerGraph` under `ops.GradOperation`) runs the layer's
forward again inside the backward, every projection included: a third of a LoRA layer's update work (forward,
forward again, input gradients), a quarter of a fully trained one's. Here the
layer is cut at its projections into pieces, each a function of its own inputs and weights:

    qkv     x (B, S, H)  -> q (B, S, nh*d), k, v (B, S, nkv*d)   the attention norm and wq, wk, wv
    core    q, k, v      -> a (B, S, nh*d)                         Qwen3's QK-norm, RoPE, softmax attention
    out     a            -> o (B, S, H)                            wo
    up      x2 (B, S, H) -> g, u (B, S, I)                         the MLP norm and w1 (gate), w3 (up)
    act     g, u         -> m (B, S, I)                            silu(g) * u
    down    m            -> d (B, S, H)                            w2

    x2 = x + o,   y = x2 + d

`SavingLayer` runs them (the same ops in the same order as `DecoderLayer.apply`: the same y, bit for bit) and
returns y with the pieces' inputs x, q, k, v, a, x2, g, u. `LayerBackward` differentiates the pieces one by one
from those inputs, last first, the incoming gradient of each from the one after it: a projection's
vector-Jacobian product needs its input and weight, not its output, so no projection runs again; what does run
again is cheap (the norms, the attention's softmax and its two batched products, silu, LoRA's rank-r product).
The gradients are the whole layer's to rounding (the same products; where two paths meet, their sum may
round in another order). The cost: the saved tensors, (2 H + 2 (nh + nkv) d + 2 I) floats a token per
layer (about 57 MB a layer at the Qwen2.5-0.5B shape and 1,064 tokens), kept from a layer's forward to its
backward.

Weights and LoRA adapters come as `DecoderLayer.weights()` and `lora_weights()` tuples (graph inputs: one
compiled graph serves every layer); `drop` is the layer's LoRA dropout key or None, as in `DecoderLayer.apply`.
One device (no tensor parallelism), additive-bias attention. Shapes use the vocabulary of `mindgrpo/__init__.py`.
"""

from __future__ import annotations

from typing import List

import mindspore as ms
from mindspore import nn, ops

from mindgrpo.models.lora_dropout import projection_key
from mindgrpo.models.qwen2 import apply_rope

__all__ = ["SavingLayer", "LayerBackward", "accumulated", "held"]

# `DecoderLayer.weights()` positions of the two norms and the seven projections
_NORM1, _NORM2, _WQ, _WK, _WV, _WO, _W1, _W3, _W2 = range(9)


def _adapter_slots(layer: nn.Cell) -> tuple:
    """For each projection (q, k, v, o, gate, up, down): the position of its A in lora_weights(), or -1
    (`DecoderLayer._adapters` of the positions themselves)."""
    return tuple(-1 if one is None else one[0] for one in layer._adapters(range(len(layer.lora_weights()))))


def _adapter(lora, slot):
    return None if slot < 0 else (lora[slot], lora[slot + 1], lora[slot + 2])


def held(w, frozen: bool):
    """w (a tuple of weights, a graph input), or with frozen each weight behind stop_gradient (a LoRA update: no
    gradient of the base weights computed)."""
    if not frozen:
        return w
    out = ()
    for t in w:
        out = out + (ops.stop_gradient(t),)
    return out


class _QKV(nn.Cell):
    """x, w, lora, drop -> q (B, S, nh*d), k, v (B, S, nkv*d): the attention norm and the three projections."""

    def __init__(self, layer: nn.Cell, frozen: bool):
        super().__init__(auto_prefix=False)
        self.layer, self.frozen = layer, frozen
        self.bias = layer.bias_slots
        self.slots = _adapter_slots(layer)

    def construct(self, x, w, lora, drop):
        w = held(w, self.frozen)
        att = self.layer.attention
        h = self.layer.attention_norm.apply(x, w[_NORM1])
        bq, bk, bv = (w[self.bias[0]], w[self.bias[1]], w[self.bias[2]]) if self.bias else (None, None, None)
        q = att.wq.apply(h, w[_WQ], bq, _adapter(lora, self.slots[0]), projection_key(drop, 0))
        k = att.wk.apply(h, w[_WK], bk, _adapter(lora, self.slots[1]), projection_key(drop, 1))
        v = att.wv.apply(h, w[_WV], bv, _adapter(lora, self.slots[2]), projection_key(drop, 2))
        return q, k, v


class _Core(nn.Cell):
    """q, k, v, cos, sin, bias, w -> a (B, S, nh*d): QK-norm (Qwen3), RoPE and the softmax attention."""

    def __init__(self, layer: nn.Cell, frozen: bool):
        super().__init__(auto_prefix=False)
        self.layer, self.frozen = layer, frozen
        self.norms = layer.norm_slots

    def construct(self, q, k, v, cos, sin, bias, w):
        w = held(w, self.frozen)
        att = self.layer.attention
        b, s, _ = q.shape
        q = q.reshape(b, s, att.nh, att.d)  # (B, S, nh, d)
        k = k.reshape(b, s, att.nkv, att.d)  # (B, S, nkv, d)
        if self.norms:
            q, k = att.q_norm.apply(q, w[self.norms[0]]), att.k_norm.apply(k, w[self.norms[1]])
        q, k = q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3)  # (B, nh, S, d), (B, nkv, S, d)
        v = v.reshape(b, s, att.nkv, att.d).transpose(0, 2, 1, 3)  # (B, nkv, S, d)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return att._attend(q, k, v, bias, att.scale)


class _Projection(nn.Cell):
    """inp, w, lora, drop -> inp's projection by one weight (`which`: _WO or _W2), its adapter with it."""

    def __init__(self, layer: nn.Cell, frozen: bool, which: int):
        super().__init__(auto_prefix=False)
        self.frozen, self.which = frozen, which
        self.lin = layer.attention.wo if which == _WO else layer.feed_forward.w2
        self.slot = _adapter_slots(layer)[which - _WQ]

    def construct(self, inp, w, lora, drop):
        w = held(w, self.frozen)
        key = projection_key(drop, self.which - _WQ)
        return self.lin.apply(inp, w[self.which], None, _adapter(lora, self.slot), key)


class _Up(nn.Cell):
    """x2, w, lora, drop -> g, u (B, S, I): the MLP norm, the gate and up projections."""

    def __init__(self, layer: nn.Cell, frozen: bool):
        super().__init__(auto_prefix=False)
        self.layer, self.frozen = layer, frozen
        self.slots = _adapter_slots(layer)

    def construct(self, x2, w, lora, drop):
        w = held(w, self.frozen)
        mlp = self.layer.feed_forward
        h = self.layer.ffn_norm.apply(x2, w[_NORM2])
        g = mlp.w1.apply(h, w[_W1], None, _adapter(lora, self.slots[4]), projection_key(drop, 4))
        u = mlp.w3.apply(h, w[_W3], None, _adapter(lora, self.slots[5]), projection_key(drop, 5))
        return g, u


class _Act(nn.Cell):
    """g, u -> silu(g) * u."""

    def construct(self, g, u):
        return ops.silu(g) * u


class _Pieces(nn.Cell):
    def __init__(self, layer: nn.Cell, frozen: bool):
        super().__init__(auto_prefix=False)
        self.qkv, self.core = _QKV(layer, frozen), _Core(layer, frozen)
        self.out, self.up = _Projection(layer, frozen, _WO), _Up(layer, frozen)
        self.act, self.down = _Act(), _Projection(layer, frozen, _W2)


class SavingLayer(nn.Cell):
    """x (B, S, H), cos, sin, bias, w, lora, drop -> (y (B, S, H), saved: x, q, k, v, a, x2, g, u): the layer's
    forward (`DecoderLayer.apply`'s ops) and what `LayerBackward` reads. `layer` lends its code only."""

    def __init__(self, layer: nn.Cell):
        super().__init__(auto_prefix=False)
        self.p = _Pieces(layer, False)

    def construct(self, x, cos, sin, bias, w, lora, drop):
        p = self.p
        q, k, v = p.qkv(x, w, lora, drop)
        a = p.core(q, k, v, cos, sin, bias, w)
        x2 = x + p.out(a, w, lora, drop)
        g, u = p.up(x2, w, lora, drop)
        y = x2 + p.down(p.act(g, u), w, lora, drop)
        return y, (x, q, k, v, a, x2, g, u)


def accumulated(layer: nn.Cell, lora: bool) -> List[int]:
    """The positions, in `weights()` (lora False) or `lora_weights()` (True), of what `LayerBackward` adds to
    its accumulators, in the accumulators' order: every weight, or every adapter's A and B."""
    if not lora:
        return list(range(len(layer.weights())))
    return [s + j for s in _adapter_slots(layer) if s >= 0 for j in (0, 1)]


class LayerBackward(nn.Cell):
    """x, q, k, v, a, x2, g, u (`SavingLayer`'s saved tensors, each its own input: MindSpore 2.10 differentiates
    nothing with respect to the elements of a tuple input), cos, sin, bias, w, lora, drop, dy (B, S, H), acc ->
    dL/dx (B, S, H), the gradients added to acc (mutable tuple of Parameters, `accumulated`'s order): every weight's
    (lora False), or with lora True the adapters' A and B only, the base weights frozen."""

    def __init__(self, layer: nn.Cell, lora: bool):
        super().__init__(auto_prefix=False)
        self.p = _Pieces(layer, lora)
        self.lora = lora
        self.grad = ops.GradOperation(get_all=True, sens_param=True)
        bias, norms = layer.bias_slots, layer.norm_slots
        slots = _adapter_slots(layer)
        # the weights (or adapters' A, B) each piece differentiates, as positions in w (or lora)
        if lora:
            def of(*projections):
                return tuple(slots[j] + i for j in projections if slots[j] >= 0 for i in (0, 1))
            own = (of(0, 1, 2), (), of(3), of(4, 5), of(6))
        else:
            own = ((_NORM1, _WQ, _WK, _WV) + bias, norms, (_WO,), (_NORM2, _W1, _W3), (_W2,))
        order = {pos: i for i, pos in enumerate(accumulated(layer, lora))}
        # per piece (qkv, core, out, up, down): (position in its gradients of w or lora, accumulator) pairs
        self.qkv_to, self.core_to, self.out_to, self.up_to, self.down_to = (
            tuple((pos, order[pos]) for pos in positions) for positions in own)

    @staticmethod
    def _add(acc, grads, pairs):
        done = ()
        for pos, i in pairs:
            done = done + (ops.assign_add(acc[i], grads[pos].astype(ms.float32)),)
        return done

    def construct(self, x, q, k, v, a, x2, g, u, cos, sin, bias, w, lora, drop, dy, acc):
        p = self.p
        at = 2 if self.lora else 1  # where a piece's gradients of w (1) or of lora (2) sit among its inputs
        m = p.act(g, u)
        gd = self.grad(p.down)(m, w, lora, drop, dy)
        ga = self.grad(p.act)(g, u, gd[0])
        gu = self.grad(p.up)(x2, w, lora, drop, (ga[0], ga[1]))
        dx2 = dy + gu[0]
        go = self.grad(p.out)(a, w, lora, drop, dx2)
        gc = self.grad(p.core)(q, k, v, cos, sin, bias, w, go[0])
        gq = self.grad(p.qkv)(x, w, lora, drop, (gc[0], gc[1], gc[2]))
        done = self._add(acc, gd[at], self.down_to) + self._add(acc, gu[at], self.up_to)
        done = done + self._add(acc, go[at], self.out_to) + self._add(acc, gq[at], self.qkv_to)
        if not self.lora:
            done = done + self._add(acc, gc[6], self.core_to)
        return ops.depend(dx2 + gq[0], done)

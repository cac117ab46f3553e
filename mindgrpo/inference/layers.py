"""The inference forward of a Qwen2ForCausalLM (Qwen2 or Qwen3), on fused copies of its layer weights.

The training model (`mindgrpo/models/qwen2.py`) computes each projection from its own parameters.
Generation runs a few rows at a time, where MindSpore's CPU kernels are bound by op count and by
layout more than by FLOPs, so the engine keeps its own copies of the layer weights
(`InferenceWeights`), remade from the parameters at the start of every `generate` call:

    qkv       ((nh+2nkv)d, H)  [wq / sqrt(d); wk; wv], the attention norm's weight folded into its columns
    qkv_bias  ((nh+2nkv)d,)    with attention_bias (Qwen2) only
    wo        (H, nh*d)
    w13       (2I, H)          [w1; w3], the MLP norm's weight folded into its columns
    w2        (H, I)

With QK-norm (Qwen3) the norm undoes any scale of wq, so 1/sqrt(d) moves into q_norm's weight
instead, applied per head after the projection with k_norm's (the model's own (d,) parameters).

One matmul for q, k and v and one for gate and up, the norm weights and 1/sqrt(d) folded in, in the model's
own (out, in) layout: each product is x @ W^T. They cost one more copy of the layer weights (not of the
embedding) in the compute dtype, counted with the inference model's memory. The model's parameters, their names
and the weight sync are untouched. The products on those copies and the head go through
`kernels.matmul.rows_matmul`: our CPU matmul where a graph has many rows (a prefill's prompt positions),
MindSpore's MatMul at a decode step's few rows, which at 16 rows runs x @ W^T on (out, in) weights faster than
x @ W on (in, out) ones (docs/cpu_kernels.md, "Few rows").

`InferenceModel` holds the model and those copies and gives the graphs in
`mindgrpo/inference/graphs.py` their pieces, rows flattened to (N, H): embed, rope, the fused
q/k/v with RoPE, the MLP, the final norm and the head. Attention itself lives with the KV cache
layout in the graphs. Tensor parallelism comes through the model's own layers (`enter` before a
column-parallel matmul, `finish` after a row-parallel one sums the ranks' partial outputs).
Shapes use the vocabulary of `mindgrpo/__init__.py`.
"""

from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from mindgrpo.kernels.matmul import RowsMatMul, rows_matmul
from mindgrpo.models.qwen2 import Qwen2ForCausalLM
from mindgrpo.utils.shrink import shrink, zeros_again

FIELDS = ("qkv", "qkv_bias", "wo", "w13", "w2")  # per layer, in this order (qkv_bias only with bias)


def layer_fields(att) -> tuple:
    """The FIELDS an Attention's layer has copies of."""
    return FIELDS if att.wq.has_bias else tuple(f for f in FIELDS if f != "qkv_bias")


def rotate_half_matrix(d: int) -> np.ndarray:
    """R (d, d) with x @ R == concat(-x[d/2:], x[:d/2]): one matmul instead of two slices, a
    negation and a concat. Exact: every output is one input times +-1."""
    half = d // 2
    r = np.zeros((d, d), np.float32)
    r[np.arange(half) + half, np.arange(half)] = -1.0
    r[np.arange(half), np.arange(half) + half] = 1.0
    return r


def fused_layer_weights(layer):
    """A DecoderLayer's inference copies (see the module docstring), in its compute dtype, LoRA adapters
    merged in (W + s B A, `DecoderLayer.merged_weights`)."""
    return fuse_layer(layer, layer.merged_weights())


def fuse_layer(layer, w):
    """The inference copies of the weights w (`DecoderLayer.weights()` order: the two norms, wq, wk,
    wv, wo, w1, w3, w2, then the q/k/v biases) of any layer of `layer`'s architecture, in its compute
    dtype: the same ops whichever layer's weights they are, so one compiled graph serves every layer."""
    att = layer.attention
    dt = att.dtype
    q_scale = 1.0 if att.qk_norm else att.scale  # with QK-norm the scale is applied after the norm
    qkv = ops.concat((w[2] * q_scale, w[3], w[4]), 0) * w[0].reshape(1, -1)  # ((nh+2nkv)d, H)
    w13 = ops.concat((w[6], w[7]), 0) * w[1].reshape(1, -1)  # (2I, H)
    rest = (w[5].astype(dt), w13.astype(dt), w[8].astype(dt))
    bs = layer.bias_slots
    if not bs:
        return (qkv.astype(dt),) + rest
    b = ops.concat((w[bs[0]] * q_scale, w[bs[1]], w[bs[2]]), 0)
    return (qkv.astype(dt), b.astype(dt)) + rest


class _Refresh(nn.Cell):
    """Assigns every layer's current fused weights to the buffers, in one graph."""

    def __init__(self, lm: Qwen2ForCausalLM, buffers: ms.ParameterTuple):
        super().__init__(auto_prefix=False)  # keep the model's parameter names
        self.lm, self.buffers = lm, buffers

    def construct(self):
        out = ()
        i = 0
        for layer in self.lm.model.layers:
            for w in fused_layer_weights(layer):
                out = out + (ops.assign(self.buffers[i], w),)
                i += 1
        return out


class _RefreshLayer(nn.Cell):
    """w (a layer's weights, `DecoderLayer.weights()` order), out (its fused buffers) -> assigns
    them: one graph called for every layer, which keeps one layer's intermediates (`layerwise`).
    `layer` lends its code only."""

    def __init__(self, layer, n: int):
        super().__init__(auto_prefix=False)
        self.layer, self.n = layer, n

    def construct(self, w, out):
        return self.assign(fuse_layer(self.layer, w), out)

    def assign(self, fused, out):
        done = ()
        for k in range(self.n):
            done = done + (ops.assign(out[k], fused[k]),)
        return done


class _RefreshAdaptedLayer(_RefreshLayer):
    """`_RefreshLayer` called (w, lora, out): the layer's LoRA adapters (`DecoderLayer.lora_weights()` order)
    merged into w first, as `fused_layer_weights` merges them."""

    def construct(self, w, lora, out):
        return self.assign(fuse_layer(self.layer, self.layer.merge(w, lora)), out)


class InferenceWeights(nn.Cell):
    """The fused copies of every layer's weights, in buffers of their own (`layer_fields` per
    layer); `refresh()` remakes them from the model's parameters (`release()` empties them until then).
    They hold zeros until the first `refresh()`: every generate starts with one (a refresh here as well compiled the graph twice, since
    the first call after building the engine compiles it again). layerwise: the refresh is one
    compiled layer graph run for every layer (its buffers: one layer's concatenated
    weights instead of every layer's)."""

    def __init__(self, lm: Qwen2ForCausalLM, layerwise: bool = False):
        super().__init__(auto_prefix=False)
        self.fields = layer_fields(lm.model.layers[0].attention)
        self.shapes = [shape for layer in lm.model.layers for shape in _fused_shapes(layer, self.fields)]
        n = len(self.fields)
        self.buffers = ms.ParameterTuple(
            Parameter(Tensor(np.zeros(shape, np.float32), lm.dtype),
                      name=f"inference_weights.{k // n}.{self.fields[k % n]}", requires_grad=False)
            for k, shape in enumerate(self.shapes))
        self.emptied = False
        self.lm, self.layerwise = lm, layerwise
        # graph inputs of the layer graphs: the Parameters themselves, the same tuples at every call
        self.sources = [ms.mutable(tuple(layer.weights()[:12 if layer.attention.wq.has_bias else 9]))
                        for layer in lm.model.layers]
        self.layer_buffers = [ms.mutable(tuple(self.buffers[i * n:(i + 1) * n])) for i in range(len(self.sources))]
        self.adapters = []  # layerwise with LoRA: each layer's adapters (`DecoderLayer.lora_weights()`), merged in
        self._refresh = self._make_refresh()

    def _make_refresh(self):
        layer = self.lm.model.layers[0]
        if not self.layerwise:
            return _Refresh(self.lm, self.buffers)
        # adapters added after the engine was built (a --lora folder loaded) are seen here, at the next refresh
        self.adapters = [ms.mutable(tuple(layer.lora_weights())) for layer in self.lm.model.layers] \
            if layer.lora_weights() else []
        return (_RefreshAdaptedLayer if self.adapters else _RefreshLayer)(layer, len(self.fields))

    def get(self, i: int, field: str):
        """Layer i's copy named `field` (a Python constant in a graph: resolved at compile time)."""
        return self.buffers[i * len(self.fields) + self.fields.index(field)]

    def refresh(self) -> None:
        if self.emptied:  # full size again (zeros, as built): every element is written below
            zeros_again(self.buffers, self.shapes, self.lm.dtype)
            self.emptied = False
        if not self.layerwise:
            self._refresh()
            return
        if bool(self.lm.model.layers[0].lora_weights()) != bool(self.adapters):
            self._refresh = self._make_refresh()
        adapters = [(a,) for a in self.adapters] or [()] * len(self.sources)
        for w, lora, out in zip(self.sources, adapters, self.layer_buffers):
            self._refresh(w, *lora, out)

    def release(self) -> None:
        """Drop the compiled refresh graph and the buffers the runtime keeps for it (its
        concatenated weights), and the copies themselves (each Parameter shrunk to one element: the same
        Parameters stay in the graphs' inputs and the memory ledger); the next `refresh` makes them again at
        full size and compiles its graph again. Exact: every generate call rewrites every element of the
        copies before it reads one. The graphs that read the copies were compiled for the full shapes: call
        none of them before the next `refresh` (`RolloutEngine.generate` refreshes first)."""
        self._refresh = self._make_refresh()
        shrink(self.buffers, self.lm.dtype)
        self.emptied = True


def _fused_shapes(layer, fields):
    """The shapes of `fused_layer_weights(layer)` (this rank's pieces), in the order of fields."""
    att, mlp = layer.attention, layer.feed_forward
    h = att.wq.weight.shape[1]
    qkv = att.wq.weight.shape[0] + 2 * att.wk.weight.shape[0]
    inter = mlp.w1.weight.shape[0]
    shapes = {"qkv": (qkv, h), "qkv_bias": (qkv,), "wo": tuple(att.wo.weight.shape), "w13": (2 * inter, h),
              "w2": tuple(mlp.w2.weight.shape)}
    return tuple(shapes[f] for f in fields)


class InferenceModel(nn.Cell):
    """The pieces of the inference forward; graphs call its methods inside their `construct`."""

    def __init__(self, lm: Qwen2ForCausalLM, layerwise: bool = False):
        super().__init__(auto_prefix=False)  # keep the model's parameter names
        if not (lm.first_stage and lm.last_stage):
            raise ValueError("generation needs the whole model on one stage (inference has no pipeline stages)")
        self.lm = lm
        self.weights = InferenceWeights(lm, layerwise)
        att = lm.model.layers[0].attention
        self.nh, self.nkv, self.g, self.d = att.nh, att.nkv, att.g, att.d  # heads on this rank
        self.qk_norm, self.has_bias, self.scale = att.qk_norm, att.wq.has_bias, att.scale
        self.n_layers = lm.config.num_hidden_layers
        self.dtype = lm.dtype
        # x (N, in) @ W (out, in)^T of the fused copies: ours (mindgrpo/kernels) on CPU fp32 at many rows (a
        # prefill's prompt positions), MindSpore's MatMul at a decode step's few rows; chosen when a graph is compiled
        self.matmul = rows_matmul(transpose_b=True, dtype=self.dtype)
        self.rotate_matmul = ops.MatMul()  # RoPE's +-1 permutation (d wide): exact whichever kernel, MindSpore's
        self.head_matmul = ops.MatMul(transpose_b=True)  # never `.T` on the head in a graph: it copies V*H
        # h W^T where ours takes it (many rows): the same rule as the layers' products
        self.rows_head = self.matmul if isinstance(self.matmul, RowsMatMul) else None
        self.rotate = Tensor(rotate_half_matrix(self.d), self.dtype)
        # the layer graphs' inputs (`layerwise`): each layer's `layer_weights`, the Parameters themselves
        self.layer_inputs = [ms.mutable(self.layer_weights(i)) for i in range(self.n_layers)]

    def resident_parameters(self) -> list:
        """The model's parameters and the fused copies made from them (for the memory ledger)."""
        return list(self.lm.get_parameters()) + list(self.weights.buffers)

    def embed(self, ids):
        """ids (N,) -> (N, H) in the compute dtype."""
        return self.lm.model.tok_embeddings(ids).astype(self.dtype)

    def rope(self, positions):
        """positions (N,) -> cos, sin (N*(nh+nkv), d): a row per q and k head of this rank, made
        once per graph and shared by the layers."""
        n, heads, d = positions.shape[0], self.nh + self.nkv, self.d
        cos = ops.broadcast_to(ops.gather(self.lm.rope_cos, positions, 0).reshape(n, 1, d), (n, heads, d))
        sin = ops.broadcast_to(ops.gather(self.lm.rope_sin, positions, 0).reshape(n, 1, d), (n, heads, d))
        return cos.reshape(n * heads, d).astype(self.dtype), sin.reshape(n * heads, d).astype(self.dtype)

    def layer_weights(self, i: int) -> tuple:
        """Layer i's weights as the `layer_*` methods take them: its fused copies in the order of
        `weights.fields`, then (qk_norm) its q_norm and k_norm weights."""
        att = self.lm.model.layers[i].attention
        bias = (self.weights.get(i, "qkv_bias"),) if self.has_bias else ()
        norms = (att.q_norm.weight, att.k_norm.weight) if self.qk_norm else ()
        return (self.weights.get(i, "qkv"),) + bias + (self.weights.get(i, "wo"), self.weights.get(i, "w13"),
                                                       self.weights.get(i, "w2")) + norms

    def at(self, field: str) -> int:
        """The index of a fused copy in a `layer_weights` tuple (a constant in a graph)."""
        return self.weights.fields.index(field)

    def qkv(self, i: int, x, cos, sin):
        """Layer i's attention input (`layer_qkv` with layer i's weights)."""
        return self.layer_qkv(self.lm.model.layers[i], self.layer_weights(i), x, cos, sin)

    def attention_out(self, i: int, x, attended):
        """`layer_attention_out` with layer i's weights."""
        return self.layer_attention_out(self.lm.model.layers[i], self.layer_weights(i), x, attended)

    def mlp(self, i: int, x):
        """`layer_mlp` with layer i's weights."""
        return self.layer_mlp(self.lm.model.layers[i], self.layer_weights(i), x)

    def layer_qkv(self, layer, w, x, cos, sin):
        """The attention input of the layer whose weights are w (`layer_weights`; `layer`, any layer of
        the model, lends its norm's epsilon and its tensor-parallel entry): x (N, H) the residual stream
        -> q (N, nh, d) scaled by 1/sqrt(d), k (N, nkv, d), both rotated, v (N, nkv, d)."""
        n, nh, nkv, d = x.shape[0], self.nh, self.nkv, self.d
        h = layer.attention_norm.normalize(x).astype(x.dtype)  # the norm's weight is in qkv
        y = self.matmul(layer.attention.enter(h), w[0])  # (N, (nh+2nkv)d)
        if self.has_bias:
            y = y + w[1]
        qk, v = ops.split(y, ((nh + nkv) * d, nkv * d), 1)
        if self.qk_norm:
            nf = len(self.weights.fields)
            qk = self.head_norms(layer.attention, qk.reshape(n, nh + nkv, d), w[nf], w[nf + 1])
        qk = qk.reshape(n * (nh + nkv), d)
        qk = (qk * cos + self.rotate_matmul(qk, self.rotate) * sin).reshape(n, nh + nkv, d)  # RoPE, q and k at once
        q, k = ops.split(qk, (nh, nkv), 1)
        return q, k, v.reshape(n, nkv, d)

    def head_norms(self, att, qk, q_norm, k_norm):
        """Qwen3's QK-norm with the weights q_norm, k_norm (d,) on qk (N, nh+nkv, d) -> the same shape,
        the q heads also scaled by 1/sqrt(d) (through their weight: the norm would undo a scale folded
        into wq)."""
        w = ops.concat((ops.broadcast_to((q_norm * self.scale).reshape(1, -1), (self.nh, self.d)),
                        ops.broadcast_to(k_norm.reshape(1, -1), (self.nkv, self.d))), 0)  # (nh+nkv, d)
        return (att.q_norm.normalize(qk) * w.astype(ms.float32)).astype(qk.dtype)

    def layer_attention_out(self, layer, w, x, attended):
        """x (N, H) + wo(attended (N, nh*d)): the residual after the attention of the layer whose
        weights are w."""
        return x + layer.attention.wo.finish(self.matmul(attended, w[self.at("wo")]))

    def layer_mlp(self, layer, w, x):
        """x (N, H) -> x + the MLP of the layer whose weights are w."""
        w13, w2 = w[self.at("w13")], w[self.at("w2")]
        h = layer.ffn_norm.normalize(x).astype(x.dtype)  # the norm's weight is in w13
        gate, up = ops.split(self.matmul(layer.feed_forward.enter(h), w13), w13.shape[0] // 2, 1)  # (N, I) each
        return x + layer.feed_forward.w2.finish(self.matmul(ops.silu(gate) * up, w2))

    def logits(self, x):
        """x (N, H) the last residual -> logits (N, V) fp32 after the final norm, gathered over the
        vocabulary ranks. Computed as (W h^T)^T: at decode's few rows MindSpore's CPU MatMul runs it
        about 1.5x faster than h W^T at V=4096 and as fast at V=152k. Where ours takes the product (CPU fp32,
        at least its MIN_ROWS rows: a decode step of that many slots), ours computes h W^T."""
        lm = self.lm
        h = lm.head_enter(lm.model.norm_out(x))
        if self.dtype != ms.float32:
            h = h.astype(self.dtype)
        w = lm.head_weight()
        if self.rows_head is not None and self.rows_head.takes(h, w):
            local = self.rows_head.ours(h, w)  # (N, V/tp)
        else:
            local = self.head_matmul(w, h).transpose(1, 0)
        return lm.gather_vocab(local.astype(ms.float32))

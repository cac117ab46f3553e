"""Qwen2 / Qwen2.5 / Qwen3 (dense) in MindSpore, top-down: layers (linear, embedding, log-probs
and their factory), RMSNorm, RoPE, attention, MLP, block, model. The config (`Qwen2Config`, with
Qwen3's switches `qk_norm` and `attention_bias`) is in `mindgrpo/models/config.py`.

The module tree mirrors the MindSpore checkpoint names our users already have (MindFormers' Qwen2
layout), so loading one of their checkpoints is a 1:1 map; the Hugging Face name table lives in
`mindgrpo/models/convert.py`.

The graphs that train and score (`models/scoring.py`, `grpo/train_graph.py`) run
`Qwen2ForCausalLM.hidden_states` on a right-padded batch, then the vocabulary projection only at
the scored positions (`Qwen2ForCausalLM.token_logprobs`). Generation reads the same parameters
through fused copies of its own (`mindgrpo/inference/layers.py`).
Tensor parallelism plugs in through the layer factory (`DenseLayers` here, a rank's version in
`mindgrpo/parallel/tp_layers.py`); this file never talks to other ranks itself.
Shapes use the vocabulary of `mindgrpo/__init__.py`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from mindgrpo.kernels.matmul import rows_matmul
from mindgrpo.models.block_attention import NEG_INF, BlockAttention
from mindgrpo.models.config import COMPUTE_DTYPES, Qwen2Config
from mindgrpo.models.fused_head import HeadLogProbs
from mindgrpo.models.lora_dropout import dropout_mask, keep_scale, layer_key, projection_key, threshold
from mindgrpo.models.reductions import row_sum

# NEG_INF (-1e9, from models/block_attention): the additive mask value; scores are fp32, so it never overflows

_DTYPES = {name: getattr(ms, name) for name in COMPUTE_DTYPES}  # "float32" -> ms.float32, ...


def _normal(shape, std, rng) -> np.ndarray:
    return rng.normal(0.0, std, size=shape).astype(np.float32)


class Linear(nn.Cell):
    """y = x W^T (+ b); W is (out, in) as in HF and MindFormers. Casts to the compute dtype.
    weight (out, in) and bias (out,) or None are the initial values.

    With a LoRA adapter (`add_adapter`, made by `mindgrpo/models/lora.py`): y + s (x A^T) B^T, A (r, in),
    B (out, r), s = alpha / r, as PEFT adds it (after the bias). s is a parameter of its own, not
    trained: 0 switches the adapter off (the reference is the base model), exactly: y + 0.
    With lora_dropout p > 0 and a projection key (`drop`, given by the training graphs only) the adapter takes
    x times the mask of `models/lora_dropout.py` (PEFT's inverted dropout on the adapter's input)."""

    def __init__(self, weight: np.ndarray, bias: Optional[np.ndarray], compute_dtype):
        super().__init__()
        self.weight = Parameter(Tensor(np.ascontiguousarray(weight, np.float32)), name="weight")
        self.has_bias = bias is not None
        if self.has_bias:
            self.bias = Parameter(Tensor(np.ascontiguousarray(bias, np.float32)), name="bias")
        self.matmul = rows_matmul(transpose_b=True, dtype=compute_dtype)  # ours on CPU fp32 at many rows
        self.dtype = compute_dtype
        self.cast_needed = compute_dtype != ms.float32
        self.has_lora = False
        self.lora_dropout = 0.0
        self.lora_offset = 0  # the first input feature this layer holds (a row-parallel piece's column offset)

    def add_adapter(self, path: str, a: np.ndarray, b: np.ndarray, scaling: float, dropout: float = 0.0) -> None:
        """A LoRA adapter on this layer: A (r, in), B (out, r) trainable, the scaling s not; path: the
        layer's name in the model (`model.layers.0.attention.wq`), its parameters' prefix; dropout: PEFT's
        lora_dropout p, applied where the forward is given a projection key (the policy's training graphs)."""
        self.lora_a = Parameter(Tensor(np.ascontiguousarray(a, np.float32)), name=f"{path}.lora_a")
        self.lora_b = Parameter(Tensor(np.ascontiguousarray(b, np.float32)), name=f"{path}.lora_b")
        self.lora_scaling = Parameter(Tensor(np.float32(scaling)), name=f"{path}.lora_scaling", requires_grad=False)
        self.has_lora = True
        self.lora_dropout = float(dropout)
        self.drop_threshold, self.drop_scale = threshold(self.lora_dropout), keep_scale(self.lora_dropout)

    def construct(self, x, drop=None):  # (..., in) -> (..., out); drop: the projection key (training) or None
        lead = x.shape[:-1]
        x = x.reshape(-1, x.shape[-1])
        w = self.weight
        if self.cast_needed:
            x, w = x.astype(self.dtype), w.astype(self.dtype)
        y = self.finish(self.matmul(x, w))
        if self.has_lora:
            y = y + self.adapter(self.dropped(x, drop))
        return y.reshape(lead + (y.shape[-1],))

    def dropped(self, x, drop):
        """x (N, in) as the adapter takes it: times the dropout mask of projection key `drop` when there is one and
        lora_dropout > 0, else x itself (no op compiled)."""
        if drop is None or self.lora_dropout == 0.0:
            return x
        return x * dropout_mask(drop, x.shape[0], x.shape[1], self.lora_offset, self.drop_threshold, self.drop_scale,
                                x.dtype)

    def adapter(self, x):
        """x (N, in) in the compute dtype -> s (x A^T) B^T (N, out)."""
        return self.adapter_of(x, self.lora_in(self.lora_a), self.lora_b, self.lora_scaling)

    def adapter_of(self, x, a, b, s):
        """`adapter` with the given A (r, in), B (out, r) and s instead of this layer's."""
        if self.cast_needed:
            a, b, s = a.astype(self.dtype), b.astype(self.dtype), s.astype(self.dtype)
        return self.matmul(self.lora_mid(self.matmul(x, a)), b) * s  # (N, r) then (N, out)

    def lora_in(self, a):
        """A as the adapter's product takes it (a tensor-parallel piece: `parallel/tp_layers.py`)."""
        return a

    def lora_mid(self, h):
        """x A^T (N, r) before B takes it (a row-parallel piece sums the ranks' partial products)."""
        return h

    def full_shape(self) -> Tuple[int, int]:
        """(out, in) of the whole projection; a tensor-parallel piece (`parallel/tp_layers.py`) says its whole's."""
        return tuple(int(v) for v in self.weight.shape)

    def adapter_piece(self, a: np.ndarray, b: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """This layer's piece of a whole adapter A (r, in), B (out, r): on one device the whole."""
        return a, b

    def merged_weight(self):
        """W + s B A (out, in) fp32 with an adapter (the rollout engine's copies), else W itself."""
        if not self.has_lora:
            return self.weight
        return merge_adapter(self.weight, self.lora_a, self.lora_b, self.lora_scaling)

    def finish(self, y):
        """What follows the matmul: the bias (a row-parallel layer first sums the ranks' partial
        outputs). The decode path calls it after its own matmul with a fused copy of the weight."""
        if self.has_bias:
            y = y + (self.bias.astype(self.dtype) if self.cast_needed else self.bias)
        return y

    def apply(self, x, w, b, lora=None, drop=None):
        """`construct` on one device with the given weight (out, in), bias (out,) or None and adapter (A, B, s)
        or None instead of this layer's: one compiled graph serves every decoder layer (`DecoderLayer.apply`).
        drop: the projection key (`dropped`) or None."""
        lead = x.shape[:-1]
        x = x.reshape(-1, x.shape[-1])
        if self.cast_needed:
            x, w = x.astype(self.dtype), w.astype(self.dtype)
        y = self.matmul(x, w)
        if b is not None:
            y = y + (b.astype(self.dtype) if self.cast_needed else b)
        if lora is not None:
            y = y + self.adapter_of(self.dropped(x, drop), lora[0], lora[1], lora[2])
        return y.reshape(lead + (y.shape[-1],))


def merge_adapter(w, a, b, s):
    """W (out, in) + s B A: a projection's weight with its adapter merged in, fp32."""
    return w + ops.matmul(b, a) * s


class Embedding(nn.Cell):
    def __init__(self, weight: np.ndarray):
        super().__init__()
        self.embedding_weight = Parameter(Tensor(np.ascontiguousarray(weight, np.float32)), name="embedding_weight")

    def construct(self, ids):  # (...) -> (..., H)
        return ops.gather(self.embedding_weight, ids, 0)


class LogProbs(nn.Cell):
    """logits (N, V) fp32, labels (N,) -> log p(label) (N,), entropy (N,) or zeros.

    No `ops.log_softmax`: MindSpore 2.10's CPU LogSoftmax kernel can stop computing after a dozen
    launches and hand out an earlier launch's values (DEVELOPERS.md, "MindSpore 2.10 on a CPU").
    `_SoftmaxLogProbs` computes them from the fused softmax kernel, with a hand-written backward."""

    def __init__(self):
        super().__init__()
        self.plain, self.with_entropy = _SoftmaxLogProbs(False), _SoftmaxLogProbs(True)

    def construct(self, logits, labels, with_entropy: bool):
        logp, ent, _ = (self.with_entropy if with_entropy else self.plain)(logits, labels)
        return logp, ent


class _SoftmaxLogProbs(nn.Cell):
    """logits (N, V), labels (N,) -> log p(label), entropy or zeros, c (N,) each:

        p    = softmax(logits)                   (N, V), one kernel; p_max = 1 / its normaliser
        c    = sum(p)                            what that normaliser missed (~2e-5 at V = 152k)
        lse  = max(logits) - log(p_max) + log(c)
        log p(label) = logits[label] - lse,      entropy = lse - sum(p * logits) / c

    Row sums are matmuls against ones (`reductions.row_sum`). Backward: d log p(label) / d logits = onehot(label) - p / c, p made again by the
    softmax kernel (autodiff of this forward held two (N, V) buffers more). The entropy is for
    metrics and masks: no gradient. (`ops.softmax` and `ops.zeros_like` do not compile inside a
    bprop in MindSpore 2.10: the primitives.)"""

    def __init__(self, with_entropy: bool):
        super().__init__()
        self.entropy = with_entropy
        self.softmax = ops.Softmax(-1)
        self.scatter_add = ops.TensorScatterElements(axis=1, reduction="add")

    def construct(self, logits, labels):
        p = self.softmax(logits)  # (N, V)
        c = row_sum(p)  # (N,)
        lse = logits.max(axis=-1) - ops.log(p.max(axis=-1)) + ops.log(c)
        logp = ops.gather_elements(logits, 1, labels.reshape(-1, 1)).reshape(-1) - lse
        if self.entropy:
            ent = lse - row_sum(p * logits) / c
        else:
            ent = ops.zeros(logp.shape, logp.dtype)
        return logp, ent, c

    def bprop(self, logits, labels, out, dout):
        g = dout[0]  # (N,) d loss / d log p(label)
        p = self.softmax(logits)
        dlogits = p * ops.broadcast_to((-g / out[2]).reshape(-1, 1), p.shape)  # explicit: models/fused_head.py
        dlogits = self.scatter_add(dlogits, labels.reshape(-1, 1), g.reshape(-1, 1))
        return dlogits, ops.zeros(labels.shape, labels.dtype)


class DenseLayers:
    """How the blocks below make their weight-holding layers: here, whole, on one device.

    Blocks draw every initial weight whole (so a seed gives the same model in any layout) and
    hand it to these factories. `mindgrpo.parallel.tp_layers.TensorParallelLayers` has the same
    methods and keeps one rank's piece (Megatron's split): blocks size their heads by `tp`.
        column  output features split over the ranks (wq/wk/wv, w1/w3, lm_head)
        row     input features split; the partial outputs summed over the ranks (wo, w2)
        enter   where a replicated activation enters column layers (identity here)
        embedding, logprobs, gather_vocab   vocabulary-split embedding and head
        grad_sq_norm   the whole gradient's squared norm from a rank's pieces (for clipping)"""

    tp = 1

    def column(self, weight, bias, compute_dtype) -> nn.Cell:
        return Linear(weight, bias, compute_dtype)

    def row(self, weight, bias, compute_dtype) -> nn.Cell:
        return Linear(weight, bias, compute_dtype)

    def enter(self) -> nn.Cell:
        return nn.Identity()

    def embedding(self, weight) -> nn.Cell:
        return Embedding(weight)

    def logprobs(self, vocab_size: int) -> nn.Cell:
        """(logits (N, V/tp), labels (N,), with_entropy) -> log p (N,), entropy (N,)."""
        return LogProbs()

    def head_logprobs(self, vocab_size: int, chunk: int, with_entropy: bool) -> nn.Cell:
        """(h (N, H), head weight (V/tp, H), labels (N,)) -> log p, entropy, logsumexp (N,) each,
        chunk rows at a time (`mindgrpo.models.fused_head`)."""
        return HeadLogProbs(chunk, with_entropy)

    def gather_vocab(self) -> nn.Cell:
        """logits (N, V/tp) -> (N, V)."""
        return nn.Identity()

    def grad_sq_norm(self, names) -> Optional[nn.Cell]:
        """A cell: gradients of the named parameters (this rank's pieces) -> the squared norm of
        the whole model's gradient; None when the local sum is the whole (one device)."""
        return None


class RMSNorm(nn.Cell):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = Parameter(Tensor(np.ones(dim, np.float32)), name="weight")
        self.eps = eps

    def construct(self, x):  # statistics in fp32, like HF
        dtype = x.dtype
        return (self.weight * self.normalize(x)).astype(dtype)

    def apply(self, x, w):
        """`construct` with the given weight (one device)."""
        dtype = x.dtype
        return (w * self.normalize(x)).astype(dtype)

    def normalize(self, x):
        """x / rms(x) in fp32, without the weight (the decode path folds it into the next matmul)."""
        x = x.astype(ms.float32)
        return x * ops.rsqrt(ops.mean(x * x, -1, keep_dims=True) + self.eps)


def rope_table(cfg: Qwen2Config, max_pos: int):
    """cos, sin of shape (max_pos, d): HF's rotate-half convention (frequencies repeated twice)."""
    d = cfg.d
    inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(0, d, 2, dtype=np.int64).astype(np.float32) / d))
    freqs = np.outer(np.arange(max_pos, dtype=np.float32), inv_freq)  # (max_pos, d/2)
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)


def apply_rope(x, cos, sin):
    """x (B, n, S, d); cos/sin (B, 1, S, d)."""
    half = x.shape[-1] // 2
    rotated = ops.concat((-x[..., half:], x[..., :half]), axis=-1)
    return x * cos + rotated * sin


class HeadNorm(RMSNorm):
    """Qwen3's QK-norm: RMSNorm over d of every head, x (..., n, d) -> (..., n, d); one weight (d,)
    shared by the heads. Under tensor parallelism each rank norms its own heads with a replicated
    weight: `enter` (f) sums the weight's gradient over the ranks, so every copy gets the whole."""

    def __init__(self, dim, eps, enter: nn.Cell):
        super().__init__(dim, eps)
        self.enter = enter

    def construct(self, x):
        dtype = x.dtype
        return (self.enter(self.weight) * self.normalize(x)).astype(dtype)


class Attention(nn.Cell):
    """Grouped-query attention; q/k/v bias when `attention_bias` (Qwen2), QK-norm when `qk_norm`
    (Qwen3). Query heads h*g .. h*g+g-1 share kv head h.
    Under tensor parallelism a rank holds nh = heads/tp query and nkv = kv_heads/tp kv heads
    (whole kv groups), so everything below is per rank and only wo sums over the ranks."""

    def __init__(self, cfg: Qwen2Config, rng, layers: DenseLayers):
        super().__init__()
        h, d, dt, std = cfg.hidden_size, cfg.d, _DTYPES[cfg.compute_dtype], cfg.param_init_std
        nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.nh, self.nkv, self.d = nh // layers.tp, nkv // layers.tp, d  # heads on this rank
        self.g = nh // nkv
        self.enter = layers.enter()

        def bias(n):
            return np.zeros(n, np.float32) if cfg.attention_bias else None

        self.wq = layers.column(_normal((nh * d, h), std, rng), bias(nh * d), dt)
        self.wk = layers.column(_normal((nkv * d, h), std, rng), bias(nkv * d), dt)
        self.wv = layers.column(_normal((nkv * d, h), std, rng), bias(nkv * d), dt)
        self.wo = layers.row(_normal((h, nh * d), std, rng), None, dt)
        self.qk_norm = cfg.qk_norm
        if self.qk_norm:
            self.q_norm = HeadNorm(d, cfg.rms_norm_eps, layers.enter())
            self.k_norm = HeadNorm(d, cfg.rms_norm_eps, layers.enter())
        self.scale = 1.0 / math.sqrt(d)
        self.blocks = BlockAttention(self.nh, self.nkv, self.scale, dtype=dt)  # forward-only scoring (reward models)
        self.qk = ops.BatchMatMul(transpose_b=True)
        self.pv = ops.BatchMatMul()
        self.dtype = dt

    def _qkv(self, x, cos, sin, drop=None):
        b, s, _ = x.shape
        x = self.enter(x)
        q = self.wq(x, projection_key(drop, 0)).reshape(b, s, self.nh, self.d)  # (B, S, nh, d)
        k = self.wk(x, projection_key(drop, 1)).reshape(b, s, self.nkv, self.d)  # (B, S, nkv, d)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3)  # (B, nh, S, d), (B, nkv, S, d)
        v = self.wv(x, projection_key(drop, 2)).reshape(b, s, self.nkv, self.d).transpose(0, 2, 1, 3)  # (B, nkv, S, d)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def _attend(self, q, k, v, bias, scale):
        """q (B, nh, S, d), k/v (B, nkv, T, d), bias (B or 1, 1, S, T) additive -> (B, S, nh*d)."""
        b, _, s, d = q.shape
        t = k.shape[2]
        q = q.reshape(b, self.nkv, self.g * s, d)  # heads of one kv group side by side, no k/v repeat
        scores = self.qk(q, k).reshape(b, self.nkv, self.g, s, t).astype(ms.float32)
        if scale != 1.0:
            scores = scores * scale
        scores = scores + bias.reshape(bias.shape[0], 1, 1, s, t)
        probs = ops.softmax(scores, -1).astype(v.dtype).reshape(b, self.nkv, self.g * s, t)
        out = self.pv(probs, v).reshape(b, self.nh, s, d)  # (B, nh, S, d)
        return out.transpose(0, 2, 1, 3).reshape(b, s, self.nh * d)

    def construct(self, x, cos, sin, bias, flash=None, drop=None):
        """Full sequence (training and reference scoring): x (B, S, H) -> (B, S, H). flash: None
        (attention through the additive bias) or, for packed rows on Ascend, (seq_ends,
        causal_mask) for `_attend_flash` (bias is then not read). drop: the layer's LoRA dropout key
        (`models/lora_dropout.layer_key`; the policy's training graphs) or None."""
        q, k, v = self._qkv(x, cos, sin, drop)
        if flash is None:
            return self.wo(self._attend(q, k, v, bias, self.scale), projection_key(drop, 3))
        return self.wo(self._attend_flash(q, k, v, flash[0], flash[1]), projection_key(drop, 3))

    def construct_blocks(self, x, cos, sin, segments):
        """`construct` of packed rows, forward only, the queries in blocks (`models/block_attention.py`): x (B, S, H),
        segments (B, S) -> (B, S, H); any layer factory (the reward scorer's whole-model graph)."""
        q, k, v = self._qkv(x, cos, sin)
        return self.wo(self.blocks(q, k, v, segments))

    def apply(self, x, cos, sin, bias, wq, wk, wv, wo, qkv_bias, qk_norms, adapters=(None,) * 4, segments=None,
              drop=None):
        """`construct` on one device with the given weights instead of this layer's: wq, wk, wv, wo;
        qkv_bias: (bq, bk, bv), or (None, None, None) without attention_bias; qk_norms: (q_norm,
        k_norm) weights with qk_norm, else None; adapters: (A, B, s) or None for wq, wk, wv, wo.
        segments (B, S): packed rows attended in blocks of queries, forward only (`construct_blocks`; bias unread).
        drop: the layer's LoRA dropout key or None (`construct`)."""
        b, s, _ = x.shape
        q = self.wq.apply(x, wq, qkv_bias[0], adapters[0], projection_key(drop, 0)).reshape(b, s, self.nh, self.d)
        k = self.wk.apply(x, wk, qkv_bias[1], adapters[1], projection_key(drop, 1)).reshape(b, s, self.nkv, self.d)
        if self.qk_norm:
            q, k = self.q_norm.apply(q, qk_norms[0]), self.k_norm.apply(k, qk_norms[1])
        q, k = q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3)  # (B, nh, S, d), (B, nkv, S, d)
        v = self.wv.apply(x, wv, qkv_bias[2], adapters[2], projection_key(drop, 2))
        v = v.reshape(b, s, self.nkv, self.d).transpose(0, 2, 1, 3)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = self._attend(q, k, v, bias, self.scale) if segments is None else self.blocks(q, k, v, segments)
        return self.wo.apply(out, wo, None, adapters[3], projection_key(drop, 3))

    def _attend_flash(self, q, k, v, seq_ends, causal_mask):
        """Packed rows through Ascend's fused kernel in its TND layout: q (B, nh, S, d), k/v
        (B, nkv, S, d) as T = B*S tokens; seq_ends (K,) int64: the cumulative ends of the runs of
        tokens that attend among themselves (each sample, each row's padding), the last one T;
        causal_mask (2048, 2048) uint8, 1 above the diagonal (the kernel's compressed causal mask,
        sparse_mode 3) -> (B, S, nh*d). Ascend only: the CPU has no such kernel."""
        b, _, s, d = q.shape
        q = q.transpose(0, 2, 1, 3).reshape(b * s, self.nh, d)  # (T, nh, d)
        k = k.transpose(0, 2, 1, 3).reshape(b * s, self.nkv, d)  # (T, nkv, d)
        v = v.transpose(0, 2, 1, 3).reshape(b * s, self.nkv, d)
        out = ops.flash_attention_score(q, k, v, self.nh, attn_mask=causal_mask, actual_seq_qlen=seq_ends,
                                        actual_seq_kvlen=seq_ends, scalar_value=self.scale, next_tokens=0,
                                        input_layout="TND", sparse_mode=3)  # (T, nh, d)
        return out.reshape(b, s, self.nh * d)


class MLP(nn.Cell):
    """SwiGLU: w2(silu(w1 x) * w3 x); w1 = gate_proj, w3 = up_proj, w2 = down_proj."""

    def __init__(self, cfg: Qwen2Config, rng, layers: DenseLayers):
        super().__init__()
        h, i, dt, std = cfg.hidden_size, cfg.intermediate_size, _DTYPES[cfg.compute_dtype], cfg.param_init_std
        self.enter = layers.enter()
        self.w1 = layers.column(_normal((i, h), std, rng), None, dt)
        self.w3 = layers.column(_normal((i, h), std, rng), None, dt)
        self.w2 = layers.row(_normal((h, i), std, rng), None, dt)
        self.dtype = dt

    def construct(self, x, drop=None):  # drop: the layer's LoRA dropout key or None
        x = self.enter(x)
        gate, up = self.w1(x, projection_key(drop, 4)), self.w3(x, projection_key(drop, 5))
        return self.w2(ops.silu(gate) * up, projection_key(drop, 6))

    def apply(self, x, w1, w3, w2, adapters=(None,) * 3, drop=None):
        """`construct` on one device with the given weights and adapters ((A, B, s) or None for w1, w3, w2)."""
        gate = self.w1.apply(x, w1, None, adapters[0], projection_key(drop, 4))
        up = self.w3.apply(x, w3, None, adapters[1], projection_key(drop, 5))
        return self.w2.apply(ops.silu(gate) * up, w2, None, adapters[2], projection_key(drop, 6))


class DecoderLayer(nn.Cell):
    def __init__(self, cfg: Qwen2Config, rng, layers: DenseLayers):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attention = Attention(cfg, rng, layers)
        self.ffn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.feed_forward = MLP(cfg, rng, layers)
        # where `weights()` holds the q/k/v biases (attention_bias) and the q/k norms (qk_norm): () without them
        self.bias_slots = (9, 10, 11) if cfg.attention_bias else ()
        self.norm_slots = (9 + len(self.bias_slots), 10 + len(self.bias_slots)) if cfg.qk_norm else ()

    def construct(self, x, cos, sin, bias, flash=None, drop=None):
        """drop: the layer's LoRA dropout key (`models/lora_dropout.layer_key`; the training graphs) or None."""
        x = x + self.attention(self.attention_norm(x), cos, sin, bias, flash, drop)
        return x + self.feed_forward(self.ffn_norm(x), drop)

    def construct_blocks(self, x, cos, sin, segments):
        """`construct` of packed rows, forward only, attention in blocks of queries (`Attention.construct_blocks`):
        segments (B, S) instead of a (B, 1, S, S) bias."""
        x = x + self.attention.construct_blocks(self.attention_norm(x), cos, sin, segments)
        return x + self.feed_forward(self.ffn_norm(x))

    def weights(self) -> tuple:
        """The layer's parameters in the order `apply` takes them: the two norms, wq, wk, wv, wo, w1, w3,
        w2, then the q/k/v biases (attention_bias) and the q/k norms (qk_norm)."""
        att, mlp = self.attention, self.feed_forward
        out = (self.attention_norm.weight, self.ffn_norm.weight, att.wq.weight, att.wk.weight, att.wv.weight,
               att.wo.weight, mlp.w1.weight, mlp.w3.weight, mlp.w2.weight)
        if self.bias_slots:
            out += (att.wq.bias, att.wk.bias, att.wv.bias)
        if self.norm_slots:
            out += (att.q_norm.weight, att.k_norm.weight)
        return out

    def merged_weights(self) -> tuple:
        """`weights()` with each projection's LoRA adapter merged in (`Linear.merged_weight`): the same
        Parameters where the layer has none."""
        w = self.weights()
        return w[:2] + tuple(lin.merged_weight() for lin in self._projections()) + w[9:]

    def _projections(self) -> tuple:
        """wq, wk, wv, wo, w1, w3, w2: the projections in `weights()` order (entries 2-8)."""
        att, mlp = self.attention, self.feed_forward
        return (att.wq, att.wk, att.wv, att.wo, mlp.w1, mlp.w3, mlp.w2)

    def lora_weights(self) -> tuple:
        """(A, B, s) of each projection that has an adapter, in `weights()` order, one flat tuple: the adapters
        `apply` and `merge` take; () without adapters."""
        out = ()
        for lin in self._projections():
            if lin.has_lora:
                out += (lin.lora_a, lin.lora_b, lin.lora_scaling)
        return out

    def _adapters(self, lora) -> tuple:
        """lora (`lora_weights()` order) -> one entry per projection: its (A, B, s), or None."""
        out, k = (), 0
        for lin in self._projections():
            if lin.has_lora:
                out += ((lora[k], lora[k + 1], lora[k + 2]),)
                k += 3
            else:
                out += (None,)
        return out

    def merge(self, w, lora) -> tuple:
        """w (`weights()` order) with each adapter of lora (`lora_weights()` order) merged into its projection
        (`merge_adapter`), of any layer of this architecture."""
        adapters = self._adapters(lora)
        merged = ()
        for k in range(7):
            one = adapters[k]
            merged += (w[2 + k] if one is None else merge_adapter(w[2 + k], one[0], one[1], one[2]),)
        return (w[0], w[1]) + merged + tuple(w[9:])

    def apply(self, x, cos, sin, bias, w, lora=(), segments=None, drop=None):
        """`construct` on one device with the weights w (a tuple in the order of `weights()`, of any
        layer of this architecture) and its adapters lora (`lora_weights()` order) instead of this layer's:
        the same ops, so that one compiled graph runs every layer (`mindgrpo/grpo/layerwise.py`). segments (B, S):
        `construct_blocks`'s attention instead of the bias's (forward only: the reward scorer). drop: the layer's LoRA
        dropout key (an int32 scalar input: `models/lora_dropout.layer_key` of this layer's index) or None."""
        att, bs, ns = self.attention, self.bias_slots, self.norm_slots
        # positive indices only: a negative one into a mutable tuple reads garbage on MindSpore 2.10's CPU
        qkv_bias = (w[bs[0]], w[bs[1]], w[bs[2]]) if bs else (None, None, None)
        qk_norms = (w[ns[0]], w[ns[1]]) if ns else None
        ad = self._adapters(lora)
        x = x + att.apply(self.attention_norm.apply(x, w[0]), cos, sin, bias, w[2], w[3], w[4], w[5], qkv_bias,
                          qk_norms, ad[:4], segments, drop)
        return x + self.feed_forward.apply(self.ffn_norm.apply(x, w[1]), w[6], w[7], w[8], ad[4:], drop)


class LayerGraph(nn.Cell):
    """x (B, S, H), cos, sin, bias, w (a decoder layer's weights, `DecoderLayer.weights()` order) -> (B, S, H).
    `layer` lends its code only (any layer of the model: `DecoderLayer.apply`); the weights are the graph's inputs,
    read in place, so one compiled graph runs every layer (layerwise training and reference: grpo/layerwise.py;
    the reward scorer's `_Layer` is the same with its attention in blocks: models/reward_model.py)."""

    def __init__(self, layer: nn.Cell):
        super().__init__(auto_prefix=False)
        self.layer = layer

    def construct(self, x, cos, sin, bias, w):
        return self.layer.apply(x, cos, sin, bias, w)


@dataclass(frozen=True)
class StageSpec:
    """The part of the model one pipeline stage holds: decoder layers [first_layer, end_layer),
    the embedding when `first`, the final norm and the lm_head when `last`. The default is the
    whole model. `mindgrpo.parallel.layout.ParallelLayout` says which stage holds what."""

    first_layer: int = 0
    end_layer: Optional[int] = None  # None: through the last layer
    first: bool = True
    last: bool = True

    def layer_ids(self, num_layers: int) -> tuple:
        return tuple(range(self.first_layer, num_layers if self.end_layer is None else self.end_layer))


class Qwen2Model(nn.Cell):
    """Every initial weight is drawn in checkpoint order whatever the stage holds, so a seed gives
    the same weights in any layout; the layers of other stages are dropped (an empty cell keeps
    the list's numbering, and so the checkpoint names)."""

    def __init__(self, cfg: Qwen2Config, rng, layers: DenseLayers, stage: StageSpec):
        super().__init__()
        embedding = _normal((cfg.vocab_size, cfg.hidden_size), cfg.param_init_std, rng)
        if stage.first:
            self.tok_embeddings = layers.embedding(embedding)
        mine = stage.layer_ids(cfg.num_hidden_layers)
        blocks = [DecoderLayer(cfg, rng, layers) for _ in range(cfg.num_hidden_layers)]
        self.layers = nn.CellList([b if i in mine else nn.Cell() for i, b in enumerate(blocks)])
        if stage.last:
            self.norm_out = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Qwen2ForCausalLM(nn.Cell):
    """Parameters and the shared pieces of every graph. Not called directly: the graph cells in
    `mindgrpo/models/scoring.py` and `mindgrpo/inference/layers.py` hold one of these and call
    its methods.

    layers: DenseLayers() for one device, or a tensor-parallel rank's factories
    (`mindgrpo.parallel.tp_layers.TensorParallelLayers`); parameter names are the same either
    way, a rank's parameters hold its piece.
    stage: the pipeline stage's part of the model (default: all of it); a stage runs
    `hidden_states` from token ids (first stage) or the previous stage's hidden states.
    lm_head False: no untied vocabulary projection (the decoder under a reward model's scalar head,
    `mindgrpo/models/reward_model.py`); the same random draws either way."""

    def __init__(self, cfg: Qwen2Config, seed: int = 0, max_positions: Optional[int] = None,
                 layers: Optional[DenseLayers] = None, stage: Optional[StageSpec] = None, lm_head: bool = True):
        super().__init__()
        layers = layers or DenseLayers()
        stage = stage or StageSpec()
        if cfg.tie_word_embeddings and not (stage.first and stage.last):
            raise ValueError("a pipeline stage of a model with tied embeddings: the embedding and the lm_head "
                             "would live on different stages (use tie_word_embeddings = false)")
        self.config = cfg
        self.stage = stage
        self.first_stage, self.last_stage = stage.first, stage.last
        self.layer_ids = stage.layer_ids(cfg.num_hidden_layers)
        self.tp = layers.tp
        self.layer_factory = layers  # the optimizer asks it how to take the gradient's norm
        self.kv_heads = cfg.num_key_value_heads // layers.tp  # on this rank (the KV cache's nkv)
        rng = np.random.default_rng(seed)
        self.model = Qwen2Model(cfg, rng, layers, stage)
        self.tied = cfg.tie_word_embeddings
        if not self.tied:
            head = _normal((cfg.vocab_size, cfg.hidden_size), cfg.param_init_std, rng)
            if stage.last and lm_head:
                self.lm_head = layers.column(head, None, _DTYPES[cfg.compute_dtype])
        self.head_enter = layers.enter()
        self.vocab_logprobs = layers.logprobs(cfg.vocab_size)
        self.gather_vocab = layers.gather_vocab()
        cos, sin = rope_table(cfg, max_positions or cfg.max_position_embeddings)
        self.rope_cos, self.rope_sin = Tensor(cos), Tensor(sin)  # constants, not parameters
        self.dtype = _DTYPES[cfg.compute_dtype]
        # never `.T` in a graph: that copies V*H; ours on CPU fp32 at many rows (mindgrpo/kernels)
        self.head_matmul = rows_matmul(transpose_b=True, dtype=self.dtype)

    def recompute_layers(self):
        """Activation recompute, per decoder layer: a graph that differentiates this model (the
        training step, a pipeline stage's backward) keeps each layer's input only and runs the
        layer's forward again inside the backward pass, instead of keeping its intermediates
        (MindSpore's `Cell.recompute`). Exact: the same ops on the same inputs. Graphs compiled
        after the call see it; graphs without a backward pass are unchanged. Once per model."""
        for i in self.layer_ids:
            self.model.layers[i].recompute()

    # MindSpore 2.10 sets `compile_phase` on a graph cell at every call, compiled or not, and the setter walks every
    # cell below it (Cell.__setattr__ on each): ~3.4 ms a call through this model at the 0.5B shape (540 cells), the
    # rollout engine's layerwise decode alone calling ~1,000 graphs a step. Only a top cell's value is read (by
    # auto-parallel's strategy code, which no layout of ours uses), so the walk stops at the model.
    @property
    def compile_phase(self):
        return self._compile_phase

    @compile_phase.setter
    def compile_phase(self, value):
        object.__setattr__(self, "_compile_phase", value)

    def update_parameters_name(self, prefix="", recurse=True):
        """Keep the checkpoint names when a graph cell wraps this model (MindSpore would prefix
        them with the wrapper's attribute path, e.g. `lm.model.layers.0...`)."""

    def rope(self, position_ids):
        """position_ids (B, S) -> cos, sin (B, 1, S, d)."""
        cos = ops.gather(self.rope_cos, position_ids, 0).expand_dims(1).astype(self.dtype)
        sin = ops.gather(self.rope_sin, position_ids, 0).expand_dims(1).astype(self.dtype)
        return cos, sin

    def hidden_states(self, inputs, position_ids, bias, flash=None, drop=None):
        """inputs: token ids (B, S) on the first stage, else the previous stage's hidden states
        (B, S, H); bias (B, 1, S, S) additive -> hidden (B, S, H) after this stage's layers, before
        the final norm (callers norm only the positions they project). flash: packed rows through
        Ascend's fused attention instead of the bias (`Attention._attend_flash`). drop: the micro-batch's LoRA
        dropout key (int32 scalar, `models/lora_dropout.update_key`; the policy's training graphs) or None."""
        cos, sin = self.rope(position_ids)
        x = self.model.tok_embeddings(inputs).astype(self.dtype) if self.first_stage else inputs
        for i in self.layer_ids:
            x = self.model.layers[i](x, cos, sin, bias, flash, None if drop is None else layer_key(drop, i))
        return x

    def local_logits(self, h):
        """h (N, H) -> this rank's slice of the logits (N, V/tp) in fp32."""
        h = self.head_enter(h)
        if self.dtype != ms.float32:
            h = h.astype(self.dtype)
        return self.head_matmul(h, self.head_weight()).astype(ms.float32)

    def head_weight(self):
        """This rank's (V/tp, H) output projection, in the compute dtype."""
        w = self.model.tok_embeddings.embedding_weight if self.tied else self.lm_head.weight
        return w.astype(self.dtype) if self.dtype != ms.float32 else w

    def logits(self, h):
        """h (N, H) -> logits (N, V) in fp32 (gathered over the ranks under tensor parallelism)."""
        return self.gather_vocab(self.local_logits(h))

    def token_logprobs(self, h, labels, with_entropy: bool):
        """h (N, H), labels (N,) -> log p(label) (N,), entropy (N,) or zeros.

        The vocabulary projection is done only for these N scored positions, and under tensor
        parallelism the (N, V) logits are never gathered."""
        return self.vocab_logprobs(self.local_logits(h), labels, with_entropy)

"""The training step of one micro-batch as a host loop over one compiled decoder-layer graph
(`actor_config.layerwise_update`): the same loss, metrics and gradients as `train_graph.GRPOGradStep`,
with the compiled graphs' buffers of one decoder layer instead of every layer's.

MindSpore 2.10's CPU runtime keeps the buffers of a compiled graph after it ran, so the whole-model
training graph holds every layer's intermediates for good: about 0.7 GB per decoder layer at the
Qwen2.5-0.5B shape, micro-batches of (4, 288) (`benchmarks/results/memory.md`). Here the graphs are:

    embed       ids (B, S) -> x_0 (B, S, H), RoPE's cos / sin and the causal bias
    layer       x_i, layer i's weights (graph inputs) -> x_{i+1}; called for i = 0 .. N-1, each x_i kept
    head        x_N -> loss, metrics (`train_graph.PolicyLoss` from the hidden states), the gradient of
                the loss with respect to x_N, the final norm's and the head's gradients accumulated; called
                for head_rows of the micro-batch's rows at a time (`actor_config.head_rows_per_graph`: its
                buffers grow with the rows' scored tokens x the vocabulary)
    layer_grad  x_i, layer i's weights and their accumulators, dL/dx_{i+1} -> dL/dx_i, layer i's weight
                gradients added to its accumulators: the layer run again from x_i and differentiated
                against the incoming gradient; called for i = N-1 .. 0
    embed_grad  ids, dL/dx_0 -> the embedding's gradient accumulated (the head's too when tied)

With actor_config.recompute_num_layers = n < N, every layer runs `saved_layer.SavingLayer` forward, which also
returns what its backward reads, and `saved_layer.LayerBackward` backward, which differentiates the layer's pieces
from those tensors without running its projections again; the layers past the first n keep those tensors from
forward to backward ((2 H + 2 (nh + nkv) d + 2 I) values a token instead of H: their update work about 0.8x), the
first n keep their input and run SavingLayer again before their backward.

A layer's weights and accumulators go in as graph inputs (a mutable tuple of the Parameters themselves:
read and written in place, no copy and no compile per layer; `Parameter.value()` would copy each one).
Between the calls the host holds the N layer inputs (B, S, H) (4 MB each at the 0.5B shape). One device (no
pipeline stages or tensor parallelism: the config refuses them).
The gradients equal the whole graph's to rounding (a recomputed layer's forward runs twice, as with recompute).

Packed rows (`grpo/packing.py`: budget, packed and shared-prefix micro-batches with the mask attention) go through the
same layer graphs: the embed graph takes the rows' positions and runs too and makes their bias (`scoring.runs_bias`,
(B, 1, S, S): each sample, or each response with its prompt, causal within itself), which every layer graph takes
as it takes the causal one; the head picks the scored tokens from x_N as `scoring.PackedTokenLogProbs` does, and
with head_rows it takes that many samples a call (their scored tokens, the whole x_N in). Not Ascend's flash
attention: the layer graphs attend through an additive bias.

`LayerwiseAdamW` runs the gradient norm and the optimizer step so: one compiled graph per kind of parameter
group (the embedding, a decoder layer, the final norm) called for every group in the parameters' order, each
element's arithmetic and the norm's order of summation unchanged (bit for bit `optim.AdamW`'s), with one group's
buffers kept instead of a copy of every gradient (the clipped gradient) and of their squares.

`LayerwiseLogProbs` is the no-grad scoring pass so (`ref_config.layerwise`: the reference's log-probs):
embed, layer for i = 0 .. N-1 (only the last x kept), then the final norm and the head
(`scoring.TokenLogProbs`, or on packed rows `scoring.PackedTokenLogProbs`, from the hidden states); the same log-probs
as the whole-model graph.
Shapes use the vocabulary of `mindgrpo/__init__.py`.
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Sequence

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from mindgrpo.grpo.optim import AccumulateGrads, AdamW, GradBuffer
from mindgrpo.grpo.train_graph import GRPOGradStep, PolicyLoss, fold_metrics, metric_keys, metric_means
from mindgrpo.models.lora_dropout import host_layer_key
from mindgrpo.models.qwen2 import LayerGraph, Qwen2ForCausalLM
from mindgrpo.models.reductions import squared_sum
from mindgrpo.models.saved_layer import LayerBackward, SavingLayer, held
from mindgrpo.models.scoring import PackedTokenLogProbs, TokenLogProbs, causal_bias, positions, runs_bias


class _Accumulators:
    """Some of a GradBuffer's accumulators, in the order of `params`, for `AccumulateGrads`."""

    def __init__(self, buffer: GradBuffer, all_params: Sequence[Parameter], params: Sequence[Parameter]):
        index = {id(p): i for i, p in enumerate(all_params)}
        self.bufs = ms.ParameterTuple(buffer.bufs[index[id(p)]] for p in params)


class _Embed(nn.Cell):
    """ids (B, S) -> x_0 (B, S, H), cos, sin (B, 1, S, d), causal bias (1, 1, S, S)."""

    def __init__(self, lm: Qwen2ForCausalLM):
        super().__init__(auto_prefix=False)  # keep the model's parameter names
        self.lm = lm

    def construct(self, ids):
        b, s = ids.shape
        cos, sin = self.lm.rope(positions(b, s))
        return self.lm.model.tok_embeddings(ids).astype(self.lm.dtype), cos, sin, causal_bias(s)


class _PackedEmbed(nn.Cell):
    """ids, positions, runs (B, S) -> x_0 (B, S, H), cos, sin (B, 1, S, d), the runs' bias (B, 1, S, S): packed rows
    (`scoring.runs_bias` of `attention`, "mask" or "prefix")."""

    def __init__(self, lm: Qwen2ForCausalLM, attention: str):
        super().__init__(auto_prefix=False)
        self.lm, self.attention = lm, attention

    def construct(self, ids, positions, runs):
        cos, sin = self.lm.rope(positions)
        return self.lm.model.tok_embeddings(ids).astype(self.lm.dtype), cos, sin, runs_bias(runs, self.attention)


def _embed(lm: Qwen2ForCausalLM, attention: Optional[str]) -> nn.Cell:
    """The embed graph of right-padded rows (attention None) or of packed rows."""
    if attention is None:
        return _Embed(lm)
    if attention not in ("mask", "prefix"):
        raise ValueError(f"the layer graphs attend through an additive bias (mask or prefix), not {attention!r}")
    return _PackedEmbed(lm, attention)


def _embedded(embed: nn.Cell, packed: bool, ids, feed):
    """embed's x_0, cos, sin, bias; packed rows' positions and runs are the first two of feed."""
    return embed(ids, feed[0], feed[1]) if packed else embed(ids)


def _sample_parts(feed, sizes: List[int]) -> List[tuple]:
    """A packed micro-batch's feed (positions, runs, tokens (N,), labels (N,), slots (n, R)) -> per part of `sizes`
    samples: its own (positions, runs, tokens (k R,), labels (k R,), slots (k, R)), the part's scored tokens alone
    (0 in the unused places, which no slot picks; k R entries: one compiled shape per part size)."""
    positions, runs = feed[0], feed[1]
    tokens, labels, slots = (feed[k].asnumpy() for k in (2, 3, 4))
    parts, start = [], 0
    for k in sizes:
        part = slots[start:start + k]  # (k, R)
        used = part < len(tokens)
        flat, width = part[used], part.size
        tok, lab = np.zeros(width, np.int32), np.zeros(width, np.int32)
        tok[:len(flat)], lab[:len(flat)] = tokens[flat], labels[flat]
        own = np.full(part.shape, width, np.int32)
        own[used] = np.arange(len(flat), dtype=np.int32)
        parts.append((positions, runs, Tensor(tok), Tensor(lab), Tensor(own)))
        start += k
    return parts


class _Lookup(nn.Cell):
    """ids (B, S) -> x_0 (B, S, H): what `_EmbedGrad` differentiates."""

    def __init__(self, lm: Qwen2ForCausalLM):
        super().__init__(auto_prefix=False)
        self.lm = lm

    def construct(self, ids):
        return self.lm.model.tok_embeddings(ids).astype(self.lm.dtype)


class _EmbedGrad(nn.Cell):
    """ids (B, S), dL/dx_0 (B, S, H) -> the embedding's gradient added to its accumulator."""

    def __init__(self, lm: Qwen2ForCausalLM, accumulators: _Accumulators):
        super().__init__(auto_prefix=False)
        self.lookup = _Lookup(lm)
        self.weights = ms.ParameterTuple([lm.model.tok_embeddings.embedding_weight])
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)
        self.accumulate = AccumulateGrads(accumulators)

    def construct(self, ids, dx):
        grads = self.grad(self.lookup, self.weights)(ids, dx)
        return ops.depend(ops.zeros((1,), ms.float32), self.accumulate(grads))


class _AdaptedLayer(nn.Cell):
    """`LayerGraph` with the layer's LoRA adapters as inputs too: x, cos, sin, bias, w, lora (the adapters,
    `DecoderLayer.lora_weights()` order), drop (the layer's LoRA dropout key, `lora_dropout.layer_key`, or None)
    -> (B, S, H). frozen: no gradient flows into w (the base weights of a LoRA update: their gradients are neither
    wanted nor computed)."""

    def __init__(self, layer: nn.Cell, frozen: bool = False):
        super().__init__(auto_prefix=False)
        self.layer, self.frozen = layer, frozen

    def construct(self, x, cos, sin, bias, w, lora, drop):
        return self.layer.apply(x, cos, sin, bias, held(w, self.frozen), lora, None, drop)


class _AdaptedLayerGrad(nn.Cell):
    """x, cos, sin, bias, w, lora, drop, dy (B, S, H), acc (the accumulators of lora's A and B, in lora's order
    without the scalings) -> dL/dx (B, S, H); the adapters' gradients added to acc, the base weights frozen.
    drop: the layer's dropout key, as its forward had it (the same masks again)."""

    def __init__(self, layer: nn.Cell):
        super().__init__(auto_prefix=False)
        self.layer = _AdaptedLayer(layer, frozen=True)
        self.grad = ops.GradOperation(get_all=True, sens_param=True)
        self.n = len(layer.lora_weights()) // 3

    def construct(self, x, cos, sin, bias, w, lora, drop, dy, acc):
        grads = self.grad(self.layer)(x, cos, sin, bias, w, lora, drop, dy)
        done = ()
        for k in range(self.n):
            done = done + (ops.assign_add(acc[2 * k], grads[5][3 * k].astype(ms.float32)),
                           ops.assign_add(acc[2 * k + 1], grads[5][3 * k + 1].astype(ms.float32)))
        return ops.depend(grads[0], done)


class _LayerGrad(nn.Cell):
    """x (B, S, H), cos, sin, bias, w, dy (B, S, H), acc (w's accumulators, in w's order) -> dL/dx
    (B, S, H); the weights' gradients added to acc: the layer run again from x, its vector-Jacobian
    product with dy."""

    def __init__(self, layer: nn.Cell):
        super().__init__(auto_prefix=False)
        self.layer = LayerGraph(layer)
        self.grad = ops.GradOperation(get_all=True, sens_param=True)
        self.n = len(layer.weights())

    def construct(self, x, cos, sin, bias, w, dy, acc):
        grads = self.grad(self.layer)(x, cos, sin, bias, w, dy)
        done = ()
        for k in range(self.n):
            done = done + (ops.assign_add(acc[k], grads[4][k].astype(ms.float32)),)
        return ops.depend(grads[0], done)


class LayerwiseGradStep:
    """One micro-batch, called as `GRPOGradStep` is (the same inputs; loss and metrics out, every
    gradient accumulated into `buffer`), through the graphs of the module docstring.

    head_rows > 0: the head graph runs that many of the micro-batch's rows a call (the last call the rest),
    for the buffers of that many rows' (rows * R, V) logits instead of the micro-batch's; loss, metrics and
    gradients as micro-batches of head_rows rows would give them (`train_graph.fold_metrics`), which, with
    the losses normalised by the global counts, are the whole micro-batch's to rounding. A loss with
    top_entropy_quantile < 1 takes its quantile over the tokens of one head call: its head takes the whole
    micro-batch. 0: the whole micro-batch in one call.

    dropout (LoRA dropout, `models/lora_dropout.py`): feed ends with the micro-batch's key; each layer graph, forward
    and backward, is given its layer's key (`host_layer_key`), so both make the whole graph's masks.

    attention: None for right-padded rows; for packed rows (feed as `grpo/packing.py` makes it) their attention,
    "mask" or "prefix" (policy_loss built packed with it); head_rows then counts samples (module docstring)."""

    def __init__(self, policy_loss: PolicyLoss, lm: Qwen2ForCausalLM, params: Sequence[Parameter],
                 buffer: GradBuffer, head_rows: int = 0, dropout: bool = False,
                 recompute_layers: Optional[int] = None, attention: Optional[str] = None):
        if not (lm.first_stage and lm.last_stage) or lm.tp != 1:
            raise ValueError("the layerwise update runs the whole model on one device (no pipeline stages or "
                             "tensor parallelism)")
        trained = {id(p) for p in params}
        layers = [lm.model.layers[i] for i in lm.layer_ids]
        weights = [layer.weights() for layer in layers]
        adapters = [layer.lora_weights() for layer in layers]
        tuned = [[p for k, p in enumerate(a) if k % 3 != 2] for a in adapters]  # LoRA: A and B, not the scalings
        self.lora = any(adapters)
        self.dropout, self.layer_ids = dropout, list(lm.layer_ids)
        if dropout and not self.lora:
            raise ValueError("LoRA dropout needs the model's adapters")
        if self.lora and trained != {id(p) for t in tuned for p in t}:
            raise ValueError("with LoRA adapters the layerwise update trains the adapters alone")
        if not self.lora and any(id(p) not in trained for w in weights for p in w):
            raise ValueError("the layerwise update trains every decoder layer weight")
        embedding = lm.model.tok_embeddings.embedding_weight
        in_layers = {id(p) for w in weights + adapters for p in w}
        head = [p for p in params if id(p) not in in_layers and (lm.tied or p is not embedding)]
        # graph inputs: the Parameters themselves (in place, no copy), the same tuples at every call
        # each layer graph's weight inputs: (w,), or with LoRA (w, lora)
        self.layer_inputs = [(ms.mutable(tuple(w)), ms.mutable(tuple(a))) if self.lora else (ms.mutable(tuple(w)),)
                             for w, a in zip(weights, adapters)]
        self.layer_accumulators = [ms.mutable(tuple(_Accumulators(buffer, params, t if self.lora else w).bufs))
                                   for w, t in zip(weights, tuned)]
        # the first `recompute_layers` layers (None: all) keep their input and run again in their backward, the
        # others keep their activations (models/saved_layer.py). One pair of layer graphs per update (each compiled
        # graph keeps buffers of its own): every layer recomputing runs layer and layer_grad (MindSpore's autodiff of
        # the whole layer, the fastest recompute); otherwise every layer runs saving_layer and layer_backward, a
        # recomputed one saving_layer again before its backward. The pair no layer takes is never compiled
        self.recomputed = len(layers) if recompute_layers is None else min(recompute_layers, len(layers))
        self.saving = self.recomputed < len(layers)
        self.packed = attention is not None
        self.embed = _embed(lm, attention)
        self.layer = _AdaptedLayer(layers[0]) if self.lora else LayerGraph(layers[0])
        self.layer_grad = _AdaptedLayerGrad(layers[0]) if self.lora else _LayerGrad(layers[0])
        # LayerBackward takes the same accumulators: `saved_layer.accumulated`'s order is weights() or A, B per adapter
        self.saving_layer, self.layer_backward = SavingLayer(layers[0]), LayerBackward(layers[0], self.lora)
        self.head = GRPOGradStep(policy_loss, head, _Accumulators(buffer, params, head), wrt_inputs=True)
        self.embed_grad = _EmbedGrad(lm, _Accumulators(buffer, params, [embedding])) \
            if id(embedding) in trained else None  # LoRA: the embedding is the frozen base's
        self.loss = policy_loss.loss
        self.head_rows = 0 if policy_loss.loss.needs_entropy else head_rows

    def __call__(self, ids, feed, mask, advantages, old_logp, ref_logp, global_tokens, global_seqs,
                 rollout_logp=None):
        drops = [None] * len(self.layer_inputs)
        if self.dropout:  # the key ends the feed; each layer graph takes its layer's
            key = int(feed[len(feed) - 1].asnumpy())
            feed = ms.mutable(tuple(feed[k] for k in range(len(feed) - 1)))
            drops = [Tensor(host_layer_key(key, i)) for i in self.layer_ids]
        x, cos, sin, bias = _embedded(self.embed, self.packed, ids, feed)
        kept = []  # per layer: its input (recomputed) or its saved activations
        for i, (w, drop) in enumerate(zip(self.layer_inputs, drops)):
            if not self.saving:
                kept.append(x)
                x = self.layer(x, cos, sin, bias, *w, drop) if self.lora else self.layer(x, cos, sin, bias, *w)
                continue
            y, saved = self.saving_layer(x, cos, sin, bias, w[0], self._lora(w), drop)
            kept.append(x if i < self.recomputed else saved)
            x = y
        loss, metrics, dx = self._head(x, feed, mask, advantages, old_logp, ref_logp, global_tokens, global_seqs,
                                       rollout_logp)
        for i in reversed(range(len(self.layer_inputs))):
            w, acc = self.layer_inputs[i], self.layer_accumulators[i]
            if self.saving:
                saved = kept[i] if i >= self.recomputed else \
                    self.saving_layer(kept[i], cos, sin, bias, w[0], self._lora(w), drops[i])[1]
                dx = self.layer_backward(*saved, cos, sin, bias, w[0], self._lora(w), drops[i], dx, acc)
            elif self.lora:
                dx = self.layer_grad(kept[i], cos, sin, bias, *w, drops[i], dx, acc)
            else:
                dx = self.layer_grad(kept[i], cos, sin, bias, *w, dx, acc)
            kept[i] = saved = None  # its activations go as soon as its backward is done
        if self.embed_grad is not None:
            self.embed_grad(ids, dx)
        return loss, metrics

    def _lora(self, w):
        """A layer's adapters among its graph inputs, or () without LoRA."""
        return w[1] if self.lora else ()

    def _head(self, x, feed, mask, advantages, old_logp, ref_logp, global_tokens, global_seqs, rollout_logp):
        """The head graph on the micro-batch's rows (packed: its samples), head_rows a call (class docstring)
        -> loss, metrics, dL/dx (B, S, H)."""
        n = mask.shape[0]  # rows, or packed the sample slots
        if self.head_rows == 0 or self.head_rows >= n:
            return self.head(x, feed, mask, advantages, old_logp, ref_logp, global_tokens, global_seqs, rollout_logp)
        sizes = [self.head_rows] * (n // self.head_rows) + ([n % self.head_rows] if n % self.head_rows else [])
        per_sample = [ops.split(t, sizes, 0) if t is not None else [None] * len(sizes)
                      for t in (mask, advantages, old_logp, ref_logp, rollout_logp)]
        if self.packed:  # every call takes the whole x and its samples' scored tokens; their dx add up
            xs, feeds = [x] * len(sizes), _sample_parts(feed, sizes)
        else:  # the rows apart; their dx side by side
            xs = ops.split(x, sizes, 0)
            feeds = list(zip(*(ops.split(t, sizes, 0) for t in feed)))
        keys = metric_keys(self.loss, rollout_logp is not None)
        totals = np.zeros(2 + len(keys))
        dxs = []
        for g in range(len(sizes)):
            mask_g, adv_g, old_g, ref_g, roll_g = (part[g] for part in per_sample)
            loss, metrics, dx = self.head(xs[g], ms.mutable(tuple(feeds[g])), mask_g, adv_g, old_g, ref_g,
                                          global_tokens, global_seqs, roll_g)
            fold_metrics(keys, totals, float(loss.asnumpy()), [float(m.asnumpy()) for m in metrics],
                         float(mask_g.sum().asnumpy()))
            dxs.append(dx)
        metrics = metric_means(keys, totals[2:], totals[1])
        dx = sum(dxs[1:], dxs[0]) if self.packed else ops.cat(dxs, 0)
        return Tensor(np.float32(totals[0])), tuple(Tensor(np.float32(m)) for m in metrics), dx


class LayerwiseLogProbs:
    """Called as `scoring.TokenLogProbs` is on right-padded rows: ids (B, S), score_pos (B, R), labels (B, R)
    -> logp (B, R), entropy (B, R); or with attention ("mask" or "prefix") as `scoring.PackedTokenLogProbs` is on packed
    rows: ids, positions, runs, tokens, labels, slots -> logp (n, R), entropy (n, R). Through the embed graph, one
    layer graph run for every decoder layer (the layer's weights the graph inputs) and the head graph (module
    docstring)."""

    def __init__(self, lm: Qwen2ForCausalLM, with_entropy: bool = False, temperature: float = 1.0, chunk: int = 0,
                 attention: Optional[str] = None):
        if not (lm.first_stage and lm.last_stage) or lm.tp != 1:
            raise ValueError("layerwise scoring runs the whole model on one device (no pipeline stages or tensor "
                             "parallelism)")
        layers = [lm.model.layers[i] for i in lm.layer_ids]
        # each layer graph's weight inputs (in place, no copy): its weights and, with LoRA, its adapters (with
        # `lora.adapters_off`, scaling 0: the base's log-probs, y + 0)
        self.lora = bool(layers[0].lora_weights())
        self.layer_inputs = [(ms.mutable(tuple(layer.weights())),) + ((ms.mutable(tuple(layer.lora_weights())),)
                                                                      if self.lora else ()) for layer in layers]
        self.packed = attention is not None
        self.embed = _embed(lm, attention)
        self.layer = _AdaptedLayer(layers[0]) if self.lora else LayerGraph(layers[0])
        self.head = PackedTokenLogProbs(lm, with_entropy, temperature, chunk, attention, from_hidden=True) \
            if self.packed else TokenLogProbs(lm, with_entropy, temperature, chunk, from_hidden=True)

    def __call__(self, ids, *feed):
        x, cos, sin, bias = _embedded(self.embed, self.packed, ids, feed)  # (B, S, H)
        for w in self.layer_inputs:
            x = self.layer(x, cos, sin, bias, *w, None) if self.lora else self.layer(x, cos, sin, bias, *w)
        return self.head(x, *feed)


class _SqSum(nn.Cell):
    """sq (0-d), bufs (a group's gradient accumulators) -> sq + the squares of each, added in order."""

    def __init__(self, n: int):
        super().__init__(auto_prefix=False)
        self.n = n

    def construct(self, sq, bufs):
        for i in range(self.n):
            sq = sq + squared_sum(bufs[i])
        return sq


class _Sqrt(nn.Cell):
    def construct(self, x):
        return ops.sqrt(x)


class _AdamScalars(nn.Cell):
    """lr, bias corrections, max_norm, norm -> clip coefficient, AdamW's step size and epsilon (`optim.AdamW`'s
    arithmetic, in the same order)."""

    def __init__(self, eps: float):
        super().__init__(auto_prefix=False)
        self.eps = eps

    def construct(self, lr, bias_correction1, bias_correction2, max_norm, norm):
        coef = ops.where(max_norm > 0, ops.minimum(max_norm / (norm + 1e-6), 1.0), 1.0)
        root = ops.sqrt(bias_correction2)
        return coef, lr * root / bias_correction1, self.eps * root


class _AdamGroup(nn.Cell):
    """One group's AdamW step (`optim.AdamW.construct`'s loop body): params, m, v, bufs (mutable tuples of the
    Parameters, written in place), lr, step, eps, coef; then the group's accumulators zeroed."""

    def __init__(self, decay: tuple, beta1: float, beta2: float):
        super().__init__(auto_prefix=False)
        self.decay, self.beta1, self.beta2, self.n = decay, beta1, beta2, len(decay)
        self.adam = ops.AdamWeightDecay()

    def construct(self, params, m, v, bufs, lr, step, eps, coef):
        out = ()
        for i in range(self.n):
            g = bufs[i] * coef
            decay = lr * self.decay[i] / step
            done = self.adam(params[i], m[i], v[i], step, self.beta1, self.beta2, eps, decay, g)
            out = out + (ops.depend(ops.assign(bufs[i], ops.zeros_like(bufs[i])), done),)
        return ops.depend(ops.zeros((1,), ms.float32), out)


class LayerwiseAdamW:
    """`optim.AdamW` (its moments, its state for checkpoints, its zero_grads) with `grad_norm()` and the step
    run group by group (module docstring): one device, unsharded moments, the whole gradient local."""

    def __init__(self, adamw: AdamW, params: Sequence[Parameter]):
        if adamw.grad_norm.sq_norm is not None or any(adamw.sharded):
            raise ValueError("the layerwise optimizer step takes one device's whole gradient (no ZeRO-1 or tensor "
                             "parallelism)")
        self.whole = adamw
        groups: List[List[int]] = []  # consecutive runs of params of one decoder layer (or one outside any layer)
        last = None
        for i, p in enumerate(params):
            layer = re.search(r"layers\.(\d+)\.", p.name)
            key = layer.group(1) if layer else f"other{i}"
            if key != last:
                groups.append([])
            groups[-1].append(i)
            last = key
        pick = lambda tup, idx: ms.mutable(tuple(tup[i] for i in idx))  # noqa: E731
        self.groups = [(pick(adamw.params, g), pick(adamw.m, g), pick(adamw.v, g), pick(adamw.bufs, g),
                        self._signature(adamw, params, g)) for g in groups]
        self.norm_graphs: Dict[tuple, _SqSum] = {}
        self.adam_graphs: Dict[tuple, _AdamGroup] = {}
        self.scalars = _AdamScalars(adamw.eps)
        self.sqrt = _Sqrt()

    @staticmethod
    def _signature(adamw: AdamW, params, idx) -> tuple:
        return tuple((tuple(params[i].shape), adamw.decay[i]) for i in idx)

    def state_parameters(self) -> List[Parameter]:
        return self.whole.state_parameters()

    def resident_parameters(self) -> List[Parameter]:
        return self.whole.resident_parameters()

    def zero_grads(self):
        return self.whole.zero_grads()

    def release(self) -> None:
        """Drop the compiled group graphs and the buffers the runtime keeps for them; compiled again when used."""
        self.norm_graphs, self.adam_graphs = {}, {}

    def release_norm(self) -> None:
        """Drop the norm's group graphs only (once the norm is in, before the step's graphs make their buffers)."""
        self.norm_graphs = {}

    def grad_norm(self):
        sq = ms.Tensor(0.0, ms.float32)
        for _, _, _, bufs, sig in self.groups:
            if sig not in self.norm_graphs:
                self.norm_graphs[sig] = _SqSum(len(sig))
            sq = self.norm_graphs[sig](sq, bufs)
        return self.sqrt(sq)

    def __call__(self, lr, bias_correction1, bias_correction2, max_norm, norm=None):
        if norm is None:
            norm = self.grad_norm()
        coef, step, eps = self.scalars(lr, bias_correction1, bias_correction2, max_norm, norm)
        for params, m, v, bufs, sig in self.groups:
            if sig not in self.adam_graphs:
                self.adam_graphs[sig] = _AdamGroup(tuple(d for _, d in sig), self.whole.beta1, self.whole.beta2)
            self.adam_graphs[sig](params, m, v, bufs, lr, step, eps, coef)
        return norm

"""The rollout engine's KV cache and its three graphs: prefill, copy and decode.

The cache of each layer is two Parameters, k and v, of (S+1)*nkv*C rows of d: row
(s*nkv + h)*C + t holds kv head h of the token at position t of slot s. Slot S is a trash slot
that padding rows write to and nothing live reads. Flat rows because MindSpore's CPU ScatterUpdate
writes rows of its first axis in place, where ScatterNdUpdate copies its whole input to its output:
writing 64 rows into each of 8 caches of 64 MB took 6 ms more than not writing with ScatterUpdate
and 406 ms more with ScatterNdUpdate (a probe, removed: `git show 997488e:benchmarks/cache_write.py`, 2026-11-25, loaded
machine). A decode step writes B*nkv rows, a prefill or a copy the rows of the prompts it moves,
whatever the cache's size.

Every graph takes slot numbers and positions as inputs and builds its row indices and its mask
from them (a few integer ops per graph, shared by the layers), so the host sends O(B) numbers per
call. A row sees the keys at positions <= its own position; what lies beyond (an earlier request's
tokens, a copy's padding) is masked until the row overwrites it.

    PrefillGraph (Bp, P)  prompts without their last token, right-padded -> their k/v into their
                          home slots at positions [0, P); the last layer's attention and MLP are
                          not needed and not run
    CopyGraph    (n, P)   positions [0, P) of n source slots -> n destination slots
    AppendGraph  (Ba, T)  a conversation's next turn (a tool's answer), right-padded -> its k/v into
                          each slot at the slot's own positions [start, start + n), attending over
                          the slot's cache (no prefill of the history); padding writes to the trash slot
    DecodeGraph  (B, L)   one token for each of B slots at its own position: writes its k/v,
                          attends over positions [0, L) of its slot (L, a length bucket, covers
                          every row's position; all slots and all positions: read in place),
                          samples -> (B, 3): token, its log-prob under the
                          sampled distribution, its log-prob under softmax(logits / T); and the
                          logits (B, V)

Layer by layer (the engine's `layerwise`): PrefillInputs / DecodeInputs make what the layers share,
PrefillLayer runs one layer and DecodeLayers a group of k layers given their weights and k/v caches as graph
inputs (mutable tuples of the Parameters themselves: read and written in place, one compile for every layer
or group), DecodeHead the head and the sampler. The whole graphs and the layer graphs call the same per-layer
functions (`_prefill_layer`, `_decode_layer`), so they compute the same thing bit for bit.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import Parameter, nn, ops
from mindspore.common.initializer import initializer

from mindgrpo.inference.layers import InferenceModel
from mindgrpo.inference.sampling import Sampler
from mindgrpo.models.qwen2 import NEG_INF
from mindgrpo.utils.shrink import shrink, zeros_again


class KVCache(nn.Cell):
    """k and v caches of every layer: ((S+1)*nkv*C, d) each, in the compute dtype."""

    def __init__(self, model: InferenceModel, slots: int, capacity: int):
        super().__init__()
        self.slots, self.capacity, self.nkv = slots, capacity, model.nkv
        shape = ((slots + 1) * model.nkv * capacity, model.d)
        n = model.n_layers
        self.k = ms.ParameterTuple(Parameter(initializer("zeros", shape, model.dtype), name=f"kv_cache.k.{i}",
                                             requires_grad=False) for i in range(n))
        self.v = ms.ParameterTuple(Parameter(initializer("zeros", shape, model.dtype), name=f"kv_cache.v.{i}",
                                             requires_grad=False) for i in range(n))
        self.nbytes = 2 * n * shape[0] * shape[1] * (4 if model.dtype == ms.float32 else 2)
        # the layer graphs' inputs (`layerwise`): each layer's (k, v), the Parameters themselves
        self.layer_caches = [ms.mutable((self.k[i], self.v[i])) for i in range(n)]
        self.shape, self.dtype, self.emptied = shape, model.dtype, False

    def empty(self) -> None:
        """Every k and v shrunk to one element (the same Parameters, in the graphs that take them) until `refill`."""
        shrink((*self.k, *self.v), self.dtype)
        self.emptied = True

    def refill(self) -> None:
        """After `empty`: zeros of the full shape again, as built."""
        if self.emptied:
            zeros_again((*self.k, *self.v), [self.shape] * (2 * len(self.k)), self.dtype)
            self.emptied = False

    def rows(self, slot, positions):
        """slot (N,) int32, positions (T,) int32 -> row indices (N, T, nkv) int32: the rows of
        positions `positions` of each slot, in the order a (N*T, nkv, d) k or v tensor has."""
        n, t, nkv = slot.shape[0], positions.shape[0], self.nkv
        heads = ops.arange(nkv, dtype=ms.int32).reshape(1, 1, nkv)
        return (slot.reshape(n, 1, 1) * nkv + heads) * self.capacity + positions.reshape(1, t, 1)


def _attend(q, keys, values, bias):
    """q (B, nkv, g*T, d), keys/values (B, nkv, L, d), bias broadcastable to (B, nkv, g, T, L)
    -> (B, nkv, g*T, d). q carries the 1/sqrt(d) scale; scores and softmax in fp32."""
    b, nkv, gt, _ = q.shape
    length = keys.shape[2]
    scores = ops.BatchMatMul(transpose_b=True)(q, keys.astype(q.dtype)).astype(ms.float32)  # (B, nkv, g*T, L)
    t = bias.shape[-2]
    scores = scores.reshape(b, nkv, gt // t, t, length) + bias
    probs = ops.softmax(scores, -1).astype(q.dtype).reshape(b, nkv, gt, length)
    return ops.BatchMatMul()(probs, values.astype(q.dtype))


def _prefill_layer(m: InferenceModel, layer, w, kc, vc, write, x, cos, sin, rows, bias, last: bool):
    """One layer of a prefill: writes the k/v of x (Bp*P, H) into its caches kc, vc at rows; unless
    last, returns the next residual (Bp*P, H) (else x). bias (1, 1, 1, P, P) the causal mask.
    -> (x, the writes)."""
    p = bias.shape[-1]
    bp = x.shape[0] // p
    nh, nkv, g, d = m.nh, m.nkv, m.g, m.d
    q, k, v = m.layer_qkv(layer, w, x, cos, sin)  # (Bp*P, nh or nkv, d)
    done = (write(kc, rows, k.reshape(-1, d).astype(kc.dtype)), write(vc, rows, v.reshape(-1, d).astype(vc.dtype)))
    if last:  # the last layer's output is not needed: only its k/v
        return x, done
    q = q.reshape(bp, p, nh, d).transpose(0, 2, 1, 3).reshape(bp, nkv, g * p, d)
    k = k.reshape(bp, p, nkv, d).transpose(0, 2, 1, 3)  # (Bp, nkv, P, d)
    v = v.reshape(bp, p, nkv, d).transpose(0, 2, 1, 3)
    out = _attend(q, k, v, bias).reshape(bp, nh, p, d).transpose(0, 2, 1, 3)  # (Bp, P, nh, d)
    return m.layer_mlp(layer, w, m.layer_attention_out(layer, w, x, out.reshape(bp * p, nh * d))), done


def _prefill_inputs(m: InferenceModel, cache: KVCache, ids, slot):
    """ids (Bp, P), slot (Bp,) -> x (Bp*P, H), cos, sin, the cache rows (Bp*P*nkv,), the causal bias."""
    bp, p = ids.shape
    positions = ops.arange(p, dtype=ms.int32)
    rows = cache.rows(slot, positions).reshape(-1)  # (Bp*P*nkv,)
    causal = ops.arange(p).reshape(p, 1) >= ops.arange(p).reshape(1, p)  # right padding: enough
    bias = ops.where(causal, 0.0, NEG_INF).astype(ms.float32).reshape(1, 1, 1, p, p)
    cos, sin = m.rope(ops.tile(positions, (bp,)))  # (Bp*P*(nh+nkv), d)
    return m.embed(ids.reshape(-1)), cos, sin, rows, bias  # x (Bp*P, H)


class PrefillGraph(nn.Cell):
    """ids (Bp, P) int32, right-padded; slot (Bp,) int32 home slots (the trash slot for padding
    prompts) -> a scalar; writes k/v of positions [0, P) of each home slot."""

    def __init__(self, model: InferenceModel, cache: KVCache):
        super().__init__(auto_prefix=False)  # keep the model's parameter names
        self.model, self.cache = model, cache
        self.write = ops.ScatterUpdate()

    def construct(self, ids, slot):
        m = self.model
        x, cos, sin, rows, bias = _prefill_inputs(m, self.cache, ids, slot)
        done = ()
        for i in range(m.n_layers):
            x, wrote = _prefill_layer(m, m.lm.model.layers[i], m.layer_weights(i), self.cache.k[i], self.cache.v[i],
                                      self.write, x, cos, sin, rows, bias, i + 1 == m.n_layers)
            done = done + wrote
        return ops.depend(ops.zeros((1,), ms.float32), done)


class PrefillInputs(nn.Cell):
    """The layerwise prefill's first graph: ids (Bp, P), slot (Bp,) -> x (Bp*P, H), cos, sin, the
    cache rows, the causal bias (`PrefillLayer`'s inputs)."""

    def __init__(self, model: InferenceModel, cache: KVCache):
        super().__init__(auto_prefix=False)
        self.model, self.cache = model, cache

    def construct(self, ids, slot):
        return _prefill_inputs(self.model, self.cache, ids, slot)


class PrefillLayer(nn.Cell):
    """One prefill layer, called for every layer (`layerwise`): x (Bp*P, H), cos, sin, rows, bias,
    w (the layer's `layer_weights`), kv (its k and v caches) -> the next x (last: a scalar); writes
    the layer's k/v. `model.lm`'s first layer lends its code only."""

    def __init__(self, model: InferenceModel, last: bool):
        super().__init__(auto_prefix=False)
        self.model, self.last = model, last
        self.write = ops.ScatterUpdate()

    def construct(self, x, cos, sin, rows, bias, w, kv):
        m = self.model
        out = _prefill_layer(m, m.lm.model.layers[0], w, kv[0], kv[1], self.write, x, cos, sin, rows, bias,
                             self.last)
        if self.last:  # out[0] not taken: an unused `y` of `y, done = ...` drew MindSpore's warning that
            return ops.depend(ops.zeros((1,), ms.float32), out[1])  # "side effect nodes were eliminated"
        return ops.depend(out[0], out[1])


class CopyGraph(nn.Cell):
    """src, dst (n,) int32 slots -> a scalar; copies positions [0, P) of each src slot to its dst
    in every layer. A destination may repeat if its source repeats too (the same rows again)."""

    def __init__(self, model: InferenceModel, cache: KVCache, length: int):
        super().__init__(auto_prefix=False)
        self.model, self.cache, self.length = model, cache, length
        self.write = ops.ScatterUpdate()

    def construct(self, src, dst):
        positions = ops.arange(self.length, dtype=ms.int32)
        src_rows = self.cache.rows(src, positions).reshape(-1)
        dst_rows = self.cache.rows(dst, positions).reshape(-1)
        done = ()
        for i in range(self.model.n_layers):
            for cache in (self.cache.k[i], self.cache.v[i]):
                done = done + (self.write(cache, dst_rows, ops.gather(cache, src_rows, 0)),)
        return ops.depend(ops.zeros((1,), ms.float32), done)


def _append_inputs(m: InferenceModel, cache: KVCache, ids, slot, start, n):
    """ids (Ba, T), slot, start, n (Ba,) -> x (Ba*T, H), cos, sin, the rows the tokens write (Ba*T*nkv,) and the
    rows they read (Ba*nkv*C,), the bias (Ba, 1, 1, T, C): token t of a row sits at start + t and sees the
    positions up to its own; tokens t >= n (padding) write to the trash slot."""
    ba, t = ids.shape
    nkv, length = m.nkv, cache.capacity
    steps = ops.arange(t, dtype=ms.int32)
    positions = start.reshape(ba, 1) + steps.reshape(1, t)  # (Ba, T)
    valid = steps.reshape(1, t) < n.reshape(ba, 1)  # (Ba, T)
    zero = ops.zeros((1,), ms.int32)
    first = cache.rows(slot, zero).reshape(ba, 1, nkv)  # (Ba, 1, nkv): position 0's rows
    trash = cache.rows(ops.fill(ms.int32, (1,), cache.slots), zero).reshape(1, 1, nkv)
    write = ops.where(valid.reshape(ba, t, 1), first + positions.reshape(ba, t, 1),
                      trash + steps.reshape(1, t, 1)).reshape(-1)  # (Ba*T*nkv,)
    span = ops.arange(length, dtype=ms.int32)
    read = (first.reshape(ba, nkv, 1) + span.reshape(1, 1, length)).reshape(-1)  # (Ba*nkv*C,)
    visible = span.reshape(1, 1, length) <= positions.reshape(ba, t, 1)  # (Ba, T, C)
    bias = ops.where(visible, 0.0, NEG_INF).astype(ms.float32).reshape(ba, 1, 1, t, length)
    cos, sin = m.rope(ops.where(valid, positions, 0).reshape(-1))  # (Ba*T*(nh+nkv), d)
    return m.embed(ids.reshape(-1)), cos, sin, write, read, bias


def _append_layer(m: InferenceModel, layer, w, kc, vc, scatter, x, cos, sin, write, read, bias, last: bool):
    """One layer of an append: writes the k/v of x (Ba*T, H) at its rows, then (unless last) attends over the
    slot's cache -> the next residual (Ba*T, H) (last: x)."""
    ba, t, length = bias.shape[0], bias.shape[-2], bias.shape[-1]
    nh, nkv, g, d = m.nh, m.nkv, m.g, m.d
    q, k, v = m.layer_qkv(layer, w, x, cos, sin)  # (Ba*T, nh or nkv, d)
    kc = scatter(kc, write, k.reshape(-1, d).astype(kc.dtype))
    vc = scatter(vc, write, v.reshape(-1, d).astype(vc.dtype))
    if last:  # only the last layer's k/v are needed
        return ops.depend(x, (kc, vc))
    q = q.reshape(ba, t, nh, d).transpose(0, 2, 1, 3).reshape(ba, nkv, g * t, d)
    keys = ops.gather(kc, read, 0).reshape(ba, nkv, length, d)
    values = ops.gather(vc, read, 0).reshape(ba, nkv, length, d)
    out = _attend(q, keys, values, bias).reshape(ba, nh, t, d).transpose(0, 2, 1, 3)  # (Ba, T, nh, d)
    return m.layer_mlp(layer, w, m.layer_attention_out(layer, w, x, out.reshape(ba * t, nh * d)))


class AppendGraph(nn.Cell):
    """ids (Ba, T) int32 right-padded, slot, start, n (Ba,) int32 -> a scalar; writes the k/v of each row's n
    tokens at positions [start, start + n) of its slot (a padding row: the trash slot, n = 0)."""

    def __init__(self, model: InferenceModel, cache: KVCache):
        super().__init__(auto_prefix=False)
        self.model, self.cache = model, cache
        self.write = ops.ScatterUpdate()

    def construct(self, ids, slot, start, n):
        m = self.model
        x, cos, sin, write, read, bias = _append_inputs(m, self.cache, ids, slot, start, n)
        for i in range(m.n_layers):
            x = _append_layer(m, m.lm.model.layers[i], m.layer_weights(i), self.cache.k[i], self.cache.v[i],
                              self.write, x, cos, sin, write, read, bias, i + 1 == m.n_layers)
        return ops.depend(ops.zeros((1,), ms.float32), x)


def _decode_inputs(m: InferenceModel, cache: KVCache, length: int, token, position, slot):
    """token, position, slot (B,) -> x (B, H), cos, sin, the rows each row writes (B*nkv,) and reads
    (B*nkv*L,), the bias (B, 1, 1, 1, L) hiding positions beyond each row's."""
    b = token.shape[0]
    nkv = m.nkv
    span = ops.arange(length, dtype=ms.int32)
    first = cache.rows(slot, ops.zeros((1,), ms.int32)).reshape(b, nkv)  # (B, nkv): position 0's rows
    write = (first + position.reshape(b, 1)).reshape(-1)  # (B*nkv,)
    read = (first.reshape(b, nkv, 1) + span.reshape(1, 1, length)).reshape(-1)  # (B*nkv*L,)
    visible = span.reshape(1, length) <= position.reshape(b, 1)  # (B, L)
    bias = ops.where(visible, 0.0, NEG_INF).astype(ms.float32).reshape(b, 1, 1, 1, length)
    cos, sin = m.rope(position)  # (B*(nh+nkv), d)
    return m.embed(token), cos, sin, write, read, bias  # x (B, H)


def _decode_layer(m: InferenceModel, layer, w, kc, vc, scatter, x, cos, sin, write, read, bias, whole: bool):
    """One layer of a decode step: writes each row's k/v at its position, attends over [0, L) of its
    slot -> the next residual (B, H)."""
    b, length = x.shape[0], bias.shape[-1]
    nh, nkv, g, d = m.nh, m.nkv, m.g, m.d
    q, k, v = m.layer_qkv(layer, w, x, cos, sin)  # (B, nh or nkv, d)
    kc = scatter(kc, write, k.reshape(b * nkv, d).astype(kc.dtype))
    vc = scatter(vc, write, v.reshape(b * nkv, d).astype(vc.dtype))
    q = q.reshape(b, nkv, g, d)
    if whole:  # the cache as it lies, S + 1 slots: a zero query row and a zero bias row for the trash slot
        keys, values = kc.reshape(b + 1, nkv, length, d), vc.reshape(b + 1, nkv, length, d)
        q = ops.concat((q, ops.zeros((1, nkv, g, d), q.dtype)), 0)
        bias = ops.concat((bias, ops.zeros((1,) + bias.shape[1:], bias.dtype)), 0)
        out = ops.slice(_attend(q, keys, values, bias), (0, 0, 0, 0), (b, nkv, g, d))  # (B, nkv, g, d)
    else:
        keys = ops.gather(kc, read, 0).reshape(b, nkv, length, d)
        values = ops.gather(vc, read, 0).reshape(b, nkv, length, d)
        out = _attend(q, keys, values, bias)  # (B, nkv, g, d)
    return m.layer_mlp(layer, w, m.layer_attention_out(layer, w, x, out.reshape(b, nh * d)))


class DecodeGraph(nn.Cell):
    """token, position, slot (B,) int32, u, temperature (B,) fp32 -> (B, 3) fp32 [token, sampled
    log-prob, scaled log-prob] and the logits (B, V). Attends over positions [0, L) of each row's slot.

    whole: the rows are every slot of the cache in order (B = S) and L = C, so attention reads the cache as it
    lies (S + 1 slots: the trash slot's keys meet a zero query row, whose output is dropped); otherwise it gathers
    the B slots' first L positions (a copy of what it reads). The trash slot is not a row of the matmuls: at
    S = 16, the Qwen2.5-0.5B shape's layer matmuls took 6.0 ms at 17 rows and 4.6 at 16, the 152k head 36.5
    against 26.3 (a throwaway probe, 2026-11-27: MindSpore's CPU MatMul is slow at odd row counts)."""

    def __init__(self, model: InferenceModel, cache: KVCache, sampler: Sampler, length: int, whole: bool = False):
        super().__init__(auto_prefix=False)
        self.model, self.cache, self.sampler, self.length, self.whole = model, cache, sampler, length, whole
        self.write = ops.ScatterUpdate()

    def construct(self, token, position, slot, u, temperature):
        logits = self.model.logits(self.hidden(token, position, slot))
        tok, sampled, scaled = self.sampler(logits, u, temperature)
        return ops.stack((tok.astype(ms.float32), sampled, scaled), 1), logits

    def hidden(self, token, position, slot):
        """The layers: writes each row's k/v at its position, attends over [0, L) of its slot
        -> the last residual (B, H)."""
        m = self.model
        x, cos, sin, write, read, bias = _decode_inputs(m, self.cache, self.length, token, position, slot)
        for i in range(m.n_layers):
            x = _decode_layer(m, m.lm.model.layers[i], m.layer_weights(i), self.cache.k[i], self.cache.v[i],
                              self.write, x, cos, sin, write, read, bias, self.whole)
        return x


class DecodeInputs(nn.Cell):
    """The layerwise decode's first graph: token, position, slot (B,) -> x (B, H), cos, sin, the
    rows to write and read, the bias (`DecodeLayers`' inputs)."""

    def __init__(self, model: InferenceModel, cache: KVCache, length: int):
        super().__init__(auto_prefix=False)
        self.model, self.cache, self.length = model, cache, length

    def construct(self, token, position, slot):
        return _decode_inputs(self.model, self.cache, self.length, token, position, slot)


class DecodeLayers(nn.Cell):
    """k consecutive decode layers in one graph (`layerwise`), called for every group of k layers (a last
    group of fewer layers has a graph of its own): x (B, H), cos, sin, write, read, bias, ws (the k layers'
    `layer_weights`), kvs (their (k, v) caches) -> the next x; writes the layers' k/v. One graph call costs
    milliseconds of launch on a CPU, at every decode step: k layers a call instead of one cut a rollout's
    decode at the Qwen2.5-0.5B shape from 35.0 to 21.1 s (k = 4, 24 layers, 16 slots; its resident memory
    the same: `benchmarks/results/layerwise_generate_groups.md`). `model.lm`'s first layer lends its code only."""

    def __init__(self, model: InferenceModel, whole: bool, k: int):
        super().__init__(auto_prefix=False)
        self.model, self.whole, self.k = model, whole, k
        self.write = ops.ScatterUpdate()

    def construct(self, x, cos, sin, write, read, bias, ws, kvs):
        m = self.model
        for j in range(self.k):  # non-negative constant indices into the mutable tuples (DEVELOPERS.md)
            x = _decode_layer(m, m.lm.model.layers[0], ws[j], kvs[j][0], kvs[j][1], self.write, x, cos, sin, write,
                              read, bias, self.whole)
        return x


class DecodeHead(nn.Cell):
    """The layerwise decode's last graph: x (B, H) the last residual, u, temperature (B,) -> what
    `DecodeGraph` returns: (B, 3) [token, sampled log-prob, scaled log-prob] and the logits (B, V)."""

    def __init__(self, model: InferenceModel, sampler: Sampler):
        super().__init__(auto_prefix=False)
        self.model, self.sampler = model, sampler

    def construct(self, x, u, temperature):
        logits = self.model.logits(x)
        tok, sampled, scaled = self.sampler(logits, u, temperature)
        return ops.stack((tok.astype(ms.float32), sampled, scaled), 1), logits

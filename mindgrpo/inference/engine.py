"""Rollout engine: prefill + one-token decode against a static KV cache, compiled per shape bucket.

Prompts are left-padded to a bucketed length P, so every row writes its t-th new token to the
same cache slot P + t; the cache holds C = P + max_tokens (bucketed) slots per row. The batch is
padded to a bucketed B. A (B, P, C, sampler) bucket compiles once and is reused for every later
call with the same bucket: no recompilation per step or per batch.

Host work per decode step: B uniforms, a (B, C) mask and the stop check on B sampled ids.

Both graphs read the layer weights from `InferenceWeights`, the engine's own fused copies in
(in, out) layout and the compute dtype (see `DecoderLayer.fused_weights`), remade from the
model's parameters at the start of every `generate` call; the model's parameters, their names
and the weight sync are untouched. They cost one more copy of the layer weights (not of the
embedding) in the compute dtype, counted with the inference model's memory.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from mindgrpo.inference.sampling import Sampler, SamplingParams
from mindgrpo.models.qwen2 import NEG_INF, Qwen2ForCausalLM
from mindgrpo.utils import heartbeat


def _bucket(n: int, step: int) -> int:
    return max(step, -(-n // step) * step)


@dataclass(frozen=True)
class BatchPart:
    """The prompts given to `generate` are rows [offset, offset + their rows) of a batch of
    `total_rows` rows whose longest prompt has `prompt_len` tokens (data-parallel generation:
    each replica gets a part). The random numbers and the prompt padding are then those of the
    whole batch, so each row gets the tokens a one-process run would give it."""

    offset: int
    total_rows: int
    prompt_len: int


class KVCache(nn.Cell):
    """Per layer k and v caches, each (B, nkv, C, d); nkv is this rank's kv heads."""

    def __init__(self, lm: Qwen2ForCausalLM, batch: int, capacity: int):
        super().__init__()
        cfg = lm.config
        shape = (batch, lm.kv_heads, capacity, cfg.d)
        n = cfg.num_hidden_layers
        self.k = ms.ParameterTuple(
            Parameter(Tensor(np.zeros(shape, np.float32), lm.dtype), name=f"kv_cache.k.{i}", requires_grad=False)
            for i in range(n))
        self.v = ms.ParameterTuple(
            Parameter(Tensor(np.zeros(shape, np.float32), lm.dtype), name=f"kv_cache.v.{i}", requires_grad=False)
            for i in range(n))
        self.nbytes = 2 * n * int(np.prod(shape)) * (2 if lm.dtype != ms.float32 else 4)


class _FusedWeights(nn.Cell):
    """() -> every layer's `fused_weights`, flattened: 5 tensors per layer."""

    def __init__(self, lm: Qwen2ForCausalLM):
        super().__init__(auto_prefix=False)  # keep the model's parameter names
        self.lm = lm

    def construct(self):
        out = ()
        for layer in self.lm.model.layers:
            out = out + layer.fused_weights()
        return out


class _Refresh(nn.Cell):
    """Assigns the model's current fused weights to the buffers."""

    def __init__(self, fuse: _FusedWeights, buffers: ms.ParameterTuple):
        super().__init__(auto_prefix=False)
        self.fuse, self.buffers = fuse, buffers

    def construct(self):
        values = self.fuse()
        out = ()
        for i in range(len(self.buffers)):
            out = out + (ops.assign(self.buffers[i], values[i]),)
        return out


class InferenceWeights(nn.Cell):
    """The inference graphs' copies of the layer weights, per layer qkv, qkv_bias, wo, w13, w2
    (`DecoderLayer.fused_weights`), in buffers of their own; `refresh()` remakes them from the
    model's parameters."""

    FIELDS = ("qkv", "qkv_bias", "wo", "w13", "w2")

    def __init__(self, lm: Qwen2ForCausalLM):
        super().__init__(auto_prefix=False)
        fuse = _FusedWeights(lm)
        values = fuse()
        n = len(self.FIELDS)
        self.buffers = ms.ParameterTuple(
            Parameter(v, name=f"inference_weights.{i // n}.{self.FIELDS[i % n]}", requires_grad=False)
            for i, v in enumerate(values))
        self.per_layer = n
        self._refresh = _Refresh(fuse, self.buffers)

    def layer(self, i: int):
        return tuple(self.buffers[i * self.per_layer + j] for j in range(self.per_layer))

    def refresh(self) -> None:
        self._refresh()


class PrefillGraph(nn.Cell):
    """input_ids (B, P) left-padded, position_ids (B, P), key_mask (B, P), u (B,)
    -> first sampled token (B,), its logits (B, V). Writes cache slots [0, P)."""

    def __init__(self, lm: Qwen2ForCausalLM, cache: KVCache, weights: InferenceWeights, sampler: Sampler):
        super().__init__(auto_prefix=False)  # keep the model's parameter names
        self.lm, self.cache, self.weights, self.sampler = lm, cache, weights, sampler
        self.n_layers = lm.config.num_hidden_layers

    def construct(self, input_ids, position_ids, key_mask, u):
        b, p = input_ids.shape
        causal = ops.arange(p).reshape(p, 1) >= ops.arange(p).reshape(1, p)  # (P, P)
        allowed = ops.logical_and(causal.reshape(1, 1, p, p), key_mask.reshape(-1, 1, 1, p) > 0)
        bias = ops.where(allowed, 0.0, NEG_INF).astype(ms.float32)  # (B, 1, P, P)
        cos, sin = self.lm.fused_rope(position_ids.reshape(-1))  # (B*P*(nh+nkv), d)
        x = self.lm.model.tok_embeddings(input_ids.reshape(-1)).astype(self.lm.dtype)  # (B*P, H)
        for i in range(self.n_layers):
            x = self.lm.model.layers[i].prefill(x, cos, sin, bias, self.cache.k[i], self.cache.v[i],
                                                self.weights.layer(i))
        h = self.lm.model.norm_out(x.reshape(b, p, -1)[:, -1, :])  # (B, H): the last slot is real in every row
        logits = self.lm.logits(h, few_rows=True)
        return self.sampler(logits, u), logits


class DecodeGraph(nn.Cell):
    """token (B,), position (B,), bias (B, C) additive, index (B*nkv, 3), u (B,)
    -> next token (B,), its logits (B, V). Writes the cache slot named in `index`."""

    def __init__(self, lm: Qwen2ForCausalLM, cache: KVCache, weights: InferenceWeights, sampler: Sampler):
        super().__init__(auto_prefix=False)  # keep the model's parameter names
        self.lm, self.cache, self.weights, self.sampler = lm, cache, weights, sampler
        self.n_layers = lm.config.num_hidden_layers

    def construct(self, token, position, bias, index, u):
        b = token.shape[0]
        cos, sin = self.lm.fused_rope(position)  # (B*(nh+nkv), d)
        x = self.lm.model.tok_embeddings(token).astype(self.lm.dtype)  # (B, H)
        bias = bias.reshape(b, 1, 1, -1)
        for i in range(self.n_layers):
            x = self.lm.model.layers[i].decode(x, cos, sin, bias, self.cache.k[i], self.cache.v[i], index,
                                               self.weights.layer(i))
        logits = self.lm.logits(self.lm.model.norm_out(x), few_rows=True)
        return self.sampler(logits, u), logits


@dataclass
class Completion:
    prompt_index: int  # which input prompt this sample answers
    token_ids: List[int]  # generated ids, the stop id included when one was hit
    finish_reason: str  # "stop" or "length"


@dataclass
class _Bucket:
    cache: KVCache
    prefill: PrefillGraph
    decode: DecodeGraph


class RolloutEngine:
    """Generates with one Qwen2ForCausalLM's parameters (its weights are read at call time, so an
    update to them is seen by the next call)."""

    def __init__(self, lm: Qwen2ForCausalLM, pad_token_id: int = 0, batch_step: int = 8,
                 prompt_step: int = 32, tokens_step: int = 32, max_buckets: int = 4):
        self.lm = lm
        self.pad = pad_token_id
        self.batch_step, self.prompt_step, self.tokens_step = batch_step, prompt_step, tokens_step
        self.max_buckets = max_buckets
        self._buckets: "OrderedDict[tuple, _Bucket]" = OrderedDict()
        self.compiled_buckets = 0  # grows only when a new bucket is built
        self.last_stats: dict = {}
        self.weights = InferenceWeights(lm)

    @property
    def max_positions(self) -> int:
        """The model's context: positions it has RoPE rows for (at most max_position_embeddings). A prompt's
        length + max_tokens may not exceed it."""
        return int(self.lm.rope_cos.shape[0])

    def resident_parameters(self) -> list:
        """What the rollout phase keeps on the device besides the KV cache: the inference model's
        parameters and the fused copies made from them (for the memory ledger)."""
        return list(self.lm.get_parameters()) + list(self.weights.buffers)

    def cache_bytes(self) -> int:
        """The KV caches of the buckets built so far (for the memory ledger)."""
        return sum(b.cache.nbytes for b in self._buckets.values())

    def _get_bucket(self, b, p, c, params: SamplingParams) -> _Bucket:
        key = (b, p, c, params.graph_key())
        if key not in self._buckets:
            if len(self._buckets) >= self.max_buckets:
                self._buckets.popitem(last=False)  # frees the oldest cache
            cache = KVCache(self.lm, b, c)
            sampler = Sampler(params, self.lm.config.vocab_size)
            self._buckets[key] = _Bucket(cache, PrefillGraph(self.lm, cache, self.weights, sampler),
                                         DecodeGraph(self.lm, cache, self.weights, sampler))
            self.compiled_buckets += 1
        self._buckets.move_to_end(key)
        return self._buckets[key]

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 return_logits: bool = False, part: Optional[BatchPart] = None) -> List[Completion]:
        """prompts: token ids per prompt. Returns len(prompts) * params.n completions, the n
        samples of a prompt adjacent. With return_logits, each step's logits (B, V) are kept
        in self.last_logits (tests only: it syncs and copies every step). part: see BatchPart."""
        rows = [list(p) for p in prompts for _ in range(params.n)]
        if any(len(r) == 0 for r in rows):
            raise ValueError("empty prompt")
        n_rows = len(rows)
        longest = max(len(r) for r in rows)
        if part is not None and (part.prompt_len < longest or part.offset + n_rows > part.total_rows):
            raise ValueError(f"{part} does not hold these {n_rows} rows (longest prompt {longest})")
        if longest + params.max_tokens > self.max_positions:
            raise ValueError(f"a prompt of {longest} tokens + max_tokens {params.max_tokens} = "
                             f"{longest + params.max_tokens} positions, more than the model's {self.max_positions}")
        b = _bucket(n_rows, self.batch_step)
        p = _bucket(longest if part is None else part.prompt_len, self.prompt_step)
        c = p + _bucket(params.max_tokens, self.tokens_step)  # cache slots; RoPE sees each row's own positions
        bucket = self._get_bucket(b, p, c, params)

        ids = np.full((b, p), self.pad, np.int32)
        lengths = np.ones(b, np.int32)
        for i, r in enumerate(rows):
            ids[i, p - len(r):] = r
            lengths[i] = len(r)
        for i in range(n_rows, b):  # filler rows: a one-token prompt, never returned
            ids[i, -1] = self.pad
        key_valid = np.zeros((b, c), np.float32)
        key_valid[:, :p] = (np.arange(p)[None, :] >= (p - lengths)[:, None])
        positions = np.maximum(np.arange(p)[None, :] - (p - lengths)[:, None], 0).astype(np.int32)

        rng = np.random.default_rng(params.seed)
        stop = np.array(sorted(params.stop_token_ids) or [-1], np.int64)
        bh = np.stack(np.meshgrid(np.arange(b), np.arange(self.lm.kv_heads), indexing="ij"), -1)
        bh = bh.reshape(-1, 2).astype(np.int32)
        if part is None:
            uniforms = lambda: Tensor(rng.random(b, dtype=np.float32))  # noqa: E731
        else:  # the whole batch's draw, this part's rows
            b_all, mine = _bucket(part.total_rows, self.batch_step), slice(part.offset, part.offset + n_rows)
            uniforms = lambda: Tensor(np.pad(rng.random(b_all, dtype=np.float32)[mine], (0, b - n_rows)))  # noqa: E731

        t0 = time.perf_counter()
        self.weights.refresh()  # the model's weights may have changed since the last call
        tok, logits = bucket.prefill(Tensor(ids), Tensor(positions), Tensor(key_valid[:, :p]), uniforms())
        self.last_logits = [logits.asnumpy()[:n_rows]] if return_logits else None
        out = np.zeros((b, params.max_tokens), np.int64)
        done = np.zeros(b, bool)
        done[n_rows:] = True
        finished_at = np.full(b, params.max_tokens)
        steps = 0
        first_token = 0.0
        for t in range(params.max_tokens):
            tok_np = tok.asnumpy()  # (B,) host sync: needed for the stop check
            if t == 0:
                first_token = time.perf_counter() - t0  # weight refresh + prefill
            out[:, t] = tok_np
            steps = t + 1
            if not params.ignore_stop:
                hit = ~done & np.isin(tok_np, stop)
                finished_at[hit] = t + 1
                done |= hit
                if done.all():
                    break
            if t + 1 == params.max_tokens:
                break
            slot = p + t
            key_valid[:, slot] = 1.0
            bias = np.where(key_valid > 0, 0.0, NEG_INF).astype(np.float32)
            index = np.concatenate([bh, np.full((bh.shape[0], 1), slot, np.int32)], axis=1)
            tok, logits = bucket.decode(tok, Tensor(lengths + t), Tensor(bias), Tensor(index), uniforms())
            heartbeat.beat()  # a decode step (its collectives, under tensor parallelism) came back
            if return_logits:
                self.last_logits.append(logits.asnumpy()[:n_rows])
        elapsed = time.perf_counter() - t0

        results = []
        for i in range(n_rows):
            stopped = bool(done[i]) and not params.ignore_stop
            n_tok = int(finished_at[i]) if stopped else steps
            reason = "stop" if stopped else "length"
            results.append(Completion(i // params.n, out[i, :n_tok].tolist(), reason))
        new_tokens = sum(len(r.token_ids) for r in results)
        self.last_stats = {"rows": n_rows, "bucket": (b, p, c), "decode_steps": steps,
                           "new_tokens": new_tokens, "seconds": elapsed, "first_token_seconds": first_token,
                           "tokens_per_s": new_tokens / max(elapsed, 1e-9)}
        return results

    def release(self):
        """Drop every KV cache and compiled bucket (memory phase switch)."""
        self._buckets.clear()

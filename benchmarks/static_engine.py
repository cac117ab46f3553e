"""The static rollout engine that `mindgrpo/inference/engine.py` replaced, kept as the baseline of
`benchmarks/rollout.py` (its scheduling and cache as they were at 6097b61, on the same fused layers).

All rows decode as one batch until the longest stops. Prompts are left-padded to a bucketed
length P (each prompt prefilled once per sample), so every row writes its t-th new token at cache
position P + t; the cache holds C = P + max_tokens (bucketed) positions per row, all of which
every decode step attends over. The cache write is MindSpore's ScatterNdUpdate, which copies the
whole layer cache. Per step the host builds B uniforms from one seeded generator, a (B, C) mask
and the stop check.
"""

from __future__ import annotations

import time
from typing import List, Sequence

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from mindgrpo.inference.engine import Completion
from mindgrpo.inference.graphs import _attend
from mindgrpo.inference.layers import InferenceModel
from mindgrpo.inference.sampling import Sampler, SamplingParams
from mindgrpo.models.qwen2 import NEG_INF, Qwen2ForCausalLM


def _bucket(n: int, step: int) -> int:
    return max(step, -(-n // step) * step)


class _Cache(nn.Cell):
    """Per layer k and v caches, each (B, nkv, C, d)."""

    def __init__(self, model: InferenceModel, batch: int, capacity: int):
        super().__init__()
        shape = (batch, model.nkv, capacity, model.d)
        self.k = ms.ParameterTuple(Parameter(Tensor(np.zeros(shape, np.float32), model.dtype), name=f"k.{i}",
                                             requires_grad=False) for i in range(model.n_layers))
        self.v = ms.ParameterTuple(Parameter(Tensor(np.zeros(shape, np.float32), model.dtype), name=f"v.{i}",
                                             requires_grad=False) for i in range(model.n_layers))


class _Prefill(nn.Cell):
    """input_ids (B, P) left-padded, position_ids (B, P), key_mask (B, P), u (B,) -> first token (B,).
    Writes cache positions [0, P)."""

    def __init__(self, model: InferenceModel, cache: _Cache, sampler: Sampler, temperature: float):
        super().__init__(auto_prefix=False)
        self.model, self.cache, self.sampler, self.temperature = model, cache, sampler, temperature

    def construct(self, input_ids, position_ids, key_mask, u):
        m = self.model
        b, p = input_ids.shape
        nh, nkv, g, d = m.nh, m.nkv, m.g, m.d
        causal = ops.arange(p).reshape(p, 1) >= ops.arange(p).reshape(1, p)  # (P, P)
        allowed = ops.logical_and(causal.reshape(1, 1, p, p), key_mask.reshape(-1, 1, 1, p) > 0)
        bias = ops.where(allowed, 0.0, NEG_INF).astype(ms.float32).reshape(b, 1, 1, p, p)
        cos, sin = m.rope(position_ids.reshape(-1))
        x = m.embed(input_ids.reshape(-1))  # (B*P, H)
        for i in range(m.n_layers):
            q, k, v = m.qkv(i, x, cos, sin)
            q = q.reshape(b, p, nh, d).transpose(0, 2, 1, 3).reshape(b, nkv, g * p, d)
            k = k.reshape(b, p, nkv, d).transpose(0, 2, 1, 3)
            v = v.reshape(b, p, nkv, d).transpose(0, 2, 1, 3)
            kc, vc = self.cache.k[i], self.cache.v[i]
            pad = ops.zeros((b, nkv, kc.shape[2] - p, d), kc.dtype)
            k = ops.depend(k, ops.assign(kc, ops.concat((k.astype(kc.dtype), pad), axis=2)))
            v = ops.depend(v, ops.assign(vc, ops.concat((v.astype(vc.dtype), pad), axis=2)))
            out = _attend(q, k, v, bias).reshape(b, nh, p, d).transpose(0, 2, 1, 3).reshape(b * p, nh * d)
            x = m.mlp(i, m.attention_out(i, x, out))
        logits = m.logits(x.reshape(b, p, -1)[:, -1, :])  # the last position is real in every row
        return self.sampler(logits, u, ops.ones_like(u) * self.temperature)[0]


class _Decode(nn.Cell):
    """token (B,), position (B,), bias (B, C) additive, index (B*nkv, 3), u (B,) -> next token (B,).
    Writes the cache position named in `index` (the same for every row)."""

    def __init__(self, model: InferenceModel, cache: _Cache, sampler: Sampler, temperature: float):
        super().__init__(auto_prefix=False)
        self.model, self.cache, self.sampler, self.temperature = model, cache, sampler, temperature
        self.scatter = ops.ScatterNdUpdate()

    def construct(self, token, position, bias, index, u):
        m = self.model
        b = token.shape[0]
        nh, nkv, g, d = m.nh, m.nkv, m.g, m.d
        cos, sin = m.rope(position)
        x = m.embed(token)
        bias = bias.reshape(b, 1, 1, 1, -1)
        for i in range(m.n_layers):
            q, k, v = m.qkv(i, x, cos, sin)
            kc, vc = self.cache.k[i], self.cache.v[i]
            k_all = self.scatter(kc, index, k.reshape(b * nkv, d).astype(kc.dtype))  # (B, nkv, C, d)
            v_all = self.scatter(vc, index, v.reshape(b * nkv, d).astype(vc.dtype))
            out = _attend(q.reshape(b, nkv, g, d), k_all, v_all, bias)
            x = m.mlp(i, m.attention_out(i, x, out.reshape(b, nh * d)))
        return self.sampler(m.logits(x), u, ops.ones_like(u) * self.temperature)[0]


class StaticEngine:
    """The previous engine's `generate`, for the benchmark: same arguments, same Completion type
    (without log-probs); one bucket (B, P, C) per call shape, compiled once."""

    def __init__(self, lm: Qwen2ForCausalLM, pad_token_id: int = 0, batch_step: int = 8, prompt_step: int = 32,
                 tokens_step: int = 32):
        self.model = InferenceModel(lm)
        self.pad = pad_token_id
        self.batch_step, self.prompt_step, self.tokens_step = batch_step, prompt_step, tokens_step
        self._buckets = {}
        self.last_stats: dict = {}

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> List[Completion]:
        rows = [list(p) for p in prompts for _ in range(params.n)]
        n_rows = len(rows)
        b = _bucket(n_rows, self.batch_step)
        p = _bucket(max(len(r) for r in rows), self.prompt_step)
        c = p + _bucket(params.max_tokens, self.tokens_step)
        key = (b, p, c, params.temperature, params.graph_key())
        if key not in self._buckets:
            self._buckets.clear()  # one cache at a time, as the benchmark needs
            cache = _Cache(self.model, b, c)
            sampler = Sampler(params, self.model.lm.config.vocab_size)
            t = params.temperature
            self._buckets[key] = (cache, _Prefill(self.model, cache, sampler, t), _Decode(self.model, cache, sampler, t))
        cache, prefill, decode = self._buckets[key]

        ids = np.full((b, p), self.pad, np.int32)
        lengths = np.ones(b, np.int32)
        for i, r in enumerate(rows):
            ids[i, p - len(r):] = r
            lengths[i] = len(r)
        key_valid = np.zeros((b, c), np.float32)
        key_valid[:, :p] = (np.arange(p)[None, :] >= (p - lengths)[:, None])
        positions = np.maximum(np.arange(p)[None, :] - (p - lengths)[:, None], 0).astype(np.int32)
        rng = np.random.default_rng(params.seed)
        stop = np.array(sorted(params.stop_token_ids) or [-1], np.int64)
        bh = np.stack(np.meshgrid(np.arange(b), np.arange(self.model.nkv), indexing="ij"), -1)
        bh = bh.reshape(-1, 2).astype(np.int32)

        t0 = time.perf_counter()
        self.model.weights.refresh()
        tok = prefill(Tensor(ids), Tensor(positions), Tensor(key_valid[:, :p]), Tensor(rng.random(b, dtype=np.float32)))
        out = np.zeros((b, params.max_tokens), np.int64)
        done = np.zeros(b, bool)
        done[n_rows:] = True
        finished_at = np.full(b, params.max_tokens)
        steps = 0
        for t in range(params.max_tokens):
            tok_np = tok.asnumpy()
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
            tok = decode(tok, Tensor(lengths + t), Tensor(bias), Tensor(index), Tensor(rng.random(b, dtype=np.float32)))
        elapsed = time.perf_counter() - t0

        results = []
        for i in range(n_rows):
            stopped = bool(done[i]) and not params.ignore_stop
            n_tok = int(finished_at[i]) if stopped else steps
            results.append(Completion(i // params.n, out[i, :n_tok].tolist(), "stop" if stopped else "length"))
        new_tokens = sum(len(r.token_ids) for r in results)
        # `steps` passes (the prefill's and the decode steps) each produced a token for b rows
        self.last_stats = {"rows": n_rows, "new_tokens": new_tokens, "seconds": elapsed, "decode_steps": steps,
                           "useful_fraction": new_tokens / max(steps * b, 1),
                           "tokens_per_s": new_tokens / max(elapsed, 1e-9)}
        return results

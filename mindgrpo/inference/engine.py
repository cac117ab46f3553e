"""Rollout engine: slot-scheduled decoding with continuous refill, in MindSpore graphs.

S decode slots (`max_num_seqs`, capped by the KV-cache budget `max_num_batched_tokens`: S * C
tokens, C the per-slot capacity) decode one token per step each. Requests beyond the slots wait;
a slot freed by a finished sample takes the next waiting one (`scheduler.SlotScheduler`: each
prompt is prefilled once, its G samples share its cache rows). Each step runs the decode graph of
the smallest batch bucket that holds the live slots and of the smallest length bucket that holds
their positions, so finished rows and the unused tail of the cache stop costing compute as the
batch drains (no data moves: the graph is given the live slots' numbers). A sample's random
numbers come from its own stream (`streams.uniforms(seed, prompt, sample, token)`), so its tokens
do not depend on the slots, the admission order or the data-parallel split.

Graphs are compiled once per shape and kept for later calls (the sampler's settings are part of
the decode graph's key: greedy validation and sampled rollouts are two settings). Batch and
length buckets halve from the cap (S slots, C positions per slot) down to about 8 rows and 32
positions, so a call can compile at most
    decode   (log2(S / 8) + 2) batch buckets x (log2(C / 32) + 2) length buckets
    prefill  (log2 S + 2) prompt-batch buckets, copy (log2(S / 8) + 2) batch buckets, each for
             the call's prompt-length bucket (a power of two from 16 to C)
(S = 64, C = 544: at most 20 decode, 8 prefill and 5 copy shapes per prompt-length bucket; one
call of 64 prompts x 8 samples compiles about 8, 2 and 3). Prefill and copy graphs touch only
the rows they write and compile faster than a decode graph.

The cache (`graphs.KVCache`) is allocated once, at the first call, for S slots of capacity C =
`max_model_len` (or the first call's longest prompt + max_tokens, grown if a later call needs
more); `cache_bytes()` is what the memory ledger counts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np
from mindspore import Tensor

from mindgrpo.inference.graphs import CopyGraph, DecodeGraph, KVCache, PrefillGraph
from mindgrpo.inference.layers import InferenceModel
from mindgrpo.inference.sampling import Sampler, SamplingParams
from mindgrpo.inference.scheduler import SlotScheduler, halving_bucket, pow2_bucket
from mindgrpo.inference.streams import uniforms
from mindgrpo.models.qwen2 import Qwen2ForCausalLM

LENGTH_STEP = 32  # capacities are multiples of this; decode length buckets stop halving near it
PROMPT_STEP = 16  # the smallest prefill / copy length bucket
MIN_BATCH = 8  # decode and copy batch buckets stop halving near this (fewer shapes; idle rows cost little)


@dataclass
class Completion:
    prompt_index: int  # which input prompt this sample answers
    token_ids: List[int]  # generated ids, the stop id included when one was hit
    finish_reason: str  # "stop" or "length"
    logprobs: Optional[np.ndarray] = None  # (n,) fp32: each token's log-prob under softmax(logits / T)
    sampling_logprobs: Optional[np.ndarray] = None  # (n,) fp32: under the filtered distribution it was drawn from


def kv_slots(capacity: int, max_num_seqs: int, max_num_batched_tokens: Optional[int]) -> int:
    """Decode slots for a per-slot capacity: max_num_seqs, fewer if the KV-cache budget in tokens
    cannot hold that many (None: no budget)."""
    if max_num_batched_tokens is None:
        return max_num_seqs
    slots = min(max_num_seqs, max_num_batched_tokens // capacity)
    if slots < 1:
        raise ValueError(f"max_num_batched_tokens {max_num_batched_tokens} cannot hold one sequence of "
                         f"{capacity} tokens (prompt + max_tokens)")
    return slots


def slot_capacity(max_prompt_length: int, max_tokens: int) -> int:
    """Cache positions one slot needs: the prompt and the new tokens (the last one's k/v is never
    written), rounded up to LENGTH_STEP."""
    return -(-(max_prompt_length + max_tokens - 1) // LENGTH_STEP) * LENGTH_STEP


class RolloutEngine:
    """Generates with one Qwen2ForCausalLM's parameters (the fused copies are remade at every call,
    so an update to the parameters is seen by the next call).

    max_num_seqs: decode slots; max_num_batched_tokens: KV-cache budget in tokens (None: slots x
    capacity); max_model_len: the per-slot capacity (prompt + new tokens; None: from the calls)."""

    def __init__(self, lm: Qwen2ForCausalLM, pad_token_id: int = 0, max_num_seqs: int = 256,
                 max_num_batched_tokens: Optional[int] = None, max_model_len: Optional[int] = None):
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        self.lm = lm
        self.model = InferenceModel(lm)
        self.pad = pad_token_id
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.fixed_capacity = None if max_model_len is None else slot_capacity(max_model_len, 1)
        if self.fixed_capacity is not None:
            kv_slots(self.fixed_capacity, max_num_seqs, max_num_batched_tokens)  # fails early on a tiny budget
        self.cache: Optional[KVCache] = None
        self._graphs: Dict[tuple, object] = {}
        self.compiled_graphs = 0  # grows only when a new graph shape is built
        self.last_stats: dict = {}
        self.last_logits: Optional[List[np.ndarray]] = None

    # ---------------------------------------------------------------- memory
    def resident_parameters(self) -> list:
        """What the rollout phase keeps on the device besides the KV cache (for the memory ledger)."""
        return self.model.resident_parameters()

    def cache_bytes(self) -> int:
        return self.cache.nbytes if self.cache is not None else 0

    def release(self) -> None:
        """Drop the KV cache and every graph that writes it."""
        self.cache = None
        self._graphs.clear()

    def _ensure_cache(self, need: int) -> KVCache:
        capacity = self.fixed_capacity
        if capacity is None:
            capacity = max(slot_capacity(need, 1), self.cache.capacity if self.cache is not None else 0)
        elif need > capacity:
            raise ValueError(f"a prompt + its max_tokens needs {need} cache positions; max_model_len allows "
                             f"{capacity}")
        table = self.lm.rope_cos.shape[0]
        if capacity > table:
            raise ValueError(f"prompt + max_tokens ({capacity} positions) exceeds the model's position table "
                             f"({table})")
        if self.cache is None or self.cache.capacity != capacity:
            self.release()
            slots = kv_slots(capacity, self.max_num_seqs, self.max_num_batched_tokens)
            self.cache = KVCache(self.model, slots, capacity)
        return self.cache

    def _graph(self, key: tuple, make):
        if key not in self._graphs:
            self._graphs[key] = make()
            self.compiled_graphs += 1
        return self._graphs[key]

    # ---------------------------------------------------------------- generation
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 max_tokens: Optional[Sequence[int]] = None, prompt_index: Optional[Sequence[int]] = None,
                 return_logits: bool = False) -> List[Completion]:
        """prompts: token ids per prompt. Returns len(prompts) * params.n completions, the n samples
        of a prompt adjacent. max_tokens: per prompt (default params.max_tokens for all).
        prompt_index: each prompt's index in the whole batch, the key of its samples' random
        streams (default 0, 1, ...; a data-parallel replica passes its share's indices). With
        return_logits, self.last_logits[r] holds request r's logits (n, V) (tests only: it syncs
        and copies every step)."""
        n_prompts, group = len(prompts), params.n
        lengths = np.array([len(p) for p in prompts], np.int64)
        if n_prompts == 0 or (lengths == 0).any():
            raise ValueError("empty prompt" if n_prompts else "no prompts")
        limit = np.full(n_prompts, params.max_tokens, np.int64) if max_tokens is None \
            else np.asarray(max_tokens, np.int64)
        if limit.shape != (n_prompts,) or (limit < 1).any():
            raise ValueError(f"max_tokens must give one value >= 1 per prompt, got {list(limit)}")
        keys = np.arange(n_prompts) if prompt_index is None else np.asarray(prompt_index, np.int64)
        cache = self._ensure_cache(int((lengths + limit - 1).max()))
        slots, capacity, trash = cache.slots, cache.capacity, cache.slots
        vocab = self.lm.config.vocab_size
        stop = np.zeros(vocab, bool)
        stop[[t for t in params.stop_token_ids if 0 <= t < vocab]] = True
        sampler_key = params.graph_key()
        last_token = np.array([p[-1] for p in prompts], np.int64)
        prefix = int(lengths.max()) - 1  # prefill and copy move this call's prompts in one length bucket
        p_len = pow2_bucket(prefix, PROMPT_STEP, capacity)

        temperature = np.full(slots + 1, params.temperature, np.float32)  # per row; 0: greedy
        sched = SlotScheduler(n_prompts, group, slots)
        token = np.zeros(slots + 1, np.int64)  # per slot (and the trash slot): the next input token
        position = np.zeros(slots + 1, np.int64)  # its position
        count = np.zeros(slots + 1, np.int64)  # tokens generated by the slot's request so far
        n_req, width = n_prompts * group, int(limit.max())
        out_tok = np.zeros((n_req, width), np.int64)
        out_scaled = np.zeros((n_req, width), np.float32)
        out_sampled = np.zeros((n_req, width), np.float32)
        n_out = np.zeros(n_req, np.int64)
        stopped = np.zeros(n_req, bool)
        logits_rows: List[List[np.ndarray]] = [[] for _ in range(n_req)] if return_logits else []
        steps = row_steps = prefills = copies = 0
        prefill_s = decode_s = 0.0

        t0 = time.perf_counter()
        self.model.weights.refresh()  # the model's weights may have changed since the last call
        while True:
            t1 = time.perf_counter()
            adm = sched.admit()
            prefills += len(adm.prefill_prompts)
            copies += len(adm.copy_dst)
            if adm.prefill_prompts and prefix > 0:  # one-token prompts: decode writes their only position
                self._prefill(cache, [prompts[p] for p in adm.prefill_prompts], adm.prefill_slots, trash, p_len)
            if adm.copy_src and prefix > 0:
                self._copy(cache, adm.copy_src, adm.copy_dst, p_len)
            if adm.started:
                started = np.asarray(adm.started)
                p = sched.request[started] // group
                token[started], position[started], count[started] = last_token[p], lengths[p] - 1, 0
            t2 = time.perf_counter()
            prefill_s += t2 - t1

            live = sched.live()
            if live.size == 0:
                break
            n_live = live.size
            b = halving_bucket(n_live, slots, MIN_BATCH)
            length = halving_bucket(int(position[live].max()) + 1, capacity, LENGTH_STEP)
            # every slot and every position: read the cache in place (not worth a trash row below 8 slots)
            whole = b == slots >= MIN_BATCH and length == capacity
            if whole:  # the rows are the slots in order, the trash slot last; free slots idle at position 0
                rows, mine = np.arange(slots + 1), live
            else:  # the live slots, then the trash slot for padding
                rows, mine = np.concatenate([live, np.full(b - n_live, trash, np.int64)]), np.arange(n_live)
            req = sched.request[live]
            prompt_of = req // group
            u = np.zeros(rows.size, np.float32)
            if not params.greedy:
                u[mine] = uniforms(params.seed, keys[prompt_of], req % group, count[live])
            graph = self._graph(("decode", rows.size, length, sampler_key), lambda: DecodeGraph(
                self.model, cache, Sampler(params, vocab), length, whole))
            out, logits = graph(Tensor(token[rows].astype(np.int32)), Tensor(position[rows].astype(np.int32)),
                                Tensor(rows.astype(np.int32)), Tensor(u), Tensor(temperature[:rows.size]))
            res = out.asnumpy()[mine]  # (n_live, 3) host sync: the stop check needs the tokens
            new = res[:, 0].astype(np.int64)
            c = count[live]
            out_tok[req, c], out_sampled[req, c], out_scaled[req, c] = new, res[:, 1], res[:, 2]
            if return_logits:
                for r, row in zip(req, logits.asnumpy()[mine]):
                    logits_rows[r].append(row)
            count[live] += 1
            position[live] += 1
            token[live] = new
            hit = stop[new] if not params.ignore_stop else np.zeros(n_live, bool)
            done = hit | (count[live] >= limit[prompt_of])
            stopped[req[done]] = hit[done]
            n_out[req[done]] = count[live][done]
            position[live[done]] = token[live[done]] = 0  # a free slot idles at position 0 (it may ride along)
            sched.finish(live[done])
            steps += 1
            row_steps += rows.size
            decode_s += time.perf_counter() - t2
        elapsed = time.perf_counter() - t0

        results = [Completion(r // group, out_tok[r, :n_out[r]].tolist(), "stop" if stopped[r] else "length",
                              out_scaled[r, :n_out[r]].copy(), out_sampled[r, :n_out[r]].copy())
                   for r in range(n_req)]
        self.last_logits = [np.stack(rows) for rows in logits_rows] if return_logits else None
        new_tokens = int(n_out.sum())
        self.last_stats = {
            "rows": n_req, "new_tokens": new_tokens, "seconds": elapsed, "prefill_seconds": prefill_s,
            "decode_seconds": decode_s, "decode_steps": steps, "prefilled_prompts": prefills, "copied_slots": copies,
            "useful_fraction": new_tokens / max(row_steps, 1),  # generated tokens / rows computed, over the steps run
            "slots": slots, "slots_in_use": new_tokens / max(steps, 1), "capacity": capacity,
            "kv_bytes": cache.nbytes, "compiled_graphs": self.compiled_graphs,
            "tokens_per_s": new_tokens / max(elapsed, 1e-9)}
        return results

    def _prefill(self, cache: KVCache, prompts: List[Sequence[int]], homes: List[int], trash: int,
                 p_len: int) -> None:
        """Every prompt but its last token into its home slot, one graph call (padding prompts
        write to the trash slot)."""
        n = len(prompts)
        bp = halving_bucket(n, cache.slots, 1)
        ids = np.full((bp, p_len), self.pad, np.int32)
        for i, p in enumerate(prompts):
            ids[i, :len(p) - 1] = p[:-1]
        slot = np.full(bp, trash, np.int32)
        slot[:n] = homes
        graph = self._graph(("prefill", bp, p_len), lambda: PrefillGraph(self.model, cache))
        graph(Tensor(ids), Tensor(slot)).asnumpy()

    def _copy(self, cache: KVCache, src: List[int], dst: List[int], p_len: int) -> None:
        """Cache positions [0, p_len) of each src slot to its dst slot, one graph call; padding
        repeats the last pair (the same rows written again)."""
        n = len(src)
        nb = halving_bucket(n, cache.slots, MIN_BATCH)
        s = np.array(src + [src[-1]] * (nb - n), np.int32)
        d = np.array(dst + [dst[-1]] * (nb - n), np.int32)
        graph = self._graph(("copy", nb, p_len), lambda: CopyGraph(self.model, cache, p_len))
        graph(Tensor(s), Tensor(d)).asnumpy()

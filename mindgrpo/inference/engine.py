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

Graphs are compiled once per shape and kept for later calls (top-k, top-p and min-p are part of
the decode graph's key; the temperature is an input, so greedy validation and sampled rollouts
share graphs). Batch and length buckets halve from the cap (S slots, C positions per slot) down to
about 8 rows and 32 positions, so a run compiles at most (`graph_bound`)
    decode   len(halving_buckets(S, 8)) x len(halving_buckets(C, 32)) shapes
    prefill  len(halving_buckets(S, 1)) prompt-batch buckets and copy len(halving_buckets(S, 8))
             batch buckets, for each prompt-length bucket a call's longest prompt picks (a power
             of two from 16 to C)
(S = 64, C = 572: at most 20 decode, 7 prefill and 4 copy shapes per prompt-length bucket; one
call of 64 prompts x 8 samples compiles about 8, 2 and 3). Prefill and copy graphs touch only
the rows they write and compile faster than a decode graph.

With `layerwise` (generate_config.layerwise) a prefill or decode step is a few graphs instead of one:
its inputs (`PrefillInputs`, `DecodeInputs`: embedding, RoPE rows, cache rows, mask), a layer graph
called with the layers' weights and caches as inputs (`PrefillLayer` for every decoder layer; `DecodeLayers`
for every group of `decode_layers_per_graph` layers, a last smaller group in a graph of its own: a decode
step runs at every token, and each graph call costs milliseconds), and (decode) `DecodeHead`: the final
norm, the head and the sampler; the fused copies are refreshed by one layer graph too
(`layers.InferenceWeights`). The same ops on the same shapes, so the same tokens and log-probs bit for bit
(`tests/inference/test_layerwise_engine.py`); MindSpore's CPU runtime then keeps the graph buffers of one
layer (a decode group's) instead of every layer's (`benchmarks/results/layerwise_generate_groups.md`), and a shape
compiles the same few graphs whatever the number of layers (each key above: three or four graphs).

The cache (`graphs.KVCache`) is allocated once, at the first call, for S slots of capacity C =
`max_model_len` (or the first call's longest prompt + max_tokens, grown if a later call needs
more); `cache_bytes()` is what the memory ledger counts.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Protocol, Sequence, Tuple

import numpy as np
import mindspore as ms
from mindspore import Tensor

from mindgrpo.inference.graphs import (AppendGraph, CopyGraph, DecodeGraph, DecodeHead, DecodeInputs, DecodeLayers, KVCache,
                                       PrefillGraph, PrefillInputs, PrefillLayer)
from mindgrpo.inference.layers import InferenceModel
from mindgrpo.inference.sampling import Sampler, SamplingParams
from mindgrpo.inference.scheduler import SlotScheduler, halving_bucket, halving_buckets, pow2_bucket
from mindgrpo.inference.streams import uniforms
from mindgrpo.models.qwen2 import Qwen2ForCausalLM
from mindgrpo.utils import heartbeat

logger = logging.getLogger(__name__)

LENGTH_STEP = 32  # capacities are multiples of this; decode length buckets stop halving near it
# the graphs `RolloutEngine.release` keeps: their buffers are a few rows' (at the Qwen2.5-0.5B shape, 16 slots, the
# layerwise decode's about 0.13 GB), where prefill and copy graphs keep buffers of every prompt position
KEPT_GRAPHS = ("decode", "decode_inputs", "decode_layers", "decode_head", "prefill_inputs")
PROMPT_STEP = 16  # the smallest prefill / copy length bucket
MIN_BATCH = 8  # decode and copy batch buckets stop halving near this (fewer shapes; idle rows cost little)


@dataclass
class Completion:
    prompt_index: int  # which input prompt this sample answers
    token_ids: List[int]  # generated ids, the stop id included when one was hit (a conversation: every turn)
    finish_reason: str  # "stop" or "length"; "partial": not finished when the call stopped (min_groups)
    logprobs: Optional[np.ndarray] = None  # (n,) fp32: each token's log-prob under softmax(logits / T)
    sampling_logprobs: Optional[np.ndarray] = None  # (n,) fp32: under the filtered distribution it was drawn from
    model_mask: Optional[np.ndarray] = None  # (n,) bool, conversations only: the model's own tokens (tool turns
    # False, their log-probs 0)
    turns: int = 0  # the turns appended (tool answers)
    versions: Optional[np.ndarray] = None  # (n,) int64: the policy version (updates done) of the weights that
    # generated each token (the engine's `version` when it generated it; a tool turn's tokens: the version of the
    # model turn they follow)


class Turns(Protocol):
    """How a conversation goes on (generate's `turns`): after a sample ends a turn (a stop id), `end_turn`
    says whether another turn follows (True: the sample keeps its slot, parked, until `poll` gives that turn's
    token ids); `poll(block)` returns the (request, ids) whose next turn is ready, waiting for at least one
    when block. A turn's ids are what the chat template puts after the model's stop token up to and including
    the open assistant turn: its last id is the next decode input. At most max_turns turns per sample, each
    at most max_turn_tokens ids."""

    max_turns: int
    max_turn_tokens: int

    def end_turn(self, request: int, prompt: int, turn_ids: List[int]) -> bool: ...

    def poll(self, block: bool) -> List[Tuple[int, List[int]]]: ...


class Carried(NamedTuple):
    """A conversation carried over from an earlier call (partial rollouts, grpo/partial.py), given to generate as one
    prompt (its prompt and its trajectory so far): the turns it already had appended, and the ids of the model turn
    it was in when that call stopped (empty after a whole turn: the tool turn was its last)."""

    turns: int
    turn_ids: List[int]


def appended_positions(turns: Optional[Turns]) -> int:
    """Positions a sample's appended turns may take beyond its prompt and max_tokens (KV cache, output row): max_turns
    turns of at most max_turn_tokens ids; 0 without conversations (None). The one definition: the engine's cache and
    rows, the samples' rows between ranks (`parallel/data_parallel.row_width`) and the run's positions
    (`grpo/conversations.Conversations.extra_positions`) read it."""
    return 0 if turns is None else turns.max_turns * turns.max_turn_tokens


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


def graph_bound(slots: int, capacity: int, max_prompt_length: Optional[int] = None) -> dict:
    """The most graphs an engine with these slots and per-slot capacity compiles in a run, per
    setting of top-k / top-p / min-p: decode shapes, and prefill and copy shapes per prompt-length
    bucket (a call's longest prompt picks one; `prompt_buckets` of them for prompts up to
    max_prompt_length tokens, default the capacity)."""
    longest = capacity if max_prompt_length is None else max_prompt_length
    prompt_buckets = len({pow2_bucket(n, PROMPT_STEP, capacity) for n in range(longest)})
    return {"decode": len(halving_buckets(slots, MIN_BATCH)) * len(halving_buckets(capacity, LENGTH_STEP)),
            "prefill_per_prompt_bucket": len(halving_buckets(slots, 1)),
            "copy_per_prompt_bucket": len(halving_buckets(slots, MIN_BATCH)), "prompt_buckets": prompt_buckets}


def append_graph_bound(slots: int, capacity: int, max_turn_tokens: int) -> int:
    """The most append graphs (conversations' turns) an engine compiles: a batch bucket (halving from the
    slots) for each turn-length bucket (powers of two from PROMPT_STEP up to max_turn_tokens')."""
    lengths = len({pow2_bucket(n, PROMPT_STEP, capacity) for n in range(1, max_turn_tokens + 1)})
    return len(halving_buckets(slots, 1)) * lengths


def slot_capacity(need: int) -> int:
    """A slot's positions when the engine sizes it from its calls (no max_model_len): `need`
    positions rounded up to LENGTH_STEP, so that later calls rarely need a bigger cache."""
    return -(-need // LENGTH_STEP) * LENGTH_STEP


class RolloutEngine:
    """Generates with one Qwen2ForCausalLM's parameters (the fused copies are remade at every call,
    so an update to the parameters is seen by the next call).

    max_num_seqs: decode slots; max_num_batched_tokens: KV-cache budget in tokens (None: slots x
    capacity); max_model_len: the per-slot capacity in positions (the longest prompt + max_tokens, at
    most the model's context; None: from the calls). The engine has min(max_num_seqs,
    max_num_batched_tokens // capacity) slots. layerwise: the graphs a layer at a time (the module's
    docstring), decode_layers_per_graph layers in a decode graph. max_prefill_tokens: the most prompt positions
    (prompts x their length bucket) one prefill graph call takes, at least one prompt (None: every prompt
    admitted at once); the prompts admitted together are prefilled in as many calls as that needs."""

    def __init__(self, lm: Qwen2ForCausalLM, pad_token_id: int = 0, max_num_seqs: int = 256,
                 max_num_batched_tokens: Optional[int] = None, max_model_len: Optional[int] = None,
                 layerwise: bool = False, decode_layers_per_graph: int = 8,
                 max_prefill_tokens: Optional[int] = 4096):
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        if decode_layers_per_graph < 1:
            raise ValueError(f"decode_layers_per_graph must be >= 1, got {decode_layers_per_graph}")
        if max_prefill_tokens is not None and max_prefill_tokens < 1:
            raise ValueError(f"max_prefill_tokens must be >= 1, got {max_prefill_tokens}")
        self.max_prefill_tokens = max_prefill_tokens
        self.lm = lm
        self.layerwise, self.decode_layers_per_graph = layerwise, decode_layers_per_graph
        self._groups: list = []  # `layerwise`: the decode groups' graph inputs, made with the cache
        self.model = InferenceModel(lm, layerwise)
        self.pad = pad_token_id
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.fixed_capacity = None if max_model_len is None else min(max_model_len, self.max_positions)
        if self.fixed_capacity is not None:
            kv_slots(self.fixed_capacity, max_num_seqs, max_num_batched_tokens)  # fails early on a tiny budget
        self.cache: Optional[KVCache] = None
        self._graphs: Dict[tuple, object] = {}
        self.compiled_graphs = 0  # grows only when a new graph shape is built
        self.last_stats: dict = {}
        self.last_logits: Optional[List[np.ndarray]] = None
        self.turns_cut_logged = False  # the first turn that did not fit is logged, every one counted (turns_cut)
        # the policy version of the weights the engine generates with (updates done; the trainer sets it at each
        # weight sync): every token a call generates is stamped with it (Completion.versions)
        self.version = 0

    @property
    def max_positions(self) -> int:
        """The model's context: positions it has RoPE rows for (at most max_position_embeddings). A prompt's
        length + max_tokens may not exceed it."""
        return int(self.lm.rope_cos.shape[0])

    # ---------------------------------------------------------------- memory
    def resident_parameters(self) -> list:
        """What the rollout phase keeps on the device besides the KV cache (for the memory ledger)."""
        return self.model.resident_parameters()

    def cache_bytes(self) -> int:
        """The KV cache allocated so far, in bytes (for the memory ledger)."""
        return self.cache.nbytes if self.cache is not None else 0

    def release(self) -> None:
        """Between rollouts (rl_config.release_graphs): the KV cache and the fused layer copies shrink to one
        element each (the same Parameters, in the graphs that take them; the next call makes them again: zeros,
        fresh copies), and the graphs whose buffers grow with the prompts' positions or the layers (prefill,
        copy, the copies' refresh) go with the buffers the runtime keeps for them (freed only with the cells
        that compiled them: `tests/test_environment.py`); the next call compiles them again. The decode graphs
        and the prefill inputs graph stay (`KEPT_GRAPHS`): their buffers are a few rows' and compiling and first
        calling a graph again costs 0.5-0.9 s (DEVELOPERS.md)."""
        if self.cache is not None:
            self.cache.empty()
        self._graphs = {key: g for key, g in self._graphs.items() if key[0] in KEPT_GRAPHS}
        self.model.weights.release()

    def _drop(self) -> None:
        """The KV cache and every graph (all made for that cache's shape) dropped; the fused copies shrunk."""
        self.cache, self._groups = None, []
        self._graphs.clear()
        self.model.weights.release()

    def _ensure_cache(self, need: int) -> KVCache:
        """need: the cache positions the call's longest sample writes (at most max_positions - 1).
        A slot never holds more positions than the model has."""
        capacity = self.fixed_capacity
        if capacity is None:
            capacity = max(slot_capacity(need), self.cache.capacity if self.cache is not None else 0)
        elif need > capacity:
            raise ValueError(f"a prompt + its max_tokens needs {need} cache positions; max_model_len allows "
                             f"{capacity}")
        capacity = min(capacity, self.max_positions)
        if self.cache is None or self.cache.capacity != capacity:
            self._drop()
            slots = kv_slots(capacity, self.max_num_seqs, self.max_num_batched_tokens)
            self.cache = KVCache(self.model, slots, capacity)
            self._groups = self._decode_groups(self.cache) if self.layerwise else []
        self.cache.refill()  # after a release
        return self.cache

    def _graph(self, key: tuple, make):
        if key not in self._graphs:
            self._graphs[key] = make()
            self.compiled_graphs += 1
        return self._graphs[key]

    # ---------------------------------------------------------------- generation
    def next_round(self, count: int) -> int:
        """rl_config.dynamic_sampling: how many prompts the next rollout of this step draws, the trainer's own `count`
        (0: the step's rollouts are complete). This engine generates the prompts it is given: the trainer decides (a
        separate placement's engine, `parallel/separate.RemoteRollout`, answers with its rollout ranks' decision)."""
        return count

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 max_tokens: Optional[Sequence[int]] = None, prompt_index: Optional[Sequence[int]] = None,
                 return_logits: bool = False, turns: Optional[Turns] = None,
                 min_groups: Optional[int] = None, carried: Optional[Sequence[Carried]] = None) -> List[Completion]:
        """prompts: token ids per prompt. Returns len(prompts) * params.n completions, the n samples
        of a prompt adjacent. max_tokens: per prompt (default params.max_tokens for all).
        prompt_index: each prompt's index in the whole batch, the key of its samples' random
        streams (default 0, 1, ...; a data-parallel replica passes its share's indices). With
        return_logits, self.last_logits[r] holds request r's logits (n, V) (tests only: it syncs
        and copies every step). turns: conversations (the `Turns` protocol): a sample whose turn ends with a
        stop id may get another turn appended to its cache rows, then decodes on in its slot; max_tokens
        counts its own tokens over all turns; its Completion holds the whole trajectory and its model_mask.
        min_groups: stop as soon as this many prompts have all their n samples finished (partial rollouts); the
        samples not finished then come back with finish_reason "partial" and the tokens they have (none for one
        never started). None: every sample to its end. With conversations such a call appends every parked sample's
        turn before its next decode step (the tools do not overlap its decoding), so where it stops does not depend on
        how long they take; it stops after a decode step, then waits for the turns its parked samples asked for and
        puts each in its sample's trajectory (no cache written: the call ends), so an unfinished conversation comes
        back in the middle of a model turn or right after an appended turn, never between a turn's end and its answer.
        carried: with turns, a `Carried` per prompt (n = 1), the conversations of earlier calls that go on here (each
        prompt its prompt and trajectory so far): their turns count towards max_turns, and the model turn under
        way is whole when it ends (`Turns.end_turn`). Completion.turns counts the turns this call appended."""
        if carried is not None and (turns is None or params.n != 1 or len(carried) != len(prompts)):
            raise ValueError("carried conversations need turns, n = 1 and one Carried per prompt")
        if turns is not None and self.layerwise:
            raise ValueError("conversations (turns) run on the whole graphs: set generate_config.layerwise false")
        lengths = np.array([len(p) for p in prompts], np.int64)
        if len(prompts) == 0 or (lengths == 0).any():
            raise ValueError("empty prompt" if len(prompts) else "no prompts")
        limit = np.full(len(prompts), params.max_tokens, np.int64) if max_tokens is None \
            else np.asarray(max_tokens, np.int64)
        if limit.shape != (len(prompts),) or (limit < 1).any():
            raise ValueError(f"max_tokens must give one value >= 1 per prompt, got {list(limit)}")
        too_long = np.flatnonzero(lengths + limit > self.max_positions)
        if too_long.size:
            i = int(too_long[0])
            raise ValueError(f"a prompt of {lengths[i]} tokens + max_tokens {limit[i]} = {lengths[i] + limit[i]} "
                             f"positions, more than the model's {self.max_positions}")
        keys = np.arange(len(prompts)) if prompt_index is None else np.asarray(prompt_index, np.int64)
        appended = np.full(len(prompts), appended_positions(turns), np.int64)
        if carried is not None:  # what a carried conversation has left of its turns (the rest is in its prompt)
            appended = np.array([max(turns.max_turns - c.turns, 0) * turns.max_turn_tokens for c in carried],
                                np.int64)
        cache = self._ensure_cache(min(int((lengths + limit - 1 + appended).max()), self.max_positions - 1))
        call = _Call(prompts, params, limit, keys, cache.slots, self.lm.config.vocab_size, return_logits, turns,
                     carried)
        # prefill and copy move this call's prompts (without their last token) in one length bucket
        prefix = int(lengths.max()) - 1
        p_len = pow2_bucket(prefix, PROMPT_STEP, cache.capacity)

        t0 = time.perf_counter()
        self.model.weights.refresh()  # the model's weights may have changed since the last call
        while True:
            t1 = time.perf_counter()
            adm = call.sched.admit()
            if adm.prefill_prompts and prefix > 0:  # one-token prompts: decode writes their only position
                step = self.prefill_batch(len(adm.prefill_prompts), cache.slots, p_len)
                for i in range(0, len(adm.prefill_prompts), step):
                    self._prefill(cache, [prompts[p] for p in adm.prefill_prompts[i:i + step]],
                                  adm.prefill_slots[i:i + step], p_len)
            if adm.copy_src and prefix > 0:
                self._copy(cache, adm.copy_src, adm.copy_dst, p_len)
            call.start(adm)
            if turns is not None:
                self._append(cache, call, turns.poll(False))
                while min_groups is not None and call.waiting():  # where the call stops: not the tools' timing
                    self._append(cache, call, self._poll(turns, call))
            t2 = time.perf_counter()
            call.stats["prefill_seconds"] += t2 - t1
            live = call.sched.live()
            if live.size == 0:
                if not call.sched.parked.any():
                    break
                self._append(cache, call, turns.poll(True))  # every sample waits for a tool
                call.stats["waiting_seconds"] += time.perf_counter() - t2
                continue
            self._decode(cache, call, live, params)
            call.stats["decode_seconds"] += time.perf_counter() - t2
            if min_groups is not None and call.complete_groups() >= min_groups:
                if turns is not None:
                    self._drain(call, turns, cache.capacity)
                break
        elapsed = time.perf_counter() - t0

        self.last_logits = [np.stack(rows) for rows in call.logits] if return_logits else None
        self.last_stats = call.summary(elapsed, cache, self.compiled_graphs)
        if call.first_cut is not None and not self.turns_cut_logged:
            self.turns_cut_logged = True
            logger.warning("a conversation's turn of %d tokens did not fit (%s): its sample ended, finish_reason "
                           "\"length\"; this and every later one counted in turns/cut", *call.first_cut)
        return call.completions(self.version)

    def prefill_batch(self, n: int, slots: int, p_len: int) -> int:
        """Prompts of length bucket p_len per prefill call, n admitted at once: all n without max_prefill_tokens,
        else the largest prefill batch bucket whose positions fit in it (at least one prompt): every call but
        the last fills that bucket, and each call's bucket is one of those `graph_bound` counts."""
        if self.max_prefill_tokens is None:
            return n
        fits = [b for b in halving_buckets(slots, 1) if b * p_len <= self.max_prefill_tokens]
        return min(n, max(fits, default=1))

    def _decode(self, cache: KVCache, call: "_Call", live: np.ndarray, params: SamplingParams) -> None:
        """One decode step of the live slots: the smallest batch and length buckets that hold them."""
        slots, capacity = cache.slots, cache.capacity
        b = halving_bucket(live.size, slots, MIN_BATCH)
        length = halving_bucket(int(call.position[live].max()) + 1, capacity, LENGTH_STEP)
        # every slot and every position: read the cache in place (not worth a trash row below 8 slots)
        whole = b == slots >= MIN_BATCH and length == capacity
        if whole:  # the rows are the slots in order (the graphs read the trash slot's cache as it lies); free
            rows, mine = np.arange(slots), live  # slots idle at position 0
        else:  # the live slots, then the trash slot for padding
            rows, mine = np.concatenate([live, np.full(b - live.size, slots, np.int64)]), np.arange(live.size)
        u = np.zeros(rows.size, np.float32)
        if not params.greedy:
            u[mine] = call.uniforms(live)
        inputs = (Tensor(call.token[rows].astype(np.int32)), Tensor(call.position[rows].astype(np.int32)),
                  Tensor(rows.astype(np.int32)))
        sampling = (Tensor(u), Tensor(call.temperature[:rows.size]))
        if self.layerwise:
            out, logits = self._decode_layerwise(cache, inputs, sampling, length, whole, params)
        else:
            graph = self._graph(("decode", rows.size, length, params.graph_key()), lambda: DecodeGraph(
                self.model, cache, Sampler(params, self.lm.config.vocab_size), length, whole))
            out, logits = graph(*inputs, *sampling)
        res = out.asnumpy()[mine]  # (live, 3) host sync: the stop check needs the tokens
        call.record(live, res, logits.asnumpy()[mine] if call.logits else None)
        heartbeat.beat(live.size)  # a decode step (its collectives, under tensor parallelism) came back: a token a row
        call.stats["decode_steps"] += 1
        call.stats["rows_computed"] += rows.size

    def _decode_layerwise(self, cache: KVCache, inputs: tuple, sampling: tuple, length: int, whole: bool,
                          params: SamplingParams):
        """A decode step as DecodeInputs, a DecodeLayers graph called for every group of layers, DecodeHead:
        what the DecodeGraph of the same shape computes (the same ops), holding one group's buffers."""
        b = inputs[0].shape[0]
        first = self._graph(("decode_inputs", b, length), lambda: DecodeInputs(self.model, cache, length))
        head = self._graph(("decode_head", b, params.graph_key()),
                           lambda: DecodeHead(self.model, Sampler(params, self.lm.config.vocab_size)))
        x, cos, sin, write, read, bias = first(*inputs)
        for k, ws, kvs in self._groups:
            layers = self._graph(("decode_layers", b, length, whole, k), lambda: DecodeLayers(self.model, whole, k))
            x = layers(x, cos, sin, write, read, bias, ws, kvs)
        return head(x, *sampling)

    def _decode_groups(self, cache: KVCache) -> list:
        """(k, the k layers' weights, their caches) for each group of decode_layers_per_graph consecutive
        layers (the last group the rest), as mutable tuples of the layers' own."""
        step, n = self.decode_layers_per_graph, self.model.n_layers
        return [(min(step, n - i), ms.mutable(tuple(self.model.layer_inputs[i:i + step])),
                 ms.mutable(tuple(cache.layer_caches[i:i + step]))) for i in range(0, n, step)]

    def _prefill(self, cache: KVCache, prompts: List[Sequence[int]], homes: List[int], p_len: int) -> None:
        """Every prompt but its last token into its home slot, one graph call (padding prompts
        write to the trash slot)."""
        n = len(prompts)
        bp = halving_bucket(n, cache.slots, 1)
        ids = np.full((bp, p_len), self.pad, np.int32)
        for i, p in enumerate(prompts):
            ids[i, :len(p) - 1] = p[:-1]
        slot = np.full(bp, cache.slots, np.int32)  # the trash slot
        slot[:n] = homes
        if not self.layerwise:
            graph = self._graph(("prefill", bp, p_len), lambda: PrefillGraph(self.model, cache))
            graph(Tensor(ids), Tensor(slot)).asnumpy()
            return
        first = self._graph(("prefill_inputs", bp, p_len), lambda: PrefillInputs(self.model, cache))
        x, cos, sin, rows, bias = first(Tensor(ids), Tensor(slot))
        for i, (w, kv) in enumerate(zip(self.model.layer_inputs, cache.layer_caches)):
            last = i + 1 == self.model.n_layers
            layer = self._graph(("prefill_layer", bp, p_len, last), lambda: PrefillLayer(self.model, last))
            x = layer(x, cos, sin, rows, bias, w, kv)
        x.asnumpy()

    def _append(self, cache: KVCache, call: "_Call", ready: List[Tuple[int, List[int]]]) -> None:
        """Each ready turn into its parked slot's cache at the slot's position, in one graph call of the smallest
        batch and turn-length buckets (no prefill of the history); the slots then decode on."""
        rows = [row for row in (call.accept_turn(r, ids, cache.capacity) for r, ids in ready) if row is not None]
        if not rows:
            return
        t0 = time.perf_counter()
        n = len(rows)
        ba = halving_bucket(n, cache.slots, 1)
        t = pow2_bucket(max(len(w) for _, _, w in rows), PROMPT_STEP, cache.capacity)
        ids = np.full((ba, t), self.pad, np.int32)
        slot = np.full(ba, cache.slots, np.int32)  # padding rows: the trash slot, nothing written
        start, count = np.zeros(ba, np.int32), np.zeros(ba, np.int32)
        for i, (s, pos, written) in enumerate(rows):
            ids[i, :len(written)], slot[i], start[i], count[i] = written, s, pos, len(written)
        graph = self._graph(("append", ba, t), lambda: AppendGraph(self.model, cache))
        graph(Tensor(ids), Tensor(slot), Tensor(start), Tensor(count)).asnumpy()
        call.sched.resume(np.array([s for s, _, _ in rows]))
        call.stats["append_seconds"] += time.perf_counter() - t0
        call.stats["append_calls"] += 1

    @staticmethod
    def _drain(call: "_Call", turns: Turns, capacity: int) -> None:
        """A call that stops early (min_groups) with conversations: every parked sample's next turn, once its tools
        (environment) answered, into its trajectory only (the call ends: its cache is not kept); the sample stays
        unfinished (or ends, as in `_append`, when the turn does not fit)."""
        while call.waiting():
            for r, ids in RolloutEngine._poll(turns, call):
                if call.accept_turn(r, ids, capacity) is not None:
                    call.sched.resume(np.flatnonzero(call.sched.request == r))

    @staticmethod
    def _poll(turns: Turns, call: "_Call") -> List[Tuple[int, List[int]]]:
        """The next turns ready, waiting for one (some sample is parked)."""
        ready = turns.poll(True)
        if not ready:
            raise RuntimeError(f"conversations: {len(call.waiting())} parked sample(s) wait for a turn that never came")
        return ready

    def _copy(self, cache: KVCache, src: List[int], dst: List[int], p_len: int) -> None:
        """Cache positions [0, p_len) of each src slot to its dst slot, one graph call; padding
        repeats the last pair (the same rows written again)."""
        n = len(src)
        nb = halving_bucket(n, cache.slots, MIN_BATCH)
        s = np.array(src + [src[-1]] * (nb - n), np.int32)
        d = np.array(dst + [dst[-1]] * (nb - n), np.int32)
        graph = self._graph(("copy", nb, p_len), lambda: CopyGraph(self.model, cache, p_len))
        graph(Tensor(s), Tensor(d)).asnumpy()


class _Call:
    """The host side of one generate call: each slot's next input (O(S) arrays, the trash slot
    last), each request's outputs, the counters of the call."""

    def __init__(self, prompts, params: SamplingParams, limit: np.ndarray, keys: np.ndarray, slots: int,
                 vocab: int, return_logits: bool, turns: Optional[Turns] = None,
                 carried: Optional[Sequence[Carried]] = None):
        self.params, self.limit, self.keys, self.turns = params, limit, keys, turns
        # per prompt: the turns a carried conversation had before this call, the ids of its model turn so far
        self.turns_before = np.array([c.turns for c in carried] if carried else [0] * len(prompts), np.int64)
        self.turn_prefix = [list(c.turn_ids) for c in carried] if carried else None
        self.group = params.n
        self.lengths = np.array([len(p) for p in prompts], np.int64)
        self.last_token = np.array([p[-1] for p in prompts], np.int64)
        self.stop = np.zeros(vocab, bool)
        self.stop[[t for t in params.stop_token_ids if 0 <= t < vocab]] = True
        self.sched = SlotScheduler(len(prompts), params.n, slots)
        self.temperature = np.full(slots + 1, params.temperature, np.float32)  # per row; 0: greedy
        self.token = np.zeros(slots + 1, np.int64)  # per slot: the next input token
        self.position = np.zeros(slots + 1, np.int64)  # its position
        self.count = np.zeros(slots + 1, np.int64)  # tokens generated by the slot's request so far
        n_req, width = len(prompts) * params.n, int(limit.max()) + appended_positions(turns)
        self.out_tok = np.zeros((n_req, width), np.int64)
        self.out_scaled = np.zeros((n_req, width), np.float32)
        self.out_sampled = np.zeros((n_req, width), np.float32)
        self.n_out = np.zeros(n_req, np.int64)
        self.tpos = np.zeros(n_req, np.int64)  # each request's trajectory length so far (all turns)
        self.turn_start = np.zeros(n_req, np.int64)  # where its current model turn began
        self.n_turns = np.zeros(n_req, np.int64)  # turns appended
        self.out_model = np.zeros((n_req, width), bool) if turns is not None else None
        self.stopped = np.zeros(n_req, bool)
        self.finished = np.zeros(n_req, bool)  # the sample ended (a stop id, max_tokens, or its turn did not fit)
        self.logits: List[List[np.ndarray]] = [[] for _ in range(n_req)] if return_logits else []
        self.stats = {"prefill_seconds": 0.0, "decode_seconds": 0.0, "decode_steps": 0, "rows_computed": 0,
                      "prefilled_prompts": 0, "copied_slots": 0, "append_seconds": 0.0, "append_calls": 0,
                      "waiting_seconds": 0.0, "appended_tokens": 0, "turns_cut": 0}
        self.first_cut: Optional[Tuple[int, str]] = None  # the first turn that did not fit: its length, why

    def start(self, adm) -> None:
        """The slots that begin a sample: at its prompt's last token."""
        self.stats["prefilled_prompts"] += len(adm.prefill_prompts)
        self.stats["copied_slots"] += len(adm.copy_dst)
        if adm.started:
            s = np.asarray(adm.started)
            p = self.sched.request[s] // self.group
            self.token[s], self.position[s], self.count[s] = self.last_token[p], self.lengths[p] - 1, 0

    def uniforms(self, live: np.ndarray) -> np.ndarray:
        req = self.sched.request[live]
        return uniforms(self.params.seed, self.keys[req // self.group], req % self.group, self.count[live])

    def record(self, live: np.ndarray, res: np.ndarray, logits: Optional[np.ndarray]) -> None:
        """res (live, 3): each live slot's new token and its two log-probs; ends finished samples, parks those
        whose turn ends and that another turn follows (conversations)."""
        req = self.sched.request[live]
        new = res[:, 0].astype(np.int64)
        c = self.count[live]
        t = self.tpos[req]
        self.out_tok[req, t], self.out_sampled[req, t], self.out_scaled[req, t] = new, res[:, 1], res[:, 2]
        if self.out_model is not None:
            self.out_model[req, t] = True
        if logits is not None:
            for r, row in zip(req, logits):
                self.logits[r].append(row)
        self.count[live] += 1
        self.tpos[req] += 1
        self.position[live] += 1
        self.token[live] = new
        hit = self.stop[new] if not self.params.ignore_stop else np.zeros(live.size, bool)
        done = hit | (self.count[live] >= self.limit[req // self.group])
        if self.turns is not None:
            parked = [k for k in np.flatnonzero(hit & (c + 1 < self.limit[req // self.group]))
                      if self.n_turns[req[k]] + self.turns_before[req[k] // self.group] < self.turns.max_turns
                      and self.turns.end_turn(int(req[k]), int(self.keys[req[k] // self.group]),
                                              self.turn_ids(int(req[k])))]
            done[parked] = False
            self.sched.park(live[parked])
        self.stopped[req[done]] = hit[done]
        self.finished[req[done]] = True
        self.n_out[req[done]] = self.tpos[req[done]]
        self.position[live[done]] = self.token[live[done]] = 0  # a free slot idles at position 0
        self.sched.finish(live[done])

    def turn_ids(self, r: int) -> List[int]:
        """Request r's model turn that just ended: from its start, in an earlier call too (a carried conversation)."""
        ids = self.out_tok[r, self.turn_start[r]:self.tpos[r]].tolist()
        if self.turn_prefix is not None and self.n_turns[r] == 0:
            ids = self.turn_prefix[r // self.group] + ids
        return ids

    def accept_turn(self, r: int, ids: List[int], capacity: int):
        """Request r's next turn `ids`: (its slot, the first position, the ids to write there) for the append
        (its pending stop token and ids[:-1]; ids[-1] is its next decode input), or None when the turn does not
        fit (over max_turn_tokens, or no room left in the slot): the sample then ends ("length"), counted in
        stats["turns_cut"]."""
        slot = int(np.flatnonzero(self.sched.request == r)[0])
        start = int(self.position[slot])
        left = int(self.limit[r // self.group] - self.count[slot])  # the model's own tokens still allowed
        why = self._misfit(r, len(ids), capacity - start - left, left)
        if why is not None:
            self.stats["turns_cut"] += 1
            self.first_cut = self.first_cut or (len(ids), why)
            self.n_out[r] = self.tpos[r]
            self.finished[r] = True
            self.position[slot] = self.token[slot] = 0
            self.sched.finish(np.array([slot]))  # parked until the next admit frees or hands it over
            return None
        written = [int(self.token[slot])] + [int(i) for i in ids[:-1]]
        t = int(self.tpos[r])
        self.out_tok[r, t:t + len(ids)] = ids  # the tool turn: context, not the model's (mask False, log-probs 0)
        self.tpos[r] += len(ids)
        self.turn_start[r] = self.tpos[r]
        self.n_turns[r] += 1
        self.token[slot], self.position[slot] = int(ids[-1]), start + len(ids)
        self.stats["appended_tokens"] += len(ids)
        return slot, start, written

    def _misfit(self, r: int, n: int, slot_room: int, left: int) -> Optional[str]:
        """Why request r's next turn of n ids does not fit, or None. slot_room: the positions its slot has left once
        the model's own tokens still allowed (`left`) are set aside."""
        if n == 0:
            return "an empty turn"
        if n > self.turns.max_turn_tokens:
            return f"over max_turn_tokens {self.turns.max_turn_tokens}"
        if n > slot_room:
            return f"{slot_room} positions left in its slot"
        row_room = self.out_tok.shape[1] - int(self.tpos[r]) - left
        if n > row_room:
            return f"{row_room} positions left in its row"
        return None

    def waiting(self) -> List[int]:
        """The requests parked for their next turn (not ended)."""
        parked = self.sched.request[np.flatnonzero(self.sched.parked)]
        return [int(r) for r in parked if r >= 0 and not self.finished[r]]

    def complete_groups(self) -> int:
        """Prompts whose samples have all finished."""
        return int(self.finished.reshape(-1, self.group).all(axis=1).sum())

    def completions(self, version: int) -> List[Completion]:
        ends = np.where(self.finished, self.n_out, self.tpos)  # an unfinished sample: the tokens it has
        reasons = np.where(self.finished, np.where(self.stopped, "stop", "length"), "partial")
        return [Completion(r // self.group, self.out_tok[r, :n].tolist(), str(reasons[r]),
                           self.out_scaled[r, :n].copy(), self.out_sampled[r, :n].copy(),
                           None if self.out_model is None else self.out_model[r, :n].copy(), int(self.n_turns[r]),
                           np.full(n, version, np.int64))
                for r, n in enumerate(ends)]

    def summary(self, seconds: float, cache: KVCache, compiled: int) -> dict:
        new_tokens = int(np.where(self.finished, self.n_out, self.tpos).sum()) - self.stats["appended_tokens"]
        s = self.stats
        return {"rows": self.n_out.size, "new_tokens": new_tokens, "seconds": seconds,
                "prefill_seconds": s["prefill_seconds"], "decode_seconds": s["decode_seconds"],
                "decode_steps": s["decode_steps"], "prefilled_prompts": s["prefilled_prompts"],
                "copied_slots": s["copied_slots"],
                # generated tokens / rows the decode graphs computed, over the steps run
                "useful_fraction": new_tokens / max(s["rows_computed"], 1),
                "slots": cache.slots, "slots_in_use": new_tokens / max(s["decode_steps"], 1),
                "capacity": cache.capacity, "kv_bytes": cache.nbytes, "compiled_graphs": compiled,
                "tokens_per_s": new_tokens / max(seconds, 1e-9), "turns": int(self.n_turns.sum()),
                "appended_tokens": s["appended_tokens"], "append_seconds": s["append_seconds"],
                "append_calls": s["append_calls"], "waiting_seconds": s["waiting_seconds"],
                "turns_cut": s["turns_cut"]}

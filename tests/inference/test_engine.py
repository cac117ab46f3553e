"""RolloutEngine on a tiny random model: tokens that do not depend on the slots (refill and
compaction exercised), stops and per-prompt max_tokens, log-probs against the training graph,
one prefill per prompt, a bounded set of compiled shapes, the KV-cache budget."""

import numpy as np
import pytest
import mindspore as ms

from mindgrpo.config import GenerateConfig
from mindgrpo.grpo.experience import pack
from mindgrpo.inference.engine import RolloutEngine, graph_bound
from mindgrpo.inference.sampling import SamplingParams
from mindgrpo.memory.plan import kv_cache_bytes
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.qwen2 import Qwen2ForCausalLM
from mindgrpo.models.scoring import SequenceLogits, TokenLogProbs
from mindgrpo.parallel.layout import ParallelLayout

CFG = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  param_init_std=0.3)
PROMPTS = [[3, 4, 5], [7], [9, 10, 11, 12, 13, 14], [20, 21], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40]]
# refill with one prompt's samples split over slots; refill with the cache read in place (8 slots
# all live, every position: the whole-cache decode graph); all at once
SLOTS = (2, 8, 64)


@pytest.fixture(scope="module")
def lm():
    return Qwen2ForCausalLM(CFG, seed=1)


@pytest.fixture(scope="module")
def engines(lm):
    return {s: RolloutEngine(lm, pad_token_id=0, max_num_seqs=s) for s in SLOTS}


def tokens(out):
    return [c.token_ids for c in out]


def reforward(lm, prompts, responses):
    """Logits (B, S, V) of every prompt + response, right-padded into one batch, by the training
    graph's full forward (no KV cache)."""
    seqs = [p + r for p, r in zip(prompts, responses)]
    ids = np.zeros((len(seqs), max(len(q) for q in seqs)), np.int32)
    mask = np.zeros_like(ids)
    for i, q in enumerate(seqs):
        ids[i, :len(q)], mask[i, :len(q)] = q, 1
    return SequenceLogits(lm)(ms.Tensor(ids), ms.Tensor(mask)).asnumpy()


@pytest.mark.slow  # issue 18: over 30 s under -n 2 at load 6 (the -m "not slow" loop of 2026-11-26)
def test_sampled_tokens_and_logprobs_do_not_depend_on_the_slots(engines):
    p = SamplingParams(max_tokens=12, temperature=1.0, n=3, seed=5, stop_token_ids=(6, 17))
    runs = {s: engines[s].generate(PROMPTS, p) for s in SLOTS}
    for s in SLOTS[:-1]:
        assert tokens(runs[s]) == tokens(runs[SLOTS[-1]]), s
        for a, b in zip(runs[s], runs[SLOTS[-1]]):
            np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=0, atol=1e-5)
            np.testing.assert_allclose(a.sampling_logprobs, b.sampling_logprobs, rtol=0, atol=1e-5)
    assert {c.finish_reason for c in runs[2]} == {"stop", "length"}  # the stops cut some samples short
    assert engines[8]._graphs[("decode", 8, 32, p.graph_key())].whole  # all 8 slots: the cache read in place
    stats = engines[2].last_stats
    assert stats["slots"] == 2 and stats["prefilled_prompts"] == len(PROMPTS)
    # 15 samples through 2 slots: refill, and slots handed from sample to sample of a prompt
    assert stats["decode_steps"] >= stats["new_tokens"] / 2 and stats["copied_slots"] < 15 - len(PROMPTS)


def test_seeded_sampling_is_reproducible_and_seed_dependent(engines):
    e = engines[8]
    p = SamplingParams(max_tokens=12, temperature=1.0, seed=5)
    a, b = tokens(e.generate(PROMPTS, p)), tokens(e.generate(PROMPTS, p))
    c = tokens(e.generate(PROMPTS, SamplingParams(max_tokens=12, temperature=1.0, seed=6)))
    assert a == b and a != c


def test_n_samples_are_adjacent_and_differ(engines):
    out = engines[8].generate(PROMPTS[:3], SamplingParams(max_tokens=10, temperature=1.0, n=3, seed=0))
    assert [c.prompt_index for c in out] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert len({tuple(c.token_ids) for c in out[:3]}) > 1


def test_stop_ids_and_per_prompt_max_tokens_end_each_sample(engines):
    e = engines[2]
    free = e.generate(PROMPTS, SamplingParams(max_tokens=16, temperature=1.0, n=2, seed=3))
    stops = (free[0].token_ids[4], free[4].token_ids[6])  # ids the unconstrained run produced mid-way
    limits = [16, 3, 9, 16, 1]
    out = e.generate(PROMPTS, SamplingParams(max_tokens=16, temperature=1.0, n=2, seed=3, stop_token_ids=stops),
                     max_tokens=limits)
    for f, c in zip(free, out):
        hits = [i for i, t in enumerate(f.token_ids) if t in stops]
        limit = limits[c.prompt_index]
        if hits and hits[0] < limit:
            assert c.token_ids == f.token_ids[:hits[0] + 1] and c.finish_reason == "stop"
        else:
            assert c.token_ids == f.token_ids[:limit] and c.finish_reason == "length"
    forced = e.generate(PROMPTS, SamplingParams(max_tokens=16, temperature=1.0, n=2, seed=3, stop_token_ids=stops,
                                                ignore_stop=True))
    assert tokens(forced) == tokens(free)


@pytest.mark.parametrize("slots", [2, 8])
def test_decode_logits_and_logprobs_equal_the_training_graph(lm, engines, slots):
    """Through refill and slot hand-over (2 slots; 8 read in place): each token's logits equal a full re-forward of
    its sequence, and its log-prob under softmax(logits / T) equals the training graph's (T = 0.7).
    d = 8: 1/sqrt(d) is not a power of two, so folding it into the fused wq rounds differently
    from the training graph's scaling of the scores."""
    e = engines[slots]
    out = e.generate(PROMPTS, SamplingParams(max_tokens=12, temperature=0.7, n=3, seed=2), return_logits=True)
    ref = reforward(lm, [PROMPTS[c.prompt_index] for c in out], tokens(out))
    for r, c in enumerate(out):
        p = PROMPTS[c.prompt_index]
        # fp32 rounding of two summation orders on logits up to ~5 in size: a few 1e-6, at most 2e-5
        np.testing.assert_allclose(e.last_logits[r], ref[r, len(p) - 1:len(p) - 1 + len(c.token_ids)], atol=2e-5,
                                   rtol=0)
    exp = pack([PROMPTS[c.prompt_index] for c in out], tokens(out), np.zeros(len(out), np.float32),
               rollout_logp=[c.logprobs for c in out], sampling_logp=[c.sampling_logprobs for c in out])
    logp, _ = TokenLogProbs(lm, with_entropy=False, temperature=0.7)(
        ms.Tensor(exp.input_ids), ms.Tensor(exp.score_pos), ms.Tensor(exp.labels))
    assert np.abs((logp.asnumpy() - exp.rollout_logp) * exp.mask).max() <= 1e-4
    # no filter: the sampled distribution is softmax(logits / T) itself
    assert np.abs((exp.sampling_logp - exp.rollout_logp) * exp.mask).max() <= 1e-5
    assert exp.mask.sum() == sum(len(c.token_ids) for c in out) and (exp.rollout_logp * exp.mask).sum() < -10


def test_greedy_is_the_same_for_every_slot_count_and_its_sampled_logprob_is_zero(engines):
    greedy = SamplingParams(max_tokens=8, temperature=0.0)
    out = [engines[s].generate(PROMPTS, greedy) for s in SLOTS]
    assert tokens(out[0]) == tokens(out[1]) == tokens(out[2])
    assert all((c.sampling_logprobs == 0).all() and (c.logprobs < 0).all() for c in out[0])


@pytest.mark.slow  # issue 18: over 30 s under -n 2 at load 6 (the -m "not slow" loop of 2026-11-26)
def test_the_kv_budget_sets_the_slots_and_graphs_compile_once_per_shape_within_the_bound(lm):
    gen = GenerateConfig(max_prompt_length=48, max_tokens=16, max_num_seqs=8, max_num_batched_tokens=200)
    e = RolloutEngine(lm, max_num_seqs=gen.max_num_seqs, max_num_batched_tokens=gen.max_num_batched_tokens,
                      max_model_len=gen.max_prompt_length + gen.max_tokens)
    p = SamplingParams(max_tokens=16, temperature=1.0, n=2, seed=4, stop_token_ids=(6, 17, 40))
    out = e.generate(PROMPTS, p)
    assert len(out) == 10
    assert e.last_stats["slots"] == 200 // 64 == 3  # each slot holds 48 + 16 positions
    # k and v, 2 layers, 3 slots + the trash slot, 2 kv heads, 64 positions, d 8, fp32
    assert e.cache_bytes() == 2 * 2 * 4 * 2 * 64 * 8 * 4 == kv_cache_bytes(CFG, gen, ParallelLayout())
    first = e.compiled_graphs
    e.generate(PROMPTS[::-1], p)
    e.generate(PROMPTS, p)
    assert e.compiled_graphs == first  # the same shapes again: nothing new to compile
    # the engine's bound for 3 slots of 64 positions: decode 1 batch bucket (3 < 8) x 2 length buckets
    # (64, 32); prefill 3 batch buckets (3, 2, 1) and copy 1 (3) per prompt-length bucket; prompts of up
    # to 48 tokens fall in 3 of those (16, 32, 64), these short ones in one (16)
    bound = graph_bound(3, 64, gen.max_prompt_length)
    assert bound == {"decode": 2, "prefill_per_prompt_bucket": 3, "copy_per_prompt_bucket": 1, "prompt_buckets": 3}
    assert first <= 2 + 3 + 1
    assert {k[0] for k in e._graphs} == {"decode", "prefill", "copy"}
    assert {k[1] for k in e._graphs if k[0] == "decode"} == {3}  # fewer than 8 slots: one batch bucket
    assert {k[2] for k in e._graphs if k[0] == "decode"} <= {32, 64}
    with pytest.raises(ValueError, match="max_model_len allows 64"):
        e.generate([[1] * 60], SamplingParams(max_tokens=8))
    with pytest.raises(ValueError, match="cannot hold one sequence of 46 tokens"):
        RolloutEngine(lm, max_num_batched_tokens=45, max_model_len=46)


def test_useful_fraction_counts_the_rows_each_step_computes(engines):
    p = SamplingParams(max_tokens=7, temperature=1.0, n=2, seed=0, ignore_stop=True)
    engines[2].generate(PROMPTS[:3], p)
    s = engines[2].last_stats  # 6 samples of 7 tokens through 2 slots: 21 full steps
    assert (s["new_tokens"], s["decode_steps"], s["useful_fraction"], s["slots_in_use"]) == (42, 21, 1.0, 2.0)
    engines[64].generate(PROMPTS[:3], p)
    assert engines[64].last_stats["useful_fraction"] == 42 / (7 * 8)  # 6 rows in the smallest batch bucket, 8


def test_rejects_empty_prompts(engines):
    for bad in ([[]], []):
        with pytest.raises(ValueError):
            engines[8].generate(bad, SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="one value >= 1 per prompt"):
        engines[8].generate(PROMPTS, SamplingParams(max_tokens=2), max_tokens=[2, 2])


def greedy_by_reforward(lm, prompts, steps):
    """Greedy tokens by re-running the training graph's full forward each step (one padded shape)."""
    seqs = [list(p) for p in prompts]
    width = max(len(p) for p in prompts) + steps
    logits = SequenceLogits(lm)
    for _ in range(steps):
        ids = np.zeros((len(seqs), width), np.int32)
        mask = np.zeros_like(ids)
        for i, q in enumerate(seqs):
            ids[i, :len(q)], mask[i, :len(q)] = q, 1
        out = logits(ms.Tensor(ids), ms.Tensor(mask)).asnumpy()
        for i, q in enumerate(seqs):
            q.append(int(out[i, len(q) - 1].argmax()))
    return [q[len(p):] for p, q in zip(prompts, seqs)]


def test_generate_sees_updated_weights(lm, engines):
    """The engine's fused weight copies are remade from the model's parameters at every call."""
    from mindgrpo.models.checkpoint import load_state, model_state

    e, p = engines[8], SamplingParams(max_tokens=10, temperature=0.0)
    before = tokens(e.generate(PROMPTS, p))
    saved = model_state(lm)
    try:
        load_state(lm, model_state(Qwen2ForCausalLM(CFG, seed=2)))
        after = tokens(e.generate(PROMPTS, p))
        assert after == greedy_by_reforward(lm, PROMPTS, 10)
    finally:
        load_state(lm, saved)
    assert after != before
    assert tokens(e.generate(PROMPTS, p)) == before


@pytest.mark.slow  # issue 18: over 30 s under -n 2 at load 6 (the -m "not slow" loop of 2026-11-26)
def test_the_limit_is_the_models_context_not_the_cache_bucket(lm):
    # 40 positions (the weights of lm): a 30-token prompt + 10 new tokens fits, though capacities
    # round up to 32-position steps (the slot holds 40)
    short = RolloutEngine(Qwen2ForCausalLM(CFG, seed=1, max_positions=40), max_num_seqs=1)
    assert short.max_positions == 40
    p = SamplingParams(max_tokens=10, temperature=0.0)
    prompt = [[(7 * i) % 60 + 1 for i in range(30)]]
    assert tokens(short.generate(prompt, p)) == greedy_by_reforward(lm, prompt, 10)
    assert short.last_stats["capacity"] == 40
    with pytest.raises(ValueError, match=r"a prompt of 31 tokens \+ max_tokens 10 = 41 positions, more than the "
                                         r"model's 40"):
        short.generate([[5] * 31], p)


@pytest.mark.slow  # issue 18: over 30 s under -n 2 at load 6 (the -m "not slow" loop of 2026-11-26)
def test_release_empties_the_cache_drops_the_prefill_graphs_and_the_next_call_compiles_them_again(engines):
    """rl_config.release_graphs: the KV cache and the fused layer copies shrink to one element with release(), the
    prefill and copy graphs and the copies' refresh go (the runtime frees a graph's buffers only with its cell),
    the decode graphs stay; the next call, on the cache and copies made again and the prefill graphs compiled
    again, draws the same samples (log-probs within rounding).
    Last in this file: the tests before it share the engine's compiled graphs."""
    from mindgrpo.inference.engine import KEPT_GRAPHS

    e = engines[8]
    p = SamplingParams(max_tokens=12, temperature=1.0, seed=5)  # test_seeded_sampling's call: compiled
    before = e.generate(PROMPTS, p)
    compiled, refresh, cache = e.compiled_graphs, e.model.weights._refresh, e.cache
    decode = {k: g for k, g in e._graphs.items() if k[0] == "decode"}
    shapes = [p.shape for p in e.model.weights.buffers]
    assert decode and any(k[0] == "prefill" for k in e._graphs)
    e.release()
    assert e.model.weights._refresh is not refresh and {k[0] for k in e._graphs} <= set(KEPT_GRAPHS)
    assert all(e._graphs[k] is g for k, g in decode.items())
    # the fused layer copies and the cache shrink (one element each), and the next call makes them again
    assert all(int(np.prod(b.shape)) == 1 for b in e.model.weights.buffers) and max(map(np.prod, shapes)) > 1
    assert e.cache is cache and all(int(np.prod(k.shape)) == 1 for k in (*cache.k, *cache.v))
    after = e.generate(PROMPTS, p)
    assert e.compiled_graphs > compiled and e.cache is cache and cache.k[0].shape == cache.shape
    assert all(e._graphs[k] is g for k, g in decode.items())  # not compiled again
    assert [b.shape for b in e.model.weights.buffers] == shapes
    assert tokens(after) == tokens(before)
    for a, b in zip(after, before):  # bit for bit alone; within 1.5e-6 after this file's other calls
        np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=0, atol=1e-5)
        np.testing.assert_allclose(a.sampling_logprobs, b.sampling_logprobs, rtol=0, atol=1e-5)


def test_a_prefill_budget_splits_the_admitted_prompts_into_bucket_sized_calls(lm, engines):
    """generate_config.max_prefill_tokens: 5 prompts admitted at once (64 slots), their prefixes in the
    16-position bucket; a budget of 32 positions prefills 2 prompts a call (the largest batch bucket that fits),
    so 2 + 2 + 1, and the samples are those of one call for all 5."""
    p = SamplingParams(max_tokens=8, temperature=1.0, n=3, seed=7)
    split = RolloutEngine(lm, pad_token_id=0, max_num_seqs=64, max_prefill_tokens=32)
    calls = []
    prefill = split._prefill
    split._prefill = lambda cache, prompts, homes, p_len: (calls.append((len(prompts), p_len)),
                                                             prefill(cache, prompts, homes, p_len))
    out, whole = split.generate(PROMPTS, p), engines[64].generate(PROMPTS, p)
    assert calls == [(2, 16), (2, 16), (1, 16)]
    assert tokens(out) == tokens(whole)
    for a, b in zip(out, whole):  # not bit for bit: the shared engine's last bits depend on its earlier calls
        np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=0, atol=1e-6)
        np.testing.assert_allclose(a.sampling_logprobs, b.sampling_logprobs, rtol=0, atol=1e-6)
    # a budget below one prompt's bucket still prefills one prompt a call
    assert split.prefill_batch(5, 64, 64) == 1 and split.prefill_batch(5, 64, 16) == 2
    assert RolloutEngine(lm, max_num_seqs=64, max_prefill_tokens=None).prefill_batch(64, 64, 256) == 64
    assert RolloutEngine(lm, max_num_seqs=64).prefill_batch(64, 64, 256) == 16  # 4,096 positions by default
    with pytest.raises(ValueError, match="max_prefill_tokens"):
        RolloutEngine(lm, max_prefill_tokens=0)


@pytest.mark.slow  # two training-graph forwards and a longer prompt bucket: over 30 s under load
def test_a_partial_sample_continued_with_new_weights_is_a_run_that_switches_weights_at_its_token(lm, engines):
    """Partial rollouts (mindgrpo/grpo/partial.py), greedy: a call with min_groups stops once that many prompts are
    done, the others "partial" with the tokens they have; each goes on from its prompt and its tokens under other
    weights, and the whole is what the training graph's forward gives when the weights change at that token."""
    from mindgrpo.grpo.partial import joined
    from mindgrpo.models.checkpoint import load_state, model_state

    e, greedy = engines[8], SamplingParams(max_tokens=10, temperature=0.0)
    saved = model_state(lm)
    try:
        e.version = 4
        first = e.generate(PROMPTS, greedy, max_tokens=[3, 10, 10, 10, 10], min_groups=1)
        assert [c.finish_reason for c in first] == ["length"] + ["partial"] * 4  # prompt 0 ended: the call stops
        assert tokens(first) == greedy_by_reforward(lm, PROMPTS, 3)
        load_state(lm, model_state(Qwen2ForCausalLM(CFG, seed=2)))
        e.version = 5
        carried = [p + c.token_ids for p, c in zip(PROMPTS[1:], first[1:])]
        rest = e.generate(carried, greedy, max_tokens=[7] * 4)
        whole = [joined(a, b) for a, b in zip(first[1:], rest)]
        assert [w.token_ids for w in whole] == [c.token_ids + r for c, r in
                                                zip(first[1:], greedy_by_reforward(lm, carried, 7))]
        assert all(w.versions.tolist() == [4] * 3 + [5] * 7 and w.finish_reason == "length" for w in whole)
        assert all(len(w.logprobs) == len(w.sampling_logprobs) == 10 for w in whole)
        # the new weights changed the continuation: the check can fail
        load_state(lm, saved)
        assert any(w.token_ids != t for w, t in zip(whole, tokens(e.generate(PROMPTS[1:], greedy))))
    finally:
        load_state(lm, saved)
        e.version = 0

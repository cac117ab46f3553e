"""Conversations in the rollout engine: a sample that ends its turn gets the next turn (a tool's answer)
appended to its slot's cache at its own position, and decodes on in the same slot. What it continues with
equals a fresh prefill of the whole conversation (greedy tokens identical, log-probs within 1e-5), through
refill and hand-over (2 slots for 10 samples); sampled trajectories do not depend on the slots or on how long
the tools take; tool turns are masked out of the model's tokens."""

import logging

import numpy as np
import pytest

from mindgrpo.inference.engine import RolloutEngine, append_graph_bound
from mindgrpo.inference.sampling import SamplingParams
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.qwen2 import Qwen2ForCausalLM

CFG = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  param_init_std=0.3)
PROMPTS = [[3, 4, 5], [7], [9, 10, 11, 12, 13, 14], [20, 21], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40]]
ANSWERS = [[50, 51, 52], list(range(40, 60)), [8], [60, 61, 62, 63, 1, 2, 3, 4, 5]]  # 3, 20, 1, 9 ids: two buckets


class ScriptedTurns:
    """Every turn end gets an answer from ANSWERS (by prompt and turn), held back for `delay` polls (a tool's
    latency while the other samples decode)."""

    def __init__(self, max_turns, delay=0, max_turn_tokens=24):
        self.max_turns, self.max_turn_tokens, self.delay = max_turns, max_turn_tokens, delay
        self.turn = {}
        self.waiting = []  # [request, ids, polls left]
        self.ended = []

    def end_turn(self, request, prompt, turn_ids):
        k = self.turn.get(request, 0)
        self.turn[request] = k + 1
        self.ended.append((request, list(turn_ids)))
        self.waiting.append([request, ANSWERS[(prompt + k) % len(ANSWERS)], self.delay])
        return True

    def poll(self, block):
        ready = [w for w in self.waiting if w[2] <= 0 or block]
        for w in self.waiting:
            w[2] -= 1
        self.waiting = [w for w in self.waiting if w not in ready]
        return [(r, ids) for r, ids, _ in ready]


@pytest.fixture(scope="module")
def lm():
    return Qwen2ForCausalLM(CFG, seed=1)


@pytest.fixture(scope="module")
def engines(lm):
    return {s: RolloutEngine(lm, pad_token_id=0, max_num_seqs=s) for s in (2, 8)}


@pytest.fixture(scope="module")
def stops(engines):
    """Stop ids the greedy model writes early: the third token of each prompt's greedy answer."""
    out = engines[8].generate(PROMPTS, SamplingParams(max_tokens=3, temperature=0.0))
    return tuple(sorted({c.token_ids[2] for c in out}))


def segments(c):
    """(start, end) of each run of the model's own tokens in a trajectory."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], c.model_mask.astype(int), [0]])))
    return list(zip(edges[::2], edges[1::2]))


@pytest.mark.slow  # compiles the append graphs of two turn lengths on top of an engine's (~30 s under load)
def test_continuation_in_the_cache_equals_a_fresh_prefill_of_the_conversation(engines, stops):
    e = engines[2]
    turns = ScriptedTurns(max_turns=2)
    params = SamplingParams(max_tokens=14, temperature=0.0, n=2, stop_token_ids=stops)
    out = e.generate(PROMPTS, params, turns=turns)
    assert e.last_stats["turns"] >= 4 and e.last_stats["slots"] == 2  # 10 samples through 2 slots
    fresh_prompts, fresh_limits, expected = [], [], []
    for c in out:
        mask = c.model_mask
        assert mask.sum() <= 14 and c.turns <= 2 and len(mask) == len(c.token_ids) == len(c.logprobs)
        assert (c.logprobs[~mask] == 0).all() and (c.logprobs[mask] < 0).all()
        runs = segments(c)
        assert len(runs) == c.turns + 1  # model, tool, model, ...: each tool turn between two model turns
        for k, ((_, end), (start, _)) in enumerate(zip(runs, runs[1:])):  # the tool turns, as scripted
            assert c.token_ids[end - 1] in stops and c.token_ids[end:start] == ANSWERS[(c.prompt_index + k) % 4]
        for a, b in runs[1:]:  # every model turn after a tool turn, against the whole history prefilled anew
            fresh_prompts.append(PROMPTS[c.prompt_index] + c.token_ids[:a])
            fresh_limits.append(b - a)
            expected.append((c.token_ids[a:b], c.logprobs[a:b]))
    assert len(expected) >= 4
    fresh = engines[8].generate(fresh_prompts, SamplingParams(max_tokens=14, temperature=0.0, stop_token_ids=stops),
                                max_tokens=fresh_limits)
    for f, (ids, logprobs) in zip(fresh, expected):
        assert f.token_ids == ids
        np.testing.assert_allclose(f.logprobs, logprobs, rtol=0, atol=1e-5)
    # the appends: a batch bucket per call, turn-length buckets 16 and 32 (20 ids), within their bound
    keys = [k for k in e._graphs if k[0] == "append"]
    assert {k[2] for k in keys} == {16, 32} and len(keys) <= append_graph_bound(2, e.cache.capacity, 24)


@pytest.mark.slow  # four calls of two engines
def test_sampled_trajectories_do_not_depend_on_the_slots_or_the_tools_latency(engines, stops):
    params = SamplingParams(max_tokens=14, temperature=1.0, n=2, seed=3, stop_token_ids=stops)
    runs = [engines[s].generate(PROMPTS, params, turns=ScriptedTurns(max_turns=3, delay=d))
            for s, d in ((8, 0), (2, 0), (2, 4), (8, 3))]
    for other in runs[1:]:
        assert [c.token_ids for c in other] == [c.token_ids for c in runs[0]]
        for a, b in zip(other, runs[0]):
            np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=0, atol=1e-5)
            assert (a.model_mask == b.model_mask).all()
    assert sum(c.turns for c in runs[0]) >= 3


@pytest.mark.slow  # ~10 s of CPU or more (pyproject.toml): CI runs it, the quick loop does not
def test_a_turn_that_does_not_fit_ends_the_sample_and_is_counted(engines, stops, caplog):
    e = engines[2]
    e.turns_cut_logged = False  # (the module's engines are shared)
    params = SamplingParams(max_tokens=14, temperature=0.0, stop_token_ids=stops)
    with caplog.at_level(logging.WARNING, logger="mindgrpo.inference.engine"):
        calls = [e.generate(PROMPTS, params, turns=ScriptedTurns(max_turns=2, max_turn_tokens=8)) for _ in range(2)]
        counted = e.last_stats["turns_cut"]
    out = calls[-1]  # the 20- and 9-id answers are over the limit
    for c in out:
        runs = segments(c)
        assert all(start - end <= 8 for (_, end), (start, _) in zip(runs, runs[1:]))  # only the short answers
    cut = [c for c in out if c.finish_reason == "length" and c.token_ids[-1] in stops]  # a turn ended, no answer
    assert cut and all(len(ANSWERS[(c.prompt_index + c.turns) % 4]) > 8 for c in cut)
    assert counted == len(cut)  # each call counts its own
    warned = [r.getMessage() for r in caplog.records if "did not fit" in r.getMessage()]
    assert len(warned) == 1 and "over max_turn_tokens 8" in warned[0] and "turns/cut" in warned[0]  # logged once
    with pytest.raises(ValueError, match="layerwise"):
        RolloutEngine(e.lm, layerwise=True).generate(PROMPTS, SamplingParams(max_tokens=2), turns=ScriptedTurns(2))


# ------------------------------------------------------------------------------------ partial rollouts (issue 46)
class CarriedScript(ScriptedTurns):
    """ScriptedTurns for a continuation call: request k goes on the conversation of prompt keys[k], which had
    done[k] turns (the answers go on from there, as in one call)."""

    def __init__(self, max_turns, keys, done):
        super().__init__(max_turns)
        self.keys, self.turn = keys, dict(enumerate(done))

    def end_turn(self, request, prompt, turn_ids):
        return super().end_turn(request, self.keys[request], turn_ids)


def converse_by_reforward(lm, starts, keys, used, done, limit, stops, max_turns, width=96):
    """Greedy conversations by re-running the training graph's full forward each step (one padded shape), written
    again: from each start (prompt + trajectory so far: `used` model tokens, `done` turns), a model token a step; a
    stop id with turns and tokens left gets the scripted answer of its prompt key and turn. Returns each one's
    (new ids, their model mask)."""
    from mindspore import Tensor
    from mindgrpo.models.scoring import SequenceLogits

    seqs, used, done = [list(s) for s in starts], list(used), list(done)
    new, own = [[] for _ in starts], [[] for _ in starts]
    active = [u < limit for u in used]
    logits = SequenceLogits(lm)
    while any(active):
        ids = np.zeros((len(seqs), width), np.int32)
        mask = np.zeros_like(ids)
        for i, q in enumerate(seqs):
            ids[i, :len(q)], mask[i, :len(q)] = q, 1
        out = logits(Tensor(ids), Tensor(mask)).asnumpy()
        for i, q in enumerate(seqs):
            if not active[i]:
                continue
            token = int(out[i, len(q) - 1].argmax())
            q.append(token), new[i].append(token), own[i].append(True)
            used[i] += 1
            if token in stops and done[i] < max_turns and used[i] < limit:
                answer = ANSWERS[(keys[i] + done[i]) % len(ANSWERS)]
                q.extend(answer), new[i].extend(answer), own[i].extend([False] * len(answer))
                done[i] += 1
            elif token in stops or used[i] >= limit:
                active[i] = False
    return [(n, np.array(o, bool)) for n, o in zip(new, own)]


@pytest.mark.slow  # two engine calls per park point and the training graph's forwards
def test_a_parked_conversation_continued_with_new_weights_is_a_run_that_switches_weights_at_the_park(engines, lm):
    """Partial rollouts with conversations, greedy: a call with min_groups stops at a decode step and waits for the
    turns its parked samples asked for, so an unfinished conversation comes back in the middle of a model turn or
    right after a tool turn; it goes on (prompt + trajectory as its prompt, its turns and its turn under way:
    engine.Carried) under other weights, and the whole is what the training graph's forward gives when the weights
    change there, the tool turns in place, each token stamped with its weights' version."""
    from mindgrpo.grpo.partial import joined
    from mindgrpo.grpo.partial_conversations import turn_under_way
    from mindgrpo.inference.engine import Carried
    from mindgrpo.models.checkpoint import load_state, model_state

    e, limit, max_turns = engines[8], 14, 2
    stops = tuple(range(1, 64, 4))  # a quarter of the ids: the turns end often, under either weights
    params = SamplingParams(max_tokens=limit, temperature=0.0, stop_token_ids=stops)
    saved, other = model_state(lm), model_state(Qwen2ForCausalLM(CFG, seed=2))
    kinds = set()
    try:
        for first_limit in (2, 3):  # the call stops mid-turn (2 tokens), or once the first turns ended (3)
            load_state(lm, saved)
            e.version = 4
            turns = ScriptedTurns(max_turns, delay=2)
            first = e.generate(PROMPTS, params, max_tokens=[first_limit] + [limit] * 4, turns=turns, min_groups=1)
            assert first[0].finish_reason != "partial"
            carried = [k for k, c in enumerate(first) if c.finish_reason == "partial"]
            assert carried
            for k, (ids, own) in zip(range(5), converse_by_reforward(lm, PROMPTS, range(5), [0] * 5, [0] * 5,
                                                                     limit, stops, max_turns)):
                if k in carried:  # so far, the one-weights conversation
                    c = first[k]
                    assert c.token_ids == ids[:len(c.token_ids)] and (c.model_mask == own[:len(c.token_ids)]).all()
                    kinds.add("mid-turn" if turn_under_way(c) else "after a tool turn")
            load_state(lm, other)
            e.version = 5
            before = [first[k] for k in carried]
            again = CarriedScript(max_turns, carried, [c.turns for c in before])
            rest = e.generate([PROMPTS[k] + c.token_ids for k, c in zip(carried, before)], params,
                              max_tokens=[limit - int(c.model_mask.sum()) for c in before], turns=again,
                              carried=[Carried(c.turns, turn_under_way(c)) for c in before])
            whole = [joined(b, r) for b, r in zip(before, rest)]
            expected = converse_by_reforward(lm, [PROMPTS[k] + c.token_ids for k, c in zip(carried, before)],
                                             carried, [int(c.model_mask.sum()) for c in before],
                                             [c.turns for c in before], limit, stops, max_turns)
            for b, r, w, (ids, own) in zip(before, rest, whole, expected):
                assert r.token_ids == ids and (r.model_mask == own).all()
                assert w.versions.tolist() == [4] * len(b.token_ids) + [5] * len(r.token_ids)
                assert w.turns == b.turns + r.turns <= max_turns and int(w.model_mask.sum()) <= limit
                assert len(w.model_mask) == len(w.token_ids) == len(w.logprobs)
                assert (w.logprobs[~w.model_mask] == 0).all() and (w.logprobs[w.model_mask] < 0).all()
            # the model turn under way at the park ended whole: the tools read it from its first token
            firsts = {}
            for request, ids in again.ended:
                firsts.setdefault(request, ids)
            for request, ids in firsts.items():
                if turn_under_way(before[request]):
                    kinds.add("a turn under way ended")
                    assert ids[:len(turn_under_way(before[request]))] == turn_under_way(before[request])
            for b, r, w in zip(before, rest, whole):  # a stop with tokens left and no turn: the carried turns count
                if b.turns and r.token_ids[-1] in stops and w.turns == max_turns and w.model_mask.sum() < limit:
                    kinds.add("turns capped by the carried ones")
            assert any(not w.model_mask.all() for w in whole)  # tool turns in the trajectories
            # the new weights changed the continuation: the check can fail
            load_state(lm, saved)
            e.version = 0
            plain = e.generate([PROMPTS[k] for k in carried], params, turns=ScriptedTurns(max_turns))
            assert any(w.token_ids != p.token_ids for w, p in zip(whole, plain))
        assert kinds == {"mid-turn", "after a tool turn", "a turn under way ended", "turns capped by the carried ones"}
    finally:
        load_state(lm, saved)
        e.version = 0


@pytest.mark.slow  # four calls of two engines
def test_where_a_call_with_conversations_stops_does_not_depend_on_the_tools_latency(engines):
    """min_groups with conversations: every parked sample gets its turn before the next decode step, so the samples
    that come back unfinished, and how far each got, are the same however long the tools take (a run repeats itself;
    a separate placement equals one process)."""
    stops = tuple(range(1, 64, 4))
    params = SamplingParams(max_tokens=14, temperature=1.0, n=2, seed=3, stop_token_ids=stops)
    for slots, delays in ((8, (0, 5)), (2, (0, 3))):  # (the slots decide which samples start first: not compared)
        runs = [[(c.token_ids, c.finish_reason, c.turns) for c in engines[slots].generate(
            PROMPTS, params, turns=ScriptedTurns(max_turns=2, delay=d), min_groups=2)] for d in delays]
        assert runs[0] == runs[1], slots
        assert any(reason == "partial" and ids for ids, reason, _ in runs[0])
        assert any(turns for _, _, turns in runs[0])

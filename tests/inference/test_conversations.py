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

"""DataParallelEngine: the completions summed into every rank are each replica's own, conversations' model masks,
turn counts and token versions included (a fake engine and a fake collective: no msrun)."""

from types import SimpleNamespace

import numpy as np

from mindgrpo.inference.engine import Completion
from mindgrpo.inference.sampling import SamplingParams
from mindgrpo.parallel.data_parallel import DataParallelEngine


def completion(prompt, sample, turns):
    """A made-up conversation: 3 + 4 * prompt + sample tokens, the middle third a tool turn when turns > 0."""
    m = 3 + 4 * prompt + sample
    ids = [100 * prompt + 10 * sample + t for t in range(m)]
    mask = np.ones(m, bool)
    if turns:
        mask[m // 3: 2 * m // 3] = False
    logp = -np.arange(1, m + 1, dtype=np.float32) / 7 * mask
    versions = prompt + np.arange(m, dtype=np.int64) // 3  # per token: a partial rollout's carried sample
    return Completion(prompt, ids, "stop" if sample % 2 == 0 else "length", logp, logp - 0.5,
                      mask if turns else None, turns, versions)


class FakeEngine:
    last_stats = {}

    def __init__(self, turns):
        self.turns, self.calls = turns, []

    def generate(self, prompts, params, prompt_index=None, return_logits=False, turns=None):
        self.calls.append(turns)
        return [completion(int(p), s, self.turns) for p in prompt_index for s in range(params.n)]


class Recorder:
    """host_sum as one replica sees it: its rows plus `other` (the other replica's rows)."""

    def __init__(self, other=0.0):
        self.other, self.seen = other, None

    def host_sum(self, rows, group):
        self.seen = rows.copy()
        return rows + self.other


def test_every_completion_comes_back_whole_with_its_model_mask_and_turns():
    turns = SimpleNamespace(max_turns=2, max_turn_tokens=8)
    params = SamplingParams(max_tokens=24, temperature=1.0, n=2)
    prompts = [[1, 2], [3], [4, 5, 6]]
    for tool_turns in (2, 0):
        second = Recorder()
        engine = FakeEngine(tool_turns)
        DataParallelEngine(engine, second, SimpleNamespace(size=2, index=1)).generate(prompts, params, turns=turns)
        out = DataParallelEngine(engine, Recorder(second.seen), SimpleNamespace(size=2, index=0)).generate(
            prompts, params, turns=turns)
        assert engine.calls == [turns, turns]  # each replica's engine runs the conversations
        want = [completion(p, s, tool_turns) for p in range(3) for s in range(2)]
        assert len(out) == len(want)
        for got, c in zip(out, want):
            assert (got.prompt_index, got.token_ids, got.finish_reason, got.turns) == \
                (c.prompt_index, c.token_ids, c.finish_reason, c.turns)
            np.testing.assert_array_equal(got.logprobs, c.logprobs)
            np.testing.assert_array_equal(got.sampling_logprobs, c.sampling_logprobs)
            assert got.versions.dtype == np.int64 and got.versions.tolist() == c.versions.tolist()
            if c.model_mask is None:
                assert got.model_mask is None
            else:
                assert got.model_mask.dtype == bool
                np.testing.assert_array_equal(got.model_mask, c.model_mask)

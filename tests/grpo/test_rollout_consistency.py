"""Rollouts are samples of the policy that the training graph scores.

GRPO's gradient is unbiased only if the inference graph (its own weight copy, KV-cache decode,
in-graph sampler) draws completions from the distribution whose log-probs the training graph
computes. For samples y ~ p, E[-log p(y_t | y_<t)] = E[H(p(. | y_<t))], where both sides come from
the training graph; a sampler that drew from any other distribution (a stale or wrongly synced
weight copy, a temperature slip, a biased inverse CDF) breaks the equality. The test checks it
to four standard errors on 512 sequences, after a WeightSync into a differently initialised copy.
"""

import numpy as np
import pytest
from mindspore import Tensor

from mindgrpo.grpo.experience import pack
from mindgrpo.inference.engine import RolloutEngine
from mindgrpo.inference.sampling import SamplingParams
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.qwen2 import Qwen2ForCausalLM
from mindgrpo.models.scoring import TokenLogProbs
from mindgrpo.parallel.weight_sync import WeightSync

CFG = Qwen2Config(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  param_init_std=0.15)
PROMPTS = [[3, 4, 5], [7, 8], [9, 10, 11, 12], [20]]


class Rollouts:
    """The policy, its synced inference copy and engine, built once for the module: each temperature's
    rollouts are drawn once (the same seed draws the same samples) and each scoring temperature's graph
    compiles once."""

    def __init__(self):
        self.policy = Qwen2ForCausalLM(CFG, seed=1)
        inference = Qwen2ForCausalLM(CFG, seed=2)
        WeightSync(self.policy, inference)()
        self.engine = RolloutEngine(inference, pad_token_id=0)
        self.samples, self.scorers = {}, {}

    def experience(self, samples, temperature):
        key = (samples, temperature)
        if key not in self.samples:
            comps = self.engine.generate(
                PROMPTS, SamplingParams(max_tokens=6, temperature=temperature, n=samples // len(PROMPTS), seed=7))
            self.samples[key] = pack([PROMPTS[c.prompt_index] for c in comps], [c.token_ids for c in comps],
                                     np.zeros(len(comps), np.float32))
        return self.samples[key]

    def scorer(self, temperature):
        if temperature not in self.scorers:
            self.scorers[temperature] = TokenLogProbs(self.policy, with_entropy=True, temperature=temperature)
        return self.scorers[temperature]


@pytest.fixture(scope="module")
def rollouts():
    return Rollouts()


def nll_minus_entropy(rollouts, samples, temperature, scored_at=None):
    """E[-log p - H] per sequence for `samples` rollouts at `temperature`, scored at `scored_at`
    (default: the same temperature, as the trainer scores)."""
    exp = rollouts.experience(samples, temperature)
    logp, ent = rollouts.scorer(scored_at or temperature)(Tensor(exp.input_ids), Tensor(exp.score_pos),
                                                         Tensor(exp.labels))
    diff = ((-logp.asnumpy() - ent.asnumpy()) * exp.mask).sum(-1)  # (B,) per sequence
    return diff.mean(), diff.std() / np.sqrt(len(diff)), float((ent.asnumpy() * exp.mask).sum(-1).mean())


@pytest.mark.slow  # ~10 s of CPU or more (pyproject.toml): CI runs it, the quick loop does not
def test_samples_follow_the_scored_policy(rollouts):
    mean, se, entropy = nll_minus_entropy(rollouts, 512, temperature=1.0)
    assert entropy > 3.0  # a broad distribution, so a wrong sampler would show
    assert abs(mean) < 4 * se, (mean, se)


def test_samples_at_a_lower_temperature_follow_the_policy_scored_at_it(rollouts):
    mean, se, _ = nll_minus_entropy(rollouts, 512, temperature=0.7)
    assert abs(mean) < 4 * se, (mean, se)


def test_the_check_sees_a_different_distribution(rollouts):
    mean, se, _ = nll_minus_entropy(rollouts, 512, temperature=0.7, scored_at=1.0)  # sharper than the scored policy
    assert mean < -4 * se, (mean, se)

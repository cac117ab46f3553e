"""The in-graph sampler against transformers' logits warpers: on an evenly spaced grid of N
uniforms, the share of each token must equal the warped softmax probability within 1/N."""

import numpy as np
import pytest

import mindspore as ms

from mindgrpo.inference.sampling import Sampler, SamplingParams

N = 4000  # uniforms; each token's share is exact to 1/N


def hf_probs(logits, p: SamplingParams):
    import torch
    from transformers.generation.logits_process import (MinPLogitsWarper, TemperatureLogitsWarper,
                                                        TopKLogitsWarper, TopPLogitsWarper)
    x = torch.tensor(logits[None, :], dtype=torch.float64)
    warpers = [TemperatureLogitsWarper(p.temperature)]
    if p.top_k:
        warpers.append(TopKLogitsWarper(p.top_k))
    if p.top_p < 1:
        warpers.append(TopPLogitsWarper(p.top_p))
    if p.min_p > 0:
        warpers.append(MinPLogitsWarper(p.min_p))
    for w in warpers:
        x = w(None, x)
    return torch.softmax(x, -1)[0].numpy()


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7),
    SamplingParams(temperature=1.0, top_k=5),
    SamplingParams(temperature=1.3, top_p=0.8),
    SamplingParams(temperature=1.0, top_k=10, top_p=0.6),
    SamplingParams(temperature=1.0, min_p=0.2),
], ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}-m{p.min_p}")
def test_sampled_shares_equal_warped_probabilities(params):
    rng = np.random.default_rng(0)
    logits = (rng.normal(size=50) * 2).astype(np.float32)
    u = ((np.arange(N) + 0.5) / N).astype(np.float32)
    picks = Sampler(params, 50)(ms.Tensor(np.tile(logits, (N, 1))), ms.Tensor(u)).asnumpy()
    share = np.bincount(picks, minlength=50) / N
    ref = hf_probs(logits, params)
    assert np.abs(share - ref).max() <= 1.0 / N + 1e-6
    assert set(np.nonzero(share)[0]) <= set(np.nonzero(ref > 0)[0])


def test_greedy_is_argmax():
    logits = np.random.default_rng(1).normal(size=(7, 300)).astype(np.float32)
    picks = Sampler(SamplingParams(temperature=0.0), 300)(ms.Tensor(logits), ms.Tensor(np.zeros(7, np.float32)))
    assert picks.asnumpy().tolist() == logits.argmax(-1).tolist()


@pytest.mark.parametrize("bad", [dict(top_p=0.0), dict(top_p=1.5), dict(temperature=-1), dict(top_k=-2),
                                 dict(min_p=1.0), dict(max_tokens=0), dict(n=0)])
def test_invalid_params_rejected(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)

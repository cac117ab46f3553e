"""Our MindSpore model with `model_type: qwen3` (QK-norm, no q/k/v bias, head_dim its own field)
against transformers' Qwen3ForCausalLM on the same random weights, moved through
scripts/convert_weight.py: logits on a padded batch, the training/scoring log-probs, greedy
generation through the rollout engine (its fused inference path), tied and untied."""

import numpy as np
import pytest

import mindspore as ms

from hf_models import hf_greedy, hf_logits, make_hf_model, padded_batch

from mindgrpo.inference.engine import RolloutEngine
from mindgrpo.inference.sampling import SamplingParams
from mindgrpo.models.checkpoint import load_model
from mindgrpo.models.scoring import SequenceLogits, TokenLogProbs
from scripts import convert_weight

VARIANTS = {  # name: (tied, heads, kv_heads, head_dim); hidden is 64, so 24 and 32 are not 64 / heads
    "untied-gqa-d24": (False, 4, 2, 24),
    "tied-gqa-d32": (True, 4, 1, 32),
}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def pair(request, tmp_path_factory):
    tied, heads, kv, head_dim = VARIANTS[request.param]
    d = tmp_path_factory.mktemp(request.param)
    hf = make_hf_model(str(d / "hf"), tied=tied, heads=heads, kv_heads=kv, head_dim=head_dim,
                       model_type="qwen3", seed=len(request.param))
    ckpt = str(d / "ms" / "model.ckpt")
    assert convert_weight.main(["--torch_ckpt_dir", str(d / "hf"), "--mindspore_ckpt_path", ckpt]) == 0
    lm = load_model(ckpt)
    assert (lm.config.model_type, lm.config.qk_norm, lm.config.attention_bias, lm.config.d) == \
        ("qwen3", True, False, head_dim)
    names = {n for n, _ in lm.parameters_and_names()}
    assert "model.layers.1.attention.q_norm.weight" in names and "model.layers.1.attention.wq.bias" not in names
    return hf, lm


def test_logits_match_transformers_on_padded_batch(pair):
    hf, lm = pair
    ids, mask = padded_batch(np.random.default_rng(1), 512, [17, 9, 4, 12], 17)
    ours = SequenceLogits(lm)(ms.Tensor(ids), ms.Tensor(mask)).asnumpy()
    ref = hf_logits(hf, ids, mask)
    assert np.abs(ours - ref)[mask.astype(bool)].max() <= 1e-4


def test_token_logprobs_match_transformers(pair):
    """The log-probs training and the reference score (the fused head, chunks of 4) and their entropy."""
    hf, lm = pair
    ids, mask = padded_batch(np.random.default_rng(3), 512, [16, 10, 7], 16)
    prompt_len = np.array([5, 3, 6])
    score_pos, labels, valid = np.zeros((3, 11), np.int32), np.zeros((3, 11), np.int32), np.zeros((3, 11), bool)
    for i, n in enumerate(mask.sum(1)):
        k = n - prompt_len[i]
        score_pos[i, :k] = np.arange(prompt_len[i] - 1, n - 1)
        labels[i, :k] = ids[i, prompt_len[i]:n]
        valid[i, :k] = True
    logp, ent = TokenLogProbs(lm, temperature=1.0, chunk=4)(ms.Tensor(ids), ms.Tensor(score_pos), ms.Tensor(labels))
    import torch

    ref = torch.log_softmax(torch.tensor(hf_logits(hf, ids, mask), dtype=torch.float64), -1).numpy()
    rows = np.arange(3)[:, None]
    ref_logp = np.take_along_axis(ref[rows, score_pos], labels[..., None], -1)[..., 0]
    ref_ent = -(np.exp(ref) * ref).sum(-1)[rows, score_pos]
    assert np.abs(logp.asnumpy() - ref_logp)[valid].max() <= 1e-4
    assert np.abs(ent.asnumpy() - ref_ent)[valid].max() <= 1e-4


@pytest.mark.slow  # issue 18: over 30 s under -n 2 at load 6 (the -m "not slow" loop of 2026-11-26)
def test_greedy_generation_matches_transformers(pair):
    """Mixed prompt lengths, 3 slots for 5 prompts (refill), stop ids transformers produces mid-way."""
    hf, lm = pair
    rng = np.random.default_rng(4)
    prompts = [rng.integers(1, 512, n).tolist() for n in (7, 3, 12, 1, 5)]
    free = [hf_greedy(hf, p, 16) for p in prompts]
    stops = (free[0][5], free[2][11])
    engine = RolloutEngine(lm, pad_token_id=0, max_num_seqs=3)
    ours = engine.generate(prompts, SamplingParams(max_tokens=16, temperature=0.0, stop_token_ids=stops))
    for p, c in zip(prompts, ours):
        assert c.token_ids == hf_greedy(hf, p, 16, stops)

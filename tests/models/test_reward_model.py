"""The reward model (`mindgrpo/models/reward_model.py`) against transformers' Qwen2ForSequenceClassification
and Qwen3ForSequenceClassification (num_labels 1) on random weights moved through scripts/convert_weight.py:
scores of prompt + completion pairs of mixed lengths, padded left and right and packed; the way back to HF."""

import numpy as np
import pytest

import mindspore as ms

from hf_models import hf_reward_scores, make_hf_reward_model

from mindgrpo.models.convert import WeightError
from mindgrpo.models.checkpoint import load_model
from mindgrpo.models.reward_model import PackedRewardScores, RewardScores, load_reward_model, pack_rows
from scripts import convert_weight

VOCAB = 512
PAIRS = [(5, 12), (3, 4), (9, 1), (2, 9), (7, 7)]  # (prompt, completion) tokens


def padded(seqs, left: bool):
    s = max(len(q) for q in seqs)
    ids, mask = np.zeros((len(seqs), s), np.int32), np.zeros((len(seqs), s), np.int32)
    for i, q in enumerate(seqs):
        at = slice(s - len(q), s) if left else slice(0, len(q))
        ids[i, at], mask[i, at] = q, 1
    return ids, mask


@pytest.fixture(scope="module", params=["qwen2", "qwen3"])
def pair(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param)
    hf = make_hf_reward_model(str(d / "hf"), model_type=request.param, seed=3, vocab=VOCAB)
    ckpt = str(d / "ms" / "rm.ckpt")
    assert convert_weight.main(["--torch_ckpt_dir", str(d / "hf"), "--mindspore_ckpt_path", ckpt]) == 0
    rm = load_reward_model(ckpt)
    names = set(rm.named_parameters())
    assert "score.weight" in names and "lm_head.weight" not in names
    assert "model.layers.1.attention.wq.weight" in names
    rng = np.random.default_rng(5)
    seqs = [rng.integers(1, VOCAB, p + c).tolist() for p, c in PAIRS]  # no real token is the pad id 0
    return hf, rm, seqs, d


def test_scores_match_transformers_left_and_right_padding(pair):
    hf, rm, seqs, _ = pair
    scorer = RewardScores(rm)
    for left in (False, True):
        ids, mask = padded(seqs, left)
        ours = scorer(ms.Tensor(ids), ms.Tensor(mask)).asnumpy()
        ref = hf_reward_scores(hf, ids, mask)
        assert ours.shape == (len(seqs),)
        assert np.abs(ours - ref).max() <= 1e-4, (left, ours, ref)
    assert np.ptp(ref) > 0.1  # the scores differ between sequences (0.19 apart): a constant would not pass


def test_packed_scores_match_transformers(pair):
    hf, rm, seqs, _ = pair
    arrays, order = pack_rows(seqs, width=18, n_rows=5, n_last=8)
    assert arrays["ids"].shape == (5, 18) and arrays["last"].shape == (8,)
    assert (arrays["segments"].max(1) > 1).any()  # some row holds two sequences
    out = PackedRewardScores(rm)(*(ms.Tensor(arrays[k]) for k in ("ids", "positions", "segments", "last")))
    ref = hf_reward_scores(hf, *padded(seqs, left=False))
    assert np.abs(out.asnumpy()[order] - ref).max() <= 1e-4


def test_reverse_conversion_gives_transformers_the_same_model(pair, tmp_path):
    import transformers

    hf, _, seqs, d = pair
    out = tmp_path / "back"
    assert convert_weight.main(["--reverse", "--mindspore_ckpt_path", str(d / "ms" / "rm.ckpt"),
                                "--torch_ckpt_dir", str(out)]) == 0
    back = transformers.AutoModelForSequenceClassification.from_pretrained(str(out)).eval()
    assert back.config.num_labels == 1 and type(back).__name__ == type(hf).__name__
    ids, mask = padded(seqs, left=False)
    assert np.array_equal(hf_reward_scores(back, ids, mask), hf_reward_scores(hf, ids, mask))


def test_a_reward_model_is_not_a_causal_lm(pair):
    *_, d = pair
    with pytest.raises(WeightError, match="score.weight.*reward model"):
        load_model(str(d / "ms" / "rm.ckpt"))


def test_pack_rows_refuses_what_does_not_fit():
    with pytest.raises(ValueError, match="does not fit a row of 4"):
        pack_rows([[1, 2, 3, 4, 5]], width=4)


@pytest.mark.parametrize("max_tokens", [0, 64])
def test_scorer_keeps_input_order_padded_and_packed(pair, max_tokens):
    """RewardScorer's micro-batches (2 padded rows, or packed rows of 32 within 64 tokens) give transformers'
    scores in input order."""
    hf, rm, seqs, _ = pair
    from mindgrpo.models.reward_model import RewardScorer

    ours = RewardScorer(rm, micro_batch_size=2, max_tokens=max_tokens)(seqs)
    ref = hf_reward_scores(hf, *padded(seqs, left=False))
    assert np.abs(ours - ref).max() <= 1e-4

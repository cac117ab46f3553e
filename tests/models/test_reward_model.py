"""The reward model (`mindgrpo/models/reward_model.py`) against transformers' Qwen2ForSequenceClassification
and Qwen3ForSequenceClassification (num_labels 1) on random weights moved through scripts/convert_weight.py:
scores of prompt + completion pairs of mixed lengths through `RewardScorer` (the path users run), against
transformers' padded left and right, and of packed rows; the row lengths whose graphs it keeps; the way back to HF.
The attention in blocks of queries (`models/block_attention.py`, MindSpore's ops) against numpy's whole-row attention."""

import numpy as np
import pytest

import mindspore as ms

from hf_models import hf_reward_scores, make_hf_reward_model
from attention_reference import whole_row_attention

from mindgrpo.config.sections import RewardModelConfig
from mindgrpo.models.block_attention import BlockAttention, query_block
from mindgrpo.models.convert import WeightError
from mindgrpo.models.checkpoint import load_model
from mindgrpo.models.reward_model import (KEPT_ROW_LENGTHS, RewardScorer, load_reward_model, pack_rows, row_length,
                                          scoring_graph_bound)
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
    """One padded micro-batch of the five sequences through RewardScorer (rows of 32 tokens) against transformers
    given them padded right and padded left, positions counting real tokens."""
    hf, rm, seqs, _ = pair
    ours = RewardScorer(rm, micro_batch_size=len(seqs))(seqs)
    assert ours.shape == (len(seqs),)
    for left in (False, True):
        ref = hf_reward_scores(hf, *padded(seqs, left))
        assert np.abs(ours - ref).max() <= 1e-4, (left, ours, ref)
    assert np.ptp(ref) > 0.1  # the scores differ between sequences (0.19 apart): a constant would not pass


@pytest.mark.parametrize("layerwise", [True, False])
def test_packed_scores_match_transformers(pair, layerwise):
    """Packed rows of 18 tokens (two sequences in a row, an empty row beside them) through the scorer's graphs
    (`RewardScorer.rows`: layerwise, or the whole model in one graph), read at each sequence's last token."""
    hf, rm, seqs, _ = pair
    arrays, order = pack_rows(seqs, width=18, n_rows=5, n_last=8)
    assert arrays["ids"].shape == (5, 18) and arrays["last"].shape == (8,)
    assert (arrays["segments"].max(1) > 1).any()  # some row holds two sequences
    at_every = RewardScorer(rm, layerwise=layerwise).rows(arrays["ids"], arrays["positions"], arrays["segments"])
    assert at_every.shape == (5, 18)
    ref = hf_reward_scores(hf, *padded(seqs, left=False))
    assert np.abs(at_every.reshape(-1)[arrays["last"]][order] - ref).max() <= 1e-4


@pytest.mark.parametrize("budget, block", [(1, 32), (10 ** 9, 80)])
def test_block_attention_is_whole_row_attention(budget, block):
    """Rows of 80 tokens (two packed sequences and padding; one sequence and padding) in blocks of 32, 32 and 16
    queries (or one block of 80), 4 query heads on 2 kv heads, against float64 numpy on the same inputs."""
    rng = np.random.default_rng(2)
    b, nh, nkv, s, d = 2, 4, 2, 80, 8
    q, k, v = (rng.normal(size=(b, n, s, d)).astype(np.float32) for n in (nh, nkv, nkv))
    segments = np.zeros((b, s), np.int32)
    segments[0, :30], segments[0, 30:71] = 1, 2
    segments[1, :57] = 1
    assert query_block(b, nh, s, budget) == block
    blocks = BlockAttention(nh, nkv, d ** -0.5, budget)
    blocks.kernel = None  # the blocks themselves (tests/kernels/test_attention_kernel.py: the CPU kernel)
    ours = blocks(*(ms.Tensor(x) for x in (q, k, v, segments))).asnumpy()
    ref = whole_row_attention(q, k, v, segments, d ** -0.5)
    assert ours.shape == (b, s, nh * d)
    assert np.abs(ours - ref).max() <= 1e-5
    assert np.abs(ref[0, 30] - ref[0, 29]).max() > 0.1  # a sequence's first token does not see the one before


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


@pytest.mark.parametrize("layerwise", [True, False])
@pytest.mark.parametrize("max_tokens", [0, 64])
def test_scorer_keeps_input_order_padded_and_packed(pair, max_tokens, layerwise):
    """RewardScorer's micro-batches (2 padded rows, or packed rows of 32 within 64 tokens), a layer graph run for
    every layer or the whole model in one graph, give transformers' scores in input order."""
    hf, rm, seqs, _ = pair
    ours = RewardScorer(rm, micro_batch_size=2, max_tokens=max_tokens, layerwise=layerwise)(seqs)
    ref = hf_reward_scores(hf, *padded(seqs, left=False))
    assert np.abs(ours - ref).max() <= 1e-4


def test_row_lengths_are_two_a_octave():
    assert [row_length(n, 16) for n in (1, 16, 17, 33, 49, 65, 97, 100, 129, 193, 200)] == \
        [16, 16, 32, 48, 64, 96, 128, 128, 192, 256, 256]
    assert scoring_graph_bound(100, 16) == 3 * 6 and scoring_graph_bound(100, 16, layerwise=False) == 6


@pytest.mark.slow  # 11-22 s: a graph set compiled for each of the many row lengths
@pytest.mark.parametrize("pair", ["qwen2"], indirect=True)  # one model is enough for the count (both pass above)
@pytest.mark.parametrize("max_tokens", [0, 192])
def test_scorer_compiles_at_most_its_bound_whatever_the_lengths(pair, max_tokens, monkeypatch):
    """Calls whose longest sequence takes 14 values from 5 to 96 tokens (and shorter sequences beside it): the
    scorer compiles at most `scoring_graph_bound`'s graphs (the row lengths 16 .. 96), padded and packed, each
    call's scores transformers', the attention in blocks of 32 queries (rows of 48 to 96 tokens: 2 or 3 blocks, the
    last one partial at 48 and 80); after `release` a call compiles its row length's graphs again, the same scores."""
    hf, rm, _, _ = pair
    for i in rm.lm.layer_ids:
        monkeypatch.setattr(rm.lm.model.layers[i].attention.blocks, "budget", 1)  # 32 queries a block
    rng = np.random.default_rng(11)
    scorer = RewardScorer(rm, micro_batch_size=2, max_tokens=max_tokens, step=16, kept_row_lengths=5)
    calls = []
    for longest in range(5, 97, 7):
        seqs = [rng.integers(1, VOCAB, n).tolist() for n in (longest, *rng.integers(1, longest + 1, 2))]
        ours = scorer(seqs)
        ref = hf_reward_scores(hf, *padded(seqs, left=False))
        assert np.abs(ours - ref).max() <= 1e-4, longest
        calls.append((seqs, ours))
    bound = scoring_graph_bound(96, step=16)
    assert 3 * 4 <= scorer.compiled_graphs <= bound == 3 * 5, scorer.compiled_graphs  # 14 lengths, <= 5 shapes
    seen = scorer.compiled_graphs
    scorer(calls[0][0])  # a length seen: nothing new
    assert scorer.compiled_graphs == seen
    scorer.release()
    again = scorer(calls[-1][0])
    assert scorer.compiled_graphs > seen and np.array_equal(again, calls[-1][1])


@pytest.mark.slow  # 10-20 s: four graph sets compiled
@pytest.mark.parametrize("pair", ["qwen2"], indirect=True)  # one model is enough for the count
def test_scorer_keeps_the_graphs_of_its_most_recent_row_lengths(pair):
    """A scorer keeping 2 row lengths fed 3 (rows of 16, 32 and 48 tokens): after each call the graphs of the
    two row lengths used last are alive (3 graphs each), the oldest dropped; a kept one compiles nothing when used
    again, a dropped one compiles its graphs again and gives the same scores."""
    hf, rm, _, _ = pair
    assert RewardModelConfig(path="rm").kept_row_lengths == KEPT_ROW_LENGTHS  # the config's default is the scorer's
    rng = np.random.default_rng(12)
    scorer = RewardScorer(rm, micro_batch_size=2, step=16, kept_row_lengths=2)
    calls = {}
    for longest, kept in ((10, (16,)), (30, (16, 32)), (40, (32, 48)), (25, (48, 32))):
        seqs = [rng.integers(1, VOCAB, n).tolist() for n in (longest, longest - 3)]
        calls[longest] = (seqs, scorer(seqs))
        assert scorer.row_lengths == kept and scorer.kept_graphs == 3 * len(kept), (longest, scorer.row_lengths)
    assert scorer.compiled_graphs == 3 * 3  # 32 was kept when used again
    seqs, first = calls[10]
    assert np.array_equal(scorer(seqs), first)  # 16 was dropped: compiled again, 48 (used longest ago) dropped
    assert scorer.compiled_graphs == 3 * 4 and scorer.row_lengths == (32, 16)
    assert np.abs(first - hf_reward_scores(hf, *padded(seqs, left=False))).max() <= 1e-4
    with pytest.raises(ValueError, match="kept_row_lengths must be >= 1, got 0"):
        RewardScorer(rm, kept_row_lengths=0)


def test_a_qwen2_for_reward_model_head_matches_torch_and_converts_both_ways(tmp_path):
    """Qwen2ForRewardModel (Qwen2.5-Math-RM's architecture, whose modeling code ships with the model, not with
    transformers): transformers' Qwen2Model as the decoder and a torch head Linear(H, H), ReLU, Linear(H, 1) on the
    last real token, saved with the model's tensor names (`model.*`, `score.0.*`, `score.2.*`)."""
    import json

    import torch
    import transformers
    from safetensors.torch import save_file

    hidden = 64
    cfg = transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0,
                                   rms_norm_eps=1e-6, max_position_embeddings=512)
    torch.manual_seed(4)
    decoder = transformers.Qwen2Model(cfg).eval()
    head = torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))
    with torch.no_grad():
        for p in [*decoder.parameters(), *head.parameters()]:
            p.normal_(0.0, 0.2)
    hf = tmp_path / "hf"
    hf.mkdir()
    tensors = {f"model.{k}": v.contiguous() for k, v in decoder.state_dict().items()}
    tensors.update({f"score.{k}": v.contiguous() for k, v in head.state_dict().items()})
    save_file(tensors, str(hf / "model.safetensors"))
    (hf / "config.json").write_text(json.dumps({**cfg.to_dict(), "architectures": ["Qwen2ForRewardModel"]}))
    ckpt = str(tmp_path / "ms" / "rm.ckpt")
    assert convert_weight.main(["--torch_ckpt_dir", str(hf), "--mindspore_ckpt_path", ckpt]) == 0
    rm = load_reward_model(ckpt)
    assert {"score.0.weight", "score.0.bias", "score.2.weight", "score.2.bias"} <= set(rm.named_parameters())

    rng = np.random.default_rng(6)
    seqs = [rng.integers(1, VOCAB, p + c).tolist() for p, c in PAIRS]
    ids, mask = padded(seqs, left=False)
    with torch.no_grad():
        m = torch.tensor(mask, dtype=torch.long)
        h = decoder(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=m,
                    position_ids=(m.cumsum(1) - 1).clamp(min=0)).last_hidden_state  # (B, S, H), after the norm
        ref = head(h[torch.arange(len(seqs)), m.sum(1) - 1])[:, 0].numpy()
    ours = RewardScorer(rm, micro_batch_size=len(seqs))(seqs)
    assert np.abs(ours - ref).max() <= 1e-4, (ours, ref)
    assert np.ptp(ref) > 0.02  # 0.05 apart, 500x the tolerance: a wrong head or token would not pass
    back = tmp_path / "back"
    assert convert_weight.main(["--reverse", "--mindspore_ckpt_path", ckpt, "--torch_ckpt_dir", str(back)]) == 0
    from safetensors.numpy import load_file
    again = load_file(str(back / "model.safetensors"))
    assert set(again) == set(tensors)
    assert all(np.array_equal(again[k], tensors[k].numpy()) for k in tensors)

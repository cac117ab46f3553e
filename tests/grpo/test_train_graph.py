"""The training step's embedding gradient taken as rows (`GRPOGradStep(embedding=...)`, the
lookup outside the differentiated function, its rows scatter-added into the buffer) against
MindSpore's own autodiff through the lookup (a dense (V, H) gradient), on token ids that repeat
many times (the rows of one id must add up), tied and untied, over two accumulated micro-batches."""

import numpy as np
import pytest
from mindspore import Tensor

from mindgrpo.grpo.ms_algos import GRPOLoss
from mindgrpo.grpo.optim import GradBuffer
from mindgrpo.grpo.train_graph import GRPOGradStep, PolicyLoss
from mindgrpo.models.qwen2 import Qwen2Config, Qwen2ForCausalLM


def accumulated(tied: bool, rows: bool, batches):
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=tied)
    lm = Qwen2ForCausalLM(cfg, seed=5)
    params = [p for p in lm.trainable_params()]
    buf = GradBuffer(params)
    loss = PolicyLoss(lm, GRPOLoss(beta=0.1, kl_kind="k3"), detach_old=False, use_ref=True, embedded=rows)
    step = GRPOGradStep(loss, params, buf, embedding=lm.model.tok_embeddings if rows else None)
    losses = [float(step(*map(Tensor, b))[0].asnumpy()) for b in batches]
    return losses, {p.name: b.asnumpy() for p, b in zip(params, buf.bufs)}


@pytest.mark.parametrize("tied", [True, False])
def test_embedding_rows_match_autodiff(tied):
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(2):
        b, s, r = 3, 24, 8
        ids = rng.integers(0, 6, (b, s)).astype(np.int32)  # 6 distinct ids in 72 positions
        score_pos = np.tile(np.arange(s - r - 1, s - 1, dtype=np.int32), (b, 1))
        labels = ids[:, s - r:].copy()
        mask = (rng.random((b, r)) < 0.8).astype(np.float32)
        logp = (-3 + 0.3 * rng.standard_normal((b, r))).astype(np.float32)
        batches.append((ids, score_pos, labels, mask, rng.standard_normal(b).astype(np.float32), logp,
                        (logp + 0.1 * rng.standard_normal((b, r))).astype(np.float32),
                        np.float32(mask.sum() * 2), np.float32(6)))
    loss_rows, rows = accumulated(tied, True, batches)
    loss_dense, dense = accumulated(tied, False, batches)
    np.testing.assert_allclose(loss_rows, loss_dense, rtol=1e-6)
    assert rows.keys() == dense.keys()
    for name in dense:
        np.testing.assert_allclose(rows[name], dense[name], rtol=1e-5, atol=1e-7, err_msg=name)
    emb = rows["model.tok_embeddings.embedding_weight"]
    assert np.abs(emb[:6]).min(axis=1).max() > 0  # the looked-up rows got gradient
    if not tied:
        assert not emb[6:].any()  # the others none

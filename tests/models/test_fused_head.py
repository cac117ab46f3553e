"""mindgrpo/models/fused_head.py: the chunked projection + log-softmax and its hand-written backward,
against PyTorch autograd of log_softmax(h @ w.T) on the same arrays."""

import numpy as np
import pytest
import mindspore as ms
from mindspore import Parameter, Tensor, nn

from mindgrpo.models.fused_head import HeadLogProbs

torch = pytest.importorskip("torch")


class Loss(nn.Cell):
    """sum(g * logp) through the head, the weight a Parameter (as the lm_head / tied embedding is)."""

    def __init__(self, w, chunk, with_entropy, vocab_start=0):
        super().__init__()
        self.w = Parameter(Tensor(w), name="w")
        self.head = HeadLogProbs(chunk, with_entropy, vocab_start)

    def construct(self, h, labels, g):
        logp, ent, lse = self.head(h, self.w, labels)
        return (logp * g).sum(), logp, ent, lse


def reference(h, w, labels, g):
    th, tw = torch.tensor(h, requires_grad=True), torch.tensor(w, requires_grad=True)
    logp_all = torch.log_softmax(th.double() @ tw.double().T, -1)
    logp = logp_all.gather(1, torch.tensor(labels, dtype=torch.long).reshape(-1, 1)).reshape(-1)
    (logp * torch.tensor(g, dtype=torch.float64)).sum().backward()
    ent = -(logp_all.exp() * logp_all).sum(-1)
    lse = torch.logsumexp(th.double() @ tw.double().T, -1)
    return [x.detach().numpy() for x in (logp, ent, lse, th.grad, tw.grad)]


@pytest.mark.parametrize("chunk, with_entropy", [(1, True), (4, True), (7, False), (64, True)])
def test_values_and_gradients_match_torch(chunk, with_entropy):
    rng = np.random.default_rng(chunk)
    n, hidden, vocab = 13, 16, 97
    h = rng.standard_normal((n, hidden)).astype(np.float32)
    w = (rng.standard_normal((vocab, hidden)) * 0.5).astype(np.float32)
    labels = rng.integers(0, vocab, n).astype(np.int32)
    g = rng.standard_normal(n).astype(np.float32)
    net = Loss(w, chunk, with_entropy)
    grad = ms.value_and_grad(net, grad_position=0, weights=net.trainable_params(), has_aux=True)
    (_, logp, ent, lse), (dh, (dw,)) = grad(Tensor(h), Tensor(labels), Tensor(g))
    ref_logp, ref_ent, ref_lse, ref_dh, ref_dw = reference(h, w, labels, g)
    np.testing.assert_allclose(logp.asnumpy(), ref_logp, rtol=0, atol=2e-5)
    np.testing.assert_allclose(lse.asnumpy(), ref_lse, rtol=0, atol=2e-5)
    if with_entropy:
        np.testing.assert_allclose(ent.asnumpy(), ref_ent, rtol=0, atol=2e-5)
    else:
        assert not ent.asnumpy().any()
    np.testing.assert_allclose(dh.asnumpy(), ref_dh, rtol=0, atol=2e-5)
    np.testing.assert_allclose(dw.asnumpy(), ref_dw, rtol=0, atol=2e-5)
    assert np.abs(ref_dw).max() > 0.1


def test_a_vocabulary_slice_scores_only_its_own_labels():
    """Under tensor parallelism a rank holds rows [start, start + V/tp): labels outside add nothing to
    its target sum and get no one-hot gradient there (one rank of two, with no group to sum over)."""
    rng = np.random.default_rng(0)
    n, hidden, vocab, start = 6, 8, 20, 10
    h = rng.standard_normal((n, hidden)).astype(np.float32)
    w = rng.standard_normal((vocab, hidden)).astype(np.float32)
    labels = np.array([10, 3, 29, 15, 0, 19], np.int32)  # 10, 29, 15, 19 are in [10, 30)
    g = np.ones(n, np.float32)
    net = Loss(w, 4, False, vocab_start=start)
    grad = ms.value_and_grad(net, grad_position=None, weights=net.trainable_params(), has_aux=True)
    (_, logp, _, lse), (dw,) = grad(Tensor(h), Tensor(labels), Tensor(g))
    logits = h.astype(np.float64) @ w.T.astype(np.float64)
    ref_lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    local = labels - start
    mine = (local >= 0) & (local < vocab)
    # this rank's share of log p: its shifted target (the owner's l_y - max, else 0) minus log Z
    top = logits.max(-1)
    ref_logp = np.where(mine, logits[np.arange(n), np.clip(local, 0, vocab - 1)] - top, 0.0) - (ref_lse - top)
    np.testing.assert_allclose(logp.asnumpy(), ref_logp, rtol=0, atol=2e-5)
    np.testing.assert_allclose(lse.asnumpy(), ref_lse, rtol=0, atol=2e-5)
    onehot = np.zeros((n, vocab))
    onehot[np.arange(n)[mine], local[mine]] = 1.0
    p = np.exp(logits - ref_lse[:, None])
    np.testing.assert_allclose(dw.asnumpy(), (onehot - p).T @ h, rtol=0, atol=2e-5)


def test_bad_chunk():
    with pytest.raises(ValueError, match="chunk must be >= 1"):
        HeadLogProbs(0, True)

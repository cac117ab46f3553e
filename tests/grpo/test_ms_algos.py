"""Tests for mindgrpo.grpo.ms_algos, run in GRAPH_MODE on CPU.

Values are compared with the numpy functions of algos.py (themselves tested by hand and against
TRL in test_algos.py); gradients w.r.t. logp against torch autograd through TRL's own
`_compute_loss` (the `TRLLoss` harness of test_algos.py) and, for what TRL does not have (dual
clip, k1/k2/low_var_kl), against central finite differences of the numpy loss.

Tolerance: MindSpore's graph compiler turns Python-float constants (clip bounds, beta, dual_clip)
into float32, e.g. 0.8 -> 0.800000011920929, so float64 results that involve them match numpy to
~3e-8 relative per term; results that involve them are compared at rtol = atol = 1e-7
(FP32_CONST; atol because sums of terms of both signs lose relative precision), the rest at 1e-12.
"""

import mindspore as ms
import numpy as np
import pytest
import torch
from mindspore import Tensor, nn

from mindgrpo.grpo import algos, ms_algos, objective
from mindgrpo.grpo.ms_algos import Aggregate, KLPenalty
from mindgrpo.grpo.ms_objective import GRPOLoss
from test_algos import TRL_MODES, TRLLoss, random_batch, torch_of  # tests/grpo is on sys.path under pytest

FP32_CONST = 1e-7
MODES = algos.AGG_MODES.names()
KINDS = algos.KL_ESTIMATORS.names()


pytestmark = pytest.mark.usefixtures("graph_mode")  # tests/grpo/conftest.py


def t(x, dtype=ms.float64):
    return Tensor(np.asarray(x), dtype)


def close(ms_value, np_value, rtol, atol=1e-12):
    np.testing.assert_allclose(ms_value.asnumpy(), np_value, rtol=rtol, atol=atol)


class MaskedReductions(nn.Cell):
    def construct(self, x, mask):
        return (ms_algos.masked_sum(x, mask), ms_algos.masked_mean(x, mask), ms_algos.masked_mean(x, mask, -1),
                ms_algos.num_tokens(mask), ms_algos.num_seqs(mask))


class PolicyLoss(nn.Cell):
    def __init__(self, clip_low, clip_high, dual_clip):
        super().__init__()
        self.clip_low, self.clip_high, self.dual_clip = clip_low, clip_high, dual_clip

    def construct(self, logp, old_logp, advantages, mask):
        return ms_algos.policy_loss(logp, old_logp, advantages, mask, clip_low=self.clip_low, clip_high=self.clip_high,
                                    dual_clip=self.dual_clip)


class SumOfMaskedX(nn.Cell):
    def construct(self, x, mask):
        return ms_algos.masked_sum(ms.ops.exp(x), mask)


# ---------------------------------------------------------------------------------------
# values against numpy
# ---------------------------------------------------------------------------------------


def test_masked_reductions_match_numpy():
    x = np.array([[1.0, 2.0, np.inf], [4.0, np.nan, 6.0], [7.0, 8.0, 9.0]])
    mask = np.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=np.float64)
    s, m, m_row, n_tok, n_seq = MaskedReductions()(t(x), t(mask))
    assert s.asnumpy() == 7.0 and m.asnumpy() == pytest.approx(7 / 3)
    np.testing.assert_allclose(m_row.asnumpy(), algos.masked_mean(x, mask, axis=-1))  # [1.5, 4, 0]
    assert n_tok.asnumpy() == 3.0 and n_seq.asnumpy() == 2.0
    # masked-out entries get exactly zero gradient
    big = np.array([[0.0, 50.0], [1.0, 2.0]])
    grad = ms.grad(SumOfMaskedX())(t(big), t([[1.0, 0.0], [1.0, 1.0]])).asnumpy()
    np.testing.assert_allclose(grad, [[1.0, 0.0], [np.e, np.e ** 2]])


@pytest.mark.parametrize("kind", KINDS)
def test_kl_matches_numpy(kind):
    rng = np.random.default_rng(10)
    logp, ref = rng.normal(-2, 2, (4, 6)), rng.normal(-2, 2, (4, 6))
    logp[0, :3], ref[0, :3] = [-30.0, -1.0, -2.0], [-1.0, -30.0, -2.0]  # far apart (clamped) and equal
    close(KLPenalty(kind)(t(logp), t(ref)), algos.kl_penalty(logp, ref, kind), rtol=1e-12)


@pytest.mark.parametrize("dual_clip", [None, 1.6])
def test_policy_loss_matches_numpy(dual_clip):
    rng = np.random.default_rng(11)
    logp, old, _, adv, mask = random_batch(rng, B=8, spread=0.8)
    loss, metrics = PolicyLoss(0.2, 0.28, dual_clip)(t(logp), t(old), t(adv), t(mask))
    np_loss, np_metrics = algos.policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, dual_clip=dual_clip)
    close(loss, np_loss, rtol=FP32_CONST)
    assert set(metrics) == set(np_metrics)
    for key, value in np_metrics.items():
        assert metrics[key].asnumpy() == pytest.approx(value, rel=1e-12), key
    assert np_metrics["clipfrac_low"] > 0 and np_metrics["clipfrac_high"] > 0
    assert (np_metrics["dual_clipfrac"] > 0) == (dual_clip is not None)


@pytest.mark.parametrize("mode", MODES)
def test_aggregate_matches_numpy(mode):
    rng = np.random.default_rng(12)
    loss, mask = rng.normal(size=(5, 6)), (rng.random((5, 6)) < 0.5).astype(np.float64)
    mask[2] = 0.0  # an empty row
    agg = Aggregate(mode)
    close(agg(t(loss), t(mask)), algos.aggregate(loss, mask, mode), rtol=1e-12)
    close(agg(t(loss), t(mask), t(40.0), t(9.0)),
          algos.aggregate(loss, mask, mode, global_tokens=40.0, global_seqs=9.0), rtol=1e-12)
    close(Aggregate(mode, max_len=10)(t(loss), t(mask)), algos.aggregate(loss, mask, mode, max_len=10), rtol=1e-12)
    assert Aggregate(mode)(t(loss), t(np.zeros_like(mask))).asnumpy() == 0.0


@pytest.mark.parametrize("mode,kind,dual_clip", [
    ("token-mean", "low_var_kl", None),
    ("seq-mean-token-mean", "k3", None),
    ("seq-mean-token-sum-norm", "k2", 1.6),
    ("token-mean", "k1", 2.0),
])
def test_grpo_loss_matches_numpy(mode, kind, dual_clip):
    rng = np.random.default_rng(13)
    logp, old, ref, adv, mask = random_batch(rng, B=8, spread=0.8)
    cell = GRPOLoss(beta=0.05, kl_kind=kind, clip_low=0.2, clip_high=0.28, dual_clip=dual_clip, agg_mode=mode)
    loss, metrics = cell(t(logp), t(old), t(ref), t(adv), t(mask))
    np_loss, np_metrics = objective.grpo_loss(logp, old, ref, adv, mask, beta=0.05, kl_kind=kind, clip_low=0.2,
                                          clip_high=0.28, dual_clip=dual_clip, agg_mode=mode)
    assert loss.asnumpy() == pytest.approx(np_loss, rel=FP32_CONST, abs=FP32_CONST)
    assert set(metrics) == set(np_metrics)
    for key, value in np_metrics.items():
        assert metrics[key].asnumpy() == pytest.approx(value, rel=FP32_CONST, abs=FP32_CONST), key


def test_grpo_loss_float32_and_no_reference():
    rng = np.random.default_rng(14)
    logp, old, ref, adv, mask = random_batch(rng)
    f32 = [t(a, ms.float32) for a in (logp, old, ref, adv, mask)]
    loss, _ = GRPOLoss(beta=0.1, kl_kind="k3", agg_mode="seq-mean-token-mean")(*f32)
    np_loss, _ = objective.grpo_loss(logp, old, ref, adv, mask, beta=0.1, kl_kind="k3", agg_mode="seq-mean-token-mean")
    assert loss.dtype == ms.float32 and loss.asnumpy() == pytest.approx(np_loss, rel=1e-5)
    # beta 0: ref_logp may be None, and the loss is the policy term alone
    loss, metrics = GRPOLoss()(t(logp), t(old), None, t(adv), t(mask))
    assert loss.asnumpy() == pytest.approx(objective.grpo_loss(logp, old, None, adv, mask)[0], rel=FP32_CONST)
    assert "kl" not in metrics


def test_names_and_arguments_fail_at_build_time():
    with pytest.raises(KeyError, match="valid names: k1, k2, k3, low_var_kl"):
        GRPOLoss(kl_kind="kl")
    with pytest.raises(KeyError, match="valid names: seq-mean-token-mean, seq-mean-token-sum-norm, token-mean"):
        GRPOLoss(agg_mode="token-sum")
    with pytest.raises(KeyError, match="unknown policy loss"):
        GRPOLoss(policy_loss="ppo")
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        GRPOLoss(dual_clip=0.5)
    # the MindSpore registries carry exactly the numpy names
    assert ms_algos.KL_ESTIMATORS.names() == algos.KL_ESTIMATORS.names()
    assert ms_algos.AGG_MODES.names() == algos.AGG_MODES.names()
    assert ms_algos.POLICY_LOSSES.names() == algos.POLICY_LOSSES.names()


def test_beta_without_reference_fails():
    logp = t(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="needs ref_logp"):
        GRPOLoss(beta=0.1)(logp, logp, None, t(np.ones(2)), t(np.ones((2, 3))))


# ---------------------------------------------------------------------------------------
# gradients w.r.t. logp
# ---------------------------------------------------------------------------------------


def ms_grad(cell, logp, old, ref, adv, mask, *norms):
    fn = ms.value_and_grad(cell, grad_position=0, has_aux=True)
    (loss, _), grad = fn(t(logp), t(old), None if ref is None else t(ref), t(adv), t(mask), *norms)
    return loss.asnumpy(), grad.asnumpy()


@pytest.mark.parametrize("loss_type", list(TRL_MODES))
def test_gradient_matches_trl_autograd(loss_type):
    rng = np.random.default_rng(15)
    logp, old, ref, adv, mask = random_batch(rng)
    max_len = mask.shape[1] + 3
    torch_logp, *rest = torch_of(logp, old, ref, adv, mask)
    torch_logp.requires_grad_(True)
    trl_loss, _ = TRLLoss(loss_type, 0.04, 0.2, 0.28, max_len)(torch_logp, *rest)
    trl_loss.backward()
    cell = GRPOLoss(beta=0.04, kl_kind="k3", clip_low=0.2, clip_high=0.28, agg_mode=TRL_MODES[loss_type],
                    max_len=max_len)
    loss, grad = ms_grad(cell, logp, old, ref, adv, mask)
    assert loss == pytest.approx(trl_loss.item(), rel=FP32_CONST)
    np.testing.assert_allclose(grad, torch_logp.grad.numpy(), rtol=FP32_CONST, atol=1e-14)
    assert np.all(grad[mask == 0] == 0) and np.any(grad != 0)


def numeric_grad(logp, old, ref, adv, mask, kw, h=1e-6):
    """d objective.grpo_loss / d logp by central differences (float64), one element at a time."""
    fd = np.zeros_like(logp)
    for idx in np.ndindex(logp.shape):
        up, down = logp.copy(), logp.copy()
        up[idx] += h
        down[idx] -= h
        fd[idx] = (objective.grpo_loss(up, old, ref, adv, mask, **kw)[0]
                   - objective.grpo_loss(down, old, ref, adv, mask, **kw)[0]) / (2 * h)
    return fd


@pytest.mark.parametrize("mode,kind,dual_clip", [
    ("token-mean", "low_var_kl", 1.6),
    ("seq-mean-token-mean", "k1", 1.6),
    ("seq-mean-token-sum-norm", "k2", None),
])
def test_gradient_matches_finite_differences(mode, kind, dual_clip):
    rng = np.random.default_rng(16)
    logp, old, ref, adv, mask = random_batch(rng, B=4, R=5, spread=0.8)
    kw = dict(beta=0.1, kl_kind=kind, clip_low=0.2, clip_high=0.28, dual_clip=dual_clip, agg_mode=mode)
    _, grad = ms_grad(GRPOLoss(**kw), logp, old, ref, adv, mask)
    np.testing.assert_allclose(grad, numeric_grad(logp, old, ref, adv, mask, kw), rtol=1e-6, atol=1e-8)
    if dual_clip is not None:  # the dual clip is active somewhere, so its zero gradient is tested
        _, m = algos.policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, dual_clip=dual_clip)
        assert m["dual_clipfrac"] > 0


@pytest.mark.parametrize("mode", MODES)
def test_micro_batches_with_global_counts_match_full_batch(mode):
    """Loss and gradient do not depend on how the batch is split, given the global counts."""
    rng = np.random.default_rng(17)
    logp, old, ref, adv, mask = random_batch(rng, B=6)
    mask[1] = 0.0
    cell = GRPOLoss(beta=0.1, kl_kind="k3", agg_mode=mode)
    full_loss, full_grad = ms_grad(cell, logp, old, ref, adv, mask)
    g_tokens, g_seqs = t(algos.num_tokens(mask)), t(algos.num_seqs(mask))
    losses, grads = zip(*(ms_grad(cell, logp[h], old[h], ref[h], adv[h], mask[h], g_tokens, g_seqs)
                          for h in (slice(0, 2), slice(2, 6))))
    assert sum(losses) == pytest.approx(full_loss, rel=1e-12)
    np.testing.assert_allclose(np.concatenate(grads), full_grad, rtol=1e-12, atol=1e-15)

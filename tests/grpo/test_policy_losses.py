"""The policy losses besides ppo_clip (gspo, cispo, sapo, gmpo) and the top-entropy mask: by hand,
as loops over tokens, against TRL 1.16's own `_compute_loss` (`TRLLoss` of test_algos.py: gspo is
TRL's importance_sampling_level="sequence", cispo and sapo its loss types, the dual clip its
`delta`, top_entropy_quantile its own), and the MindSpore twins against numpy and TRL's autograd.
GMPO is not in TRL: its gradient is checked against finite differences of the numpy loss.
"""

import math

import mindspore as ms
import numpy as np
import pytest
import torch
from mindspore import Tensor, nn

from mindgrpo.grpo import algos, ms_algos
from mindgrpo.grpo.algos import POLICY_LOSSES, top_entropy_mask
from mindgrpo.grpo.objective import grpo_loss
from mindgrpo.grpo.ms_objective import GRPOLoss
from test_algos import HAND_ADV, HAND_MASK, HAND_RATIOS, TRLLoss, random_batch, torch_of
from test_ms_algos import numeric_grad

LN = math.log
FP32_CONST = 1e-7  # Python-float settings are float32 constants in the graph (see test_ms_algos.py)
# each loss with settings that make it bite on random_batch(spread=0.8)
SETTINGS = {
    "ppo_clip": dict(clip_low=0.2, clip_high=0.28, dual_clip=1.6),
    "gspo": dict(clip_low=0.05, clip_high=0.08, dual_clip=1.3),
    "cispo": dict(cispo_epsilon_max=1.5),
    "sapo": dict(sapo_temperature_pos=1.0, sapo_temperature_neg=1.25),  # float32-exact: TRL makes them float32
    "gmpo": dict(gmpo_epsilon=0.4),
}


def hand(name, **settings):
    return POLICY_LOSSES.get(name)(np.log(HAND_RATIOS), np.zeros((2, 3)), HAND_ADV, HAND_MASK, **settings)


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


# ---------------------------------------------------------------------------------------
# by hand: row 0: A = +1, ratios [1.5, 0.5, (padding)]; row 1: A = -1, ratios [0.5, 1.5, 1.0]
# ---------------------------------------------------------------------------------------


def test_gspo_by_hand():
    # sequence ratios: row 0 exp((ln 1.5 + ln 0.5) / 2) = sqrt(0.75); row 1 exp(ln 0.75 / 3) = 0.75^(1/3)
    s0, s1 = math.sqrt(0.75), 0.75 ** (1 / 3)
    loss, m = hand("gspo", clip_low=0.2, clip_high=0.2)  # both inside [0.8, 1.2]: -s * A
    np.testing.assert_allclose(loss, [[-s0, -s0, -s0], [s1, s1, s1]], rtol=1e-12)
    assert m["clipfrac"] == 0.0
    # clip [0.95, 1.05]: row 0 (A > 0, s < 0.95) keeps -s0; row 1 (A < 0, s < 0.95) is clipped to 0.95
    loss, m = hand("gspo", clip_low=0.05, clip_high=0.05)
    np.testing.assert_allclose(loss, [[-s0, -s0, -s0], [0.95, 0.95, 0.95]], rtol=1e-12)
    assert m["clipfrac_low"] == pytest.approx(3 / 5) and m["clipfrac_high"] == 0.0  # row 1's 3 tokens of 5


def test_cispo_by_hand():
    # weights min(r, 1.2): [1.2, 0.5, 1], [0.5, 1.2, 1]; loss = -w * A * logp
    loss, m = hand("cispo", cispo_epsilon_max=1.2)
    np.testing.assert_allclose(loss, [[-1.2 * LN(1.5), -0.5 * LN(0.5), 0.0], [0.5 * LN(0.5), 1.2 * LN(1.5), 0.0]],
                               rtol=1e-12, atol=1e-15)
    assert m["clipfrac_high"] == pytest.approx(2 / 5) and m["clipfrac_low"] == 0.0  # the two r = 1.5 tokens


def test_sapo_by_hand():
    loss, m = hand("sapo", sapo_temperature_pos=1.0, sapo_temperature_neg=1.05)
    # A = +1 (tau 1): -4 sigmoid(r - 1); A = -1 (tau 1.05): +(4 / 1.05) sigmoid(1.05 (r - 1))
    expected = [[-4 * sigmoid(0.5), -4 * sigmoid(-0.5), -4 * sigmoid(0.0)],
                [4 / 1.05 * sigmoid(-0.525), 4 / 1.05 * sigmoid(0.525), 4 / 1.05 * sigmoid(0.0)]]
    np.testing.assert_allclose(loss, expected, rtol=1e-12)
    assert m["clipfrac"] == 0.0
    # at r = 1 its slope in log r is -A, as the surrogate r * A's: centred differences around ratio 1
    h, adv = 1e-6, np.array([2.0, -3.0])
    up = POLICY_LOSSES.get("sapo")(np.full((2, 1), h), np.zeros((2, 1)), adv, np.ones((2, 1)))[0]
    down = POLICY_LOSSES.get("sapo")(np.full((2, 1), -h), np.zeros((2, 1)), adv, np.ones((2, 1)))[0]
    np.testing.assert_allclose((up - down)[:, 0] / (2 * h), -adv, rtol=1e-8)


def test_gmpo_by_hand():
    # row 0 (A > 0): d = [0.405.., -0.693..] -> min(d, clip(d, -0.4, 0.4)) = [0.4, ln 0.5]
    # row 1 (A < 0): d = [ln 0.5, ln 1.5, 0] -> max(d, clip(d)) = [-0.4, ln 1.5, 0]
    r0 = math.exp((0.4 + LN(0.5)) / 2)  # 0.8636...
    r1 = math.exp((-0.4 + LN(1.5)) / 3)  # 1.0018...
    loss, m = hand("gmpo", gmpo_epsilon=0.4)
    np.testing.assert_allclose(loss, [[-r0, -r0, -r0], [r1, r1, r1]], rtol=1e-12)
    assert m["clipfrac_high"] == pytest.approx(1 / 5) and m["clipfrac_low"] == pytest.approx(1 / 5)


def test_top_entropy_mask_by_hand():
    entropy = np.array([[0.1, 0.5, 9.0], [0.3, 0.9, 0.7]])  # 9.0 sits under the mask
    # the five valid entropies sorted: 0.1 0.3 0.5 0.7 0.9
    # rho 0.4: the 0.6 quantile at position 0.6 * 4 = 2.4: 0.5 + 0.4 * 0.2 = 0.58 -> 0.7 and 0.9
    np.testing.assert_array_equal(top_entropy_mask(entropy, HAND_MASK, 0.4), [[0, 0, 0], [0, 1, 1]])
    np.testing.assert_array_equal(top_entropy_mask(entropy, HAND_MASK, 0.5), [[0, 1, 0], [0, 1, 1]])  # >= 0.5
    np.testing.assert_array_equal(top_entropy_mask(entropy, HAND_MASK, 0.0), [[0, 0, 0], [0, 1, 0]])  # the top
    np.testing.assert_array_equal(top_entropy_mask(entropy, HAND_MASK, 1.0), HAND_MASK)
    np.testing.assert_array_equal(top_entropy_mask(entropy, np.zeros((2, 3)), 0.2), np.zeros((2, 3)))
    # in the loss: masked tokens add nothing but still count (TRL): token-mean over all 5 tokens
    loss, _ = grpo_loss(np.log(HAND_RATIOS), np.zeros((2, 3)), None, HAND_ADV, HAND_MASK, entropy=entropy,
                        top_entropy_quantile=0.4)
    assert loss == pytest.approx((1.5 + 1.0) / 5)  # the ppo_clip losses of the two kept tokens (by-hand values)
    with pytest.raises(ValueError, match="needs entropy"):
        grpo_loss(np.log(HAND_RATIOS), np.zeros((2, 3)), None, HAND_ADV, HAND_MASK, top_entropy_quantile=0.4)


# ---------------------------------------------------------------------------------------
# loops over tokens
# ---------------------------------------------------------------------------------------


def token_loss(name, lp, old, a, seq_log_ratio, seq_mean_d, s):
    """The loss of one token, from its own numbers and its sequence's (settings s)."""
    r = math.exp(lp - old)
    if name == "gspo":
        q = math.exp(seq_log_ratio)
        loss = -min(q * a, min(max(q, 1 - s["clip_low"]), 1 + s["clip_high"]) * a)
        return min(loss, -s["dual_clip"] * a) if a < 0 else loss
    if name == "cispo":
        return -min(r, s["cispo_epsilon_max"]) * a * lp
    if name == "sapo":
        tau = s["sapo_temperature_pos"] if a > 0 else s["sapo_temperature_neg"]
        return -4 / tau * sigmoid(tau * (r - 1)) * a
    return -a * math.exp(seq_mean_d)  # gmpo


@pytest.mark.parametrize("name", ["gspo", "cispo", "sapo", "gmpo"])
def test_loop_vs_vectorised(name):
    rng = np.random.default_rng(21)
    logp, old, _, adv, mask = random_batch(rng, B=8, spread=0.8)
    s = SETTINGS[name]
    loss, m = POLICY_LOSSES.get(name)(logp, old, adv, mask, **s)
    clipped = 0
    for i in range(8):
        toks = [j for j in range(7) if mask[i, j]]
        seq_log_ratio = sum(logp[i, j] - old[i, j] for j in toks) / len(toks)
        eps = s.get("gmpo_epsilon", 0.0)
        pess = [(min if adv[i] >= 0 else max)(logp[i, j] - old[i, j], min(max(logp[i, j] - old[i, j], -eps), eps))
                for j in toks]
        for j in toks:
            expected = token_loss(name, logp[i, j], old[i, j], adv[i], seq_log_ratio, sum(pess) / len(toks), s)
            assert loss[i, j] == pytest.approx(expected, rel=1e-12, abs=1e-15)
            if name == "gmpo":
                d = logp[i, j] - old[i, j]
                clipped += (d > eps and adv[i] > 0) or (d < -eps and adv[i] < 0)
    if name in ("gspo", "cispo", "gmpo"):
        assert m["clipfrac"] > 0  # the case makes the clip bite
    if name == "gmpo":
        assert m["clipfrac"] == pytest.approx(clipped / mask.sum())


# ---------------------------------------------------------------------------------------
# against TRL's _compute_loss
# ---------------------------------------------------------------------------------------

# (our policy loss and settings, our aggregation, TRL's loss_type and settings)
TRL_CASES = [
    ("gspo", dict(clip_low=3e-2, clip_high=4e-2), "seq-mean-token-mean", "grpo",
     dict(importance_sampling_level="sequence")),
    ("gspo", dict(clip_low=3e-2, clip_high=4e-2), "token-mean", "dapo", dict(importance_sampling_level="sequence")),
    ("gspo", dict(clip_low=0.05, clip_high=0.08, dual_clip=1.3), "seq-mean-token-mean", "grpo",
     dict(importance_sampling_level="sequence", delta=1.3)),
    ("ppo_clip", dict(clip_low=0.2, clip_high=0.28, dual_clip=1.6), "token-mean", "dapo", dict(delta=1.6)),
    ("cispo", dict(cispo_epsilon_max=1.5), "token-mean", "cispo", dict(clip_high=1.5)),
    ("sapo", SETTINGS["sapo"], "seq-mean-token-mean", "sapo", SETTINGS["sapo"]),
    ("sapo", dict(sapo_temperature_pos=0.5, sapo_temperature_neg=2.0), "seq-mean-token-mean", "sapo",
     dict(sapo_temperature_pos=0.5, sapo_temperature_neg=2.0)),
]


def trl_loss(loss_type, beta, trl_settings, top_entropy_quantile=1.0):
    kw = dict(clip_low=0.2, clip_high=0.28)
    kw.update(trl_settings)
    clip_low, clip_high = kw.pop("clip_low"), kw.pop("clip_high")
    return TRLLoss(loss_type, beta, clip_low, clip_high, 10, top_entropy_quantile=top_entropy_quantile, **kw)


def trl_clip(name, settings):
    """TRL's epsilon / epsilon_high for our settings."""
    if name == "cispo":
        return dict(clip_high=settings["cispo_epsilon_max"])
    return {k: settings[k] for k in ("clip_low", "clip_high") if k in settings}


@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("name,settings,mode,loss_type,trl_settings", TRL_CASES)
def test_matches_trl(name, settings, mode, loss_type, trl_settings, beta):
    rng = np.random.default_rng(22)
    logp, old, ref, adv, mask = random_batch(rng, B=8, spread=0.8)
    trl = trl_loss(loss_type, beta, {**trl_clip(name, settings), **trl_settings})
    expected, _ = trl(*torch_of(logp, old, ref, adv, mask))
    loss, m = grpo_loss(logp, old, ref if beta else None, adv, mask, beta=beta, kl_kind="k3", agg_mode=mode,
                        policy_loss=name, **settings)
    assert loss == pytest.approx(expected.item(), rel=1e-12, abs=1e-14)
    if name in ("gspo", "cispo") or "delta" in trl_settings:
        assert m["clipfrac"] > 0


@pytest.mark.parametrize("name", ["ppo_clip", "gspo", "sapo"])
def test_top_entropy_quantile_matches_trl(name):
    rng = np.random.default_rng(23)
    logp, old, ref, adv, mask = random_batch(rng, B=8, spread=0.8)
    entropy = rng.gamma(2.0, 1.0, mask.shape)
    settings = {k: v for k, v in SETTINGS[name].items() if k != "dual_clip"}
    trl_settings = dict(importance_sampling_level="sequence") if name == "gspo" else {}
    loss_type = "sapo" if name == "sapo" else "grpo"
    if name == "sapo":
        trl_settings = settings
    trl = trl_loss(loss_type, 0.04, {**trl_clip(name, settings), **trl_settings}, top_entropy_quantile=0.2)
    t_logp, t_old, t_ref, t_adv, t_mask = torch_of(logp, old, ref, adv, mask)
    expected, _ = trl(t_logp, t_old, t_ref, t_adv, t_mask, entropy=torch.tensor(entropy))
    loss, _ = grpo_loss(logp, old, ref, adv, mask, beta=0.04, kl_kind="k3", agg_mode="seq-mean-token-mean",
                        policy_loss=name, entropy=entropy, top_entropy_quantile=0.2, **settings)
    assert loss == pytest.approx(expected.item(), rel=1e-12)
    kept = top_entropy_mask(entropy, mask, 0.2).sum()
    assert 0 < kept < mask.sum()
    np.testing.assert_array_equal(
        top_entropy_mask(entropy, mask, 0.2),
        trl.get_high_entropy_mask(torch.tensor(entropy), torch.tensor(mask), 0.8).numpy())


# ---------------------------------------------------------------------------------------
# MindSpore against numpy, TRL's autograd and finite differences
# ---------------------------------------------------------------------------------------


def t(x, dtype=ms.float64):
    return Tensor(np.asarray(x), dtype)


class OneLoss(nn.Cell):
    def __init__(self, name, settings):
        super().__init__()
        self.fn, self.settings = ms_algos.POLICY_LOSSES.get(name), settings

    def construct(self, logp, old_logp, advantages, mask):
        return self.fn(logp, old_logp, advantages, mask, **self.settings)


class EntropyMask(nn.Cell):
    def __init__(self, rho):
        super().__init__()
        self.q = Tensor(1.0 - rho, ms.float64)

    def construct(self, entropy, mask):
        return ms_algos.top_entropy_mask(entropy, mask, self.q)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_ms_loss_matches_numpy(graph_mode, name):
    rng = np.random.default_rng(24)
    logp, old, _, adv, mask = random_batch(rng, B=8, spread=0.8)
    adv_tok = adv[:, None] * rng.random((1, 7))  # (B, R) advantages
    for a in (adv, adv_tok):
        loss, metrics = OneLoss(name, SETTINGS[name])(t(logp), t(old), t(a), t(mask))
        np_loss, np_metrics = POLICY_LOSSES.get(name)(logp, old, a, mask, **SETTINGS[name])
        np.testing.assert_allclose(loss.asnumpy(), np_loss, rtol=FP32_CONST, atol=FP32_CONST)
        assert set(metrics) == set(np_metrics)
        for key, value in np_metrics.items():
            assert metrics[key].asnumpy() == pytest.approx(value, rel=FP32_CONST, abs=1e-12), key


def test_ms_top_entropy_mask_matches_numpy(graph_mode):
    rng = np.random.default_rng(25)
    mask = (rng.random((6, 9)) < 0.7).astype(np.float64)
    entropy = rng.gamma(2.0, 1.0, mask.shape)
    entropy[0, :4] = entropy[1, 0]  # ties
    for rho in (0.2, 0.37, 0.0):
        got = EntropyMask(rho)(t(entropy), t(mask)).asnumpy()
        np.testing.assert_array_equal(got, top_entropy_mask(entropy, mask, rho))
    # float32, positions landing exactly on a value (n = 11 tokens, 0.8 * 10 = 8): the 9th value is kept
    m11 = np.zeros((2, 8), np.float32)
    m11.reshape(-1)[:11] = 1
    e11 = rng.permutation(np.arange(16, dtype=np.float32)).reshape(2, 8)
    got = EntropyMask(0.2)(t(e11, ms.float32), t(m11, ms.float32)).asnumpy()
    np.testing.assert_array_equal(got, top_entropy_mask(e11, m11, 0.2))
    assert got.sum() == 3
    assert EntropyMask(0.2)(t(entropy), t(np.zeros_like(mask))).asnumpy().sum() == 0


def ms_grad(cell, logp, old, ref, adv, mask, entropy=None):
    fn = ms.value_and_grad(cell, grad_position=0, has_aux=True)
    (loss, _), grad = fn(t(logp), t(old), None if ref is None else t(ref), t(adv), t(mask), None, None,
                         None if entropy is None else t(entropy))
    return loss.asnumpy(), grad.asnumpy()


@pytest.mark.parametrize("name,settings,mode,loss_type,trl_settings", [TRL_CASES[i] for i in (0, 2, 4, 5)])
def test_ms_gradient_matches_trl_autograd(graph_mode, name, settings, mode, loss_type, trl_settings):
    rng = np.random.default_rng(26)
    logp, old, ref, adv, mask = random_batch(rng, B=6, spread=0.8)
    entropy = rng.gamma(2.0, 1.0, mask.shape)
    torch_logp, *rest = torch_of(logp, old, ref, adv, mask)
    torch_logp.requires_grad_(True)
    trl = trl_loss(loss_type, 0.04, {**trl_clip(name, settings), **trl_settings}, top_entropy_quantile=0.5)
    expected, _ = trl(torch_logp, *rest, entropy=torch.tensor(entropy))
    expected.backward()
    cell = GRPOLoss(beta=0.04, kl_kind="k3", agg_mode=mode, policy_loss=name, top_entropy_quantile=0.5, **settings)
    loss, grad = ms_grad(cell, logp, old, ref, adv, mask, entropy)
    assert loss == pytest.approx(expected.item(), rel=FP32_CONST)
    np.testing.assert_allclose(grad, torch_logp.grad.numpy(), rtol=FP32_CONST, atol=1e-12)
    assert np.all(grad[mask == 0] == 0) and np.any(grad != 0)


def test_ms_gmpo_gradient_matches_finite_differences(graph_mode):
    rng = np.random.default_rng(27)
    logp, old, _, adv, mask = random_batch(rng, B=4, R=5, spread=0.8)
    kw = dict(agg_mode="seq-mean-token-mean", policy_loss="gmpo", gmpo_epsilon=0.4)
    _, grad = ms_grad(GRPOLoss(**kw), logp, old, None, adv, mask)
    np.testing.assert_allclose(grad, numeric_grad(logp, old, None, adv, mask, kw), rtol=1e-6, atol=1e-9)
    assert algos.gmpo_loss(logp, old, adv, mask, gmpo_epsilon=0.4)[1]["clipfrac"] > 0  # clipped tokens: no gradient
    assert np.any(grad[mask != 0] == 0) and np.any(grad != 0)

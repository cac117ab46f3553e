"""Advantage estimators (mindgrpo.grpo.algos.ADVANTAGES) and the one reward std convention.

grpo is tested by hand and against TRL in test_algos.py; here: dr_grpo, rloo and
reinforce_plus_plus_baseline by hand, as loops over samples, and rloo against the lines of TRL's
RLOOTrainer that compute it (`trl_rloo_advantages`: they live inside its 300-line
`_generate_and_score_completions`, so they are restated here, with TRL's own `nanstd`).
"""

import statistics

import numpy as np
import pytest
import torch
from trl.trainer.utils import nanstd

from mindgrpo.grpo.algos import ADVANTAGES, dr_grpo_advantages, group_advantages, reinforce_pp_baseline_advantages, \
    rloo_advantages
from mindgrpo.utils.stats import sample_std
from test_algos import trl_advantages

REWARDS = np.array([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])  # two groups of G = 4


def trl_rloo_advantages(rewards, group_size, normalize=False):
    """TRL 1.16.0 rloo_trainer.py lines 1676-1696 (no unscorable rewards, no reward clipping, beta 0)."""
    rewards = torch.as_tensor(rewards, dtype=torch.float64)
    grouped = rewards.view(-1, group_size)
    counts = (~torch.isnan(grouped)).sum(dim=1, keepdim=True)
    baselines = ((torch.nansum(grouped, dim=1, keepdim=True) - grouped) / (counts - 1)).view(-1)
    advantages = rewards - baselines
    if normalize:
        advantages = (advantages - torch.nanmean(advantages)) / (nanstd(advantages) + 1e-4)
    return advantages.numpy()


def test_dr_grpo_by_hand():
    # group 0: mean 0.25 -> [0.75, -0.25, -0.25, -0.25]; group 1: all equal -> 0
    adv, metrics = dr_grpo_advantages(REWARDS, 4)
    np.testing.assert_allclose(adv, [0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0])
    assert metrics["frac_reward_zero_std"] == 0.5
    np.testing.assert_array_equal(adv, group_advantages(REWARDS, 4, advantage_scale="none")[0])


def test_dr_grpo_matches_trl():
    rewards = np.random.default_rng(0).integers(0, 3, 24).astype(np.float64)
    np.testing.assert_allclose(dr_grpo_advantages(rewards, 6)[0], trl_advantages(rewards, 6, "none"), rtol=1e-12)


def test_rloo_by_hand():
    # group 0, sample 0: 1 - mean(0, 0, 0) = 1; samples 1-3: 0 - mean(1, 0, 0) = -1/3; group 1: 1 - 1 = 0
    adv, metrics = rloo_advantages(REWARDS, 4)
    np.testing.assert_allclose(adv, [1.0, -1 / 3, -1 / 3, -1 / 3, 0, 0, 0, 0], rtol=1e-15)
    assert metrics["advantage_abs_mean"] == pytest.approx(2.0 / 8)
    # = G / (G - 1) times the centred rewards
    np.testing.assert_allclose(adv, 4 / 3 * dr_grpo_advantages(REWARDS, 4)[0], rtol=1e-15, atol=1e-16)
    with pytest.raises(ValueError, match="group_size=1 >= 2"):
        rloo_advantages(REWARDS, 1)


def test_rloo_loop_vs_vectorised_and_trl():
    rng = np.random.default_rng(1)
    rewards, G = rng.normal(size=30), 5
    adv, _ = rloo_advantages(rewards, G)
    for i, r in enumerate(rewards):
        others = [rewards[j] for j in range(i // G * G, i // G * G + G) if j != i]
        assert adv[i] == pytest.approx(r - statistics.fmean(others), rel=1e-12)
    np.testing.assert_allclose(adv, trl_rloo_advantages(rewards, G), rtol=1e-12)


def test_reinforce_pp_baseline_by_hand():
    # centred: [0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0]; their mean is 0; sample std over 8:
    #   sum of squares 0.5625 + 3 * 0.0625 = 0.75, / 7 -> std sqrt(0.75 / 7) = 0.3273268353539886
    adv, _ = reinforce_pp_baseline_advantages(REWARDS, 4, advantage_eps=0.0)
    std = 0.3273268353539886
    np.testing.assert_allclose(adv, [0.75 / std, -0.25 / std, -0.25 / std, -0.25 / std, 0, 0, 0, 0], rtol=1e-12)
    adv_eps, _ = reinforce_pp_baseline_advantages(REWARDS, 4, advantage_eps=1e-6)
    np.testing.assert_allclose(adv_eps, adv * std / (std + 1e-6), rtol=1e-12)


def test_reinforce_pp_baseline_loop_vs_vectorised():
    rng = np.random.default_rng(2)
    rewards, G = rng.normal(size=24), 4
    adv, _ = reinforce_pp_baseline_advantages(rewards, G, advantage_eps=1e-6)
    centred = [r - statistics.fmean(list(rewards[i // G * G:i // G * G + G])) for i, r in enumerate(rewards)]
    mu, sd = statistics.fmean(centred), statistics.stdev(centred)
    for a, c in zip(adv, centred):
        assert a == pytest.approx((c - mu) / (sd + 1e-6), rel=1e-10)
    # the batch's advantages are whitened
    assert adv.mean() == pytest.approx(0.0, abs=1e-12) and sample_std(adv) == pytest.approx(1.0, rel=1e-5)


@pytest.mark.parametrize("name", ADVANTAGES.names())
def test_every_estimator_checks_its_input_and_reports_metrics(name):
    estimate = ADVANTAGES.get(name)
    with pytest.raises(ValueError, match="multiple of group_size"):
        estimate(np.zeros(7), 4)
    adv, metrics = estimate(np.arange(8, dtype=np.float32), 4)
    assert adv.shape == (8,) and np.all(np.isfinite(adv))
    assert set(metrics) == {"reward_mean", "reward_std", "frac_reward_zero_std", "advantage_abs_mean"}
    # an all-equal batch has no signal: every advantage is 0, not nan
    adv, _ = estimate(np.ones(8), 4)
    np.testing.assert_array_equal(adv, np.zeros(8))


def test_sample_std_is_the_one_convention():
    x = np.array([1.0, 2.0, 4.0])
    assert sample_std(x) == pytest.approx(statistics.stdev(x), rel=1e-15)  # n - 1 = 2
    assert sample_std(np.array([5.0])) == 0.0 and sample_std(np.array([])) == 0.0
    np.testing.assert_allclose(sample_std(np.array([[1.0, 3.0], [2.0, 2.0]]), axis=1), [np.sqrt(2.0), 0.0])
    assert sample_std(np.array([1, 3])) == pytest.approx(np.sqrt(2.0))  # integers give floats
    # and what the logged reward stds use
    assert group_advantages(x, 3)[1]["reward_std"] == pytest.approx(statistics.stdev(x))

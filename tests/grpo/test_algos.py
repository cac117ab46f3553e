"""Tests for mindgrpo.grpo.algos: hand-computed cases, loop-vs-vectorised, and parity with TRL.

The TRL reference is TRL's own code: `TRLLoss` below binds `trl.GRPOTrainer._compute_loss`
(TRL 1.16.0, trainer/grpo_trainer.py lines 3020-3291) and `get_high_entropy_mask` to a minimal
object with the attributes they read, and feeds it torch tensors through a fake
`_get_per_token_logps_and_entropies`.
Only the advantage computation is re-implemented (it lives inside the 440-line
`_generate_and_score_completions`); it calls TRL's own `nanstd` (see `trl_advantages`).
`TRLLoss` is also used by test_ms_algos.py for gradients.
"""

import collections
import math
import statistics
import types

import numpy as np
import pytest
import torch
import trl
from trl import GRPOTrainer
from trl.trainer.utils import nanstd

from mindgrpo.grpo import algos, corrections
from mindgrpo.grpo.objective import grpo_loss
from mindgrpo.grpo.algos import (
    ADVANTAGES,
    AGG_MODES,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    aggregate,
    group_advantages,
    kl_penalty,
    masked_mean,
    masked_sum,
    num_seqs,
    num_tokens,
    policy_loss,
)

LN = math.log


# ---------------------------------------------------------------------------------------
# TRL reference
# ---------------------------------------------------------------------------------------

# our aggregation mode (and whether it uses the global token count) for each TRL loss_type
TRL_MODES = {
    "grpo": "seq-mean-token-mean",
    "bnpo": "token-mean",
    "dr_grpo": "seq-mean-token-sum-norm",
    "dapo": "token-mean",  # normalised by num_items_in_batch, the generation batch's token count
}


class _OneProcessAccelerator:
    num_processes = 1

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x

    def pad_across_processes(self, x, dim=0, pad_index=0):
        return x


class TRLLoss:
    """Just enough of a GRPOTrainer for TRL's own `_compute_loss` to run on given log-probs.

    loss_type: TRL's; importance_sampling_level, top_entropy_quantile, delta, sapo_temperature_*:
    TRL's settings of the same names. Calls take the entropies (for top_entropy_quantile) and TRL's
    importance_sampling_ratio (the vLLM correction, see `trl_is_ratio`), when given."""

    _compute_loss = GRPOTrainer._compute_loss
    get_high_entropy_mask = GRPOTrainer.get_high_entropy_mask

    def __init__(self, loss_type, beta, clip_low, clip_high, max_completion_length, grad_accum=1,
                 steps_per_generation=1, importance_sampling_level="token", top_entropy_quantile=1.0, delta=None,
                 sapo_temperature_pos=1.0, sapo_temperature_neg=1.05):
        self.loss_type, self.beta = loss_type, beta
        self.epsilon_low, self.epsilon_high = clip_low, clip_high
        self.max_completion_length = max_completion_length
        self.current_gradient_accumulation_steps = grad_accum
        self.importance_sampling_level = importance_sampling_level
        self.top_entropy_quantile = top_entropy_quantile
        self.off_policy_mask_threshold = None
        self.use_vllm = self.vllm_importance_sampling_correction = False
        self._entropy_bonus_enabled = self.aux_loss_enabled = False
        # use_bias_correction_kl (TRL default True) multiplies the KL by the ratio; we implement plain k3
        self.args = types.SimpleNamespace(use_bias_correction_kl=False, delta=delta,
                                          steps_per_generation=steps_per_generation,
                                          sapo_temperature_pos=sapo_temperature_pos,
                                          sapo_temperature_neg=sapo_temperature_neg)
        self.accelerator = _OneProcessAccelerator()
        self.model = types.SimpleNamespace(training=True)
        self._metrics = collections.defaultdict(lambda: collections.defaultdict(list))
        self._logps = self._entropies = None

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, **kw):
        entropies = torch.zeros_like(self._logps) if self._entropies is None else self._entropies
        return self._logps, entropies, None

    def __call__(self, logp, old_logp, ref_logp, advantages, mask, num_items_in_batch=None, entropy=None,
                 is_ratio=None):
        """torch tensors in (logp may require grad); returns (loss tensor, metrics of this call)."""
        B, R = mask.shape
        self._logps, self._entropies = logp, entropy
        self._metrics.clear()
        inputs = {
            "prompt_ids": torch.zeros(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1),
            "completion_ids": torch.zeros(B, R, dtype=torch.long), "completion_mask": mask,
            "advantages": advantages, "old_per_token_logps": old_logp, "ref_per_token_logps": ref_logp,
            "num_items_in_batch": mask.sum() if num_items_in_batch is None else num_items_in_batch,
        }
        self.use_vllm = self.vllm_importance_sampling_correction = is_ratio is not None
        if is_ratio is not None:
            inputs["importance_sampling_ratio"] = is_ratio
        loss = self._compute_loss(None, inputs)
        return loss, {k: v[-1] for k, v in self._metrics["train"].items()}


def trl_advantages(rewards, group_size, scale):
    """TRL 1.16.0 grpo_trainer.py lines 2762-2788 (multi_objective_aggregation="sum_then_normalize",
    one reward function), with TRL's own `nanstd` (unbiased) and TRL's eps 1e-4."""
    rewards = torch.as_tensor(rewards, dtype=torch.float64)
    mean = torch.nanmean(rewards.view(-1, group_size), dim=1).repeat_interleave(group_size, dim=0)
    if scale == "batch":
        std = nanstd(rewards).expand_as(rewards)
    else:
        std = nanstd(rewards.view(-1, group_size), dim=1).repeat_interleave(group_size, dim=0)
    advantages = rewards - mean
    if scale != "none":
        advantages = advantages / (std + 1e-4)
    return advantages.numpy()


def random_batch(rng, B=6, R=7, spread=0.4):
    """Log-probs near each other so some ratios clip; every row keeps at least one token."""
    logp = rng.normal(-1.5, 0.7, (B, R))
    old_logp = logp + rng.normal(0.0, spread, (B, R))
    ref_logp = logp + rng.normal(0.0, spread, (B, R))
    mask = (rng.random((B, R)) < 0.7).astype(np.float64)
    mask[np.arange(B), rng.integers(0, R, B)] = 1.0
    advantages = rng.normal(0.0, 1.0, B)
    return logp, old_logp, ref_logp, advantages, mask


def torch_of(*arrays):
    return [torch.tensor(a, dtype=torch.float64) for a in arrays]


# ---------------------------------------------------------------------------------------
# masked reductions
# ---------------------------------------------------------------------------------------


def test_masked_sum_and_mean_by_hand():
    x = np.array([[1.0, 2.0, np.inf], [4.0, np.nan, 6.0]])
    mask = np.array([[1, 1, 0], [1, 0, 0]], dtype=np.float64)
    # kept: 1 + 2 + 4 = 7 over 3 tokens; the inf and nan sit under the mask
    assert masked_sum(x, mask) == 7.0
    assert masked_mean(x, mask) == pytest.approx(7.0 / 3.0)
    np.testing.assert_allclose(masked_sum(x, mask, axis=-1), [3.0, 4.0])
    np.testing.assert_allclose(masked_mean(x, mask, axis=-1), [1.5, 4.0])
    # an empty mask gives 0, not nan
    assert masked_mean(x, np.zeros_like(mask)) == 0.0
    assert num_tokens(mask) == 3.0 and num_seqs(np.vstack([mask, np.zeros(3)])) == 2.0


# ---------------------------------------------------------------------------------------
# advantages
# ---------------------------------------------------------------------------------------


def test_group_advantages_by_hand():
    rewards = np.array([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    # group 0: mean 0.25, centred [0.75, -0.25, -0.25, -0.25];
    #   unbiased var = (0.5625 + 3 * 0.0625) / 3 = 0.25, std 0.5 -> [1.5, -0.5, -0.5, -0.5]
    # group 1: all equal -> centred 0, std 0 -> 0 / (0 + eps) = 0
    adv, metrics = group_advantages(rewards, 4, advantage_scale="group", advantage_eps=1e-6)
    np.testing.assert_allclose(adv, [0.75 / 0.500001, -0.25 / 0.500001, -0.25 / 0.500001, -0.25 / 0.500001,
                                     0, 0, 0, 0], rtol=1e-12)
    assert metrics["frac_reward_zero_std"] == 0.5
    assert metrics["reward_mean"] == 0.625
    # batch: mean 0.625; five 1s deviate 0.375, three 0s deviate -0.625;
    #   unbiased var = (5 * 0.140625 + 3 * 0.390625) / 7 = 1.875 / 7, std 0.5175491695...
    adv, metrics = group_advantages(rewards, 4, advantage_scale="batch", advantage_eps=0.0)
    std = 0.5175491695067657
    np.testing.assert_allclose(adv, [0.75 / std, -0.25 / std, -0.25 / std, -0.25 / std, 0, 0, 0, 0], rtol=1e-12)
    assert metrics["reward_std"] == pytest.approx(std)
    # none (Dr.GRPO): only centred
    adv, _ = group_advantages(rewards, 4, advantage_scale="none")
    np.testing.assert_allclose(adv, [0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0])


def test_group_advantages_loop_vs_vectorised():
    rng = np.random.default_rng(1)
    rewards, G = rng.normal(size=24), 6
    adv, _ = group_advantages(rewards, G, advantage_scale="group", advantage_eps=1e-6)
    for start in range(0, 24, G):
        group = list(rewards[start:start + G])
        mu, sd = statistics.fmean(group), statistics.stdev(group)
        for i, r in enumerate(group):
            assert adv[start + i] == pytest.approx((r - mu) / (sd + 1e-6), rel=1e-12)
    adv, _ = group_advantages(rewards, G, advantage_scale="batch", advantage_eps=1e-6)
    sd = statistics.stdev(list(rewards))
    for i, r in enumerate(rewards):
        assert adv[i] == pytest.approx((r - statistics.fmean(list(rewards[i // G * G:i // G * G + G]))) / (sd + 1e-6))


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_advantages_match_trl(scale):
    rng = np.random.default_rng(2)
    rewards = rng.integers(0, 3, 32).astype(np.float64)  # ties and zero-std groups happen
    rewards[:4] = 1.0  # at least one zero-std group
    adv, _ = group_advantages(rewards, 4, advantage_scale=scale, advantage_eps=1e-4)
    # rtol 1e-7: TRL's nanstd computes Bessel's count / (count - 1) from int64 counts, which torch
    # divides in float32 (4/3 -> 1.3333334), a relative error of ~1e-8 in the std
    np.testing.assert_allclose(adv, trl_advantages(rewards, 4, scale), rtol=1e-7, atol=1e-12)


def test_group_advantages_errors_and_registry():
    with pytest.raises(ValueError, match="multiple of group_size"):
        group_advantages(np.zeros(7), 4)
    with pytest.raises(KeyError, match="valid names: batch, group, none"):
        group_advantages(np.zeros(8), 4, advantage_scale="groupwise")
    assert ADVANTAGES.get("grpo") is group_advantages
    # one sample per group: centred to 0, no nan
    adv, _ = group_advantages(np.array([3.0, 5.0]), 1)
    np.testing.assert_array_equal(adv, [0.0, 0.0])


# ---------------------------------------------------------------------------------------
# KL
# ---------------------------------------------------------------------------------------


def test_kl_by_hand():
    logp, ref = np.array([[LN(0.5)]]), np.array([[LN(0.25)]])
    # d = ref - logp = ln 0.5 = -0.693147..
    assert kl_penalty(logp, ref, "k1")[0, 0] == pytest.approx(LN(2.0))  # logp - ref
    assert kl_penalty(logp, ref, "k2")[0, 0] == pytest.approx(0.5 * LN(2.0) ** 2)  # 0.2402265
    assert kl_penalty(logp, ref, "k3")[0, 0] == pytest.approx(0.5 + LN(2.0) - 1.0)  # e^d - d - 1 = 0.1931472
    assert kl_penalty(logp, ref, "low_var_kl")[0, 0] == pytest.approx(0.5 + LN(2.0) - 1.0)
    # far apart: k3 = e^15 - 16 = 3269001.37 and e^-30 + 29 = 29, both clamped to 10
    logp, ref = np.array([[-20.0, -1.0]]), np.array([[-5.0, -31.0]])
    np.testing.assert_allclose(kl_penalty(logp, ref, "k3"), [[math.exp(15) - 16, math.exp(-30) + 29]])
    np.testing.assert_array_equal(kl_penalty(logp, ref, "low_var_kl"), [[10.0, 10.0]])
    # no overflow even at d = 1000
    assert kl_penalty(np.array([[-1000.0]]), np.array([[0.0]]), "low_var_kl")[0, 0] == 10.0
    with pytest.raises(KeyError, match="valid names: k1, k2, k3, low_var_kl"):
        kl_penalty(logp, ref, "k4")


@pytest.mark.parametrize("kind", KL_ESTIMATORS.names())
def test_kl_loop_vs_vectorised(kind):
    rng = np.random.default_rng(3)
    logp, ref = rng.normal(-2, 2, (3, 5)), rng.normal(-2, 2, (3, 5))
    scalar = {
        "k1": lambda lp, rf: lp - rf,
        "k2": lambda lp, rf: 0.5 * (lp - rf) ** 2,
        "k3": lambda lp, rf: math.exp(rf - lp) - (rf - lp) - 1,
        "low_var_kl": lambda lp, rf: min(max(math.exp(rf - lp) - (rf - lp) - 1, -10), 10),
    }[kind]
    out = kl_penalty(logp, ref, kind)
    for i in range(3):
        for j in range(5):
            assert out[i, j] == pytest.approx(scalar(logp[i, j], ref[i, j]), rel=1e-12)


# ---------------------------------------------------------------------------------------
# policy loss
# ---------------------------------------------------------------------------------------

# row 0: A = +1, ratios [1.5, 0.5, 1.0 (padding)]; row 1: A = -1, ratios [0.5, 1.5, 1.0]
HAND_RATIOS = np.array([[1.5, 0.5, 1.0], [0.5, 1.5, 1.0]])
HAND_ADV = np.array([1.0, -1.0])
HAND_MASK = np.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])


def test_policy_loss_by_hand():
    logp, old = np.log(HAND_RATIOS), np.zeros((2, 3))
    loss, m = policy_loss(logp, old, HAND_ADV, HAND_MASK, clip_low=0.2, clip_high=0.2)
    # A=+1, r=1.5: -min(1.5, 1.2) = -1.2 (high-clipped)   A=+1, r=0.5: -min(0.5, 0.8) = -0.5
    # A=-1, r=0.5: -min(-0.5, -0.8) = 0.8 (low-clipped)    A=-1, r=1.5: -min(-1.5, -1.2) = 1.5
    # r=1: -A
    np.testing.assert_allclose(loss, [[-1.2, -0.5, -1.0], [0.8, 1.5, 1.0]])
    # 5 valid tokens: one high-clipped, one low-clipped
    assert m["clipfrac_high"] == pytest.approx(0.2) and m["clipfrac_low"] == pytest.approx(0.2)
    assert m["clipfrac"] == pytest.approx(0.4) and m["dual_clipfrac"] == 0.0
    # ppo_kl = mean(old - logp) = -(ln1.5 + ln0.5 + ln0.5 + ln1.5 + 0) / 5 = -2 ln0.75 / 5
    assert m["ppo_kl"] == pytest.approx(-2 * LN(0.75) / 5)

    # dual clip c = 1.4: the A=-1, r=1.5 token's loss 1.5 is capped at c * |A| = 1.4
    loss, m = policy_loss(logp, old, HAND_ADV, HAND_MASK, dual_clip=1.4)
    np.testing.assert_allclose(loss, [[-1.2, -0.5, -1.0], [0.8, 1.4, 1.0]])
    assert m["dual_clipfrac"] == pytest.approx(0.2)
    # c = 3 does not bite here; A=-2, r=4 gives |A| * r = 8, capped at 3 * 2 = 6
    loss, _ = policy_loss(logp, old, HAND_ADV, HAND_MASK, dual_clip=3.0)
    np.testing.assert_allclose(loss, [[-1.2, -0.5, -1.0], [0.8, 1.5, 1.0]])
    loss, _ = policy_loss(np.log([[4.0]]), np.zeros((1, 1)), np.array([-2.0]), np.ones((1, 1)), dual_clip=3.0)
    assert loss[0, 0] == pytest.approx(6.0)
    # asymmetric clip (DAPO clip-higher): A=+1, r=1.5 with clip_high=0.28 -> -1.28
    loss, _ = policy_loss(logp, old, HAND_ADV, HAND_MASK, clip_high=0.28)
    assert loss[0, 0] == pytest.approx(-1.28)
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        policy_loss(logp, old, HAND_ADV, HAND_MASK, dual_clip=1.0)


def test_policy_loss_loop_vs_vectorised():
    rng = np.random.default_rng(4)
    logp, old, _, adv, mask = random_batch(rng, B=8, spread=0.8)
    adv_tok = adv[:, None] * rng.random((1, 7))  # (B, R) advantages are accepted too
    cl, ch, c = 0.2, 0.28, 1.6
    loss, m = policy_loss(logp, old, adv_tok, mask, clip_low=cl, clip_high=ch, dual_clip=c)
    low = high = dual = 0
    for i in range(mask.shape[0]):
        for j in range(mask.shape[1]):
            r, a = math.exp(logp[i, j] - old[i, j]), adv_tok[i, j]
            expected = -min(r * a, min(max(r, 1 - cl), 1 + ch) * a)
            if a < 0:
                expected = min(expected, -c * a)
            assert loss[i, j] == pytest.approx(expected, rel=1e-12)
            if mask[i, j]:
                low += r < 1 - cl and a < 0
                high += r > 1 + ch and a > 0
                dual += r > c and a < 0
    n = mask.sum()
    assert low > 0 and high > 0 and dual > 0  # the case exercises every branch
    assert m["clipfrac_low"] == pytest.approx(low / n)
    assert m["clipfrac_high"] == pytest.approx(high / n)
    assert m["clipfrac"] == pytest.approx((low + high) / n)
    assert m["dual_clipfrac"] == pytest.approx(dual / n)


# ---------------------------------------------------------------------------------------
# aggregation
# ---------------------------------------------------------------------------------------


def test_aggregate_by_hand():
    loss = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = np.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=np.float64)  # last row fully padded
    # token-mean: (1 + 2 + 4) / 3
    assert aggregate(loss, mask, "token-mean") == pytest.approx(7 / 3)
    # seq-mean-token-mean: seq means [1.5, 4], the empty row does not count: 5.5 / 2
    assert aggregate(loss, mask, "seq-mean-token-mean") == pytest.approx(2.75)
    # seq-mean-token-sum-norm: seq sums [3, 4] / R=3 -> [1, 4/3], mean over 2 seqs = 7/6
    assert aggregate(loss, mask, "seq-mean-token-sum-norm") == pytest.approx(7 / 6)
    # ... with max_len 4: [0.75, 1], mean 0.875
    assert aggregate(loss, mask, "seq-mean-token-sum-norm", max_len=4) == pytest.approx(0.875)
    # global normalisers replace the local counts: 7 / 7 and 5.5 / 5 and (7/3) / 5
    assert aggregate(loss, mask, "token-mean", global_tokens=7) == pytest.approx(1.0)
    assert aggregate(loss, mask, "seq-mean-token-mean", global_seqs=5) == pytest.approx(1.1)
    assert aggregate(loss, mask, "seq-mean-token-sum-norm", global_seqs=5) == pytest.approx(7 / 15)
    # an all-padding batch gives 0, not nan
    for mode in AGG_MODES:
        assert aggregate(loss, np.zeros_like(mask), mode) == 0.0
    with pytest.raises(KeyError, match="valid names: seq-mean-token-mean, seq-mean-token-sum-norm, token-mean"):
        aggregate(loss, mask, "seq-sum")
    with pytest.raises(ValueError, match=r"must both be \(B, R\)"):
        aggregate(loss, mask[:2], "token-mean")


@pytest.mark.parametrize("mode", AGG_MODES.names())
def test_aggregate_loop_vs_vectorised(mode):
    rng = np.random.default_rng(5)
    loss, mask = rng.normal(size=(5, 6)), (rng.random((5, 6)) < 0.5).astype(np.float64)
    mask[2] = 0.0
    tokens = [[loss[i][j] for j in range(6) if mask[i][j]] for i in range(5)]
    seqs = [t for t in tokens if t]
    expected = {
        "token-mean": sum(sum(t) for t in seqs) / sum(len(t) for t in seqs),
        "seq-mean-token-mean": sum(sum(t) / len(t) for t in seqs) / len(seqs),
        "seq-mean-token-sum-norm": sum(sum(t) / 6 for t in seqs) / len(seqs),
    }[mode]
    assert aggregate(loss, mask, mode) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("mode", AGG_MODES.names())
def test_aggregate_micro_batches_sum_to_full_batch(mode):
    """Two micro-batches of unequal token counts, each normalised by the global counts, sum to
    the full-batch loss; and so do the full-batch gradients (the loss is linear in per-token loss)."""
    rng = np.random.default_rng(6)
    loss, mask = rng.normal(size=(8, 5)), (rng.random((8, 5)) < 0.6).astype(np.float64)
    mask[1] = 0.0  # an empty row in the first micro-batch
    mask[5] = 1.0  # a full row in the second
    full = aggregate(loss, mask, mode)
    halves = [slice(0, 3), slice(3, 8)]  # unequal micro-batch sizes
    g_tokens = sum(num_tokens(mask[h]) for h in halves)
    g_seqs = sum(num_seqs(mask[h]) for h in halves)
    split = sum(aggregate(loss[h], mask[h], mode, global_tokens=g_tokens, global_seqs=g_seqs) for h in halves)
    assert split == pytest.approx(full, rel=1e-12)
    # without global counts the micro-batch means do not add up to it
    local = sum(aggregate(loss[h], mask[h], mode) for h in halves) / 2
    assert local != pytest.approx(full, rel=1e-6)


# ---------------------------------------------------------------------------------------
# grpo_loss, and parity with TRL's _compute_loss
# ---------------------------------------------------------------------------------------


def test_grpo_loss_by_hand():
    logp, old, ref = np.log(HAND_RATIOS), np.zeros((2, 3)), np.zeros((2, 3))
    # policy token-mean: (-1.2 - 0.5 + 0.8 + 1.5 + 1.0) / 5 = 0.32
    # k1 = logp - ref = ln r; token-mean = (ln1.5 + ln0.5 + ln0.5 + ln1.5 + 0) / 5 = 2 ln0.75 / 5
    loss, m = grpo_loss(logp, old, ref, HAND_ADV, HAND_MASK, beta=0.1, kl_kind="k1", agg_mode="token-mean")
    assert m["pg_loss"] == pytest.approx(0.32)
    assert m["kl_loss"] == pytest.approx(2 * LN(0.75) / 5)
    assert loss == pytest.approx(0.32 + 0.1 * 2 * LN(0.75) / 5)
    # beta 0 without a reference: the policy loss alone, no KL metric
    loss, m = grpo_loss(logp, old, None, HAND_ADV, HAND_MASK)
    assert loss == pytest.approx(0.32) and "kl" not in m
    with pytest.raises(ValueError, match="needs ref_logp"):
        grpo_loss(logp, old, None, HAND_ADV, HAND_MASK, beta=0.1)
    with pytest.raises(KeyError, match="unknown policy loss 'ppo'"):
        grpo_loss(logp, old, None, HAND_ADV, HAND_MASK, policy_loss="ppo")
    assert POLICY_LOSSES.get("ppo_clip") is policy_loss


def test_trl_version():
    # the line numbers cited above are for this version; a different TRL still runs the parity
    # tests, but check the citations when this fails
    assert trl.__version__ == "1.16.0"


@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("loss_type", list(TRL_MODES))
def test_grpo_loss_matches_trl(loss_type, beta):
    rng = np.random.default_rng(7)
    logp, old, ref, adv, mask = random_batch(rng)
    R, max_len = mask.shape[1], mask.shape[1] + 3  # TRL's max_completion_length may exceed the padded R
    trl_loss, trl_m = TRLLoss(loss_type, beta, 0.2, 0.28, max_len)(*torch_of(logp, old, ref, adv, mask))
    loss, m = grpo_loss(logp, old, ref if beta else None, adv, mask, beta=beta, kl_kind="k3", clip_low=0.2,
                        clip_high=0.28, agg_mode=TRL_MODES[loss_type], max_len=max_len)
    assert loss == pytest.approx(trl_loss.item(), rel=1e-12, abs=1e-14)
    assert m["clipfrac_low"] == pytest.approx(trl_m["clip_ratio/low_mean"], rel=1e-12)
    assert m["clipfrac_high"] == pytest.approx(trl_m["clip_ratio/high_mean"], rel=1e-12)
    assert m["clipfrac"] == pytest.approx(trl_m["clip_ratio/region_mean"], rel=1e-12)
    assert m["clipfrac_low"] > 0 and m["clipfrac_high"] > 0
    if beta:
        assert m["kl"] == pytest.approx(trl_m["kl"], rel=1e-12)


def test_micro_batches_with_global_tokens_match_trl_dapo():
    """TRL "dapo" with 2 accumulation steps normalises each micro-batch by the generation batch's
    token count; our token-mean with global_tokens does the same."""
    rng = np.random.default_rng(8)
    logp, old, ref, adv, mask = random_batch(rng, B=8)
    total = num_tokens(mask)
    ref_fn = TRLLoss("dapo", 0.04, 0.2, 0.2, 7, grad_accum=2, steps_per_generation=2)
    for h in (slice(0, 3), slice(3, 8)):
        trl_loss, _ = ref_fn(*torch_of(logp[h], old[h], ref[h], adv[h], mask[h]),
                             num_items_in_batch=torch.tensor(total))
        loss, _ = grpo_loss(logp[h], old[h], ref[h], adv[h], mask[h], beta=0.04, kl_kind="k3",
                            agg_mode="token-mean", global_tokens=total)
        assert loss == pytest.approx(trl_loss.item(), rel=1e-12)


def test_registries_hold_what_the_module_exports():
    assert ADVANTAGES.names() == ["dr_grpo", "grpo", "reinforce_plus_plus_baseline", "rloo"]
    assert POLICY_LOSSES.names() == ["cispo", "gmpo", "gspo", "ppo_clip", "sapo"]
    assert corrections.ROLLOUT_CORRECTIONS.names() == ["mask_sequence", "mask_token", "none", "tis_sequence", "tis_token"]
    assert KL_ESTIMATORS.names() == ["k1", "k2", "k3", "low_var_kl"]
    assert AGG_MODES.names() == ["seq-mean-token-mean", "seq-mean-token-sum-norm", "token-mean"]
    assert algos.REWARD_SCALES.names() == ["batch", "group", "none"]

"""GRPO math in numpy: advantages, KL estimators, policy losses, loss aggregation. The rollout
correction is in `corrections.py`, the objective that combines them in `objective.py`.

Pure functions: arrays and explicit scalars in, arrays and a metrics dict out. No config
objects, no logging, no collectives. `ms_algos.py` is the same math in MindSpore ops for the
training graph, registered under the same names, and is tested against this file.

Every token-level function takes an explicit `mask` (B, R): 1 for response tokens that
count, 0 for padding. Every token reduction goes through `masked_sum` / `masked_mean`,
and every loss reduction through `aggregate`. Reward stds are `utils.stats.sample_std`.

Registries, the one source of each kind's names (unknown names fail listing the valid ones). A
function's keyword-only parameters are its settings, named like the `rl_config` keys that set them:
    ADVANTAGES           advantage estimators   fn(rewards (B,), group_size, *, ...) -> ((B,), metrics)
    REWARD_SCALES        advantage scalings     fn(rewards (B,), group_size) -> (B,) std or None
    KL_ESTIMATORS        per-token KL           fn(logp, ref_logp) -> (B, R)
    POLICY_LOSSES        per-token policy loss  fn(logp, old_logp, advantages, mask, *, ...)
                                                    -> ((B, R) loss, metrics)
    AGG_MODES            loss aggregation       fn(loss, mask, max_len, global_tokens, global_seqs)
                                                    -> scalar
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np

from mindgrpo.utils.registry import Registry
from mindgrpo.utils.stats import sample_std

ADVANTAGES = Registry("advantage estimator")
REWARD_SCALES = Registry("advantage scale")
KL_ESTIMATORS = Registry("KL estimator")
POLICY_LOSSES = Registry("policy loss")
AGG_MODES = Registry("loss aggregation mode")

Metrics = Dict[str, float]


# ---------------------------------------------------------------------------------------
# The one masked reduction helper
# ---------------------------------------------------------------------------------------


def masked_sum(x, mask, axis=None):
    """Sum of `x * mask` over `axis`; masked-out entries contribute 0 even if `x` is inf/nan."""
    x, mask = np.asarray(x), np.asarray(mask)
    return np.sum(np.where(mask != 0, x, 0.0) * mask, axis=axis)


def masked_mean(x, mask, axis=None):
    """masked_sum / (number of mask entries, at least 1): an empty mask gives 0, not nan."""
    count = np.sum(np.asarray(mask, dtype=np.float64), axis=axis)
    return masked_sum(x, mask, axis) / np.maximum(count, 1.0)


def masked_max(x, mask):
    """Largest `x` where mask is set; 0 for an empty mask."""
    x, mask = np.asarray(x), np.asarray(mask)
    return float(np.max(x[mask != 0])) if np.any(mask != 0) else 0.0


def num_tokens(mask) -> float:
    """Tokens that count in `mask` (B, R): the default `global_tokens` of `aggregate`."""
    return float(np.sum(np.asarray(mask, dtype=np.float64)))


def num_seqs(mask) -> float:
    """Rows of `mask` (B, R) with at least one token: the default `global_seqs` of `aggregate`."""
    return float(np.sum(np.sum(np.asarray(mask, dtype=np.float64), axis=-1) > 0))


# ---------------------------------------------------------------------------------------
# Advantages: one per sample, from the rewards (B,) of B = prompts * G samples, each
# prompt's G samples adjacent
# ---------------------------------------------------------------------------------------


def _rewards(rewards, group_size: int, least: int = 1) -> np.ndarray:
    r = np.asarray(rewards)
    r = r if np.issubdtype(r.dtype, np.floating) else r.astype(np.float64)
    if r.ndim != 1 or group_size < least or r.size % group_size != 0:
        raise ValueError(f"rewards must be (B,) with B a multiple of group_size={group_size} >= {least}; "
                         f"got {r.shape}")
    return r


def _advantage_metrics(r: np.ndarray, advantages: np.ndarray, group_size: int) -> Metrics:
    group_std = sample_std(r.reshape(-1, group_size), axis=1)  # (B/G,)
    return {
        "reward_mean": float(r.mean()),
        "reward_std": float(sample_std(r)),
        "frac_reward_zero_std": float(np.mean(np.isclose(group_std, 0.0))),
        "advantage_abs_mean": float(np.abs(advantages).mean()),
    }


@REWARD_SCALES.register("group")
def _scale_by_group_std(rewards, group_size):
    # (B/G, G) -> (B/G,) -> (B,)
    return np.repeat(sample_std(rewards.reshape(-1, group_size), axis=1), group_size)


@REWARD_SCALES.register("batch")
def _scale_by_batch_std(rewards, group_size):
    return np.full_like(rewards, sample_std(rewards))


@REWARD_SCALES.register("none")
def _no_scale(rewards, group_size):
    return None


@ADVANTAGES.register("grpo")
def group_advantages(rewards, group_size: int, *, advantage_scale: str = "group", advantage_eps: float = 1e-6):
    """GRPO: advantage = (r - mean of its group) / (std + advantage_eps), where std is
        advantage_scale="group": the std of its group (TRL's scale_rewards="group"),
        advantage_scale="batch": the std of all B rewards (TRL's scale_rewards="batch"),
        advantage_scale="none":  no division (= dr_grpo).
    TRL adds eps=1e-4 to the std; verl adds 1e-6 (our default). Returns (advantages (B,), metrics).
    """
    r = _rewards(rewards, group_size)
    grouped = r.reshape(-1, group_size)  # (B/G, G)
    advantages = (grouped - grouped.mean(axis=1, keepdims=True)).reshape(-1)  # (B,)
    std = REWARD_SCALES.get(advantage_scale)(r, group_size)
    if std is not None:
        advantages = advantages / (std + advantage_eps)
    return advantages, _advantage_metrics(r, advantages, group_size)


@ADVANTAGES.register("dr_grpo")
def dr_grpo_advantages(rewards, group_size: int):
    """Dr.GRPO (Liu et al. 2025): r - mean of its group, no std division."""
    return group_advantages(rewards, group_size, advantage_scale="none")


@ADVANTAGES.register("rloo")
def rloo_advantages(rewards, group_size: int):
    """RLOO (Ahmadian et al. 2024; TRL's RLOOTrainer): r_i - the mean of the G - 1 other rewards of
    its group, which is G / (G - 1) * (r_i - group mean). Needs G >= 2."""
    r = _rewards(rewards, group_size, least=2)
    grouped = r.reshape(-1, group_size)  # (B/G, G)
    baseline = (grouped.sum(axis=1, keepdims=True) - grouped) / (group_size - 1)
    advantages = (grouped - baseline).reshape(-1)  # (B,)
    return advantages, _advantage_metrics(r, advantages, group_size)


@ADVANTAGES.register("reinforce_plus_plus_baseline")
def reinforce_pp_baseline_advantages(rewards, group_size: int, *, advantage_eps: float = 1e-6):
    """REINFORCE++ with baseline (Hu et al. 2025): a = r - mean of its group, then whitened over
    the batch's B samples: (a - mean(a)) / (std(a) + advantage_eps). (verl whitens over response
    tokens, which weighs each sample by its length; here every sample counts once.)"""
    r = _rewards(rewards, group_size)
    grouped = r.reshape(-1, group_size)  # (B/G, G)
    centred = (grouped - grouped.mean(axis=1, keepdims=True)).reshape(-1)  # (B,)
    advantages = (centred - centred.mean()) / (sample_std(centred) + advantage_eps)
    return advantages, _advantage_metrics(r, advantages, group_size)


# ---------------------------------------------------------------------------------------
# KL estimators, per token: logp, ref_logp (B, R) -> (B, R)
# ---------------------------------------------------------------------------------------


@KL_ESTIMATORS.register("k1")
def kl_k1(logp, ref_logp):
    """log(pi / pi_ref): unbiased, high variance, can be negative."""
    return logp - ref_logp


@KL_ESTIMATORS.register("k2")
def kl_k2(logp, ref_logp):
    """0.5 * log(pi / pi_ref)^2."""
    return 0.5 * np.square(logp - ref_logp)


@KL_ESTIMATORS.register("k3")
def kl_k3(logp, ref_logp):
    """exp(d) - d - 1 with d = ref_logp - logp (Schulman's k3, TRL's per_token_kl); >= 0."""
    d = ref_logp - logp
    return np.exp(d) - d - 1.0


@KL_ESTIMATORS.register("low_var_kl")
def kl_low_var(logp, ref_logp):
    """k3 clamped to [-10, 10]. d is first clamped to [-20, 20] (as verl) so exp cannot
    overflow; this does not change any value, since |d| >= 20 already gives k3 > 10."""
    d = np.clip(ref_logp - logp, -20.0, 20.0)
    return np.clip(np.exp(d) - d - 1.0, -10.0, 10.0)


def kl_penalty(logp, ref_logp, kind: str = "low_var_kl"):
    """Per-token KL estimate (B, R) of pi against pi_ref, by registered estimator name."""
    return KL_ESTIMATORS.get(kind)(np.asarray(logp), np.asarray(ref_logp))


# ---------------------------------------------------------------------------------------
# Policy losses, per token: logp, old_logp, mask (B, R), advantages (B,) or (B, R)
#     -> ((B, R) loss, metrics)
# Every loss reports the same metrics (token means over mask): clipfrac_low, clipfrac_high,
# clipfrac (either), dual_clipfrac, ppo_kl (mean of old_logp - logp). A loss without a hard
# clip reports 0 clipped tokens. A sequence-level ratio counts every token of its sequence.
# ---------------------------------------------------------------------------------------


def _per_token(advantages):
    """(B,) -> (B, 1) so one advantage per sequence broadcasts over R; (B, R) passes through."""
    a = np.asarray(advantages)
    return a[:, None] if a.ndim == 1 else a


def _clipped_surrogate(ratio, adv, clip_low, clip_high, dual_clip):
    """-min(r A, clip(r, 1 - clip_low, 1 + clip_high) A), dual-clipped at -dual_clip * A for A < 0;
    ratio (B, R) or (B, 1). Returns (loss, is_low, is_high, is_dual)."""
    clipped = np.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = -np.minimum(ratio * adv, clipped * adv)
    is_low = (ratio < 1.0 - clip_low) & (adv < 0)
    is_high = (ratio > 1.0 + clip_high) & (adv > 0)
    is_dual = np.zeros_like(is_low)
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        is_dual = (ratio > dual_clip) & (adv < 0)
        loss = np.where(adv < 0, np.minimum(loss, -dual_clip * adv), loss)
    return loss, is_low, is_high, is_dual


def _loss_and_metrics(loss, mask, logp, old_logp, is_low, is_high, is_dual=None):
    """Broadcast loss and flags to mask's (B, R); the shared metrics."""
    mask = np.asarray(mask)
    low, high = np.broadcast_to(is_low, mask.shape), np.broadcast_to(is_high, mask.shape)
    dual = np.zeros(mask.shape, bool) if is_dual is None else np.broadcast_to(is_dual, mask.shape)
    metrics = {
        "clipfrac_low": float(masked_mean(low, mask)),
        "clipfrac_high": float(masked_mean(high, mask)),
        "clipfrac": float(masked_mean(low | high, mask)),
        "dual_clipfrac": float(masked_mean(dual, mask)),
        "ppo_kl": float(masked_mean(old_logp - logp, mask)),
    }
    return np.broadcast_to(loss, mask.shape), metrics


@POLICY_LOSSES.register("ppo_clip")
def policy_loss(logp, old_logp, advantages, mask, *, clip_low: float = 0.2, clip_high: float = 0.2,
                dual_clip: Optional[float] = None) -> Tuple[np.ndarray, Metrics]:
    """PPO clipped surrogate per token, optionally dual-clipped.

    ratio r = exp(logp - old_logp); loss = -min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A).
    clip_high > clip_low is DAPO's clip-higher. dual_clip = c > 1 bounds the loss of
    negative-advantage tokens by -c * A: for A < 0 the clipped loss is |A| * max(r, 1 - clip_low),
    which grows without bound in r; the dual clip caps it at c * |A|, i.e. it bites exactly where
    r > c (Ye et al. 2020; verl's clip_ratio_c; TRL's `delta` when c >= 1 + clip_high).
    """
    logp, old_logp = np.asarray(logp), np.asarray(old_logp)
    ratio = np.exp(logp - old_logp)  # (B, R)
    loss, low, high, dual = _clipped_surrogate(ratio, _per_token(advantages), clip_low, clip_high, dual_clip)
    return _loss_and_metrics(loss, mask, logp, old_logp, low, high, dual)


@POLICY_LOSSES.register("gspo")
def gspo_loss(logp, old_logp, advantages, mask, *, clip_low: float = 0.2, clip_high: float = 0.2,
              dual_clip: Optional[float] = None):
    """GSPO (Zheng et al. 2025; TRL's importance_sampling_level="sequence"): the clipped surrogate
    of one ratio per sequence, s = exp(mean over its tokens of logp - old_logp), the same for
    each of its tokens. The paper clips s to [1 - 3e-4, 1 + 4e-4] (clip_low, clip_high)."""
    logp, old_logp = np.asarray(logp), np.asarray(old_logp)
    ratio = np.exp(masked_mean(logp - old_logp, mask, axis=-1))[:, None]  # (B, 1)
    loss, low, high, dual = _clipped_surrogate(ratio, _per_token(advantages), clip_low, clip_high, dual_clip)
    return _loss_and_metrics(loss, mask, logp, old_logp, low, high, dual)


@POLICY_LOSSES.register("cispo")
def cispo_loss(logp, old_logp, advantages, mask, *, cispo_epsilon_max: float = 5.0):
    """CISPO (MiniMax-M1, 2025, in ScaleRL's form; TRL's loss_type="cispo" with epsilon_high set to
    epsilon_max): loss = -sg(min(r, epsilon_max)) * A * logp, so every token keeps a gradient,
    -min(r, epsilon_max) * A * grad logp (sg: no gradient through the weight; this numpy value
    cannot show that). clipfrac_high counts tokens whose weight is capped, whatever the sign of
    A (TRL's cispo_clip_ratio counts A > 0 only)."""
    logp, old_logp = np.asarray(logp), np.asarray(old_logp)
    ratio = np.exp(logp - old_logp)  # (B, R)
    loss = -np.minimum(ratio, cispo_epsilon_max) * _per_token(advantages) * logp
    return _loss_and_metrics(loss, mask, logp, old_logp, np.zeros(ratio.shape, bool), ratio > cispo_epsilon_max)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


@POLICY_LOSSES.register("sapo")
def sapo_loss(logp, old_logp, advantages, mask, *, sapo_temperature_pos: float = 1.0,
              sapo_temperature_neg: float = 1.05):
    """SAPO (Gao et al. 2025; TRL's loss_type="sapo"): a soft gate instead of the hard clip,
    loss = -(4 / tau) * sigmoid(tau * (r - 1)) * A with tau = sapo_temperature_pos where A > 0,
    sapo_temperature_neg elsewhere. Its gradient in r is A at r = 1 (as the surrogate r * A) and
    fades smoothly as r leaves 1. No token is hard-clipped."""
    logp, old_logp = np.asarray(logp), np.asarray(old_logp)
    ratio = np.exp(logp - old_logp)  # (B, R)
    adv = _per_token(advantages)
    tau = np.where(adv > 0, sapo_temperature_pos, sapo_temperature_neg)
    loss = -_sigmoid(tau * (ratio - 1.0)) * (4.0 / tau) * adv
    none = np.zeros(ratio.shape, bool)
    return _loss_and_metrics(loss, mask, logp, old_logp, none, none)


@POLICY_LOSSES.register("gmpo")
def gmpo_loss(logp, old_logp, advantages, mask, *, gmpo_epsilon: float = 0.4):
    """GMPO (Zhao et al. 2025): maximise the geometric mean of the token ratios, clipped per token
    in log space. d = logp - old_logp is clipped pessimistically to [-epsilon, epsilon] (min(d,
    clip(d)) where A > 0, max(d, clip(d)) where A < 0, as PPO's clip in log space), then
    loss = -A * exp(mean over the sequence's tokens of the clipped d), the same for each of its
    tokens (A: the sequence's advantage; its tokens' mean for (B, R) advantages). The paper's
    epsilon is 0.4, ratios within (e^-0.4, e^0.4); its loss is a mean over sequences
    (loss_agg_mode seq-mean-token-mean)."""
    logp, old_logp = np.asarray(logp), np.asarray(old_logp)
    adv = _per_token(advantages)
    d = logp - old_logp  # (B, R)
    d_clip = np.clip(d, -gmpo_epsilon, gmpo_epsilon)
    d_pess = np.where(adv < 0, np.maximum(d, d_clip), np.minimum(d, d_clip))  # (B, R)
    ratio = np.exp(masked_mean(d_pess, mask, axis=-1))[:, None]  # (B, 1)
    seq_adv = adv if adv.shape[-1] == 1 else masked_mean(adv, mask, axis=-1)[:, None]  # (B, 1)
    return _loss_and_metrics(-seq_adv * ratio, mask, logp, old_logp, (d < -gmpo_epsilon) & (adv < 0),
                             (d > gmpo_epsilon) & (adv > 0))


# ---------------------------------------------------------------------------------------
# Top-entropy tokens (Wang et al. 2025, "Beyond the 80/20 rule"; TRL's top_entropy_quantile)
# ---------------------------------------------------------------------------------------


def top_entropy_mask(entropy, mask, top_entropy_quantile: float):
    """(B, R) 1.0 on the tokens of `mask` whose entropy is at least the (1 - top_entropy_quantile)
    quantile of the entropies in `mask` (linear interpolation, as torch.quantile), 0 elsewhere:
    the top rho of the tokens by entropy; rho = 0 keeps the highest-entropy token(s) only."""
    entropy, mask = np.asarray(entropy), np.asarray(mask)
    valid = entropy[mask != 0]
    if valid.size == 0:
        return np.zeros(mask.shape)
    threshold = np.quantile(valid, 1.0 - top_entropy_quantile)
    return ((entropy >= threshold) & (mask != 0)).astype(mask.dtype)


# ---------------------------------------------------------------------------------------
# Loss aggregation
#
# Every mode is   sum over this batch's sequences / a count   so a global batch split into
# micro-batches and data-parallel shards gives the same loss (and gradient) as the full
# batch when each piece is given the *global* count and the pieces are summed:
#     global_tokens = sum over pieces of num_tokens(mask)
#     global_seqs   = sum over pieces of num_seqs(mask)
# Left as None they default to this batch's own counts (the per-micro-batch mean).
# A "sequence" is a row with at least one token, so fully padded rows neither add loss
# nor count (TRL divides by all B rows; the two agree whenever no row is empty).
# ---------------------------------------------------------------------------------------


@AGG_MODES.register("token-mean")
def _agg_token_mean(loss, mask, max_len, global_tokens, global_seqs):
    """All tokens weigh the same: sum / tokens (DAPO; TRL "bnpo" locally, "dapo" globally)."""
    n = num_tokens(mask) if global_tokens is None else global_tokens
    return masked_sum(loss, mask) / max(n, 1.0)


@AGG_MODES.register("seq-mean-token-mean")
def _agg_seq_mean_token_mean(loss, mask, max_len, global_tokens, global_seqs):
    """Mean over tokens of each sequence, then mean over sequences (TRL "grpo", the paper's)."""
    seq_tokens = np.sum(np.asarray(mask, dtype=np.float64), axis=-1)  # (B,)
    seq_loss = masked_sum(loss, mask, axis=-1) / np.maximum(seq_tokens, 1.0)  # (B,)
    n = num_seqs(mask) if global_seqs is None else global_seqs
    return np.sum(seq_loss) / max(n, 1.0)


@AGG_MODES.register("seq-mean-token-sum-norm")
def _agg_seq_mean_token_sum_norm(loss, mask, max_len, global_tokens, global_seqs):
    """Sum over tokens of each sequence / max_len, mean over sequences (Dr.GRPO, TRL "dr_grpo")."""
    seq_loss = masked_sum(loss, mask, axis=-1) / max_len  # (B,)
    n = num_seqs(mask) if global_seqs is None else global_seqs
    return np.sum(seq_loss) / max(n, 1.0)


def aggregate(per_token_loss, mask, mode: str = "token-mean", max_len: Optional[int] = None,
              global_tokens: Optional[float] = None, global_seqs: Optional[float] = None):
    """Reduce a (B, R) per-token loss to a scalar with a registered mode.

    max_len (seq-mean-token-sum-norm only) defaults to R; pass the generation's
    max_tokens when batches are padded to less. global_tokens / global_seqs: see above.
    """
    loss = np.asarray(per_token_loss)
    if loss.ndim != 2 or loss.shape != np.shape(mask):
        raise ValueError(f"per_token_loss {loss.shape} and mask {np.shape(mask)} must both be (B, R)")
    fn = AGG_MODES.get(mode)
    max_len = loss.shape[-1] if max_len is None else max_len
    return fn(loss, mask, max_len, global_tokens, global_seqs)

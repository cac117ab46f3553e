"""GRPO math in numpy: advantages, KL estimators, clipped policy loss, loss aggregation.

Pure functions: arrays and explicit scalars in, arrays and a metrics dict out. No config
objects, no logging, no collectives. `ms_algos.py` is the same math in MindSpore ops for
the training graph and is tested against this file.

Every token-level function takes an explicit `mask` (B, R): 1 for response tokens that
count, 0 for padding. Every token reduction goes through `masked_sum` / `masked_mean`,
and every loss reduction through `aggregate`.

Registries (unknown names fail listing the valid ones):
    ADVANTAGES     advantage estimators      fn(rewards, group_size, **params) -> (adv, metrics)
    REWARD_SCALES  advantage scalings        fn(rewards (B,), group_size) -> (B,) std or None
    KL_ESTIMATORS  per-token KL estimators   fn(logp, ref_logp) -> (B, R)
    POLICY_LOSSES  per-token policy losses   fn(logp, old_logp, advantages, mask, **params)
                                                 -> ((B, R) loss, metrics)
    AGG_MODES      loss aggregation modes    fn(loss, mask, max_len, global_tokens, global_seqs)
                                                 -> scalar
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np

from mindgrpo.utils.registry import Registry

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


def num_tokens(mask) -> float:
    """Tokens that count in `mask` (B, R): the default `global_tokens` of `aggregate`."""
    return float(np.sum(np.asarray(mask, dtype=np.float64)))


def num_seqs(mask) -> float:
    """Rows of `mask` (B, R) with at least one token: the default `global_seqs` of `aggregate`."""
    return float(np.sum(np.sum(np.asarray(mask, dtype=np.float64), axis=-1) > 0))


# ---------------------------------------------------------------------------------------
# Advantages
# ---------------------------------------------------------------------------------------


def _std(x, axis=None):
    """Unbiased (n - 1) std, as TRL's `nanstd`; 0 where fewer than two values."""
    n = x.shape[axis] if axis is not None else x.size
    if n < 2:
        return np.zeros(np.mean(x, axis=axis).shape, dtype=x.dtype)
    return np.std(x, axis=axis, ddof=1)


@REWARD_SCALES.register("group")
def _scale_by_group_std(rewards, group_size):
    # (B/G, G) -> (B/G,) -> (B,)
    return np.repeat(_std(rewards.reshape(-1, group_size), axis=1), group_size)


@REWARD_SCALES.register("batch")
def _scale_by_batch_std(rewards, group_size):
    return np.full_like(rewards, _std(rewards))


@REWARD_SCALES.register("none")
def _no_scale(rewards, group_size):
    return None


@ADVANTAGES.register("grpo")
def group_advantages(rewards, group_size: int, scale: str = "group", eps: float = 1e-6):
    """GRPO outcome advantages, one per sample.

    rewards: (B,) with B = prompts * G, each prompt's G samples adjacent.
    advantage = (r - mean of its group) / (std + eps), where std is
        scale="group": the unbiased std of its group (TRL's scale_rewards="group"),
        scale="batch": the unbiased std of all B rewards (TRL's scale_rewards="batch"),
        scale="none":  no division (Dr.GRPO).
    Stds are unbiased (divide by n - 1) like TRL 1.16's `nanstd`; a single sample has std 0.
    TRL adds eps=1e-4 to the std; verl adds 1e-6 (our default).
    Returns (advantages (B,), metrics).
    """
    r = np.asarray(rewards)
    r = r if np.issubdtype(r.dtype, np.floating) else r.astype(np.float64)
    if r.ndim != 1 or group_size < 1 or r.size % group_size != 0:
        raise ValueError(f"rewards must be (B,) with B a multiple of group_size={group_size}; got {r.shape}")
    grouped = r.reshape(-1, group_size)  # (B/G, G)
    advantages = (grouped - grouped.mean(axis=1, keepdims=True)).reshape(-1)  # (B,)
    std = REWARD_SCALES.get(scale)(r, group_size)
    if std is not None:
        advantages = advantages / (std + eps)
    group_std = _std(grouped, axis=1)  # (B/G,)
    metrics = {
        "reward_mean": float(r.mean()),
        "reward_std": float(_std(r)),
        "frac_reward_zero_std": float(np.mean(np.isclose(group_std, 0.0))),
        "advantage_abs_mean": float(np.abs(advantages).mean()),
    }
    return advantages, metrics


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
# Policy loss, per token
# ---------------------------------------------------------------------------------------


def _per_token(advantages):
    """(B,) -> (B, 1) so one advantage per sequence broadcasts over R; (B, R) passes through."""
    a = np.asarray(advantages)
    return a[:, None] if a.ndim == 1 else a


@POLICY_LOSSES.register("clip")
def policy_loss(logp, old_logp, advantages, mask, clip_low: float = 0.2, clip_high: float = 0.2,
                dual_clip: Optional[float] = None) -> Tuple[np.ndarray, Metrics]:
    """PPO clipped surrogate per token, optionally dual-clipped.

    logp, old_logp, mask: (B, R); advantages: (B,) or (B, R).
    ratio r = exp(logp - old_logp); loss = -min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A).
    dual_clip = c > 1 bounds the loss of negative-advantage tokens by -c * A: for A < 0 the
    clipped loss is |A| * max(r, 1 - clip_low), which grows without bound in r; the dual clip
    caps it at c * |A|, i.e. it bites exactly where r > c (Ye et al. 2020; verl's clip_ratio_c).
    Metrics (masked means over tokens): clipfrac_low (r < 1 - clip_low, A < 0),
    clipfrac_high (r > 1 + clip_high, A > 0), clipfrac (either; TRL's region clip ratio),
    dual_clipfrac (r > c, A < 0), ppo_kl (mean of old_logp - logp).
    """
    logp, old_logp = np.asarray(logp), np.asarray(old_logp)
    adv = _per_token(advantages)  # (B, 1) or (B, R)
    ratio = np.exp(logp - old_logp)  # (B, R)
    clipped = np.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = -np.minimum(ratio * adv, clipped * adv)  # (B, R)
    is_low = (ratio < 1.0 - clip_low) & (adv < 0)
    is_high = (ratio > 1.0 + clip_high) & (adv > 0)
    is_dual = np.zeros_like(is_low)
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        is_dual = (ratio > dual_clip) & (adv < 0)
        loss = np.where(adv < 0, np.minimum(loss, -dual_clip * adv), loss)
    metrics = {
        "clipfrac_low": float(masked_mean(is_low, mask)),
        "clipfrac_high": float(masked_mean(is_high, mask)),
        "clipfrac": float(masked_mean(is_low | is_high, mask)),
        "dual_clipfrac": float(masked_mean(is_dual, mask)),
        "ppo_kl": float(masked_mean(old_logp - logp, mask)),
    }
    return loss, metrics


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


# ---------------------------------------------------------------------------------------
# The GRPO objective
# ---------------------------------------------------------------------------------------


def grpo_loss(logp, old_logp, ref_logp, advantages, mask, beta: float = 0.0,
              kl_kind: str = "low_var_kl", clip_low: float = 0.2, clip_high: float = 0.2,
              dual_clip: Optional[float] = None, agg_mode: str = "token-mean",
              max_len: Optional[int] = None, global_tokens: Optional[float] = None,
              global_seqs: Optional[float] = None, loss_fn: str = "clip"):
    """aggregate(policy loss) + beta * aggregate(KL to the reference), both with `agg_mode`.

    Aggregation is linear, so this equals TRL's aggregate(policy + beta * KL per token).
    ref_logp may be None when beta == 0; when given, its KL is reported even with beta == 0.
    Returns (loss scalar, metrics).
    """
    pg_tok, metrics = POLICY_LOSSES.get(loss_fn)(logp, old_logp, advantages, mask, clip_low=clip_low,
                                                 clip_high=clip_high, dual_clip=dual_clip)
    norm = dict(mode=agg_mode, max_len=max_len, global_tokens=global_tokens, global_seqs=global_seqs)
    pg = aggregate(pg_tok, mask, **norm)
    loss = pg
    metrics["pg_loss"] = float(pg)
    if beta != 0.0 and ref_logp is None:
        raise ValueError("grpo_loss: beta != 0 needs ref_logp")
    if ref_logp is not None:
        kl_tok = kl_penalty(logp, ref_logp, kl_kind)  # (B, R)
        kl = aggregate(kl_tok, mask, **norm)
        metrics["kl_loss"] = float(kl)
        metrics["kl"] = float(masked_mean(kl_tok, mask))
        if beta != 0.0:
            loss = pg + beta * kl
    return loss, metrics

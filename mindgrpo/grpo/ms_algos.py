"""GRPO math in MindSpore ops, for the training graph: the same math as `algos.py`.

Everything here runs inside GRAPH_MODE: static shapes, no host syncs, no Python branching on
tensor values (only on Python scalars, strings and None, which are constants at compile time).
Tensors in, tensors out; metrics are 0-d tensors so logging them costs one sync, outside.

Two layers:
  * tensor functions, each registered under the name of its numpy twin in `algos.py`, with the
    same keyword parameters (each registry takes its names from the numpy one, which is the one
    source of names):
        KL_ESTIMATORS        fn(logp, ref_logp) -> (B, R)
        POLICY_LOSSES        fn(logp, old_logp, advantages, mask, *, ...) -> ((B, R) loss, metrics)
        AGG_MODES            fn(loss, mask, max_len, global_tokens, global_seqs) -> 0-d
  * Cells that resolve names through those registries when they are built (in Python, where
    unknown names fail listing the valid ones) and only do tensor math in `construct`:
        KLPenalty(kind), Aggregate(mode, max_len); GRPOLoss, which combines them with the rollout
        correction, is in `ms_objective.py`.
    The lookup cannot happen inside `construct`: MindSpore's graph compiler parses every
    function called there, and `Registry.get` contains a try/except, which it rejects.

Python-float hyper-parameters (clip bounds, beta, dual_clip, temperatures, thresholds) become
float32 constants in the graph, even when the tensors are float64 (MindSpore 2.10): float64
results agree with numpy to ~1e-8 relative per term, float32 ones are unaffected.

Normalisers (`global_tokens`, `global_seqs`) are 0-d tensors so the global counts summed over
micro-batches and data-parallel ranks can be fed in; see `algos.py` for the semantics.
"""

from __future__ import annotations

from typing import Optional

import mindspore as ms
from mindspore import nn, ops

from mindgrpo.grpo import algos
from mindgrpo.utils.registry import Registry

KL_ESTIMATORS = Registry("KL estimator", names_from=algos.KL_ESTIMATORS)
POLICY_LOSSES = Registry("policy loss", names_from=algos.POLICY_LOSSES)
AGG_MODES = Registry("loss aggregation mode", names_from=algos.AGG_MODES)


# ---------------------------------------------------------------------------------------
# The one masked reduction helper
# ---------------------------------------------------------------------------------------


def masked_sum(x, mask, axis=None):
    """Sum of x * mask; masked-out entries contribute 0 even if inf/nan, and get 0 gradient."""
    return (ops.where(mask != 0, x, ops.zeros_like(x)) * mask).sum(axis)


def masked_mean(x, mask, axis=None):
    """masked_sum / (mask count, at least 1)."""
    return masked_sum(x, mask, axis) / ops.clamp(mask.sum(axis), min=1.0)


def masked_max(x, mask):
    """0-d max of x >= 0 where mask is set; 0 for an empty mask."""
    return ops.where(mask != 0, x, ops.zeros_like(x)).max()


def num_tokens(mask):
    """0-d count of tokens in mask (B, R)."""
    return mask.sum()


def num_seqs(mask):
    """0-d count of rows of mask (B, R) with at least one token."""
    return (mask.sum(-1) > 0).astype(mask.dtype).sum()


# ---------------------------------------------------------------------------------------
# KL estimators, per token: (B, R), (B, R) -> (B, R)
# ---------------------------------------------------------------------------------------


@KL_ESTIMATORS.register("k1")
def kl_k1(logp, ref_logp):
    return logp - ref_logp


@KL_ESTIMATORS.register("k2")
def kl_k2(logp, ref_logp):
    return 0.5 * ops.square(logp - ref_logp)


@KL_ESTIMATORS.register("k3")
def kl_k3(logp, ref_logp):
    d = ref_logp - logp
    return ops.exp(d) - d - 1.0


@KL_ESTIMATORS.register("low_var_kl")
def kl_low_var(logp, ref_logp):
    d = ops.clamp(ref_logp - logp, -20.0, 20.0)  # no overflow; values unchanged (see algos.py)
    return ops.clamp(ops.exp(d) - d - 1.0, -10.0, 10.0)


# ---------------------------------------------------------------------------------------
# Policy losses, per token (see algos.py): logp, old_logp, mask (B, R), advantages (B,) or
# (B, R) -> ((B, R) loss, metrics of 0-d tensors)
# ---------------------------------------------------------------------------------------


def _per_token(advantages):
    return advantages.expand_dims(-1) if advantages.ndim == 1 else advantages  # (B, 1) or (B, R)


def _clipped_surrogate(ratio, adv, clip_low, clip_high, dual_clip, dtype):
    """ratio (B, R) or (B, 1) -> (loss, is_low, is_high, is_dual), as algos._clipped_surrogate."""
    clipped = ops.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = -ops.minimum(ratio * adv, clipped * adv)
    neg, pos = adv < 0, adv > 0
    is_low = ops.logical_and(ratio < 1.0 - clip_low, neg).astype(dtype)
    is_high = ops.logical_and(ratio > 1.0 + clip_high, pos).astype(dtype)
    if dual_clip is None:
        is_dual = ops.zeros_like(is_low)
    else:
        if dual_clip <= 1.0:
            raise ValueError("dual_clip must be > 1")
        is_dual = ops.logical_and(ratio > dual_clip, neg).astype(dtype)
        loss = ops.where(neg, ops.minimum(loss, -dual_clip * adv), loss)
    return loss, is_low, is_high, is_dual


def _loss_and_metrics(loss, mask, logp, old_logp, is_low, is_high, is_dual):
    """Loss and 0/1 flags broadcast to mask's (B, R); the metrics every loss reports."""
    shape = mask.shape
    low, high = ops.broadcast_to(is_low, shape), ops.broadcast_to(is_high, shape)
    metrics = {
        "clipfrac_low": masked_mean(low, mask),
        "clipfrac_high": masked_mean(high, mask),
        "clipfrac": masked_mean(low + high, mask),  # disjoint: A < 0 vs A > 0
        "dual_clipfrac": masked_mean(ops.broadcast_to(is_dual, shape), mask),
        "ppo_kl": masked_mean(old_logp - logp, mask),
    }
    return ops.broadcast_to(loss, shape), metrics


@POLICY_LOSSES.register("ppo_clip")
def policy_loss(logp, old_logp, advantages, mask, *, clip_low: float = 0.2, clip_high: float = 0.2,
                dual_clip: Optional[float] = None):
    ratio = ops.exp(logp - old_logp)  # (B, R)
    loss, low, high, dual = _clipped_surrogate(ratio, _per_token(advantages), clip_low, clip_high, dual_clip,
                                               mask.dtype)
    return _loss_and_metrics(loss, mask, logp, old_logp, low, high, dual)


@POLICY_LOSSES.register("gspo")
def gspo_loss(logp, old_logp, advantages, mask, *, clip_low: float = 0.2, clip_high: float = 0.2,
              dual_clip: Optional[float] = None):
    ratio = ops.exp(masked_mean(logp - old_logp, mask, -1)).expand_dims(-1)  # (B, 1)
    loss, low, high, dual = _clipped_surrogate(ratio, _per_token(advantages), clip_low, clip_high, dual_clip,
                                               mask.dtype)
    return _loss_and_metrics(loss, mask, logp, old_logp, low, high, dual)


@POLICY_LOSSES.register("cispo")
def cispo_loss(logp, old_logp, advantages, mask, *, cispo_epsilon_max: float = 5.0):
    ratio = ops.exp(logp - old_logp)  # (B, R)
    weight = ops.stop_gradient(ops.clamp(ratio, max=cispo_epsilon_max))
    loss = -weight * _per_token(advantages) * logp
    capped = (ratio > cispo_epsilon_max).astype(mask.dtype)
    return _loss_and_metrics(loss, mask, logp, old_logp, ops.zeros_like(capped), capped, ops.zeros_like(capped))


@POLICY_LOSSES.register("sapo")
def sapo_loss(logp, old_logp, advantages, mask, *, sapo_temperature_pos: float = 1.0,
              sapo_temperature_neg: float = 1.05):
    ratio = ops.exp(logp - old_logp)  # (B, R)
    adv = _per_token(advantages)
    ones = ops.ones_like(adv)
    tau = ops.where(adv > 0, ones * sapo_temperature_pos, ones * sapo_temperature_neg)
    loss = -ops.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau) * adv
    none = ops.zeros_like(mask)
    return _loss_and_metrics(loss, mask, logp, old_logp, none, none, none)


@POLICY_LOSSES.register("gmpo")
def gmpo_loss(logp, old_logp, advantages, mask, *, gmpo_epsilon: float = 0.4):
    adv = _per_token(advantages)
    d = logp - old_logp  # (B, R)
    d_clip = ops.clamp(d, -gmpo_epsilon, gmpo_epsilon)
    neg = ops.broadcast_to(adv < 0, d.shape)
    d_pess = ops.where(neg, ops.maximum(d, d_clip), ops.minimum(d, d_clip))  # (B, R)
    ratio = ops.exp(masked_mean(d_pess, mask, -1)).expand_dims(-1)  # (B, 1)
    seq_adv = adv if adv.shape[-1] == 1 else masked_mean(adv, mask, -1).expand_dims(-1)  # (B, 1)
    low = ops.logical_and(d < -gmpo_epsilon, adv < 0).astype(mask.dtype)
    high = ops.logical_and(d > gmpo_epsilon, adv > 0).astype(mask.dtype)
    return _loss_and_metrics(-seq_adv * ratio, mask, logp, old_logp, low, high, ops.zeros_like(low))


# ---------------------------------------------------------------------------------------
# Top-entropy tokens
# ---------------------------------------------------------------------------------------


def top_entropy_mask(entropy, mask, quantile):
    """(B, R) 1.0 on the tokens of mask whose entropy is at least the `quantile` (a float64 0-d
    tensor: 1 - top_entropy_quantile) quantile of the entropies in mask, as algos.top_entropy_mask.
    The masked-out entries sort first (below every entropy), so the n tokens in mask are the last n
    of the sorted row; the quantile's position is found in float64 as numpy does, and interpolated
    as numpy and torch do (from the nearer end)."""
    flat = entropy.reshape(-1)  # (B*R,)
    valid = mask.reshape(-1) != 0
    size = flat.shape[0]
    ordered, _ = ops.sort(ops.where(valid, flat, ops.ones_like(flat) * -1e9))
    n = valid.astype(ms.float64).sum()
    pos = (size - n) + quantile * (n - 1.0)  # float64, as numpy's virtual index
    lo = ops.floor(pos)
    frac = (pos - lo).astype(entropy.dtype)
    a = ops.gather(ordered, ops.clamp(lo, 0.0, size - 1.0).astype(ms.int32), 0)
    b = ops.gather(ordered, ops.clamp(lo + 1.0, 0.0, size - 1.0).astype(ms.int32), 0)
    threshold = ops.where(frac >= 0.5, b - (b - a) * (1.0 - frac), a + (b - a) * frac)
    return ops.stop_gradient(ops.logical_and(entropy >= threshold, mask != 0).astype(mask.dtype))


# ---------------------------------------------------------------------------------------
# Loss aggregation: sum over this batch's sequences / a (global) count
# ---------------------------------------------------------------------------------------


@AGG_MODES.register("token-mean")
def agg_token_mean(loss, mask, max_len, global_tokens, global_seqs):
    n = num_tokens(mask) if global_tokens is None else global_tokens
    return masked_sum(loss, mask) / ops.clamp(n, min=1.0)


@AGG_MODES.register("seq-mean-token-mean")
def agg_seq_mean_token_mean(loss, mask, max_len, global_tokens, global_seqs):
    seq_loss = masked_sum(loss, mask, -1) / ops.clamp(mask.sum(-1), min=1.0)  # (B,)
    n = num_seqs(mask) if global_seqs is None else global_seqs
    return seq_loss.sum() / ops.clamp(n, min=1.0)


@AGG_MODES.register("seq-mean-token-sum-norm")
def agg_seq_mean_token_sum_norm(loss, mask, max_len, global_tokens, global_seqs):
    seq_loss = masked_sum(loss, mask, -1) / max_len  # (B,)
    n = num_seqs(mask) if global_seqs is None else global_seqs
    return seq_loss.sum() / ops.clamp(n, min=1.0)


# ---------------------------------------------------------------------------------------
# Cells: names resolved at build time, tensor math in construct
# ---------------------------------------------------------------------------------------


class KLPenalty(nn.Cell):
    """Per-token KL (B, R) of pi against pi_ref with a registered estimator."""

    def __init__(self, kind: str = "low_var_kl"):
        super().__init__()
        self.kind = kind
        self.estimate = KL_ESTIMATORS.get(kind)

    def construct(self, logp, ref_logp):
        return self.estimate(logp, ref_logp)


class Aggregate(nn.Cell):
    """(B, R) per-token loss -> 0-d with a registered mode; max_len defaults to R."""

    def __init__(self, mode: str = "token-mean", max_len: Optional[int] = None):
        super().__init__()
        self.mode, self.max_len = mode, max_len
        self.reduce = AGG_MODES.get(mode)

    def construct(self, per_token_loss, mask, global_tokens=None, global_seqs=None):
        max_len = per_token_loss.shape[-1] if self.max_len is None else self.max_len
        return self.reduce(per_token_loss, mask, max_len, global_tokens, global_seqs)

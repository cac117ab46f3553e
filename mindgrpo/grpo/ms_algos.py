"""GRPO math in MindSpore ops, for the training graph: the same math as `algos.py`.

Everything here runs inside GRAPH_MODE: static shapes, no host syncs, no Python branching on
tensor values (only on Python scalars, strings and None, which are constants at compile time).
Tensors in, tensors out; metrics are 0-d tensors so logging them costs one sync, outside.

Two layers:
  * tensor functions, each registered under the same name as its numpy twin in `algos.py`:
        KL_ESTIMATORS  fn(logp, ref_logp) -> (B, R)
        POLICY_LOSSES  fn(logp, old_logp, advantages, mask, clip_low, clip_high, dual_clip)
                           -> ((B, R) loss, metrics)
        AGG_MODES      fn(loss, mask, max_len, global_tokens, global_seqs) -> 0-d
  * Cells that resolve names through those registries when they are built (in Python, where
    unknown names fail listing the valid ones) and only do tensor math in `construct`:
        KLPenalty(kind), Aggregate(mode, max_len), GRPOLoss(beta, kl_kind, ..., agg_mode).
    The lookup cannot happen inside `construct`: MindSpore's graph compiler parses every
    function called there, and `Registry.get` contains a try/except, which it rejects.

Python-float hyper-parameters (clip bounds, beta, dual_clip) become float32 constants in the
graph, even when the tensors are float64 (MindSpore 2.10): float64 results agree with numpy to
~1e-8 relative per term, float32 ones are unaffected.

Normalisers (`global_tokens`, `global_seqs`) are 0-d tensors so the global counts summed over
micro-batches and data-parallel ranks can be fed in; see `algos.py` for the semantics.
"""

from __future__ import annotations

from typing import Optional

from mindspore import nn, ops

from mindgrpo.utils.registry import Registry

KL_ESTIMATORS = Registry("KL estimator")
POLICY_LOSSES = Registry("policy loss")
AGG_MODES = Registry("loss aggregation mode")


# ---------------------------------------------------------------------------------------
# The one masked reduction helper
# ---------------------------------------------------------------------------------------


def masked_sum(x, mask, axis=None):
    """Sum of x * mask; masked-out entries contribute 0 even if inf/nan, and get 0 gradient."""
    return (ops.where(mask != 0, x, ops.zeros_like(x)) * mask).sum(axis)


def masked_mean(x, mask, axis=None):
    """masked_sum / (mask count, at least 1)."""
    return masked_sum(x, mask, axis) / ops.clamp(mask.sum(axis), min=1.0)


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
# Policy loss, per token
# ---------------------------------------------------------------------------------------


@POLICY_LOSSES.register("clip")
def policy_loss(logp, old_logp, advantages, mask, clip_low: float = 0.2, clip_high: float = 0.2,
                dual_clip: Optional[float] = None):
    """PPO clipped surrogate per token, optionally dual-clipped; see algos.policy_loss.

    logp, old_logp, mask: (B, R); advantages: (B,) or (B, R). Python-scalar clip values.
    Returns ((B, R) loss, metrics of 0-d tensors).
    """
    adv = advantages.expand_dims(-1) if advantages.ndim == 1 else advantages  # (B, 1) or (B, R)
    ratio = ops.exp(logp - old_logp)  # (B, R)
    clipped = ops.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = -ops.minimum(ratio * adv, clipped * adv)  # (B, R)
    neg, pos = adv < 0, adv > 0
    is_low = ops.logical_and(ratio < 1.0 - clip_low, neg).astype(mask.dtype)
    is_high = ops.logical_and(ratio > 1.0 + clip_high, pos).astype(mask.dtype)
    if dual_clip is None:
        is_dual = ops.zeros_like(is_low)
    else:
        if dual_clip <= 1.0:
            raise ValueError("dual_clip must be > 1")
        is_dual = ops.logical_and(ratio > dual_clip, neg).astype(mask.dtype)
        loss = ops.where(neg, ops.minimum(loss, -dual_clip * adv), loss)
    metrics = {
        "clipfrac_low": masked_mean(is_low, mask),
        "clipfrac_high": masked_mean(is_high, mask),
        "clipfrac": masked_mean(is_low + is_high, mask),  # disjoint: A < 0 vs A > 0
        "dual_clipfrac": masked_mean(is_dual, mask),
        "ppo_kl": masked_mean(old_logp - logp, mask),
    }
    return loss, metrics


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


class GRPOLoss(nn.Cell):
    """aggregate(policy loss) + beta * aggregate(KL), as algos.grpo_loss.

    construct(logp, old_logp, ref_logp, advantages, mask, global_tokens=None, global_seqs=None)
        logp, old_logp, ref_logp, mask: (B, R); advantages: (B,) or (B, R);
        ref_logp may be None when beta == 0. Returns (0-d loss, metrics of 0-d tensors).
    """

    def __init__(self, beta: float = 0.0, kl_kind: str = "low_var_kl", clip_low: float = 0.2,
                 clip_high: float = 0.2, dual_clip: Optional[float] = None, agg_mode: str = "token-mean",
                 max_len: Optional[int] = None, loss_fn: str = "clip"):
        super().__init__()
        if dual_clip is not None and dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        self.beta, self.clip_low, self.clip_high, self.dual_clip = beta, clip_low, clip_high, dual_clip
        self.policy_loss = POLICY_LOSSES.get(loss_fn)
        self.kl = KLPenalty(kl_kind)
        self.aggregate = Aggregate(agg_mode, max_len)

    def construct(self, logp, old_logp, ref_logp, advantages, mask, global_tokens=None, global_seqs=None):
        if ref_logp is None and self.beta != 0.0:
            raise ValueError("GRPOLoss: beta != 0 needs ref_logp")
        pg_tok, metrics = self.policy_loss(logp, old_logp, advantages, mask, self.clip_low, self.clip_high,
                                           self.dual_clip)
        pg = self.aggregate(pg_tok, mask, global_tokens, global_seqs)
        loss = pg
        metrics["pg_loss"] = pg
        if ref_logp is not None:
            kl_tok = self.kl(logp, ref_logp)  # (B, R)
            kl = self.aggregate(kl_tok, mask, global_tokens, global_seqs)
            metrics["kl_loss"] = kl
            metrics["kl"] = masked_mean(kl_tok, mask)
            if self.beta != 0.0:
                loss = pg + self.beta * kl
        return loss, metrics

"""The rollout corrections and mismatch metrics of `corrections.py` in MindSpore ops, for the
training graph (GRAPH_MODE: static shapes, no host syncs), registered under the numpy twins' names."""

from __future__ import annotations

from mindspore import ops

from mindgrpo.grpo import corrections
from mindgrpo.grpo.ms_algos import kl_k3, masked_max, masked_mean
from mindgrpo.utils.registry import Registry

ROLLOUT_CORRECTIONS = Registry("rollout correction", names_from=corrections.ROLLOUT_CORRECTIONS)


# ---------------------------------------------------------------------------------------
# Rollout/training mismatch (see corrections.py)
# ---------------------------------------------------------------------------------------


def log_importance_weight(old_logp, rollout_logp, mask, sequence: bool):
    """corrections.log_importance_weight in graph ops: (B, R), or (B, 1) with `sequence`."""
    d = (old_logp - rollout_logp) * mask  # (B, R); padding: weight 1
    return d.sum(-1, keepdims=True) if sequence else d


def _truncated(log_w, threshold):
    return ops.clamp(ops.exp(log_w), max=threshold)


def _masked(log_w, threshold):
    w = ops.exp(log_w)
    keep = ops.logical_and(w >= 1.0 / threshold, w <= threshold)
    return ops.where(keep, w, ops.zeros_like(w))


@ROLLOUT_CORRECTIONS.register("none")
def no_correction(old_logp, rollout_logp, mask):
    return None


@ROLLOUT_CORRECTIONS.register("tis_token")
def tis_token(old_logp, rollout_logp, mask, *, rollout_correction_threshold: float = 2.0):
    return _truncated(log_importance_weight(old_logp, rollout_logp, mask, False), rollout_correction_threshold)


@ROLLOUT_CORRECTIONS.register("tis_sequence")
def tis_sequence(old_logp, rollout_logp, mask, *, rollout_correction_threshold: float = 2.0):
    return _truncated(log_importance_weight(old_logp, rollout_logp, mask, True), rollout_correction_threshold)


@ROLLOUT_CORRECTIONS.register("mask_token")
def mask_token(old_logp, rollout_logp, mask, *, rollout_correction_threshold: float = 2.0):
    return _masked(log_importance_weight(old_logp, rollout_logp, mask, False), rollout_correction_threshold)


@ROLLOUT_CORRECTIONS.register("mask_sequence")
def mask_sequence(old_logp, rollout_logp, mask, *, rollout_correction_threshold: float = 2.0):
    return _masked(log_importance_weight(old_logp, rollout_logp, mask, True), rollout_correction_threshold)


def correction_metrics(weight, raw_log_weight, mask):
    """(weight_mean, weight_max, clipfrac) as corrections.correction_metrics."""
    w = ops.broadcast_to(weight, mask.shape)
    changed = ops.broadcast_to((ops.exp(raw_log_weight) != weight).astype(mask.dtype), mask.shape)
    return masked_mean(w, mask), masked_max(w, mask), masked_mean(changed, mask)


def mismatch_metrics(train_logp, rollout_logp, mask):
    """(abs_diff_mean, abs_diff_max, k3, log_ppl_ratio) as corrections.mismatch_metrics."""
    d = ops.abs(train_logp - rollout_logp)
    return (masked_mean(d, mask), masked_max(d, mask), masked_mean(kl_k3(rollout_logp, train_logp), mask),
            masked_mean(rollout_logp - train_logp, mask))

"""Rollout/training mismatch in numpy: the rollout corrections (importance weights of the per-token
policy loss, registered in ROLLOUT_CORRECTIONS) and the metrics that say how far the rollout
engine's log-probs are from the training graph's. Pure functions, explicit masks (B, R), as
`algos.py`; `ms_corrections.py` is the same math in MindSpore ops.

    ROLLOUT_CORRECTIONS  fn(old_logp, rollout_logp, mask, *, ...) -> (B, R) or (B, 1) weight, or None
"""

from __future__ import annotations

import numpy as np

from mindgrpo.grpo.algos import Metrics, kl_k3, masked_max, masked_mean
from mindgrpo.utils.registry import Registry

ROLLOUT_CORRECTIONS = Registry("rollout correction")


# ---------------------------------------------------------------------------------------
# Rollout/training mismatch: old_logp (the training side's log-probs before the update),
# rollout_logp (the rollout engine's, of the distribution it sampled from, after top-k/p) (B, R)
# -> weights of the per-token policy loss, (B, R) per token or (B, 1) per sequence, or None
# ---------------------------------------------------------------------------------------


def log_importance_weight(old_logp, rollout_logp, mask, sequence: bool):
    """log(old / rollout) of each token (B, R), or summed over each sequence's tokens (B, 1) with
    `sequence`; 0 (weight 1) at padding. Before any truncation or masking."""
    d = (np.asarray(old_logp) - np.asarray(rollout_logp)) * mask  # (B, R); padding: weight 1
    return d.sum(axis=-1, keepdims=True) if sequence else d


def _truncated(log_w, threshold):
    with np.errstate(over="ignore"):  # exp overflows to inf, which the cap takes down to threshold
        return np.minimum(np.exp(log_w), threshold)


def _masked(log_w, threshold):
    with np.errstate(over="ignore"):
        w = np.exp(log_w)
    return np.where((w >= 1.0 / threshold) & (w <= threshold), w, 0.0)


@ROLLOUT_CORRECTIONS.register("none")
def no_correction(old_logp, rollout_logp, mask):
    return None


@ROLLOUT_CORRECTIONS.register("tis_token")
def tis_token(old_logp, rollout_logp, mask, *, rollout_correction_threshold: float = 2.0):
    """Truncated importance sampling per token (Yao et al. 2025): min(exp(old - rollout), threshold)
    (TRL's vllm_importance_sampling_mode="token_truncate", clip_max = threshold, no clip_min)."""
    return _truncated(log_importance_weight(old_logp, rollout_logp, mask, False), rollout_correction_threshold)


@ROLLOUT_CORRECTIONS.register("tis_sequence")
def tis_sequence(old_logp, rollout_logp, mask, *, rollout_correction_threshold: float = 2.0):
    """One truncated weight per sequence: min(prod of its tokens' ratios, threshold)
    (TRL's "sequence_truncate")."""
    return _truncated(log_importance_weight(old_logp, rollout_logp, mask, True), rollout_correction_threshold)


@ROLLOUT_CORRECTIONS.register("mask_token")
def mask_token(old_logp, rollout_logp, mask, *, rollout_correction_threshold: float = 2.0):
    """Tokens whose ratio leaves [1 / threshold, threshold] get weight 0, the others their ratio
    (TRL's "token_mask", clip_min = 1 / threshold, clip_max = threshold)."""
    return _masked(log_importance_weight(old_logp, rollout_logp, mask, False), rollout_correction_threshold)


@ROLLOUT_CORRECTIONS.register("mask_sequence")
def mask_sequence(old_logp, rollout_logp, mask, *, rollout_correction_threshold: float = 2.0):
    """Sequences whose ratio (the product of their tokens') leaves [1 / threshold, threshold] get
    weight 0, the others their ratio (TRL's "sequence_mask")."""
    return _masked(log_importance_weight(old_logp, rollout_logp, mask, True), rollout_correction_threshold)


def correction_metrics(weight, raw_log_weight, mask) -> Metrics:
    """weight: a correction's (B, R) or (B, 1) output; raw_log_weight: its uncorrected log (the
    same shape). Token means over mask, a sequence's weight counting for each of its tokens:
    weight_mean, weight_max, clipfrac (tokens whose weight was truncated or masked)."""
    w = np.broadcast_to(weight, np.shape(mask))
    with np.errstate(over="ignore"):
        changed = np.broadcast_to(np.exp(raw_log_weight) != weight, np.shape(mask))
    return {"rollout_correction/weight_mean": float(masked_mean(w, mask)),
            "rollout_correction/weight_max": masked_max(w, mask),
            "rollout_correction/clipfrac": float(masked_mean(changed, mask))}


def mismatch_metrics(train_logp, rollout_logp, mask) -> Metrics:
    """How far the rollout engine's log-probs are from the training graph's for the same tokens
    (token means over mask): mean and max |train - rollout|, the k3 estimate of
    KL(rollout || train) (the tokens are samples of the rollout's distribution), and
    log_ppl_ratio = mean(rollout - train), the log of the training perplexity over the rollout
    perplexity (the trainer logs its exp as ppl_ratio)."""
    d = np.asarray(train_logp) - np.asarray(rollout_logp)
    return {"mismatch/abs_diff_mean": float(masked_mean(np.abs(d), mask)),
            "mismatch/abs_diff_max": masked_max(np.abs(d), mask),
            "mismatch/k3": float(masked_mean(kl_k3(rollout_logp, train_logp), mask)),
            "mismatch/log_ppl_ratio": float(masked_mean(-d, mask))}

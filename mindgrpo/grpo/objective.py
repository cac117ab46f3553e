"""The GRPO objective in numpy: the policy loss of `algos.py`, weighted by the top-entropy mask and
the rollout correction of `corrections.py`, aggregated, plus beta times the aggregated KL to the
reference. `ms_objective.GRPOLoss` is the same in the training graph and is tested against it."""

from __future__ import annotations

from typing import Optional

import numpy as np

from mindgrpo.grpo.algos import POLICY_LOSSES, aggregate, kl_penalty, masked_mean, top_entropy_mask
from mindgrpo.grpo.corrections import ROLLOUT_CORRECTIONS, correction_metrics, log_importance_weight


def grpo_loss(logp, old_logp, ref_logp, advantages, mask, beta: float = 0.0,
              kl_kind: str = "low_var_kl", agg_mode: str = "token-mean", max_len: Optional[int] = None,
              global_tokens: Optional[float] = None, global_seqs: Optional[float] = None,
              policy_loss: str = "ppo_clip", entropy=None, top_entropy_quantile: float = 1.0,
              rollout_logp=None, rollout_correction: str = "none", rollout_correction_threshold: float = 2.0,
              **loss_params):
    """aggregate(policy loss * top-entropy mask * rollout weight) + beta * aggregate(KL to the
    reference), both with `agg_mode`, as TRL's _compute_loss (the KL term is neither masked nor
    weighted). Masked tokens keep counting in the normalisers.

    loss_params: the keyword parameters of `policy_loss` (e.g. clip_low=0.2).
    entropy (B, R): needed when top_entropy_quantile < 1.
    rollout_logp (B, R): the rollout engine's log-probs of the sampled distribution; with
    rollout_correction != "none" the per-token policy loss is weighted by the correction's weights
    (computed against old_logp) and their metrics are reported. None: no correction.
    ref_logp may be None when beta == 0; when given, its KL is reported even with beta == 0.
    Returns (loss scalar, metrics).
    """
    pg_tok, metrics = POLICY_LOSSES.get(policy_loss)(logp, old_logp, advantages, mask, **loss_params)
    if top_entropy_quantile < 1.0:
        if entropy is None:
            raise ValueError("grpo_loss: top_entropy_quantile < 1 needs entropy")
        pg_tok = pg_tok * top_entropy_mask(entropy, mask, top_entropy_quantile)
    correct = ROLLOUT_CORRECTIONS.get(rollout_correction)
    if rollout_logp is not None and rollout_correction != "none":
        weight = correct(old_logp, rollout_logp, mask, rollout_correction_threshold=rollout_correction_threshold)
        pg_tok = pg_tok * weight
        raw = log_importance_weight(old_logp, rollout_logp, mask, sequence=np.shape(weight)[-1] == 1)
        metrics.update(correction_metrics(weight, raw, mask))
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

"""The GRPO objective as a Cell of the training graph: `objective.grpo_loss` in MindSpore ops. Names
(policy loss, KL estimator, aggregation mode, rollout correction) are resolved through the
registries when the Cell is built; `construct` does tensor math only (see `ms_algos.py`)."""

from __future__ import annotations

from typing import Optional

import mindspore as ms
from mindspore import Tensor, nn, ops

from mindgrpo.grpo.ms_algos import POLICY_LOSSES, Aggregate, KLPenalty, masked_mean, top_entropy_mask
from mindgrpo.grpo.ms_corrections import ROLLOUT_CORRECTIONS, correction_metrics, log_importance_weight
from mindgrpo.utils.registry import Registry


def _settings(registry: Registry, name: str, given: dict) -> dict:
    """`given` checked against the keyword parameters of `name`'s function."""
    unknown = sorted(set(given) - set(registry.params(name)))
    if unknown:
        raise TypeError(f"{registry.kind} {name!r} has no parameter {', '.join(unknown)}; "
                        f"its parameters: {', '.join(registry.params(name)) or '(none)'}")
    return dict(given)


class GRPOLoss(nn.Cell):
    """aggregate(policy loss * top-entropy mask * rollout weight) + beta * aggregate(KL), as
    objective.grpo_loss.

    construct(logp, old_logp, ref_logp, advantages, mask, global_tokens=None, global_seqs=None,
              entropy=None, rollout_logp=None)
        logp, old_logp, ref_logp, mask, entropy, rollout_logp: (B, R); advantages: (B,) or (B, R);
        ref_logp may be None when beta == 0; entropy is needed when top_entropy_quantile < 1;
        rollout_logp None: no rollout correction. Returns (0-d loss, metrics of 0-d tensors).
    loss_params: the keyword parameters of `policy_loss` (e.g. clip_low=0.2).
    """

    def __init__(self, beta: float = 0.0, kl_kind: str = "low_var_kl", agg_mode: str = "token-mean",
                 max_len: Optional[int] = None, policy_loss: str = "ppo_clip", top_entropy_quantile: float = 1.0,
                 rollout_correction: str = "none", rollout_correction_threshold: float = 2.0, **loss_params):
        super().__init__()
        dual_clip = loss_params.get("dual_clip")
        if dual_clip is not None and dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        if not 0.0 <= top_entropy_quantile <= 1.0:
            raise ValueError(f"top_entropy_quantile must be in [0, 1], got {top_entropy_quantile}")
        self.beta = beta
        self.policy_loss = POLICY_LOSSES.get(policy_loss)
        self.loss_params = _settings(POLICY_LOSSES, policy_loss, loss_params)
        self.quantile = None if top_entropy_quantile >= 1.0 else Tensor(1.0 - top_entropy_quantile, ms.float64)
        self.correct = ROLLOUT_CORRECTIONS.get(rollout_correction)
        self.correction_params = {k: rollout_correction_threshold
                                  for k in ROLLOUT_CORRECTIONS.params(rollout_correction)}
        self.corrects = rollout_correction != "none"  # rollout_logp, when given, weighs the loss
        self.kl = KLPenalty(kl_kind)
        self.aggregate = Aggregate(agg_mode, max_len)

    @property
    def needs_entropy(self) -> bool:
        return self.quantile is not None

    def construct(self, logp, old_logp, ref_logp, advantages, mask, global_tokens=None, global_seqs=None,
                  entropy=None, rollout_logp=None):
        if ref_logp is None and self.beta != 0.0:
            raise ValueError("GRPOLoss: beta != 0 needs ref_logp")
        pg_tok, metrics = self.policy_loss(logp, old_logp, advantages, mask, **self.loss_params)
        if self.quantile is not None:
            if entropy is None:
                raise ValueError("GRPOLoss: top_entropy_quantile < 1 needs entropy")
            pg_tok = pg_tok * top_entropy_mask(entropy, mask, self.quantile)
        if rollout_logp is not None:
            weight = self.correct(old_logp, rollout_logp, mask, **self.correction_params)
            if weight is not None:
                weight = ops.stop_gradient(weight)
                pg_tok = pg_tok * weight
                raw = ops.stop_gradient(log_importance_weight(old_logp, rollout_logp, mask, weight.shape[-1] == 1))
                w_mean, w_max, w_clipped = correction_metrics(weight, raw, mask)
                metrics["rollout_correction/weight_mean"] = w_mean
                metrics["rollout_correction/weight_max"] = w_max
                metrics["rollout_correction/clipfrac"] = w_clipped
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

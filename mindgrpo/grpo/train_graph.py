"""The GRPO training graph: per-token log-probs, GRPO loss, backward, gradient accumulation.

One call of `GRPOGradStep` handles one micro-batch: forward on the scored positions only, the
loss normalised by the global token / sequence counts of the whole mini-batch (so the summed
micro-batch gradients equal the full mini-batch gradient and the parallel layout does not
change the loss), backward, and `grads` added into the accumulation buffers. The optimizer
step (`optim.AdamW`) runs once per mini-batch.
"""

from __future__ import annotations

from typing import Sequence

import mindspore as ms
import numpy as np
from mindspore import Parameter, nn, ops

from mindgrpo.grpo.ms_corrections import mismatch_metrics
from mindgrpo.grpo.ms_objective import GRPOLoss
from mindgrpo.grpo.optim import AccumulateGrads, GradBuffer
from mindgrpo.models.qwen2 import Qwen2ForCausalLM
from mindgrpo.models.scoring import (DroppedPackedTokenLogProbs, DroppedTokenLogProbs, PackedTokenLogProbs,
                                     TokenLogProbs)

# per-micro-batch metrics of the training graph; all but pg_loss are token means (nll: -log p of the
# scored tokens under the policy before the update, free with the forward pass)
METRIC_KEYS = ("pg_loss", "kl", "entropy", "clipfrac", "clipfrac_low", "clipfrac_high", "nll")
# with the rollout engine's log-probs: how far they are from the training graph's (corrections.mismatch_metrics),
# and, with a rollout correction, its weights (corrections.correction_metrics)
MISMATCH_KEYS = ("mismatch/abs_diff_mean", "mismatch/abs_diff_max", "mismatch/k3", "mismatch/log_ppl_ratio")
CORRECTION_KEYS = ("rollout_correction/weight_mean", "rollout_correction/weight_max", "rollout_correction/clipfrac")
# Every construct compiled as a top graph or differentiated here (PolicyLoss, GRPOGradStep, StageGradStep) takes
# all its arguments, with no default values and no *args: MindSpore 2.10 keeps such a cell, and the model it
# holds, alive after the last Python reference is gone (no referrer gc can see), so every PolicyUpdater, and
# every update graph rl_config.release_graphs dropped, kept its PolicyLoss and model for good
# (tests/grpo/test_graph_lifetime.py; DEVELOPERS.md, Memory).
# how a step combines its micro-batches' values: pg_loss is already normalised globally (summed), the
# maxima (all >= 0) by their maximum, the rest by their token-weighted mean
SUMMED, MAXIMA = ("pg_loss",), ("mismatch/abs_diff_max", "rollout_correction/weight_max")


def fold_metrics(keys: Sequence[str], totals: np.ndarray, loss: float, values: Sequence[float], tokens: float) -> None:
    """Adds one micro-batch's (or row group's) loss and metrics, in the order of `keys`, to `totals` =
    [loss, tokens, then per key a sum or a maximum] in place: losses add up (each already normalised by
    the global counts), as do SUMMED metrics; MAXIMA (all >= 0) take their maximum; the rest are token
    means over the part's `tokens` (its mask's sum), added weighted by them. `metric_means` ends it."""
    summed, maxima = np.isin(keys, SUMMED), np.isin(keys, MAXIMA)
    v = np.asarray(values, np.float64)
    totals[0] += loss
    totals[1] += tokens
    totals[2:] = np.where(maxima, np.maximum(totals[2:], v), totals[2:] + np.where(summed, v, tokens * v))


def metric_means(keys: Sequence[str], sums: np.ndarray, tokens: float) -> np.ndarray:
    """`fold_metrics`' totals[2:] over all the parts -> the metrics of the parts together (token means
    divided by the parts' tokens, at least 1, as `PolicyLoss` divides a micro-batch's)."""
    keep = np.isin(keys, SUMMED) | np.isin(keys, MAXIMA)
    return np.where(keep, sums, sums / max(tokens, 1.0))


def metric_keys(loss: GRPOLoss, with_rollout: bool) -> tuple:
    """The names of the metrics `PolicyLoss` returns, in order."""
    if not with_rollout:
        return METRIC_KEYS
    return METRIC_KEYS + MISMATCH_KEYS + (CORRECTION_KEYS if loss.corrects else ())


class PolicyLoss(nn.Cell):
    """(inputs, feed, mask (B, R), advantages (B,), old_logp (B, R), ref_logp (B, R),
    global_tokens (), global_seqs (), rollout_logp (B, R) or None) -> loss, metrics tuple
    (`metric_keys`).

    inputs and feed are what the forward takes (`mindgrpo/grpo/packing.py`): input_ids (B, S) (or
    the previous stage's hidden states) and (score_pos (B, R), labels (B, R)), or with packed, the
    packed rows and (positions, segments, tokens, labels, slots). Either way the log-probs come out
    in the samples' (B, R) layout, so the loss below is the same.

    from_hidden: inputs are the hidden states after every decoder layer (`mindgrpo/grpo/layerwise.py`), of right-padded
    rows or packed ones (feed as packed's: its positions and runs are not read).
    detach_old: the TRL shortcut when each rollout is used for exactly one update: old log-probs
    are the current ones with the gradient stopped (ratio 1), and old_logp is ignored.
    use_ref: False when beta == 0 (the reference model is not run; ref_logp is ignored).
    rollout_logp: the rollout engine's log-probs of the sampled tokens (of the distribution it
    drew from); given, the mismatch metrics compare them with the training graph's log-probs
    before the update (the old log-probs, or with old_is_training False, when the old log-probs
    are the rollout's own, this pass's), and the loss's rollout correction applies.
    dropout: the model's LoRA dropout applies (docs/lora.md): feed ends with the micro-batch's dropout key
    (`models/lora_dropout.update_key`), which the forward takes after the other feed."""

    def __init__(self, lm: Qwen2ForCausalLM, loss: GRPOLoss, detach_old: bool, use_ref: bool,
                 with_entropy: bool = True, temperature: float = 1.0, chunk: int = 0, old_is_training: bool = True,
                 packed: bool = False, attention: str = "mask", from_hidden: bool = False, dropout: bool = False):
        super().__init__(auto_prefix=False)  # keep the model's parameter names
        if loss.needs_entropy and not with_entropy:
            raise ValueError("top_entropy_quantile < 1 needs the entropy: build PolicyLoss with_entropy")
        if packed and from_hidden and attention == "flash":
            raise ValueError("the layerwise update (from_hidden) takes packed rows with an additive bias, not flash")
        if dropout and from_hidden:
            raise ValueError("the layerwise update's head (from_hidden) runs after the layers: its dropout is theirs")
        packed_cls = DroppedPackedTokenLogProbs if dropout else PackedTokenLogProbs
        rows_cls = DroppedTokenLogProbs if dropout else TokenLogProbs
        self.scorer = packed_cls(lm, with_entropy, temperature, chunk, attention, from_hidden) if packed \
            else rows_cls(lm, with_entropy, temperature, chunk, from_hidden)
        self.loss = loss
        self.detach_old, self.use_ref, self.old_is_training = detach_old, use_ref, old_is_training

    def construct(self, inputs, feed, mask, advantages, old_logp, ref_logp, global_tokens, global_seqs,
                  rollout_logp):
        logp, ent = self.scorer(inputs, *feed)
        old = ops.stop_gradient(logp) if self.detach_old else old_logp
        ref = ref_logp if self.use_ref else None
        loss, m = self.loss(logp, old, ref, advantages, mask, global_tokens, global_seqs, ent, rollout_logp)
        n = ops.maximum(mask.sum(), 1.0)
        entropy = ops.stop_gradient((ent * mask).sum() / n)
        nll = ops.stop_gradient(-(logp * mask).sum() / n)
        kl = m["kl"] if self.use_ref else ops.zeros((), ms.float32)
        metrics = (m["pg_loss"], kl, entropy, m["clipfrac"], m["clipfrac_low"], m["clipfrac_high"], nll)
        if rollout_logp is not None:
            train = old if self.old_is_training else ops.stop_gradient(logp)
            metrics = metrics + mismatch_metrics(train, rollout_logp, mask)  # no gradient: inputs or stopped
            if self.loss.corrects:
                metrics = metrics + (m["rollout_correction/weight_mean"], m["rollout_correction/weight_max"],
                                     m["rollout_correction/clipfrac"])
        return loss, metrics


class GRPOGradStep(nn.Cell):
    """One micro-batch: loss and metrics out, gradients accumulated into `buffer`.

    wrt_inputs (the last of several pipeline stages, whose first input is the previous stage's
    hidden states (B, S, H)): also returns the gradient of the loss with respect to them."""

    def __init__(self, policy_loss: PolicyLoss, params: Sequence[Parameter], buffer: GradBuffer,
                 wrt_inputs: bool = False):
        super().__init__(auto_prefix=False)  # keep the model's parameter names
        self.policy_loss = policy_loss
        self.weights = ms.ParameterTuple(params)
        self.wrt_inputs = wrt_inputs
        self.has_weights = len(params) > 0  # none: the inputs' gradient alone (a LoRA head, `layerwise.py`)
        self.grad_fn = ms.value_and_grad(self.policy_loss, 0 if wrt_inputs else None,
                                         self.weights if params else None, has_aux=True)
        self.accumulate = AccumulateGrads(buffer)

    def construct(self, inputs, feed, mask, advantages, old_logp, ref_logp, global_tokens, global_seqs,
                  rollout_logp):
        (loss, metrics), grads = self.grad_fn(inputs, feed, mask, advantages, old_logp, ref_logp,
                                              global_tokens, global_seqs, rollout_logp)
        if self.wrt_inputs and not self.has_weights:
            return loss, metrics, grads
        if self.wrt_inputs:
            d_inputs, grads = grads
            return ops.depend(loss, self.accumulate(grads)), metrics, d_inputs
        return ops.depend(loss, self.accumulate(grads)), metrics


class StageGradStep(nn.Cell):
    """The backward pass of a pipeline stage before the last, for one micro-batch: its forward
    (`stage`, recomputed here) differentiated against the gradient of its output that the next
    stage sent (`sens`, (B, S, H)); the parameters' gradients are accumulated into `buffer`.
    Returns the gradient with respect to the stage's input (B, S, H), or, on the first stage
    (token ids in), zeros (1,). feed: the stage's other inputs (packed rows' positions and
    segments, or () on right-padded rows), not differentiated."""

    def __init__(self, stage: nn.Cell, params: Sequence[Parameter], buffer: GradBuffer, wrt_inputs: bool):
        super().__init__(auto_prefix=False)  # keep the model's parameter names
        self.stage = stage
        self.weights = ms.ParameterTuple(params)
        self.wrt_inputs = wrt_inputs
        self.grad = ops.GradOperation(get_all=wrt_inputs, get_by_list=True, sens_param=True)
        self.accumulate = AccumulateGrads(buffer)

    def construct(self, inputs, sens, feed):
        if self.wrt_inputs:
            d_all, grads = self.grad(self.stage, self.weights)(inputs, feed, sens)
            d_inputs = d_all[0]
        else:
            grads = self.grad(self.stage, self.weights)(inputs, feed, sens)
            d_inputs = ops.zeros((1,), ms.float32)
        return ops.depend(d_inputs, self.accumulate(grads))

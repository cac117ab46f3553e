"""The policy's training side and the log-prob scorer (reference model, old log-probs).

`Scorer` runs the no-grad log-prob graph over an Experience in micro-batches.
`PolicyUpdater` owns the policy's gradient buffers and AdamW state and runs one optimizer step
per mini-batch: micro-batches through `GRPOGradStep`, then `AdamW`. Graphs are cached per
micro-batch shape (S and R are bucketed by `experience.pack`). With pipeline stages both run
their micro-batches through the stage's schedule (`mindgrpo.parallel.pipeline`).
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional

import numpy as np
import mindspore as ms
from mindspore import Tensor

from mindgrpo.grpo.experience import Experience, micro_batches
from mindgrpo.grpo.ms_algos import GRPOLoss
from mindgrpo.grpo.optim import AdamW, GradBuffer, adam_scalars
from mindgrpo.grpo.train_graph import MAXIMA, SUMMED, GRPOGradStep, PolicyLoss, StageGradStep, metric_keys
from mindgrpo.models.convert import expected_shapes
from mindgrpo.models.qwen2 import Qwen2ForCausalLM
from mindgrpo.models.scoring import StageHidden, TokenLogProbs
from mindgrpo.parallel.layout import ParallelLayout
from mindgrpo.parallel.pipeline import Pipeline


def hidden_shape(lm: Qwen2ForCausalLM, exp: Experience, batches: List[np.ndarray]):
    """m -> the (B, S, H) hidden states micro-batch m passes between pipeline stages."""
    return lambda m: (len(batches[m]), exp.input_ids.shape[1], lm.config.hidden_size)


class Scorer:
    """log p(labels) (B, R) of an Experience under `lm`, micro-batch by micro-batch.

    pipeline: lm's pipeline stage (`mindgrpo.parallel.pipeline.Pipeline`); default one stage.
    Every stage returns the log-probs (the last computes them)."""

    def __init__(self, lm: Qwen2ForCausalLM, micro_batch_size: int, temperature: float = 1.0, chunk: int = 0,
                 pipeline: Optional[Pipeline] = None):
        self.lm = lm
        self.pipe = pipeline or Pipeline()
        if self.pipe.last:
            self.graph = TokenLogProbs(lm, with_entropy=False, temperature=temperature, chunk=chunk)
        else:
            self.stage = StageHidden(lm)
        self.micro = micro_batch_size

    def __call__(self, exp: Experience) -> np.ndarray:
        batches = micro_batches(len(exp), self.micro)

        def last(m, x):
            rows = batches[m]
            return self.graph(x, Tensor(exp.score_pos[rows]), Tensor(exp.labels[rows]))[0].asnumpy()

        logps = self.pipe.forward(len(batches), lambda m: Tensor(exp.input_ids[batches[m]]),
                                  hidden_shape(self.lm, exp, batches), lambda x: self.stage(x), last)
        out = np.zeros(exp.labels.shape, np.float32)
        for rows, logp in zip(batches, logps):
            out[rows] = logp
        return self.pipe.from_last(out) * exp.mask


class PolicyUpdater:
    def __init__(self, lm: Qwen2ForCausalLM, loss: GRPOLoss, *, micro_batch_size: int, detach_old: bool,
                 use_ref: bool, beta1: float, beta2: float, eps: float, weight_decay: float,
                 grad_clip: float, with_entropy: bool = True, grad_reducer=None, temperature: float = 1.0,
                 optimizer_shard: bool = False, chunk: int = 0, pipeline: Optional[Pipeline] = None,
                 old_is_training: bool = True):
        """old_is_training: the old log-probs given with the experience come from the training graph
        (False when they are the rollout engine's, rl_config.old_logprobs_from_rollout)."""
        self.lm = lm
        self.loss = loss
        self.pipe = pipe = pipeline or Pipeline()
        named = [(n, p) for n, p in lm.parameters_and_names() if p.requires_grad]
        self.params = [p for _, p in named]
        self.buffer = GradBuffer(self.params)
        if pipe.last:  # forward, loss and backward in one graph (the whole model with one stage)
            self.step_graph = GRPOGradStep(PolicyLoss(lm, loss, detach_old, use_ref, with_entropy, temperature,
                                                      chunk, old_is_training),
                                           self.params, self.buffer, wrt_inputs=not pipe.first)
        else:  # a stage before the last: its forward, and its backward from the next stage's gradient
            self.stage = StageHidden(lm)
            self.stage_grad = StageGradStep(StageHidden(lm), self.params, self.buffer, wrt_inputs=not pipe.first)
        # with optimizer_shard, the replicas of grad_reducer's data-parallel group split the moments (ZeRO-1);
        # under tensor parallelism the model's layer factory knows how to sum the pieces' norms, and
        # the pipeline sums them over the stages
        shard = grad_reducer.group if optimizer_shard and grad_reducer is not None else None
        layout = ParallelLayout(dp=1 if shard is None else shard.size, tp=lm.layer_factory.tp)
        full = expected_shapes(lm.config)
        sq_norm = pipe.sq_norm(lm.layer_factory.grad_sq_norm([n for n, _ in named]), len(named))
        self.adamw = AdamW(self.params, self.buffer, beta1, beta2, eps, weight_decay, sq_norm=sq_norm, shard=shard,
                           sharded=[layout.opt_shard_parts(n, full[n]) > 1 for n, _ in named])
        self.beta1, self.beta2, self.grad_clip = beta1, beta2, grad_clip
        self.micro = micro_batch_size
        # data parallelism (mindgrpo.parallel.data_parallel.DataParallelGrads), when set:
        # rows(n) picks this replica's rows, __call__(buffer) sums the gradients, sum(values)
        # sums host numbers over the replicas
        self.grad_reducer = grad_reducer
        self.optimizer_steps = 0

    def state_parameters(self) -> List[ms.Parameter]:
        """What a checkpoint must hold besides the weights to resume exactly."""
        return self.adamw.state_parameters()

    def resident_parameters(self) -> List[ms.Parameter]:
        """What the optimizer keeps on the device (for the memory ledger)."""
        return self.adamw.resident_parameters()

    def update(self, exp: Experience, lr: float, global_tokens: Optional[float] = None,
               global_seqs: Optional[float] = None) -> Dict[str, float]:
        """One optimizer step on a mini-batch. Token/sequence normalisers default to this
        mini-batch's own counts. Under data parallelism every replica is given the whole
        mini-batch and trains on its rows, so these counts are already the global ones.
        With exp.sampling_logp (the rollout engine's log-probs) the mismatch metrics are reported
        and the loss's rollout correction applies."""
        n_tok = float(exp.mask.sum()) if global_tokens is None else global_tokens
        n_seq = float((exp.mask.sum(-1) > 0).sum()) if global_seqs is None else global_seqs
        g_tok, g_seq = Tensor(np.float32(n_tok)), Tensor(np.float32(n_seq))
        dp = self.grad_reducer
        if dp is not None:
            exp = exp.select(dp.rows(len(exp)))
        zeros = np.zeros(exp.labels.shape, np.float32)
        old = exp.old_logp if exp.old_logp is not None else zeros
        ref = exp.ref_logp if exp.ref_logp is not None else zeros
        rollout = exp.sampling_logp
        keys = metric_keys(self.loss, rollout is not None)
        batches = micro_batches(len(exp), self.micro)

        def last_step(m, x):  # x: token ids, or the previous stage's hidden states
            rows = batches[m]
            out = self.step_graph(x, Tensor(exp.score_pos[rows]), Tensor(exp.labels[rows]), Tensor(exp.mask[rows]),
                                  Tensor(exp.advantages[rows]), Tensor(old[rows]), Tensor(ref[rows]), g_tok, g_seq,
                                  None if rollout is None else Tensor(rollout[rows]))
            values = [float(out[0].asnumpy())] + [float(v.asnumpy()) for v in out[1]]
            return values, (out[2] if len(out) == 3 else None)

        results = self.pipe.train(len(batches), lambda m: Tensor(exp.input_ids[batches[m]]),
                                  hidden_shape(self.lm, exp, batches), lambda x: self.stage(x),
                                  lambda x, dy: self.stage_grad(x, dy), last_step)
        summed, maxima = np.isin(keys, SUMMED), np.isin(keys, MAXIMA)
        totals = np.zeros(2 + len(keys))  # loss, tokens, metric sums (or maxima): on the last stage
        for rows, values in zip(batches, results):
            w = float(exp.mask[rows].sum())
            totals[0] += values[0]  # already normalised globally: micro-batch losses add up
            totals[1] += w
            v = np.array(values[1:])
            totals[2:] = np.where(maxima, np.maximum(totals[2:], v), totals[2:] + np.where(summed, v, w * v))
        totals = self.pipe.from_last(totals)  # the other stages add zeros: maxima are >= 0
        if dp is not None:
            dp(self.buffer)
            peaks = totals[2:][maxima]
            totals = dp.sum(totals)
            if peaks.size:
                totals[2:][maxima] = dp.max(peaks)
        loss_sum, tok_sum, sums = float(totals[0]), float(totals[1]), totals[2:]
        # A non-finite loss or gradient norm (the same on every rank: both are sums over them) skips
        # the step: weights, moments and the bias corrections' step count stay as they were.
        norm = self.adamw.grad_norm()
        grad_norm = float(norm.asnumpy())
        skipped = not (math.isfinite(loss_sum) and math.isfinite(grad_norm))
        if skipped:
            self.adamw.zero_grads()
        else:
            bc1, bc2 = adam_scalars(self.optimizer_steps + 1, self.beta1, self.beta2)
            self.adamw(Tensor(np.float32(lr)), bc1, bc2, Tensor(np.float32(self.grad_clip)), norm)
            self.optimizer_steps += 1
        # pg_loss is normalised by the global counts, so micro-batch values add up; the maxima are
        # maxima; the others are per-micro-batch token means, weighted by their token counts here
        out = {k: float(v if k in SUMMED or k in MAXIMA else v / max(tok_sum, 1.0)) for k, v in zip(keys, sums)}
        out.update(loss=loss_sum, grad_norm=grad_norm, lr=lr, skipped=float(skipped))
        return out

"""The policy's training side and the log-prob scorer (reference model, old log-probs).

`Scorer` runs the no-grad log-prob graph over an Experience in micro-batches.
`PolicyUpdater` owns the policy's gradient buffers and AdamW state and runs one optimizer step
per mini-batch: micro-batches through `GRPOGradStep`, then `AdamW`. Graphs are cached per
micro-batch shape (S and R are bucketed by `experience.pack`).
"""

from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np
import mindspore as ms
from mindspore import Tensor

from mindgrpo.grpo.experience import Experience, micro_batches
from mindgrpo.grpo.ms_algos import GRPOLoss
from mindgrpo.grpo.optim import AdamW, GradBuffer, adam_scalars
from mindgrpo.grpo.train_graph import METRIC_KEYS, GRPOGradStep, PolicyLoss
from mindgrpo.models.convert import expected_shapes
from mindgrpo.models.qwen2 import Qwen2ForCausalLM
from mindgrpo.models.scoring import TokenLogProbs
from mindgrpo.parallel.layout import ParallelLayout


class Scorer:
    """log p(labels) (B, R) of an Experience under `lm`, micro-batch by micro-batch."""

    def __init__(self, lm: Qwen2ForCausalLM, micro_batch_size: int, temperature: float = 1.0, chunk: int = 0):
        self.graph = TokenLogProbs(lm, with_entropy=False, temperature=temperature, chunk=chunk)
        self.micro = micro_batch_size

    def __call__(self, exp: Experience) -> np.ndarray:
        out = np.zeros(exp.labels.shape, np.float32)
        for rows in micro_batches(len(exp), self.micro):
            logp, _ = self.graph(Tensor(exp.input_ids[rows]), Tensor(exp.score_pos[rows]), Tensor(exp.labels[rows]))
            out[rows] = logp.asnumpy()
        return out * exp.mask


class PolicyUpdater:
    def __init__(self, lm: Qwen2ForCausalLM, loss: GRPOLoss, *, micro_batch_size: int, detach_old: bool,
                 use_ref: bool, beta1: float, beta2: float, eps: float, weight_decay: float,
                 grad_clip: float, with_entropy: bool = True, grad_reducer=None, temperature: float = 1.0,
                 optimizer_shard: bool = False, chunk: int = 0):
        self.lm = lm
        named = [(n, p) for n, p in lm.parameters_and_names() if p.requires_grad]
        self.params = [p for _, p in named]
        self.buffer = GradBuffer(self.params)
        self.step_graph = GRPOGradStep(PolicyLoss(lm, loss, detach_old, use_ref, with_entropy, temperature, chunk),
                                       self.params, self.buffer)
        # with optimizer_shard, the replicas of grad_reducer's data-parallel group split the moments (ZeRO-1);
        # under tensor parallelism the model's layer factory knows how to sum the pieces' norms
        shard = grad_reducer.group if optimizer_shard and grad_reducer is not None else None
        layout = ParallelLayout(dp=1 if shard is None else shard.size, tp=lm.layer_factory.tp)
        full = expected_shapes(lm.config)
        self.adamw = AdamW(self.params, self.buffer, beta1, beta2, eps, weight_decay,
                           sq_norm=lm.layer_factory.grad_sq_norm([n for n, _ in named]), shard=shard,
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
        mini-batch and trains on its rows, so these counts are already the global ones."""
        n_tok = float(exp.mask.sum()) if global_tokens is None else global_tokens
        n_seq = float((exp.mask.sum(-1) > 0).sum()) if global_seqs is None else global_seqs
        g_tok, g_seq = Tensor(np.float32(n_tok)), Tensor(np.float32(n_seq))
        dp = self.grad_reducer
        if dp is not None:
            exp = exp.select(dp.rows(len(exp)))
        zeros = np.zeros(exp.labels.shape, np.float32)
        old = exp.old_logp if exp.old_logp is not None else zeros
        ref = exp.ref_logp if exp.ref_logp is not None else zeros
        loss_sum, sums, tok_sum = 0.0, np.zeros(len(METRIC_KEYS)), 0.0
        for rows in micro_batches(len(exp), self.micro):
            loss, metrics = self.step_graph(
                Tensor(exp.input_ids[rows]), Tensor(exp.score_pos[rows]), Tensor(exp.labels[rows]),
                Tensor(exp.mask[rows]), Tensor(exp.advantages[rows]), Tensor(old[rows]), Tensor(ref[rows]),
                g_tok, g_seq)
            w = float(exp.mask[rows].sum())
            loss_sum += float(loss.asnumpy())  # already normalised globally: micro-batch losses add up
            values = np.array([float(m.asnumpy()) for m in metrics])
            sums += np.where(np.array(METRIC_KEYS) == "pg_loss", values, w * values)
            tok_sum += w
        if dp is not None:
            dp(self.buffer)
            totals = dp.sum(np.concatenate([[loss_sum, tok_sum], sums]))
            loss_sum, tok_sum, sums = float(totals[0]), float(totals[1]), totals[2:]
        self.optimizer_steps += 1
        bc1, bc2 = adam_scalars(self.optimizer_steps, self.beta1, self.beta2)
        norm = self.adamw(Tensor(np.float32(lr)), bc1, bc2, Tensor(np.float32(self.grad_clip)))
        # pg_loss is normalised by the global counts, so micro-batch values add up; the others
        # are per-micro-batch token means, weighted by their token counts here
        out = {k: float(v if k == "pg_loss" else v / max(tok_sum, 1.0)) for k, v in zip(METRIC_KEYS, sums)}
        out.update(loss=loss_sum, grad_norm=float(norm.asnumpy()), lr=lr)
        return out

"""The policy's training side and the log-prob scorer (reference model, old log-probs).

`Scorer` runs the no-grad log-prob graph over an Experience in micro-batches.
`PolicyUpdater` owns the policy's gradient buffers and AdamW state and runs one optimizer step
per mini-batch: micro-batches through `GRPOGradStep`, then `AdamW`. Both cut an Experience into
micro-batches as `mindgrpo.grpo.packing` says (fixed rows, token budgets or packed rows); graphs
are cached per micro-batch shape, which it buckets. With pipeline stages both run their
micro-batches through the stage's schedule (`mindgrpo.parallel.pipeline`).
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional

import numpy as np
import mindspore as ms
from mindspore import Tensor

from mindgrpo.grpo.experience import Experience
from mindgrpo.grpo.layerwise import LayerwiseAdamW, LayerwiseGradStep, LayerwiseLogProbs
from mindgrpo.grpo.ms_objective import GRPOLoss
from mindgrpo.grpo.optim import AdamW, AdamWSettings, GradBuffer, adam_scalars
from mindgrpo.grpo.packing import Batching, MicroBatch, gather_samples, plan
from mindgrpo.grpo.train_graph import (MAXIMA, GRPOGradStep, PolicyLoss, StageGradStep, fold_metrics, metric_keys,
                                      metric_means)
from mindgrpo.memory.policy import MemoryPolicy
from mindgrpo.models.convert import expected_shapes
from mindgrpo.models.lora import ADAPTER_SUFFIXES, lora_spec
from mindgrpo.models.lora_dropout import update_key
from mindgrpo.models.qwen2 import Qwen2ForCausalLM
from mindgrpo.models.scoring import PackedTokenLogProbs, StageHidden, TokenLogProbs
from mindgrpo.parallel.layout import ParallelLayout
from mindgrpo.parallel.pipeline import Pipeline


def hidden_shape(lm: Qwen2ForCausalLM, batches: List[MicroBatch]):
    """m -> the (B, S, H) hidden states micro-batch m passes between pipeline stages."""
    return lambda m: batches[m].ids.shape + (lm.config.hidden_size,)


def _check_layerwise(what: str, batching: Batching, pipe: Pipeline) -> None:
    if not (pipe.first and pipe.last) or batching.graph_attention == "flash":
        raise ValueError(f"{what} runs on one pipeline stage, its layer graphs attending through an additive bias "
                         "(no flash attention)")


def _layer_attention(batching: Batching) -> Optional[str]:
    """The layerwise graphs' attention for batching's micro-batches: None (right-padded rows), mask or prefix."""
    return None if batching.layout == "rows" else batching.graph_attention


def tensors(arrays) -> tuple:
    return tuple(Tensor(a) for a in arrays)


def feed_input(arrays) -> tuple:
    """A graph's tuple input of Tensors (`ms.mutable`: the values are inputs, not constants); () as it is."""
    return ms.mutable(tensors(arrays)) if len(arrays) else ()


class Scorer:
    """log p(labels) (B, R) of an Experience under `lm`, micro-batch by micro-batch.

    pipeline: lm's pipeline stage (`mindgrpo.parallel.pipeline.Pipeline`); default one stage.
    Every stage returns the log-probs (the last computes them).
    max_tokens, packing, attention: token-budget micro-batches, packed rows and how they keep
    samples apart (`mindgrpo.grpo.packing`).
    layerwise: a host loop over one compiled decoder-layer graph (`mindgrpo.grpo.layerwise.LayerwiseLogProbs`):
    the same log-probs, one layer's graph buffers instead of every layer's; one device, any layout but flash
    attention's."""

    def __init__(self, lm: Qwen2ForCausalLM, micro_batch_size: int, temperature: float = 1.0, chunk: int = 0,
                 pipeline: Optional[Pipeline] = None, max_tokens: int = 0, packing: bool = False,
                 attention: str = "mask", layerwise: bool = False, shared_prefix: bool = False):
        self.lm = lm
        self.pipe = pipeline or Pipeline()
        self.batching = Batching(micro_batch_size, max_tokens, packing, attention, shared_prefix=shared_prefix)
        if layerwise:
            _check_layerwise("layerwise scoring", self.batching, self.pipe)
        self.temperature, self.chunk, self.layerwise = temperature, chunk, layerwise
        self._build()

    def _build(self) -> None:
        lm, attention = self.lm, self.batching.graph_attention
        self.stage = self.graph = None
        if self.layerwise:
            self.graph = LayerwiseLogProbs(lm, with_entropy=False, temperature=self.temperature, chunk=self.chunk,
                                           attention=_layer_attention(self.batching))
        elif not self.pipe.last:
            self.stage = StageHidden(lm, attention)
        elif self.batching.layout == "rows":
            self.graph = TokenLogProbs(lm, with_entropy=False, temperature=self.temperature, chunk=self.chunk)
        else:
            self.graph = PackedTokenLogProbs(lm, False, self.temperature, self.chunk, attention)

    def release(self) -> None:
        """Drop the compiled graphs and the buffers the runtime keeps for them (freed only with the
        cells that compiled them: `tests/test_environment.py`); the next call compiles them again."""
        self.stage = self.graph = None

    def __call__(self, exp: Experience) -> np.ndarray:
        if self.stage is None and self.graph is None:
            self._build()
        batches = plan(exp, self.batching)

        def last(m, x):
            return self.graph(x, *tensors(batches[m].feed))[0].asnumpy()

        logps = self.pipe.forward(len(batches), lambda m: Tensor(batches[m].ids), hidden_shape(self.lm, batches),
                                  lambda m, x: self.stage(x, feed_input(batches[m].stage_feed)), last)
        return self.pipe.from_last(gather_samples(exp.labels.shape, batches, logps)) * exp.mask


class PolicyUpdater:
    def __init__(self, lm: Qwen2ForCausalLM, loss: GRPOLoss, batching: Batching, *, detach_old: bool, use_ref: bool,
                 optimizer: AdamWSettings = AdamWSettings(), memory: MemoryPolicy = MemoryPolicy(),
                 with_entropy: bool = True, temperature: float = 1.0, chunk: int = 0, old_is_training: bool = True,
                 grad_reducer=None, pipeline: Optional[Pipeline] = None, seed: int = 0):
        """batching: how an Experience is cut into micro-batches (as `Scorer`'s); optimizer: AdamW's settings.
        old_is_training: the old log-probs given with the experience come from the training graph
        (False when they are the rollout engine's, rl_config.old_logprobs_from_rollout).
        memory: the run's memory policy (`mindgrpo.memory.policy`), of which the updater reads
        - recompute: activation recompute per decoder layer in the training graph
          (`Qwen2ForCausalLM.recompute_layers`): the same gradients; less memory where the runtime
          frees intermediates in time (not MindSpore 2.10's CPU runtime: `benchmarks/recompute.py`);
        - layerwise_update: the training step as a host loop over one compiled decoder-layer graph
          (`mindgrpo.grpo.layerwise`): the same gradients, one layer's graph buffers instead of every
          layer's; one device, any layout but flash attention's. Without ZeRO-1 the gradient norm and AdamW's step run
          group by group too (`layerwise.LayerwiseAdamW`: bit for bit, no copy of every gradient kept);
          head_rows: the rows of a micro-batch the vocabulary head and loss take a graph call
          (`layerwise.LayerwiseGradStep`); 0 all; recompute_num_layers: how many of the first layers run their
          forward again in their backward (None: all), the others keeping their activations
          (`models/saved_layer.py`: no second forward);
        - release_graphs: the gradient accumulators start shrunk (`GradBuffer.release`): the first update
          makes them.
        seed: the run's seed, which keys LoRA dropout's masks (`models/lora_dropout.py`: with the optimizer step,
        the micro-batch and the data-parallel replica) when the model's adapters train with lora_dropout > 0."""
        self.lm = lm
        if memory.recompute:
            lm.recompute_layers()
        self.loss = loss
        self.batching = batching
        self.pipe = pipe = pipeline or Pipeline()
        named = [(n, p) for n, p in lm.parameters_and_names() if p.requires_grad]
        self.params = [p for _, p in named]
        spec = lora_spec(lm)  # dropout where the adapters train (not in a LoRA run's warm start of its base)
        self.dropout = spec is not None and spec.dropout > 0 and any(n.endswith(ADAPTER_SUFFIXES) for n, _ in named)
        self.seed = seed
        self.buffer = GradBuffer(self.params, released=memory.release_graphs)
        self._loss_args = (detach_old, use_ref, with_entropy, temperature, chunk, old_is_training)
        layerwise = memory.layerwise_update
        if layerwise:
            _check_layerwise("the layerwise update", self.batching, pipe)
        self.layerwise, self.head_rows, self.recompute_num_layers = layerwise, memory.head_rows, \
            memory.recompute_num_layers
        self._build()
        # with optimizer_shard, the replicas of grad_reducer's data-parallel group split the moments (ZeRO-1);
        # under tensor parallelism the model's layer factory knows how to sum the pieces' norms, and
        # the pipeline sums them over the stages
        shard = grad_reducer.group if optimizer.shard and grad_reducer is not None else None
        layout = ParallelLayout(dp=1 if shard is None else shard.size, tp=lm.layer_factory.tp)
        full = expected_shapes(lm.config)  # LoRA's adapters are not in it: whole on one device, their own shapes
        sq_norm = pipe.sq_norm(lm.layer_factory.grad_sq_norm([n for n, _ in named]), len(named))
        self.adamw = AdamW(self.params, self.buffer, optimizer.beta1, optimizer.beta2, optimizer.eps,
                           optimizer.weight_decay, sq_norm=sq_norm, shard=shard,
                           sharded=[layout.opt_shard_parts(n, full.get(n, tuple(p.shape))) > 1 for n, p in named])
        if layerwise and shard is None and sq_norm is None:  # the norm and the step group by group too
            self.adamw = LayerwiseAdamW(self.adamw, self.params)
        self.beta1, self.beta2, self.grad_clip = optimizer.beta1, optimizer.beta2, optimizer.grad_clip
        # data parallelism (mindgrpo.parallel.data_parallel.DataParallelGrads), when set:
        # rows(n) picks this replica's rows, __call__(buffer) sums the gradients, sum(values)
        # sums host numbers over the replicas
        self.grad_reducer = grad_reducer
        self.optimizer_steps = 0

    def _build(self) -> None:
        """The training graphs (not yet compiled: each compiles at its first call)."""
        lm, pipe, attention = self.lm, self.pipe, self.batching.graph_attention
        self.step_graph = self.stage = self.stage_grad = None
        if self.layerwise:  # a host loop over one compiled decoder-layer graph
            rows_attention = _layer_attention(self.batching)  # None: right-padded rows
            policy_loss = PolicyLoss(lm, self.loss, *self._loss_args, packed=rows_attention is not None,
                                     attention=attention, from_hidden=True)
            self.step_graph = LayerwiseGradStep(policy_loss, lm, self.params, self.buffer, self.head_rows,
                                                self.dropout, self.recompute_num_layers, rows_attention)
        elif pipe.last:  # forward, loss and backward in one graph (the whole model with one stage)
            policy_loss = PolicyLoss(lm, self.loss, *self._loss_args, packed=self.batching.layout != "rows",
                                     attention=attention, dropout=self.dropout)
            self.step_graph = GRPOGradStep(policy_loss, self.params, self.buffer, wrt_inputs=not pipe.first)
        else:  # a stage before the last: its forward, and its backward from the next stage's gradient
            self.stage = StageHidden(lm, attention, self.dropout)
            self.stage_grad = StageGradStep(StageHidden(lm, attention, self.dropout), self.params, self.buffer,
                                            wrt_inputs=not pipe.first)

    def release(self) -> None:
        """Drop the compiled training graphs and the buffers the runtime keeps for them (freed only
        with the cells that compiled them: `tests/test_environment.py`) and the layerwise optimizer's group
        graphs; the gradient accumulators (zero after every update) shrink to one element until the next
        update remakes them (`GradBuffer.release`); AdamW's moments stay. The next update compiles the graphs
        again."""
        self.step_graph = self.stage = self.stage_grad = None
        if isinstance(self.adamw, LayerwiseAdamW):
            self.adamw.release()
        self.buffer.release()  # zero after every update: remade at the next one's start

    def state_parameters(self) -> List[ms.Parameter]:
        """What a checkpoint must hold besides the weights to resume exactly."""
        return self.adamw.state_parameters()

    def resident_parameters(self) -> List[ms.Parameter]:
        """What the optimizer keeps on the device (for the memory ledger)."""
        return self.adamw.resident_parameters()

    def update(self, exp: Experience, lr: float, global_tokens: Optional[float] = None,
               global_seqs: Optional[float] = None, release: bool = False) -> Dict[str, float]:
        """One optimizer step on a mini-batch. Token/sequence normalisers default to this
        mini-batch's own counts. Under data parallelism every replica is given the whole
        mini-batch and trains on its rows (with a token budget, about the same number of tokens
        on each), so these counts are already the global ones.
        With exp.sampling_logp (the rollout engine's log-probs) the mismatch metrics are reported
        and the loss's rollout correction applies.
        release: the training graphs are dropped once the gradients are in (and the layerwise optimizer's
        norm graphs once the norm is): the runtime's buffers for them go before the optimizer step makes its
        own (the last update before `release()`; the Qwen2.5-0.5B shape cut to 2 layers: the optimizer step peaked
        at 5.54 GB against 6.02-6.06, DEVELOPERS.md, Memory). The next update compiles them again."""
        n_tok = float(exp.mask.sum()) if global_tokens is None else global_tokens
        n_seq = float((exp.mask.sum(-1) > 0).sum()) if global_seqs is None else global_seqs
        g_tok, g_seq = Tensor(np.float32(n_tok)), Tensor(np.float32(n_seq))
        dp = self.grad_reducer
        if dp is not None:  # with token budgets, shares of about the same number of tokens to train on
            tokens = exp.lengths() * (exp.mask.sum(-1) > 0) if self.batching.by_tokens else None
            exp = exp.select(dp.rows(len(exp), tokens))
        if self.step_graph is None and self.stage is None:
            self._build()
        self.buffer.restore()
        with_rollout = exp.sampling_logp is not None
        keys = metric_keys(self.loss, with_rollout)
        batches = plan(exp, self.batching)
        replica = dp.group.index if dp is not None else 0

        def drop(m):  # LoRA dropout: the micro-batch's key ends the forward's feed (StageHidden, PolicyLoss)
            return (update_key(self.seed, self.optimizer_steps, m, replica),) if self.dropout else ()

        def last_step(m, x):  # x: token ids, or the previous stage's hidden states
            part = batches[m].exp  # the micro-batch's samples, every per-sample array in its (n, R) layout
            zeros = np.zeros(part.labels.shape, np.float32)
            old = part.old_logp if part.old_logp is not None else zeros
            ref = part.ref_logp if part.ref_logp is not None else zeros
            out = self.step_graph(x, feed_input(batches[m].feed + drop(m)), Tensor(part.mask), Tensor(part.advantages),
                                  Tensor(old), Tensor(ref), g_tok, g_seq,
                                  Tensor(part.sampling_logp) if with_rollout else None)
            values = [float(out[0].asnumpy())] + [float(v.asnumpy()) for v in out[1]]
            return values, (out[2] if len(out) == 3 else None)

        results = self.pipe.train(len(batches), lambda m: Tensor(batches[m].ids), hidden_shape(self.lm, batches),
                                  lambda m, x: self.stage(x, feed_input(batches[m].stage_feed + drop(m))),
                                  lambda m, x, dy: self.stage_grad(x, dy, feed_input(batches[m].stage_feed + drop(m))),
                                  last_step)
        maxima = np.isin(keys, MAXIMA)
        totals = np.zeros(2 + len(keys))  # loss, tokens, metric sums (or maxima): on the last stage
        for mb, values in zip(batches, results):
            fold_metrics(keys, totals, values[0], values[1:], float(mb.exp.mask.sum()))
        totals = self.pipe.from_last(totals)  # the other stages add zeros: maxima are >= 0
        if dp is not None:
            dp(self.buffer)
            peaks = totals[2:][maxima]
            totals = dp.sum(totals)
            if peaks.size:
                totals[2:][maxima] = dp.max(peaks)
        loss_sum, tok_sum, sums = float(totals[0]), float(totals[1]), totals[2:]
        if release:
            self.step_graph = self.stage = self.stage_grad = None
        # A non-finite loss or gradient norm (the same on every rank: both are sums over them) skips
        # the step: weights, moments and the bias corrections' step count stay as they were.
        norm = self.adamw.grad_norm()
        grad_norm = float(norm.asnumpy())
        if release and isinstance(self.adamw, LayerwiseAdamW):
            self.adamw.release_norm()
        skipped = not (math.isfinite(loss_sum) and math.isfinite(grad_norm))
        if skipped:
            self.adamw.zero_grads()
        else:
            bc1, bc2 = adam_scalars(self.optimizer_steps + 1, self.beta1, self.beta2)
            self.adamw(Tensor(np.float32(lr)), bc1, bc2, Tensor(np.float32(self.grad_clip)), norm)
            self.optimizer_steps += 1
        # pg_loss is normalised by the global counts, so micro-batch values add up; the maxima are
        # maxima; the others are per-micro-batch token means, weighted by their token counts here
        out = {k: float(v) for k, v in zip(keys, metric_means(keys, sums, tok_sum))}
        out.update(loss=loss_sum, grad_norm=grad_norm, lr=lr, skipped=float(skipped))
        return out

"""Per-device memory of a GRPO config, phase by phase, with and without host-memory swap.

The groups and phases are the SwapManager's (`mindgrpo/memory/swap.py`), sized from the model
config and the layouts, for one rank (`plan(..., rank=k)`; by default the rank whose peak is the
largest: ranks differ only by pipeline stage, the first holding the embedding, the last the head):

    policy      this rank's piece of the policy (training layout): its pipeline stage's
                parameters, its tensor-parallel piece of each, fp32 master weights
    grads       one fp32 accumulator per policy parameter
    optimizer   AdamW's two fp32 moments; with actor_config.parallel_config.optimizer_shard (ZeRO-1)
                1/dp of dim 0 of the parameters `ParallelLayout.opt_shard_parts` splits, and an fp32
                copy of that 1/dp of the weights, which the fused update rewrites (`optim.AdamW`)
    inference   the inference model's piece (inference layout), fp32 like the policy, plus the
                engine's fused copies of its layer weights (all but the norms) in the compute
                dtype (`mindgrpo.inference.layers.InferenceWeights`). Where the inference layout
                is the training layout and generate_config.inference_weights is auto, the
                inference model is the policy itself (one copy of the weights,
                `GRPOConfig.inference_shares_policy`; a run given --sft_path_infer of
                its own keeps a copy): the group is the fused copies alone, generating needs the
                policy resident (`swap.SHARED_PHASES`) and there is no sync bucket
    reference   the reference model's piece (reference layout), when beta > 0 without LoRA
    LoRA        (actor_config.lora_rank > 0) the policy and an inference copy hold the adapters beside the
                weights (r x (in + out) fp32 per targeted projection, split as the projection in their layout:
                a column-parallel one's B by rows, a row-parallel one's A by columns; and its scaling); grads
                and optimizer are the adapters' alone; no reference group: the reference phase runs the
                policy with its adapters off; the sync moves the adapters only (its largest bucket: layers
                joined up to rl_config.weight_sync_bucket_mb, as for the weights)
    kv_cache    the rollout engine's cache, sized from generate_config as the engine sizes it
                (`mindgrpo.inference.engine`): S = max_num_seqs slots, fewer if the budget
                max_num_batched_tokens cannot hold S x C tokens, C = max_prompt_length + max_tokens
                (+ conversations' appended turns, below; at most max_position_embeddings), plus one trash slot; x this
                rank's kv heads x d x layers x 2 (k and v), in the compute dtype. Exact: the engine
                allocates it at its first call
    transient   the largest resharding bucket during `sync` (its new piece and what it receives),
                from the resharding plan itself
    reward_model  every outcome reward model of reward_config.reward_models, fp32, this rank's piece of it
                (split like the policy's tensor parallelism)
                (`grpo/reward_models.py`), and every judge of reward_config.judges (its fp32 weights with the
                LM head, and its engine's fused layer copies; `grpo/judges.py`), resident in its own phase
                "reward_model" only, with a judge's KV cache when its entry fixes max_model_len (otherwise
                its engine sizes it from the questions put to it, and it is not counted); the buffers the
                scoring graphs keep on the CPU runtime are not counted
The ledger of a run counts exactly these (tests/parallel/test_msrun.py compares). On top, the
activation estimate of the training step (not in the ledger): Megatron's per-layer count for
tensor parallelism without sequence parallelism or recomputation (Korthikanti et al. 2022,
s*b*h*(10 + 24/t + 5*a*s/(h*t)) bytes for 16-bit activations; x2 for fp32) for this stage's
layers of one micro-batch (with actor_config.recompute: each layer's output, s*b*h, and one
layer's count, recomputed in the backward pass), plus on the last stage the scored positions' logits (b * R * V/t
fp32, x3: logits, probabilities, their gradient) and, with pipeline stages, the inputs stage s
keeps of the pp - s micro-batches 1F1B has in flight (s*b*h each; `parallel.pipeline`). With
actor_config.max_tokens_per_micro_batch T > 0 a micro-batch holds at most T tokens, padding
included (`grpo.packing`): s*b is T, a row at most s long, and at most T positions are scored.
Conversations (generate_config.tools or environment): a sample also holds up to max_turns appended turns, each
taken as TURN_TEMPLATE_TOKENS of the chat template's text and tool_response_max_tokens of answer, rounded up to
TURN_STEP (`GenerateConfig.turn_positions`; the run measures its template's text and logs the turn's size): they
lengthen the cache's slots, the training rows and their scored positions alike.

Measured on MindSpore 2.10's CPU runtime (`benchmarks/results/memory.md`, the 0.5B shape, 16 rows of
up to 285 tokens, micro-batches of 4): the parameter groups above agree with the resident memory
they add (policy, reference, grads + AdamW within 3%), but the runtime keeps buffers for every
compiled graph: per decoder layer about 0.71 GB for the update graph (the estimate above: 0.12),
0.56 GB for the generation graphs, 0.16 GB for a scoring graph. On one device the plan adds them
(`cpu_graph_bytes`, `MemoryPlan.cpu_peak`): every phase's kept, or with rl_config.release_graphs the
largest phase's (`git show 997488e:benchmarks/results/graph_release.md`); actor_config.layerwise_update shrinks the update's
(`git show 997488e:benchmarks/results/layerwise.md`), generate_config.layerwise the rollout's
(`benchmarks/results/layerwise_generate.md`: 0.064 against 0.52 GB per layer, the engine's fused copies and KV
cache nearly all of it) and ref_config.layerwise the reference's. The process itself (Python, MindSpore's
runtime, the tokenizer) holds `CPU_RUNTIME_BYTES` before any model (`git show 997488e:benchmarks/results/build_memory.md`); the
weight sync's graphs hold nothing since they read the source Parameters in place (the reference's first sync held
two copies of the weights: 1.31 GB at 2 layers, `git show 997488e:benchmarks/results/build_memory_6b82433.md`; with the process's
own memory, what the groups missed of the built trainer before). The issue-20 step with the four switches:
`benchmarks/results/step_memory_{2,6,24}_layers.md`: the update's constant is fitted to the 2- and 24-layer runs
and `tests/memory/test_plan.py` checks the 6-layer run against it (built: the runtime and the groups but the
gradient accumulators, within 3.5%; peaks within 1% at the fitted runs, 5% at the held-out one). With
rl_config.release_graphs the gradient accumulators exist only while an update runs (`GradBuffer.release`) and
the engine's fused copies and KV cache only while it generates (`MemoryPlan.cpu_peak`, `cpu_built`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from mindgrpo.config.grpo import GRPOConfig
from mindgrpo.config.sections import ParallelConfig
from mindgrpo.inference.engine import kv_slots
from mindgrpo.memory.swap import PHASES, SHARED_PHASES
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.convert import expected_shapes
from mindgrpo.models.lora_targets import full_adapter_shapes, target_modules
from mindgrpo.parallel.layout import ParallelLayout
from mindgrpo.parallel.reshard_plan import exchange_bytes, plan_parameter, sync_buckets

ACTIVE_PHASES = ("rollout", "reward_model", "reference", "old_logprobs", "update", "sync")  # validate == rollout
_TRAINING = ("update",)  # the backward pass keeps activations; scoring graphs are forward-only

# MindSpore 2.10's CPU runtime keeps the buffers of every compiled graph after it ran, until the cell that
# compiled it is deleted (rl_config.release_graphs deletes a phase's graphs when the phase ends). Measured
# at the Qwen2.5-0.5B shape (`benchmarks/results/memory.md`: hidden 896, vocabulary 151,936, 16 rows of
# up to 288 positions, 128 scored tokens a row, micro-batches of 4 rows, 16 decode slots of 285 positions),
# as fixed + per decoder layer, and scaled from there by assumption: the per-layer part by the tokens of
# a micro-batch (the engine's slots x positions for the rollout) x the hidden size, the fixed part by the
# scored tokens of a micro-batch x the vocabulary. The weight sync's bucket graphs keep nothing (they read the
# source Parameters in place and return a (1,) zero: `git show 997488e:benchmarks/results/build_memory.md`).
_MEASURED_TOKENS, _MEASURED_SCORED, _MEASURED_H, _MEASURED_V = 4 * 288, 4 * 128, 896, 151936
_MEASURED_SLOT_POSITIONS = 16 * 285
CPU_GRAPH_BUFFERS = {  # phase -> (bytes fixed, bytes per decoder layer) at the measured shape
    "rollout": (0.038e9, 0.561e9),
    "reference": (0.307e9, 0.158e9),
    "old_logprobs": (0.307e9, 0.158e9),
    "update": (1.985e9, 0.712e9),
    # generate_config.layerwise: one layer's prefill, decode and refresh graphs (`git show 997488e:benchmarks/results/
    # layerwise_generate.md` found 0.694 GB fixed and per layer 0.064, the engine's fused copies and KV cache, which
    # the groups count); through the trainer the rollout peaked 0.71 and 0.69 GB above the built trainer at 2 and 6
    # layers (`git show 997488e:benchmarks/results/step_memory_{2,6}_layers.md`): nothing per layer beyond the groups
    "rollout_layerwise": (0.71e9, 0.0),
    # the issue-20 step through the trainer with release_graphs and the three layerwise switches
    # (`git show 997488e:benchmarks/results/step_memory_{2,6,24}_layers.md`, two steps each): the process peak less the runtime and
    # the groups resident in the update (all but the engine's KV cache and fused copies): 2.42, 2.50 and 3.99 GB at
    # 2, 6 and 24 layers, the line through 2 and 24 (6: 0.21 GB over). It is the second step's peak, on top of
    # what the first step left (about 1.2 GB the runtime keeps after the first update), with the layerwise
    # optimizer step (`layerwise.LayerwiseAdamW`: the embedding's squared and clipped gradient, 1.09 GB); the
    # reference's first call with ref_config.layerwise, likewise (1.07 and 1.20 GB at 2 and 6 layers)
    "update_layerwise": (2.277e9, 0.0714e9),
    # the same with the head a row at a time (actor_config.head_rows_per_graph, default 1), the step's training
    # and norm graphs dropped before the optimizer step (`PolicyUpdater.update(release=True)`), the gradient
    # accumulators made by each update and the engine's decode graphs kept across steps
    # (`benchmarks/results/step_memory_{2,6,24}_layers.md`): the process peak less the runtime, policy,
    # gradients, moments and reference was 1.94, 2.30 and 2.32 GB at 2, 6 and 24 layers; the line through 2 and 24
    # layers (6 is held out: planned 0.29 GB under, 3.9% of its peak; tests/memory/test_plan.py).
    # The peak is the optimizer step's, the embedding's AdamW group (its clipped (V, H) gradient) beside what the
    # runtime kept: the fixed part scaled by the vocabulary x the hidden size
    "update_layerwise_rows": (1.908e9, 0.01705e9),
    "reference_layerwise": (1.005e9, 0.0325e9),
}
CPU_RUNTIME_BYTES = 0.47e9  # the process before any model: Python, MindSpore's runtime, the tokenizer


def _stage_shapes(cfg: Qwen2Config, layout: ParallelLayout, rank: int) -> Dict[str, tuple]:
    """Full shapes of the parameters rank's pipeline stage of `layout` holds."""
    shapes = expected_shapes(cfg)
    if layout.pp == 1:
        return shapes
    stage = layout.stage(rank)
    return {n: s for n, s in shapes.items() if layout.param_stage(n, cfg.num_hidden_layers) == stage}


def piece_bytes(cfg: Qwen2Config, layout: ParallelLayout, itemsize: int = 4, rank: int = 0) -> int:
    return sum(itemsize * int(np.prod(layout.shard_shape(n, s))) for n, s in _stage_shapes(cfg, layout, rank).items())


def optimizer_bytes(cfg: Qwen2Config, layout: ParallelLayout, optimizer_shard: bool, rank: int = 0) -> int:
    """AdamW's two fp32 moments of this rank's policy piece, split over the dp replicas when sharded,
    plus then an fp32 copy of this replica's rows of each split parameter (`optim.AdamW`)."""
    total = 0
    for name, shape in _stage_shapes(cfg, layout, rank).items():
        parts = layout.opt_shard_parts(name, shape) if optimizer_shard else 1
        total += (2 if parts == 1 else 3) * 4 * int(np.prod(layout.shard_shape(name, shape))) // parts
    return total


def dtype_bytes(compute_dtype: str) -> int:
    """Bytes of one value in a compute dtype: 4 in fp32, 2 in bf16 or fp16."""
    return 4 if compute_dtype == "float32" else 2


def micro_batch_tokens(gcfg: GRPOConfig) -> int:
    """Token positions of one training micro-batch: max_tokens_per_micro_batch, or micro_batch_size longest rows."""
    actor = gcfg.actor_config
    return actor.max_tokens_per_micro_batch or actor.micro_batch_size * sequence_lengths(gcfg.generate_config)[0]


def inference_copy_bytes(cfg: Qwen2Config, layout: ParallelLayout) -> int:
    """The engine's fused copies of this rank's layer weights (every layer tensor but the two
    norms), in the compute dtype."""
    width = dtype_bytes(cfg.compute_dtype)
    return sum(width * int(np.prod(layout.shard_shape(n, s))) for n, s in expected_shapes(cfg).items()
               if n.startswith("model.layers.") and "_norm." not in n)


def lora_bytes(cfg: Qwen2Config, actor, layout: ParallelLayout = ParallelLayout()) -> Dict[int, int]:
    """decoder layer -> the fp32 bytes of this layout's pieces of its LoRA adapters, A (r, in) and B (out, r) per
    targeted projection split as the projection (`parallel/layout.py` SPLIT_RULES; whole on one device), without
    their scalings (4 bytes per projection, not trained). actor: actor_config."""
    out = {i: 0 for i in range(cfg.num_hidden_layers)}
    for name, shape in full_adapter_shapes(cfg, actor.lora_rank, actor.lora_target_modules).items():
        out[int(name.split(".")[2])] += 4 * int(np.prod(layout.shard_shape(name, shape)))
    return out


def sequence_lengths(gen) -> Tuple[int, int]:
    """(s, r) of generate_config: the longest sequence (prompt, response and conversations' appended turns) and
    the longest response (the model's max_tokens and the appended turns)."""
    r = gen.max_tokens + gen.turn_positions()
    return gen.max_prompt_length + r, r


def largest_adapter_bucket(cfg: Qwen2Config, actor, src: ParallelLayout, dst: ParallelLayout, rank: int = 0,
                           bucket_bytes: int = 0) -> int:
    """`largest_sync_bucket` of LoRA's adapter-only sync: the adapters' buckets alone."""
    shapes = full_adapter_shapes(cfg, actor.lora_rank, actor.lora_target_modules)
    return _largest_bucket(shapes, cfg.num_hidden_layers, src, dst, rank, bucket_bytes)


def kv_cache_bytes(cfg: Qwen2Config, gen, layout: ParallelLayout) -> int:
    """The rollout engine's KV cache on one rank of the inference layout (gen: generate_config)."""
    capacity = min(sequence_lengths(gen)[0], cfg.max_position_embeddings)
    slots = kv_slots(capacity, gen.max_num_seqs, gen.max_num_batched_tokens)
    return cache_bytes(cfg, slots, capacity, cfg.compute_dtype, layout.tp)


def cache_bytes(cfg: Qwen2Config, slots: int, capacity: int, compute_dtype: str, tp: int = 1) -> int:
    """A rollout engine's KV cache: slots + the trash slot of `capacity` positions, k and v of every layer and of
    this rank's kv heads, in the compute dtype."""
    width = dtype_bytes(compute_dtype)
    return 2 * cfg.num_hidden_layers * (slots + 1) * (cfg.num_key_value_heads // tp) * capacity * cfg.d * width


def largest_sync_bucket(cfg: Qwen2Config, src: ParallelLayout, dst: ParallelLayout, rank: int = 0,
                        bucket_bytes: int = 0) -> int:
    """Bytes of the largest resharding bucket on `rank`: its destination pieces + what it receives
    (bucket_bytes: rl_config.weight_sync_bucket_mb in bytes)."""
    return _largest_bucket(expected_shapes(cfg), cfg.num_hidden_layers, src, dst, rank, bucket_bytes)


def _largest_bucket(shapes, num_layers: int, src: ParallelLayout, dst: ParallelLayout, rank: int,
                    bucket_bytes: int) -> int:
    best = 0
    for names in sync_buckets(shapes, src, bucket_bytes):
        plans = [plan_parameter(n, shapes[n], 4, src, dst, rank, num_layers) for n in names]
        size = sum(4 * int(np.prod(dst.shard_shape(n, shapes[n]))) for n, p in zip(names, plans) if p.needed)
        best = max(best, size + exchange_bytes(plans, [shapes[n] for n in names]))
    return best


def activation_bytes(cfg: Qwen2Config, gcfg: GRPOConfig, layout: ParallelLayout, rank: int = 0) -> int:
    """Estimate for one micro-batch of the training graph on rank's stage (see the module docstring)."""
    gen, actor, rl = gcfg.generate_config, gcfg.actor_config, gcfg.rl_config
    s, r = sequence_lengths(gen)
    b, h, a, tp = actor.micro_batch_size, cfg.hidden_size, cfg.num_attention_heads, layout.tp
    scored = b * r
    if actor.max_tokens_per_micro_batch:  # rows of at most s tokens, T in all (packing.py)
        b = actor.max_tokens_per_micro_batch / s
        scored = actor.max_tokens_per_micro_batch
    stage = layout.stage(rank)
    layers = len(layout.stage_layers(stage, cfg.num_hidden_layers))
    width = dtype_bytes(cfg.compute_dtype)
    per_layer = s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp)) * width / 2
    if actor.recompute:  # each layer keeps its output (the next one's input); one layer's intermediates at a time
        per_layer = s * b * h * width + per_layer / max(layers, 1)
    logits = 3 * scored * cfg.vocab_size // tp * 4 if stage == layout.pp - 1 else 0
    kept = 0
    if layout.pp > 1:  # 1F1B: the inputs of the micro-batches in flight, from forward to backward
        rows = -(-rl.batch_size * rl.num_generations // (rl.num_mini_batches * layout.dp))
        kept = min(layout.pp - stage, -(-rows // b)) * s * b * h * width
    return int(layers * per_layer + logits + kept)


def cpu_graph_bytes(cfg: Qwen2Config, gcfg: GRPOConfig, phases) -> Dict[str, int]:
    """phase -> the buffers its compiled graphs keep on MindSpore 2.10's CPU runtime, on one device
    (`CPU_GRAPH_BUFFERS`, scaled to this config), for the phases in `phases`."""
    gen, actor = gcfg.generate_config, gcfg.actor_config
    s, r = sequence_lengths(gen)
    tokens = micro_batch_tokens(gcfg)
    scored = actor.max_tokens_per_micro_batch or actor.micro_batch_size * r
    capacity = min(s, cfg.max_position_embeddings)
    slot_positions = kv_slots(capacity, gen.max_num_seqs, gen.max_num_batched_tokens) * capacity
    width = cfg.hidden_size / _MEASURED_H
    out = {}
    for phase in phases:
        if phase == "sync":  # the bucket graphs read and write the Parameters in place
            out[phase] = 0
            continue
        layerwise = {"update": actor.layerwise_update, "rollout": gen.layerwise,
                     "reference": gcfg.ref_config.layerwise}.get(phase, False)
        head_rows = phase == "update" and layerwise and actor.head_rows_per_graph > 0
        key = "update_layerwise_rows" if head_rows else f"{phase}_layerwise" if layerwise else phase
        fixed, per_layer = CPU_GRAPH_BUFFERS[key]
        rows = slot_positions / _MEASURED_SLOT_POSITIONS if phase == "rollout" else tokens / _MEASURED_TOKENS
        if head_rows:  # the (V, H) buffers of the embedding's gradient and AdamW group
            head = cfg.vocab_size / _MEASURED_V * width
        elif phase == "rollout":  # (layerwise) one layer's graphs: scaled as a layer's
            head = rows * width
        else:
            head = scored / _MEASURED_SCORED * cfg.vocab_size / _MEASURED_V
        out[phase] = int(fixed * head + per_layer * cfg.num_hidden_layers * rows * width)
        if phase == "update" and layerwise:
            out[phase] += saved_activation_bytes(cfg, gcfg)
    return out


def saved_activation_bytes(cfg: Qwen2Config, gcfg: GRPOConfig) -> int:
    """What the layerwise update's layers past actor_config.recompute_num_layers keep from their forward to their
    backward in one micro-batch (`models/saved_layer.py`: x, q, k, v, a, x2, g, u): 2 H + 2 (nh + nkv) d + 2 I
    values a token and layer, in the compute dtype; 0 when every layer recomputes (null). Counted on top of the
    update's measured buffers, whose peak may fall elsewhere (the optimizer step's): an upper bound."""
    actor = gcfg.actor_config
    if actor.recompute_num_layers is None:
        return 0
    kept = max(cfg.num_hidden_layers - actor.recompute_num_layers, 0)
    values = 2 * cfg.hidden_size + 2 * (cfg.num_attention_heads + cfg.num_key_value_heads) * cfg.d \
        + 2 * cfg.intermediate_size  # x, x2; q, a; k, v; g, u
    width = dtype_bytes(cfg.compute_dtype)
    return int(kept * micro_batch_tokens(gcfg) * values * width)


@dataclass
class MemoryPlan:
    groups: Dict[str, int]  # group -> bytes on this device when resident
    phases: Dict[str, List[str]]  # phase -> resident groups with swap on
    activations: int  # training step estimate, not in the ledger
    rank: int = 0  # the rank planned
    stage: int = 0  # its pipeline stage in the training layout
    stages: int = 1  # pipeline stages of the training layout
    cpu_graphs: Dict[str, int] = field(default_factory=dict)  # phase -> compiled-graph buffers on the CPU runtime
    shared: bool = False  # the inference model is the policy: one copy of the weights, no sync
    fused: int = 0  # the engine's fused layer copies (in the inference group)

    def phase_bytes(self, phase: str, swap: bool) -> int:
        """Ledger bytes during a phase (groups + the sync bucket), without activations."""
        names = self.phases[phase] if swap else [g for g in self.groups if g != "transient"]
        return sum(self.groups[g] for g in names) + (self.groups["transient"] if phase == "sync" else 0)

    def total(self, phase: str, swap: bool) -> int:
        return self.phase_bytes(phase, swap) + (self.activations if phase in _TRAINING else 0)

    def peak(self, swap: bool) -> int:
        return max(self.total(p, swap) for p in self.phases)

    def cpu_peak(self, release: bool) -> int:
        """On MindSpore 2.10's CPU runtime (one device): the process's own (`CPU_RUNTIME_BYTES`), every group
        resident (no swap: host and device are the same memory) plus the compiled graphs' buffers, every
        phase's kept, or with rl_config.release_graphs the largest phase's and the weight sync's (which that
        key leaves); they include the update's activations. With release_graphs the engine's KV cache and
        fused layer copies go with its graphs (`RolloutEngine.release`): resident in the rollout only; and the
        gradient accumulators in the update only (`GradBuffer.release`)."""
        return max(self.cpu_phase_peaks(release).values())

    def cpu_phase_peaks(self, release: bool) -> Dict[str, int]:
        """phase -> the process's planned peak during it (`cpu_peak`'s terms). With the graphs kept every phase
        holds every phase's graphs from the second step on, so each phase's figure is the same."""
        phases = {k: v for k, v in self.cpu_graphs.items() if k != "sync"}  # the weight sync's are never released
        base = int(CPU_RUNTIME_BYTES) + self.phase_bytes("sync", False) + self.cpu_graphs.get("sync", 0)
        if not release:
            return {k: base + sum(phases.values()) for k in phases}
        engine, grads = self.fused + self.groups["kv_cache"], self.groups["grads"]
        return {k: base + v - (0 if k == "rollout" else engine) - (0 if k == "update" else grads)
                for k, v in phases.items()}

    def cpu_built(self, release: bool) -> int:
        """The built trainer on MindSpore 2.10's CPU runtime (one device): the process's own and every group (the
        KV cache, made by the first rollout, counted too), but with rl_config.release_graphs the gradient
        accumulators (made by each update, dropped after it)."""
        held = self.phase_bytes("sync", False)
        return int(CPU_RUNTIME_BYTES) + held - (self.groups["grads"] if release else 0)


def reward_model_bytes(configs: Sequence[Qwen2Config], tps: Sequence[int]) -> int:
    """The reward models' fp32 weights (decoder and scalar head), each rank's tensor-parallel piece of each, split
    over tps[i] ranks (its entry's model_parallel, or the policy's: `parallel.colocated.ParallelPlacement.
    reward_model`)."""
    return sum(4 * int(np.prod(ParallelLayout(dp=1, tp=tp).shard_shape(name, shape))) for c, tp in zip(configs, tps)
               for name, shape in expected_shapes(c, "score").items())


def judge_bytes(configs: Sequence[Qwen2Config], entries: Sequence = (), compute_dtype: str = "float32") -> int:
    """The judges' fp32 weights (decoder and LM head), each whole, their engines' fused layer copies, and the KV
    cache of each judge whose entry (reward_config.judges[i]) fixes max_model_len: max_num_seqs slots of that many
    positions, in the compute dtype (the rollout engine's cache: `kv_cache_bytes`)."""
    one = ParallelLayout.from_config(ParallelConfig())
    cache = 0
    for c, e in zip(configs, entries):
        if e.max_model_len is not None:
            capacity = min(e.max_model_len, c.max_position_embeddings)
            cache += cache_bytes(c, kv_slots(capacity, e.max_num_seqs, None), capacity, compute_dtype)
    return sum(4 * int(np.prod(shape)) for c in configs for shape in expected_shapes(c).values()) + \
        sum(inference_copy_bytes(c, one) for c in configs) + cache


def plan(gcfg: GRPOConfig, mcfg: Qwen2Config, rank: Optional[int] = None,
         reward_models: Sequence[Qwen2Config] = ()) -> MemoryPlan:
    """The plan of one rank; by default the rank with the largest peak (swap on). reward_models: the model
    configs of reward_config.reward_models, then of reward_config.judges, in order
    (`grpo.builder.reward_model_configs`)."""
    train = ParallelLayout.from_config(gcfg.actor_config.parallel_config)
    if rank is None:
        candidates = [_plan_rank(gcfg, mcfg, s * train.stage_size, reward_models) for s in range(train.pp)]
        return max(candidates, key=lambda p: p.peak(True))
    return _plan_rank(gcfg, mcfg, rank, reward_models)


def _plan_rank(gcfg: GRPOConfig, mcfg: Qwen2Config, rank: int, reward_models: Sequence[Qwen2Config] = ()
               ) -> MemoryPlan:
    actor, gen, rl = gcfg.actor_config, gcfg.generate_config, gcfg.rl_config
    train = ParallelLayout.from_config(actor.parallel_config)
    # generate_config.placement separate: the weights meeting moves whole buckets (docs/async.md); the inference copy
    # and its cache are planned as one rollout rank's whatever the replicas' number: its piece of a replica in T'
    # tensor-parallel pieces (generate_config.parallel_config.model_parallel), 1/T' of each split tensor and of the kv
    # heads; a training rank holds its piece of the training layout
    separate = gen.placement == "separate"
    infer = ParallelLayout() if separate else ParallelLayout.from_config(gen.parallel_config)
    source = ParallelLayout() if separate else train  # the layout the sync reads
    rollout = ParallelLayout(tp=gen.parallel_config.model_parallel) if separate else infer  # the inference piece
    policy = piece_bytes(mcfg, train, rank=rank)
    optimizer = optimizer_bytes(mcfg, train, actor.parallel_config.optimizer_shard, rank)
    shared = gcfg.inference_shares_policy(infer == source)  # the plan of a run without --sft_path_infer of its own
    inference = inference_copy_bytes(mcfg, rollout) + (0 if shared else piece_bytes(mcfg, rollout))
    grads, sync_bucket = policy, 0 if shared else largest_sync_bucket(mcfg, source, infer, 0 if separate else rank,
                                                                      rl.weight_sync_bucket_bytes)
    lora = actor.lora_rank > 0  # adapters beside the weights, split as their projection in each layout
    if lora:
        scaling = 4 * len(target_modules(actor.lora_target_modules))  # per layer
        mine = train.stage_layers(train.stage(rank), mcfg.num_hidden_layers)  # a pipeline stage: its layers' adapters
        adapters = sum(v for i, v in lora_bytes(mcfg, actor, train).items() if i in mine)
        policy, grads, optimizer = policy + adapters + scaling * len(mine), adapters, 2 * adapters
        inference += 0 if shared else sum(lora_bytes(mcfg, actor, rollout).values()) + scaling * mcfg.num_hidden_layers
        # only the adapters move, in buckets of layers joined up to weight_sync_bucket_mb
        sync_bucket = 0 if shared else largest_adapter_bucket(mcfg, actor, train, infer, rank,
                                                              rl.weight_sync_bucket_bytes)
    groups = {"policy": policy, "grads": grads, "optimizer": optimizer, "inference": inference}
    if rl.beta > 0 and not lora:  # with LoRA the reference is the policy with its adapters off
        groups["reference"] = piece_bytes(mcfg, ParallelLayout.from_config(gcfg.ref_config.parallel_config),
                                          rank=rank)
    groups["kv_cache"] = kv_cache_bytes(mcfg, gen, rollout)
    groups["transient"] = sync_bucket
    n_rm, n_judges = len(gcfg.reward_config.reward_models), len(gcfg.reward_config.judges)
    if len(reward_models) != n_rm + n_judges:
        raise ValueError(f"{len(reward_models)} model configs for {n_rm} reward_config.reward_models and "
                         f"{n_judges} reward_config.judges")
    if reward_models:
        # separate placement: training rank 0 holds each whole (parallel/shared_rewards.SharedModelRewards)
        default_tp = 1 if gcfg.generate_config.placement == "separate" else train.tp
        tps = [e.model_parallel or default_tp for e in gcfg.reward_config.reward_models]
        groups["reward_model"] = reward_model_bytes(reward_models[:n_rm], tps) + judge_bytes(
            reward_models[n_rm:], gcfg.reward_config.judges, gcfg.actor_config.dtype)
    table = {**(SHARED_PHASES if shared else PHASES), **({"reference": ("policy",)} if lora else {})}
    phases = {p: [g for g in table[p] if g in groups] for p in ACTIVE_PHASES}
    if not reward_models:
        del phases["reward_model"]
    if rl.beta == 0:
        del phases["reference"]
    if not (rl.num_iterations > 1 or rl.num_mini_batches > 1):
        del phases["old_logprobs"]
    one_device = train.world_size == 1 and infer.world_size == 1
    graphs = [p for p in phases if not (shared and p == "sync") and p != "reward_model"]  # shared: no sync graphs
    return MemoryPlan(groups, phases, activation_bytes(mcfg, gcfg, train, rank), rank, train.stage(rank), train.pp,
                      cpu_graph_bytes(mcfg, gcfg, graphs) if one_device else {}, shared,
                      inference_copy_bytes(mcfg, rollout))


def report(p: MemoryPlan, device_bytes: Optional[int] = None) -> str:
    unit, div = ("GiB", 2 ** 30) if p.peak(False) >= 2 ** 30 else ("MiB", 2 ** 20)
    lines = []
    if p.stages > 1:
        lines += [f"Rank {p.rank}, training pipeline stage {p.stage} of {p.stages} (the stage with the largest peak).",
                  ""]
    if p.shared:
        lines += ["One copy of the weights: the inference layout is the training layout, so the engine generates "
                  "with the policy model itself (generate_config.inference_weights: auto; a run given --sft_path_infer "
                  "of its own, or inference_weights: copy, keeps a second copy). The inference group is the engine's "
                  "fused layer copies alone, generating keeps the policy resident, and the sync moves nothing.", ""]
    lines += [f"| group | {unit} on each device |", "|-------|--------------------|"]
    label = {"inference": "inference (the fused layer copies alone)"} if p.shared else {}
    lines += [f"| {label.get(g, g)} | {b / div:.2f} |" for g, b in p.groups.items()]
    lines += [f"| activations (update, estimate) | {p.activations / div:.2f} |", "",
              f"| phase | resident with swap | {unit}, swap on | {unit}, swap off |",
              "|-------|--------------------|--------------|---------------|"]
    for phase, names in p.phases.items():
        extra = " + activations" if phase in _TRAINING else ""
        extra += " + sync bucket" if phase == "sync" and not p.shared else ""
        lines.append(f"| {phase} | {', '.join(names)}{extra} | {p.total(phase, True) / div:.2f} | "
                     f"{p.total(phase, False) / div:.2f} |")
    lines.append(f"| **peak** | | **{p.peak(True) / div:.2f}** | **{p.peak(False) / div:.2f}** |")
    if p.cpu_graphs:
        lines += ["", f"On MindSpore 2.10's CPU runtime the compiled graphs keep buffers that the groups above do not "
                  f"count (measured at the Qwen2.5-0.5B shape, scaled: `mindgrpo/memory/plan.py`), in {unit}: "
                  + ", ".join(f"{k} {v / div:.2f}" for k, v in p.cpu_graphs.items())
                  + f"; with every group resident (no swap on a CPU), the peak is {p.cpu_peak(False) / div:.2f} with "
                  f"the graphs kept and {p.cpu_peak(True) / div:.2f} with rl_config.release_graphs (which also drops "
                  "the engine's KV cache and fused copies between rollouts and the gradient accumulators between "
                  "updates), the process's own "
                  f"{CPU_RUNTIME_BYTES / div:.2f} included."]
    if device_bytes:
        lines.append("")
        for swap in (True, False):
            fits = p.peak(swap) <= device_bytes
            lines.append(f"swap {'on' if swap else 'off'}: peak {p.peak(swap) / 2 ** 30:.1f} GiB "
                         f"{'fits in' if fits else 'does NOT fit in'} {device_bytes / 2 ** 30:.0f} GiB per device")
    return "\n".join(lines)

"""The sections of the GRPO config, each a frozen dataclass with every default and the checks of
its own keys: rl_config (the algorithm and the loop), actor_config (policy model and optimiser),
ref_config (reference model), generate_config (sampling), reward_config (verifiers), sft_config
(the warm start), synthetic_config (the built-in task), and the parallel_config of the three
models. The whole config and the rules across sections are `mindgrpo/config/grpo.py`'s.

Names of registered variants (advantage estimators, policy losses, KL estimators, aggregation
modes, rollout corrections, templates) are checked against their registries here, so a typo fails
at start-up listing the valid names.

Shape vocabulary: each step draws `rl_config.batch_size` prompts and samples G =
`rl_config.num_generations` completions per prompt (TRL's name; mindrlhf's num_generations,
verl's rollout.n), giving B = batch_size * G rollout rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal, Optional

from mindgrpo.config.loader import check
from mindgrpo.data.synthetic import ArithmeticTask
from mindgrpo.data.templates import TEMPLATES
from mindgrpo.eval.metrics import ks_up_to
from mindgrpo.grpo.algos import (
    ADVANTAGES,
    AGG_MODES,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    REWARD_SCALES,
)
from mindgrpo.grpo.corrections import ROLLOUT_CORRECTIONS
from mindgrpo.models.lora_targets import ALL_LINEAR, target_modules
from mindgrpo.rewards.judge_parsers import JUDGE_PARSERS


# Sampling that leaves one token: a group's G samples alike, its rewards equal, its advantages 0, nothing learned.
# The rule: a token whose logit is GREEDY_LOGIT_GAP below the top one must keep a real chance (a weight of at least
# e^-10 against the top token's). Temperature T weighs it exp(-gap / T): T < gap / 10 = 0.01 is greedy. min_p drops
# it when exp(-gap / T) < min_p. top_k = 1 keeps the top token alone; top_p keeps it alone whenever it holds top_p
# of the probability, which below 0.01 is (nearly) always. (Checked in grpo.greedy_sampling_key with
# rl_config.num_generations, and for validation here.)
GREEDY_LOGIT_GAP = 0.1
MIN_TEMPERATURE = GREEDY_LOGIT_GAP / 10
MIN_TOP_P = 0.01


# rl_config's registered variants, each (its registry, the key that names the variant): the settings of a
# variant are the keys named like its function's keyword parameters (`_check_settings`)
VARIANTS = ((ADVANTAGES, "adv_estimator"), (POLICY_LOSSES, "policy_loss"), (ROLLOUT_CORRECTIONS, "rollout_correction"))


def _check_name(registry, name: str, key: str) -> None:
    check(name in registry, key, f"unknown {registry.kind} {name!r}; valid names: {', '.join(registry.names())}")


def _check_settings(cfg, registry, key: str) -> None:
    """A setting of some variant in `registry` (a keyword parameter of its function, named like the
    config key) moved from its default while the variant chosen by `key` does not read it is refused."""
    chosen = getattr(cfg, key)
    read = set(registry.params(chosen))
    defaults = {f.name: f.default for f in fields(cfg)}
    for name in registry.names():
        for setting in registry.params(name):
            readers = [n for n in registry.names() if setting in registry.params(n)]
            check(setting in read or getattr(cfg, setting) == defaults[setting], setting,
                  f"is a setting of {key} {' / '.join(readers)}, and {key} is {chosen!r}, which does not read it")


def _check_positive(cfg, *keys: str) -> None:
    for key in keys:
        check(getattr(cfg, key) >= 1, key, f"must be >= 1, got {getattr(cfg, key)}")


def _check_non_negative(cfg, *keys: str) -> None:
    for key in keys:
        check(getattr(cfg, key) >= 0, key, f"must be >= 0, got {getattr(cfg, key)}")


@dataclass(frozen=True)
class ParallelConfig:
    data_parallel: int = 1
    model_parallel: int = 1
    pipeline_stage: int = 1
    # ZeRO-1 (training layout only): the AdamW moments are split across the data-parallel replicas
    optimizer_shard: bool = False

    def __post_init__(self):
        _check_positive(self, "data_parallel", "model_parallel", "pipeline_stage")

    @property
    def world_size(self) -> int:
        return self.data_parallel * self.model_parallel * self.pipeline_stage


@dataclass(frozen=True)
class RLConfig:
    seed: int = 42
    max_steps: int = 1000
    batch_size: int = 8  # prompts per step
    num_generations: int = 8  # G, completions per prompt
    num_iterations: int = 1  # policy updates per rollout batch (GRPO's mu)
    num_mini_batches: int = 1  # optimiser steps per iteration; the B rows are split into this many
    # loss
    beta: float = 0.0  # KL coefficient; 0 skips the reference model
    kl_kind: str = "low_var_kl"
    clip_low: float = 0.2
    clip_high: float = 0.2  # 0.28 for DAPO's clip-higher
    dual_clip: Optional[float] = None  # c > 1 bounds negative-advantage token losses at c * |A|
    loss_agg_mode: str = "token-mean"
    advantage_scale: str = "group"  # adv_estimator grpo: group | batch | none (= dr_grpo)
    advantage_eps: float = 1e-6  # adv_estimator grpo and reinforce_plus_plus_baseline
    # The algorithm's variants, by registered name (mindgrpo/grpo/algos.py). A variant's settings are the
    # keys named like its function's keyword parameters (clip_low, clip_high and dual_clip above are
    # those of ppo_clip and gspo); a setting moved from its default is refused when the variant chosen
    # does not read it. Reward stds are sample stds (n - 1) throughout (mindgrpo/utils/stats.py).
    adv_estimator: str = "grpo"  # grpo | dr_grpo | rloo | reinforce_plus_plus_baseline
    policy_loss: str = "ppo_clip"  # ppo_clip | gspo (sequence-level ratio) | cispo | sapo | gmpo
    cispo_epsilon_max: float = 5.0  # cispo: the cap of the importance weight (ScaleRL's value)
    sapo_temperature_pos: float = 1.0  # sapo: the gate's temperature where A > 0 (TRL's default)
    sapo_temperature_neg: float = 1.05  # sapo: ... where A <= 0
    gmpo_epsilon: float = 0.4  # gmpo: token log-ratios clipped to [-epsilon, epsilon] (the paper's)
    # the policy loss counts the top rho of tokens by entropy, ranked within each micro-batch of a replica
    # (TRL ranks each micro-batch gathered over its processes); 1: all tokens
    top_entropy_quantile: float = 1.0
    # Rollout/training mismatch, from the rollout engine's log-probs of the sampled tokens: the weight of a
    # token is exp(old log-prob - its log-prob under the distribution the engine sampled from); tis_*
    # truncate it at the threshold, mask_* drop tokens (sequences) whose weight leaves [1/threshold, threshold]
    rollout_correction: str = "none"  # none | tis_token | tis_sequence | mask_token | mask_sequence
    rollout_correction_threshold: float = 2.0
    # the engine's log-probs under softmax(logits / T) (before top-k / top-p) are the old ones: no scoring pass
    old_logprobs_from_rollout: bool = False
    # asynchronous GRPO (docs/async.md; verl's one-step-off-policy): the rollout engine's weights are this many
    # updates behind the policy's (0: synchronous, each rollout with the latest update). With k, the rollout of step
    # s samples with the weights of update s - 1 - k; every token records the policy version that sampled it, and
    # the corrections (rollout_correction) weigh it by that version's log-probs against the current policy's; a
    # sample staler than max_staleness is dropped from the loss and counted (staleness/dropped)
    off_policy_steps: int = 0
    # how many updates stale a sample may be and still train (AReaL's max_head_offpolicyness, verl's staleness
    # threshold): a sample's staleness is that of its oldest token. null: off_policy_steps, plus one with
    # generate_config.partial_rollout (a carried sample's first tokens are a rollout older than a fresh sample's:
    # without the extra update every carried sample would be dropped). At least off_policy_steps
    max_staleness: Optional[int] = None
    # reference model
    ref_model_sync_steps: int = 0  # copy the policy into the reference every this many steps; 0 never
    # DAPO
    dynamic_sampling: bool = False  # drop groups whose rewards are all equal, resample to refill
    max_resample_times: int = 3  # rollout rounds per step before training on what was kept
    overlong_filtering: bool = False  # mask out completions cut at max_tokens
    # loop
    val_interval: int = 0  # steps between validations; 0 never
    val_size: int = 64  # validation prompts
    val_n: int = 1  # samples per validation prompt: val/pass@k for k = 1, 2, 4, ... val_n, val/mean@n, val/maj@n
    val_temperature: float = 0.0  # 0: greedy (then val_n must be 1); top-k / top-p / min-p from generate_config
    val_before_train: bool = True  # validate at step 0, before the first update
    save_best: Optional[str] = None  # a val/ metric (higher is better): the best validated step kept as checkpoints/best
    save_interval: int = 0  # steps between checkpoints; 0 only at the end
    keep_last_k: int = 2  # checkpoints kept
    log_interval: int = 1  # steps between console progress lines; metrics.jsonl gets every step
    max_bad_steps: int = 3  # steps in a row with a non-finite loss or gradient norm before the run stops
    completions_interval: int = 10  # completions.jsonl gets step 1 and every N-th step; 0 never
    swap: bool = True  # host-memory swap between phases (mindgrpo/memory/swap.py)
    # the memory policy (mindgrpo/memory/policy.py, docs/memory.md): "auto" plans the step
    # (mindgrpo/memory/plan.py) against the memory this placement has and turns on the fastest set of memory
    # savers (release_graphs, actor_config.layerwise_update, ref_config.layerwise, generate_config.layerwise) that
    # fits with a 10% margin; "speed" every saver off; "low" every saver that can act in this config on. A saver
    # set here (true / false, not null) keeps its value whatever the policy
    memory: Literal["auto", "speed", "low"] = "auto"
    # with memory auto: the GiB to plan against; null: what the placement has at start-up (the host's available
    # memory on a CPU, the device's HBM on Ascend)
    memory_budget_gb: Optional[float] = None
    # a memory saver (null: rl_config.memory decides). Drop each phase's compiled graphs when it ends (rollout and
    # validation, reference, old log-probs, update): MindSpore's CPU runtime keeps a graph's buffers until the cell
    # that compiled it is deleted, so a step then holds one phase's buffers at a time instead of every phase's,
    # and compiles its graphs again every step (git show 997488e:benchmarks/results/graph_release.md); the engine keeps its decode
    # graphs (a few rows' buffers) and shrinks its KV cache and fused copies, and the gradient accumulators exist
    # only while an update runs
    release_graphs: Optional[bool] = None
    # with release_graphs (which compiles the step's graphs again every step; MindSpore keeps a few MB of each
    # compile): once the resident memory at a step's end is this fraction above the process's own at its second
    # step, save a checkpoint and continue in a fresh process with --resume (mindgrpo/grpo/recycle.py): the same
    # metrics.jsonl and TensorBoard run, no step lost. 0: never. One process only (not under msrun)
    restart_on_memory_growth: float = 0.03
    # the weight sync (policy -> inference, reference) moves consecutive decoder layers (and the embedding,
    # the final norm, the head) together up to this many MiB of full fp32 parameters per bucket: a collective
    # and a compiled graph per bucket, not per layer. A bigger layer goes alone (Qwen2.5-7B: 889 MiB, one a
    # bucket as with 0; the tiny models: one bucket); the largest bucket is the sync's transient memory
    # (scripts/plan_memory.py). 0: one bucket per decoder layer
    weight_sync_bucket_mb: float = 512.0
    # msrun runs: a rank with no progress (a blocking call such as a collective that does not return) for
    # this many seconds ends the job naming the phase and the rank (mindgrpo/parallel/watchdog.py); the
    # first run of each phase, which compiles its graphs, gets compile_timeout_s instead. 0: no watchdog
    collective_timeout_s: float = 1800.0  # HCCL's own execution timeout
    compile_timeout_s: float = 3600.0
    # one device's peak TFLOP/s for perf/mfu; null: Ascend 910B bf16 (313) on Ascend, 0.12 (fp32 matmul peak
    # measured on 2 AVX2 cores) on CPU (mindgrpo/grpo/throughput.py)
    device_peak_tflops: Optional[float] = None
    # data: None means the built-in synthetic arithmetic data
    dataset_path: Optional[str] = None
    val_dataset_path: Optional[str] = None
    output_dir: str = "outputs/grpo"

    def __post_init__(self):
        _check_positive(self, "max_steps", "batch_size", "num_iterations", "num_mini_batches", "keep_last_k",
                        "log_interval", "max_bad_steps")
        check(self.num_generations >= 2, "num_generations",
              f"must be >= 2 (group advantages of one sample are 0), got {self.num_generations}")
        _check_non_negative(self, "beta", "advantage_eps", "ref_model_sync_steps", "max_resample_times",
                            "off_policy_steps", "val_interval", "val_size", "save_interval", "completions_interval")
        check(self.max_staleness is None or self.max_staleness >= self.off_policy_steps, "max_staleness",
              f"must be >= off_policy_steps ({self.off_policy_steps}: every sample is that stale), got "
              f"{self.max_staleness}")
        check(0 < self.clip_low < 1, "clip_low", f"must be in (0, 1), got {self.clip_low}")
        check(self.clip_high > 0, "clip_high", f"must be > 0, got {self.clip_high}")
        check(self.dual_clip is None or self.dual_clip > 1, "dual_clip", f"must be > 1 or null, got {self.dual_clip}")
        _check_name(KL_ESTIMATORS, self.kl_kind, "kl_kind")
        _check_name(AGG_MODES, self.loss_agg_mode, "loss_agg_mode")
        _check_name(REWARD_SCALES, self.advantage_scale, "advantage_scale")
        for registry, key in VARIANTS:
            _check_name(registry, getattr(self, key), key)
            _check_settings(self, registry, key)
        for key in ("cispo_epsilon_max", "sapo_temperature_pos", "sapo_temperature_neg", "gmpo_epsilon"):
            check(getattr(self, key) > 0, key, f"must be > 0, got {getattr(self, key)}")
        check(0 <= self.top_entropy_quantile <= 1, "top_entropy_quantile",
              f"must be in [0, 1], got {self.top_entropy_quantile}")
        check(self.rollout_correction_threshold > 1, "rollout_correction_threshold",
              f"must be > 1, got {self.rollout_correction_threshold}")
        check(self.val_interval == 0 or self.val_size >= 1, "val_size", "must be >= 1 when val_interval > 0")
        _check_positive(self, "val_n")
        _check_non_negative(self, "val_temperature")
        check(self.val_temperature > 0 or self.val_n == 1, "val_n",
              f"must be 1 with val_temperature 0 (greedy samples are all alike), got {self.val_n}")
        check(self.val_n == 1 or self.val_temperature == 0 or self.val_temperature >= MIN_TEMPERATURE,
              "val_temperature",
              f"{self.val_temperature} is nearly greedy (below {MIN_TEMPERATURE}): the val_n = {self.val_n} samples of "
              "a prompt would be alike; use 0 with val_n 1, or sample")
        check(self.save_best is None or self.save_best in self.val_metric_names, "save_best",
              f"must be a validation metric ({', '.join(self.val_metric_names)}), got {self.save_best!r}")
        check(self.device_peak_tflops is None or self.device_peak_tflops > 0, "device_peak_tflops",
              f"must be > 0 or null, got {self.device_peak_tflops}")
        _check_non_negative(self, "collective_timeout_s", "weight_sync_bucket_mb", "restart_on_memory_growth")
        check(self.memory_budget_gb is None or self.memory_budget_gb > 0, "memory_budget_gb",
              f"must be > 0 or null, got {self.memory_budget_gb}")
        check(self.collective_timeout_s == 0 or self.compile_timeout_s >= self.collective_timeout_s,
              "compile_timeout_s", f"must be >= collective_timeout_s = {self.collective_timeout_s}, "
              f"got {self.compile_timeout_s}")

    @property
    def val_metric_names(self) -> list:
        """What a validation logs (rl_config.val_n samples per prompt)."""
        return ["val/accuracy", *(f"val/pass@{k}" for k in ks_up_to(self.val_n)), f"val/mean@{self.val_n}",
                f"val/maj@{self.val_n}"]

    @property
    def weight_sync_bucket_bytes(self) -> int:
        """weight_sync_bucket_mb in bytes."""
        return int(self.weight_sync_bucket_mb * 2 ** 20)

    @property
    def rollout_rows(self) -> int:
        """B = batch_size * G."""
        return self.batch_size * self.num_generations

    def settings(self, registry, name: str) -> dict:
        """The keys `name`'s function in `registry` reads (its keyword parameters) and their values."""
        return {key: getattr(self, key) for key in registry.params(name)}


@dataclass(frozen=True)
class ActorConfig:
    model: str = "qwen2_5_0_5b"  # preset name (model_configs/NAME.yaml) or path to a model config
    # weights the policy (and, unless given their own, the inference copy and the reference) start
    # from: an HF directory or a MindSpore .ckpt, like --sft_path_train; None: random init from `model`
    load_checkpoint: Optional[str] = None
    checkpoint_dir: Optional[str] = None  # None: <rl_config.output_dir>/checkpoints
    # compute dtype of matmuls (master weights, norms, softmax, log-probs, loss and AdamW stay fp32: models/precision.py);
    # bfloat16 is the Ascend setting, float16 the half precision MindSpore's CPU kernels have
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    lr: float = 1e-6
    lr_schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = 0
    min_lr: float = 0.0  # cosine floor
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip: Optional[float] = 1.0  # global grad-norm clip; None off
    micro_batch_size: int = 4  # rows per forward/backward; gradients accumulate over a mini-batch
    # > 0: the vocabulary projection + log-softmax of scoring and training run this many scored
    # tokens at a time with a hand-written backward (mindgrpo/models/fused_head.py); 0: autodiff
    logprob_chunk_size: int = 0
    # activation recompute in the training graph, per decoder layer (Qwen2ForCausalLM.recompute_layers):
    # a layer's intermediates are recomputed in the backward pass instead of kept; the same gradients.
    # On MindSpore 2.10's CPU runtime it saves no memory and costs time (benchmarks/results/recompute.md)
    recompute: bool = False
    # the training step as a host loop over one compiled decoder-layer graph (mindgrpo/grpo/layerwise.py): each
    # layer's forward, then from the last layer to the first its forward again and its backward; the same
    # gradients, and the compiled graphs' buffers of one layer instead of every layer's (MindSpore's CPU runtime
    # keeps them all: git show 997488e:benchmarks/results/layerwise.md). One device; any micro-batches but packed rows with
    # flash attention. A memory saver (null: rl_config.memory decides)
    layerwise_update: Optional[bool] = None
    # with layerwise_update: the rows of a micro-batch (packed rows: its samples) the final norm, vocabulary head and
    # loss take a graph call (their buffers grow with rows x response length x vocabulary); the same loss, metrics and
    # gradients, to rounding (a loss with top_entropy_quantile < 1 takes its quantile over one call's tokens: its head
    # takes the whole micro-batch). 0: the whole micro-batch. (The Qwen2.5-0.5B shape, micro-batches of 4 rows of 128
    # response tokens: benchmarks/results/head_rows.md)
    head_rows_per_graph: int = 1
    # with layerwise_update: how many decoder layers, the first ones, keep only their input and run their forward
    # again in their backward (Megatron's recompute_num_layers, its "block" method); the others keep what their
    # backward reads from forward to backward (mindgrpo/models/saved_layer.py), so that their forward runs once:
    # with LoRA about 0.8x the update's time for those layers (a recomputed layer beside them about 1.15x its time
    # with every layer recomputing: it runs the saving forward again; for full fine-tuning no gain was measured), at
    # (2 H + 2 (nh + nkv) d + 2 I) x tokens x 4 bytes a layer (57 MB at the Qwen2.5-0.5B shape and 4 rows of 266
    # tokens). null: rl_config.memory decides (auto, with LoRA: the fewest recomputed layers whose plan fits where
    # that is faster; speed, with LoRA: none; low and full fine-tuning: every layer, the least memory)
    recompute_num_layers: Optional[int] = None
    # Micro-batches by tokens (mindgrpo/grpo/packing.py), for the update and the old log-probs. > 0: a
    # mini-batch's samples, sorted by length, are cut into micro-batches of at most this many tokens,
    # padding included, each padded only to its own length (micro_batch_size then sizes the SFT warm start
    # only); data-parallel replicas get about the same number of tokens. 0: micro_batch_size samples each
    max_tokens_per_micro_batch: int = 0
    packing: bool = False  # several samples per row of a token-budget micro-batch, each attending only to itself
    # how packed rows keep samples apart: "mask" (a block-diagonal causal bias, any device) or "flash"
    # (Ascend's flash_attention_score in its TND layout; not available on CPU)
    packed_attention: Literal["mask", "flash"] = "mask"
    # packed rows with a group's prompt once: the samples of a prompt in one run, each response after the prompt
    # seeing it and itself (mindgrpo/grpo/packing.py "shared"): the same log-probs and update, the prompt's tokens
    # scored once a group instead of once a sample (the update and the reference pass); needs packed_attention mask
    shared_prefix: bool = False
    # LoRA, PEFT's method and names (docs/lora.md). > 0: adapters of this rank on lora_target_modules train and
    # the weights stay (AdamW moments and gradient buffers for the adapters alone; with rl_config.beta > 0 the
    # reference is the policy with its adapters off, no copy). 0: full fine-tuning
    lora_rank: int = 0
    lora_alpha: float = 16.0  # the adapters' scaling is lora_alpha / lora_rank
    lora_dropout: float = 0.0  # PEFT's lora_dropout p in [0, 1): the policy's training forward only (docs/lora.md)
    # PEFT's module names of the decoder's projections (q, k, v, o, gate, up, down and all-linear accepted)
    lora_target_modules: tuple[str, ...] = ALL_LINEAR
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)

    def __post_init__(self):
        check(self.lr > 0, "lr", f"must be > 0, got {self.lr}")
        check(0 <= self.min_lr <= self.lr, "min_lr", f"must be in [0, lr={self.lr}], got {self.min_lr}")
        _check_non_negative(self, "warmup_steps", "weight_decay", "logprob_chunk_size", "max_tokens_per_micro_batch",
                            "head_rows_per_graph")
        check(not self.packing or self.max_tokens_per_micro_batch > 0, "packing",
              "needs max_tokens_per_micro_batch > 0 (the tokens of a micro-batch's packed rows)")
        check(not self.shared_prefix or self.packed_attention == "mask", "shared_prefix",
              "needs packed_attention mask (the flash kernel's runs cannot share a prompt)")
        for key in ("adam_beta1", "adam_beta2"):
            check(0 <= getattr(self, key) < 1, key, f"must be in [0, 1), got {getattr(self, key)}")
        check(self.adam_eps > 0, "adam_eps", f"must be > 0, got {self.adam_eps}")
        check(self.grad_clip is None or self.grad_clip > 0, "grad_clip", f"must be > 0 or null, got {self.grad_clip}")
        _check_positive(self, "micro_batch_size")
        par = self.parallel_config
        check(not self.recompute or (par.model_parallel == 1 and par.pipeline_stage == 1), "recompute",
              "is tested on one device and under data parallelism only: set it false with "
              f"parallel_config.model_parallel = {par.model_parallel}, pipeline_stage = {par.pipeline_stage}")
        check(not self.layerwise_update or (par.model_parallel == 1 and par.pipeline_stage == 1), "layerwise_update",
              "runs the whole model on one device (or under data parallelism): set it false with "
              f"parallel_config.model_parallel = {par.model_parallel}, pipeline_stage = {par.pipeline_stage}")
        check(not (self.layerwise_update and self.packing and self.packed_attention == "flash"), "layerwise_update",
              "attends through an additive bias, not flash attention: set it false or packed_attention mask")
        check(not (self.layerwise_update and self.recompute), "layerwise_update",
              "already runs each layer's forward again in its backward (how many layers do: recompute_num_layers): "
              "set recompute false")
        check(self.recompute_num_layers is None or self.recompute_num_layers >= 0,  # the loader checks it is an int
              "recompute_num_layers", f"must be an integer >= 0 or null, got {self.recompute_num_layers!r}")
        _check_non_negative(self, "lora_rank")
        if self.lora_rank > 0:
            self._check_lora()

    def _check_lora(self) -> None:
        try:
            target_modules(self.lora_target_modules)
        except ValueError as e:
            check(False, "lora_target_modules", str(e).split(": ", 1)[1])
        check(self.lora_alpha > 0, "lora_alpha", f"must be > 0, got {self.lora_alpha}")
        check(0.0 <= self.lora_dropout < 1.0, "lora_dropout",
              f"must be in [0, 1) (PEFT's dropout probability of the adapters' input), got {self.lora_dropout}")
        par = self.parallel_config
        check(not par.optimizer_shard, "lora_rank",
              "cannot combine with parallel_config.optimizer_shard (ZeRO-1 of the adapters' moments is not built; "
              "they are megabytes): set it false")


@dataclass(frozen=True)
class RefConfig:
    """The reference model (beta > 0 only). It has the policy's architecture and vocabulary."""

    load_checkpoint: Optional[str] = None  # like --ref_path; None: the policy's starting weights
    # the reference pass's token budget (mindgrpo/grpo/packing.py; it packs when actor_config.packing):
    # None: actor_config.max_tokens_per_micro_batch; 0: actor_config.micro_batch_size samples per micro-batch
    max_tokens_per_micro_batch: Optional[int] = None
    # the reference's scoring as a host loop over one compiled decoder-layer graph (mindgrpo/grpo/layerwise.py,
    # LayerwiseLogProbs), as actor_config.layerwise_update runs the update: the same log-probs, and the compiled
    # graphs' buffers of one layer instead of every layer's (MindSpore's CPU runtime keeps them all). One device; any
    # micro-batches but packed rows with flash attention. A memory saver (null: rl_config.memory decides)
    layerwise: Optional[bool] = None
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)

    def __post_init__(self):
        check(self.max_tokens_per_micro_batch is None or self.max_tokens_per_micro_batch >= 0,
              "max_tokens_per_micro_batch", f"must be >= 0 or null, got {self.max_tokens_per_micro_batch}")
        par = self.parallel_config
        check(not self.layerwise or (par.model_parallel == 1 and par.pipeline_stage == 1), "layerwise",
              "runs the whole reference on one device (or under data parallelism): set it false with "
              f"parallel_config.model_parallel = {par.model_parallel}, pipeline_stage = {par.pipeline_stage}")

    def max_tokens(self, actor: ActorConfig) -> int:
        """The reference pass's token budget (0: rows)."""
        return actor.max_tokens_per_micro_batch if self.max_tokens_per_micro_batch is None \
            else self.max_tokens_per_micro_batch


TURN_STEP = 16  # an appended turn's token budget is rounded up to this
TURN_TEMPLATE_TOKENS = 32  # the memory plan's allowance for the chat template's text around one appended turn


@dataclass(frozen=True)
class GenerateConfig:
    max_prompt_length: int = 512  # P
    max_tokens: int = 512  # R, completion tokens
    temperature: float = 1.0  # 0 is greedy
    top_k: int = 0  # 0 off
    top_p: float = 1.0
    min_p: float = 0.0
    stop_token_ids: tuple[int, ...] = ()  # besides the tokenizer's EOS
    seed: Optional[int] = None  # None: rl_config.seed
    # the rollout engine (vLLM's names): decode slots per inference replica, and the KV cache of a
    # replica in tokens (slots x (max_prompt_length + max_tokens) at most; null: as many as the slots need)
    max_num_seqs: int = 256
    max_num_batched_tokens: Optional[int] = None
    # the inference model's weights (mindgrpo/grpo/builder.py): "auto" generates with the policy model itself
    # (one copy of the weights, no weight sync) where it would hold exactly the policy's parameters in the same
    # layout: one device, or parallel_config equal to actor_config's, and no --sft_path_infer of its own; else a
    # copy, synced after every update. "copy": always the copy (to check the sync, or the old memory figures)
    inference_weights: Literal["auto", "copy"] = "auto"
    # the engine's graphs one decoder layer at a time (mindgrpo/inference/engine.py): one compiled prefill / decode
    # layer graph (and fused-weight refresh) run for every layer, so MindSpore's CPU runtime keeps one layer's
    # buffers instead of every layer's; the same tokens and log-probs bit for bit. No tensor parallelism. A memory
    # saver (null: rl_config.memory decides)
    layerwise: Optional[bool] = None
    # with layerwise: the decoder layers in one decode graph (the last graph the rest). A decode step runs at every
    # token and each graph call costs milliseconds; more layers a graph, fewer calls and more buffers held, growing
    # with the slots (the Qwen2.5-0.5B shape at 24 layers, 16 slots: 4 layers 30.2 s of decode, 8 layers 28.7 s,
    # 24 layers 25.1 s, the engine holding +2.31, +2.34, +2.48 GB; benchmarks/results/layerwise_generate_groups.md)
    decode_layers_per_graph: int = 8
    # the most prompt positions (prompts x their padded length) the engine prefills in one graph call, at least one
    # prompt a call; null: every prompt admitted at once (up to max_num_seqs / num_generations of them). A prefill's
    # buffers grow with it: 64 prompts of 256 positions at the Qwen2.5-0.5B shape (4 layers, 256 slots) held 6.28 GB
    # in one call, 3.05 in calls of 4,096, the same samples (benchmarks/results/prefill_budget.md)
    max_prefill_tokens: Optional[int] = 4096
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    # where the rollout runs under msrun (docs/async.md): "colocated", every rank trains and generates in turn;
    # "separate", the ranks split into a training group (actor_config.parallel_config, the first ranks) and a
    # rollout group (this parallel_config, the next ones) that meet once a step (the samples to the trainers, the
    # new weights to the rollout) and otherwise work at the same time: with rl_config.off_policy_steps k >= 1 the
    # rollout of the next k steps runs while this step trains (the rollout ranks keep them queued). For now the
    # training group is actor_config.parallel_config.data_parallel replicas of the whole model (each trains its share
    # of a mini-batch, the gradients summed over the group; tensor and pipeline parallelism 1) and the rollout group
    # parallel_config.data_parallel whole replicas, each generating its share of a step's prompts
    placement: Literal["colocated", "separate"] = "colocated"
    # partial rollouts (docs/async.md; AReaL's, slime's): a step's rollout admits twice the groups it still needs and
    # stops once it has them; the unfinished samples keep their tokens and go on in the next step's rollout with the
    # new weights (prefilled again), their tokens stamped with the version that generated each. A group trains when
    # all its samples are finished; rl_config.max_staleness bounds how stale a sample may be (off_policy_steps >= 1)
    partial_rollout: bool = False
    # conversations with tools (docs/tools.md; TRL's `tools`, verl's multi-turn names): the registered tools offered
    # to the model (empty: one answer per prompt). A turn that ends with <tool_call> blocks gets the tools' answers
    # as a tool turn appended to its KV cache, then the sample decodes on: at most max_turns tool turns a sample,
    # each answer cut to tool_response_max_tokens tokens; max_tokens counts the model's own tokens over all turns.
    # The calls run in tool_num_workers processes, each bounded by tool_timeout_s seconds; tool_plugin is a .py file
    # of @register_tool functions; chat_template a tokenizer_config.json whose Jinja chat_template writes the tool
    # turns (and the synthetic task's prompts), null: the tokenizer's own
    tools: tuple[str, ...] = ()
    max_turns: int = 4
    tool_response_max_tokens: int = 256
    tool_timeout_s: float = 10.0
    tool_num_workers: int = 2
    tool_plugin: Optional[str] = None
    chat_template: Optional[str] = None
    # conversations with an environment (docs/tools.md, "Environments in a run"; TRL's environments): a registered
    # multi-turn environment (mindgrpo/envs; null: none) whose reset writes each prompt from the dataset's `prompt`
    # text and whose step answers each model turn with the next user turn and a reward (the `env_reward` column, the
    # `environment` reward function). environment_plugin: a .py file of @register_environment classes;
    # environment_settings: the environment's keyword settings. It shares max_turns, tool_response_max_tokens (each
    # observation's budget), tool_timeout_s (each reset / step), tool_num_workers and chat_template with tools; not
    # both at once
    environment: Optional[str] = None
    environment_plugin: Optional[str] = None
    environment_settings: Optional[dict[str, Any]] = None

    @property
    def conversations(self) -> bool:
        """Whether the rollouts are conversations (tools or an environment), not one answer per prompt."""
        return bool(self.tools) or self.environment is not None

    def turn_positions(self, around: int = TURN_TEMPLATE_TOKENS) -> int:
        """KV-cache positions a sample's appended turns may take beyond prompt + max_tokens: max_turns turns of
        `around` tokens of the chat template's text and tool_response_max_tokens of answer, rounded up to TURN_STEP
        (the run measures `around` from its template; the memory plan takes TURN_TEMPLATE_TOKENS); 0 without
        conversations."""
        if not self.conversations:
            return 0
        return self.max_turns * (-(-(around + self.tool_response_max_tokens) // TURN_STEP) * TURN_STEP)

    def __post_init__(self):
        _check_positive(self, "max_prompt_length", "max_tokens", "max_num_seqs", "decode_layers_per_graph",
                        "max_turns", "tool_response_max_tokens", "tool_num_workers")
        check(self.tool_timeout_s > 0, "tool_timeout_s", f"must be > 0, got {self.tool_timeout_s}")
        check(len(set(self.tools)) == len(self.tools), "tools", f"has duplicates: {list(self.tools)}")
        capacity = self.max_prompt_length + self.max_tokens
        check(self.max_num_batched_tokens is None or self.max_num_batched_tokens >= capacity,
              "max_num_batched_tokens", f"must hold one sequence of max_prompt_length + max_tokens = {capacity} "
              f"tokens, got {self.max_num_batched_tokens}")
        _check_non_negative(self, "temperature", "top_k")
        check(self.max_prefill_tokens is None or self.max_prefill_tokens >= 1, "max_prefill_tokens",
              f"must be >= 1 or null, got {self.max_prefill_tokens}")
        check(0 < self.top_p <= 1, "top_p", f"must be in (0, 1], got {self.top_p}")
        check(0 <= self.min_p < 1, "min_p", f"must be in [0, 1), got {self.min_p}")
        check(not self.layerwise or self.parallel_config.model_parallel == 1, "layerwise",
              "runs one device's whole layers (no tensor parallelism: parallel_config.model_parallel must be 1)")


@dataclass(frozen=True)
class CosineRewardConfig:
    """Length-scaled correctness reward (Yeo et al. 2025; open-r1's cosine_scaled): short correct
    answers earn the most, short wrong ones lose the most; in between along half a cosine."""

    min_value_wrong: float = -1.0  # a wrong answer of length 0
    max_value_wrong: float = -0.5  # a wrong answer of max_len tokens or more
    min_value_correct: float = 0.5  # a correct answer of max_len tokens or more
    max_value_correct: float = 1.0  # a correct answer of length 0
    max_len: Optional[int] = None  # None: generate_config.max_tokens


@dataclass(frozen=True)
class SoftOverlongConfig:
    """DAPO's soft overlong punishment: linear penalty over the last buffer_len tokens, 0 down to -1
    (scaled by its entry in reward_config.verifier_weight, DAPO's penalty factor)."""

    buffer_len: int = 128
    max_len: Optional[int] = None  # None: generate_config.max_tokens

    def __post_init__(self):
        _check_positive(self, "buffer_len")


# How a reward model is shown a rollout (`mindgrpo/grpo/reward_models.py`): "raw" the prompt as the policy saw
# it and the completion, their token ids as they are; "completion" the completion's tokens alone
REWARD_MODEL_TEMPLATES = ("raw", "completion")


@dataclass(frozen=True)
class RewardModelConfig:
    """One outcome reward model (`mindgrpo/models/reward_model.py`): an HF folder of a Qwen2/Qwen3
    *ForSequenceClassification with one label, or a MindSpore .ckpt of one (`scripts/convert_weight.py`), with
    the run's tokenizer. Its score enters the total reward times `weight`, as a verifier's does."""

    path: str = ""  # the model: HF folder, or .ckpt with its config beside it (or `config`)
    name: Optional[str] = None  # metrics' reward/<name>/...; None: rm0, rm1, ... by position
    weight: float = 1.0
    template: str = "raw"  # a name of REWARD_MODEL_TEMPLATES
    config: Optional[str] = None  # the model config, when none is beside the weights
    # micro-batches: max_tokens_per_micro_batch = 0 scores micro_batch_size right-padded rows at a time (each
    # micro-batch padded to its longest row, rounded up to 32); T > 0 packs the sequences into rows of the
    # longest one's length (rounded up to 32), T // that length rows a micro-batch (the reference pass's packing)
    micro_batch_size: int = 8
    max_tokens_per_micro_batch: int = 0
    # the row lengths (two a octave: docs/reward_models.md) whose compiled scoring graphs stay alive, the most
    # recently used; another row length drops the graphs (and buffers) of the one used longest ago
    kept_row_lengths: int = 4
    # the score, standardised by the running mean and std of every score this model gave so far (the current
    # batch's included) before it is weighted: (x - mean) / max(std, 1e-6)
    normalize: bool = False
    # under msrun, the reward model's own layout: split over this many ranks (tensor parallelism, vLLM's
    # tensor_parallel_size), the world's other ranks data-parallel replicas of it, each scoring its share of the
    # rollouts (parallel/replica_scores.py); None: the policy's (actor_config.parallel_config.model_parallel)
    model_parallel: Optional[int] = None

    def __post_init__(self):
        check(bool(self.path), "path", "names no reward model (an HF folder or a MindSpore .ckpt)")
        check(self.model_parallel is None or self.model_parallel >= 1, "model_parallel",
              f"must be >= 1 (or null: the policy's), got {self.model_parallel}")
        check(self.template in REWARD_MODEL_TEMPLATES, "template",
              f"unknown reward model template {self.template!r}; valid names: {', '.join(REWARD_MODEL_TEMPLATES)}")
        _check_positive(self, "micro_batch_size", "kept_row_lengths")
        _check_non_negative(self, "max_tokens_per_micro_batch")


# What a generative judge is asked by default (`mindgrpo/grpo/judges.py`): a Jinja template over the rollout's
# `prompt` and `completion` texts (and its data columns, e.g. `solution`), parsed by the "number" parser
DEFAULT_JUDGE_TEMPLATE = ("Rate the answer to the question below from 0 (wrong or useless) to 10 (correct and "
                          "complete). Reply with the number only.\n\nQuestion: {{ prompt }}\n\nAnswer: "
                          "{{ completion }}\n\nScore:")


@dataclass(frozen=True)
class JudgeConfig:
    """A generative judge (`mindgrpo/grpo/judges.py`): a Qwen2/Qwen3 causal LM (an HF folder or a MindSpore .ckpt,
    with the run's tokenizer) asked by `template` to judge each rollout, through the rollout engine; a score is
    parsed from its answer by `parser` (`mindgrpo/rewards/judge_parsers.py`), None when it cannot be. The score
    enters the total reward times `weight`, as a verifier's does."""

    path: str = ""  # the judge model: HF folder, or .ckpt with its config beside it (or `config`)
    name: Optional[str] = None  # metrics' reward/<name>/...; None: judge0, judge1, ... by position
    weight: float = 1.0
    config: Optional[str] = None  # the model config, when none is beside the weights
    # the question put to the judge: Jinja (sandboxed) over `prompt`, `completion` and the data's columns
    template: str = DEFAULT_JUDGE_TEMPLATE
    # a tokenizer_config.json whose chat template wraps the question as the user's turn (None: the text as it is)
    chat_template: Optional[str] = None
    parser: str = "number"  # a name of rewards/judge_parsers.JUDGE_PARSERS
    # scores outside [lo, hi] are None (a judge that answers 11 on a 0-10 scale did not follow the question)
    score_range: Optional[tuple[float, float]] = (0.0, 10.0)
    max_tokens: int = 16  # of the judge's answer
    temperature: float = 0.0  # 0: greedy
    max_num_seqs: int = 64  # the judge engine's slots
    # positions a slot holds, question + answer (vLLM's name): questions longer than max_model_len - max_tokens get
    # no score (counted too_long); None: sized from the questions put to it (the memory plan cannot count its KV
    # cache then)
    max_model_len: Optional[int] = None
    seed: int = 0
    normalize: bool = False  # standardised by its running mean and std before weighting, as a reward model's

    def __post_init__(self):
        check(bool(self.path), "path", "names no judge model (an HF folder or a MindSpore .ckpt)")
        check(bool(self.template.strip()), "template", "is empty")
        check(self.parser in JUDGE_PARSERS, "parser",
              f"unknown judge parser {self.parser!r}; valid names: {', '.join(JUDGE_PARSERS.names())}")
        _check_positive(self, "max_tokens")
        _check_positive(self, "max_num_seqs")
        if self.max_model_len is not None:
            check(self.max_model_len > self.max_tokens, "max_model_len",
                  f"must exceed max_tokens ({self.max_tokens}): it holds the question and the answer, got "
                  f"{self.max_model_len}")
        check(self.temperature >= 0, "temperature", f"must be >= 0, got {self.temperature}")
        if self.score_range is not None:
            check(len(self.score_range) == 2 and self.score_range[0] <= self.score_range[1], "score_range",
                  f"must be [lo, hi] with lo <= hi, got {list(self.score_range)}")


@dataclass(frozen=True)
class RewardConfig:
    verifier_function: tuple[str, ...] = ("accuracy", "format")  # registered reward names
    verifier_weight: tuple[float, ...] = (1.0, 1.0)  # one per verifier_function
    reward_plugin: Optional[str] = None  # path to a .py file registering more reward functions
    # reward functions run in this many worker processes, each call bounded by timeout_s seconds (a call
    # that times out scores None for its completions, counted in reward/<name>/timeouts); 0 runs them in
    # the trainer's process, without a timeout (mindgrpo/rewards/pool.py)
    num_workers: int = 2
    timeout_s: float = 10.0
    cosine: CosineRewardConfig = field(default_factory=CosineRewardConfig)
    soft_overlong: SoftOverlongConfig = field(default_factory=SoftOverlongConfig)
    # outcome reward models scored on the devices in a phase of their own, beside the verifiers
    reward_models: tuple[RewardModelConfig, ...] = ()
    # generative judges: models asked to judge each rollout, in the same phase as the reward models
    judges: tuple[JudgeConfig, ...] = ()

    def model_names(self) -> tuple:
        """The reward models' names (`RewardModelConfig.name`, else rm0, rm1, ...)."""
        return tuple(m.name or f"rm{i}" for i, m in enumerate(self.reward_models))

    def judge_names(self) -> tuple:
        """The judges' names (`JudgeConfig.name`, else judge0, judge1, ...)."""
        return tuple(m.name or f"judge{i}" for i, m in enumerate(self.judges))

    def __post_init__(self):
        check(len(self.verifier_function) >= 1, "verifier_function", "needs at least one reward function")
        check(len(set(self.verifier_function)) == len(self.verifier_function), "verifier_function",
              f"has duplicates: {list(self.verifier_function)}")
        check(len(self.verifier_weight) == len(self.verifier_function), "verifier_weight",
              f"has {len(self.verifier_weight)} weights for {len(self.verifier_function)} verifier_function entries")
        _check_non_negative(self, "num_workers")
        check(self.timeout_s > 0, "timeout_s", f"must be > 0, got {self.timeout_s}")
        names = self.verifier_function + self.model_names() + self.judge_names()
        check(len(set(names)) == len(names), "judges" if self.judges else "reward_models",
              f"names must differ from each other and from verifier_function: {list(names)}")


@dataclass(frozen=True)
class SFTConfig:
    """An optional supervised warm start on the dataset's reference solutions before GRPO."""

    steps: int = 0  # 0: none
    lr: float = 1e-3
    batch_size: int = 32
    # A flawed teacher (built-in synthetic task only): each addition of a warm-start solution that carries
    # out of the ones column forgets the carry with this probability (mindgrpo.data.synthetic.flawed_solution).
    teacher_carry_error: float = 0.0
    # A teacher that calls the tools only sometimes (built-in synthetic task with generate_config.tools: the warm
    # start's targets are conversations in the chat template): in this share of its solutions it calls the
    # calculator and boxes its answer, in the others it answers at once (with teacher_carry_error's mistakes)
    teacher_tool_call_rate: float = 0.0

    def __post_init__(self):
        _check_non_negative(self, "steps")
        _check_positive(self, "batch_size")
        check(self.lr > 0, "lr", f"must be > 0, got {self.lr}")
        check(0.0 <= self.teacher_carry_error <= 1.0, "teacher_carry_error",
              f"must be in [0, 1], got {self.teacher_carry_error}")
        check(0.0 <= self.teacher_tool_call_rate <= 1.0, "teacher_tool_call_rate",
              f"must be in [0, 1], got {self.teacher_tool_call_rate}")


@dataclass(frozen=True)
class SyntheticConfig:
    """The built-in task, used when rl_config.dataset_path is null."""

    template: str = "qwen_r1"  # prompt template (mindgrpo.data.templates)
    task: ArithmeticTask = field(default_factory=ArithmeticTask)

    def __post_init__(self):
        _check_name(TEMPLATES, self.template, "template")


__all__ = ["GREEDY_LOGIT_GAP", "MIN_TEMPERATURE", "MIN_TOP_P", "VARIANTS",
           "ActorConfig", "CosineRewardConfig", "GenerateConfig", "ParallelConfig", "RLConfig", "RefConfig",
           "RewardConfig", "RewardModelConfig", "SFTConfig", "SoftOverlongConfig", "SyntheticConfig"]

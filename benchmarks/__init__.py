"""Performance claims of mindgrpo, each with the command that reproduces it. Run from the repo root:

    python -m benchmarks.NAME [--help]

NAME is one of the modules below; each writes its figures under benchmarks/results/ (NAME.json and NAME.md,
with the command, date, machine and load average of the run). The machine is shared, so every figure is a
ratio against a baseline timed side by side in the same run. benchmarks/README.md says which claim each backs.

    grpo_step            one GRPO step against TRL's GRPOTrainer on tiny models, and mindgrpo's scaling (a package)
    step_memory          the GRPO step at the Qwen2.5-0.5B shape through the trainer: memory and time per phase,
                         against TRL (--sides ours trl), with the memory switches on or off (--switches, --set)
    update_profile       where the update phase's time goes, by kind of op, against the matmul peak
    packing              reference + update on long-tailed samples: padded rows, token budgets, packed rows, TRL
    packing_memory       the memory of the same three ways of cutting micro-batches
    rollout              the slot-scheduled engine against a static batch and transformers' generate
    generate             decode throughput against transformers' generate
    layerwise_generate   the rollout engine with layer graphs (generate_config.layerwise) against whole graphs
    prefill_budget       generate_config.max_prefill_tokens: memory and time of the prefill by budget
    memory               where a step's memory goes at the Qwen2.5-0.5B shape, per phase and per layer
    head_rows            actor_config.head_rows_per_graph: the layerwise update's head a few rows a call
    recompute            actor_config.recompute against none (no saving on MindSpore's CPU runtime)
    logprobs             per-token log-probs: the softmax-kernel head against LogSoftmax and the op chain
    adamw                one AdamW step: the fused kernel against tensor arithmetic
    async_rollout        asynchronous GRPO (separate placement, one step off, partial rollouts) against the
                         synchronous step on 2 msrun workers, a long-tailed rollout
    reshard              online resharding against the disk path, under msrun
    transform_checkpoint slicing a checkpoint for 8 ranks against a file copy
    rlhf_data            the data tool on the GSM8K train set
    reward_pool          the reward worker pool: start-up, scoring in the pool against in process
    checkpoint_save      the crash-safe checkpoint save (fsync, SHA-256, manifest) against a plain save
    readme_table         the README's performance table, generated from the results files
    soak                 resident memory per step over a long run under release_graphs, with the trainer's restarts

Shared pieces: `harness` (timing loops, run stamps, result files), `workers` (sides in their own processes;
one failing stops the others), `tiny_models` (the model configs, the same weights on both sides),
`matmul_peak` (the fp32 matmul rate a measured rate is set against; run alone, MindSpore's, ours and PyTorch's side by side), `update_sides` (the Qwen2.5-0.5B-shaped
update and step workload of the memory benchmarks), `static_engine` (the static-batch baseline of `rollout`).
"""

"""Performance claims of mindgrpo, each with the command that reproduces it. Run from the repo root:

    python -m benchmarks.NAME [--help]

NAME is one of the modules below; each writes or prints its figures (most under benchmarks/results/,
with the command, date, machine and load average of the run). The machine is shared, so every
figure is a ratio against a baseline timed side by side in the same run.

    grpo_step          one GRPO step against TRL's GRPOTrainer, and mindgrpo's scaling (a package)
    fused_head         the training step's vocabulary head: fused and chunked against autodiff
    update_profile     where the update phase's time goes, by kind of op, against the matmul peak
    packing            reference + update on long-tailed samples: padded rows, token budgets, packed rows, TRL
    logprobs           per-token log-probs: fused log_softmax against the op chain
    adamw              one AdamW step: the fused kernel against tensor arithmetic
    generate           decode throughput against transformers' generate
    decode_bound       what bounds the decode step's vocabulary head
    sampler            the whole-vocabulary draw: fused softmax against exp(logits - max)
    reshard            online resharding against the disk path, under msrun
    transform_checkpoint   slicing a checkpoint for 8 ranks against a file copy
    rlhf_data          the data tool on the GSM8K train set
    reward_pool        the reward worker pool: start-up, scoring in the pool against in process
    checkpoint_save    the crash-safe checkpoint save (fsync, SHA-256, manifest) against a plain save
    soak               resident memory per step over a long run under release_graphs, with the trainer's restarts

Shared pieces: `harness` (timing loops, run stamps, result files), `workers` (sides in their own
processes; one failing stops the others), `tiny_models` (the model configs, the same weights on both
sides), `matmul_peak` (the fp32 matmul rate a measured rate is set against).
"""

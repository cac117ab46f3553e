"""One GRPO step: mindgrpo against TRL's GRPOTrainer (PyTorch, CPU) on identical work, in one run.

    python -m benchmarks.grpo_step                      # both configs, TRL side by side
    python -m benchmarks.grpo_step --mode all           # ... and mindgrpo's scaling sweep
    python -m benchmarks.grpo_step --mode scaling       # only the sweep
        [--configs tiny-qwen-vocab tiny-small-vocab] [--steps 3] [--output benchmarks/results/grpo_step.json]

One mode alone keeps the other's last results in the JSON (each part records its date and command).

Identical work on both sides (`workload.py`): the same random HF Qwen2 weights (saved by
transformers, converted for us by scripts/convert_weight.py), the same 4 prompts (GSM8K test
questions in the R1 template when ../shared holds them, else synthetic text; Qwen2.5's tokenizer for
the Qwen vocabulary when ../shared holds it, else our tiny tokenizer, which the 4096-vocabulary
config always uses; both sides must produce the same prompt ids), G = 4, exactly --new_tokens tokens
per completion (no stop ids on our side, min_new_tokens on TRL's), temperature 1, top-k off, top-p 1,
fp32, beta > 0 (both score a reference model), k3 KL, token-mean loss, one optimizer step per rollout
batch, micro-batches of --micro_batch rows (our trainer's default, 4; TRL: per_device_train_batch_size
with gradient accumulation), grad clip 1, the same cheap reward (the share of ASCII letters; not constant, so
the advantages are not all zero). TRL runs with its own defaults otherwise (gradient checkpointing on).

Our step (`ours.py`) is the project's trainer (`mindgrpo.grpo.builder.build`,
`GRPOTrainer.train_step`) with the phases its Progress times. TRL's phases (`trl_side.py`) come from
wrapping its methods (`_generate_single_turn`, `_get_per_token_logps_and_entropies`,
`_prepare_inputs`) and trainer callbacks; its update is the step less the time in `_prepare_inputs`
(losses, backwards, clip, AdamW). TRL generates with the model it trains, so it has no weight sync.
Each side runs in its own process (no shared thread pools or allocators; `benchmarks.workers`: when
one side fails, the other is stopped) and the parent (`run.py`) alternates them step by step (TRL
step i, then ours), so changes in the shared machine's load hit both; each side's first step
(compilation, lazy set-up) is a warm-up; numbers are medians over --steps. Update GFLOP/s count the
useful model FLOPs (`flops.py`: 3x a forward over the real tokens; the vocabulary projection on
response positions; attention over the full S x S square), the same number for both sides. Each side
measures its framework's fp32 matmul GFLOP/s right after each of its steps (square shapes and the
update's own largest shapes; the best is the peak), and each step's update is set against the peak
measured after it, so both see the same machine load. `report.py` writes the markdown and the plots.
"""
